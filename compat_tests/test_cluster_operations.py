"""Operating a cluster of brokers on one PostgreSQL: controlled shutdown hands a stopping broker's partitions over;
the status page and ``trireme cluster`` show the brokers and who leads what."""
from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import TopicPartition as KafkaTopicPartition
from kafka.admin import KafkaAdminClient

from compat_tests.clients import kcat_consume
from compat_tests.cluster_support import Cluster
from compat_tests.test_admin_cli import TRIREME
from compat_tests.test_status_page import cluster_section, get, status_url
from trireme.wire import error_codes as E

pytestmark = pytest.mark.trireme_only("starts trireme serve processes on a PostgreSQL of its own")

# Long enough that nothing in a test moves because a lease lapsed or a broker polled the cluster on its own: what
# moves, moves because a broker announced it (NOTIFY).
SLOW_CLUSTER = {"broker.session.timeout.ms": 120000, "trireme.cluster.metadata.poll.ms": 120000}


def wait_for(what: str, check, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"{what}: not within {timeout}s"
        time.sleep(0.1)


def leaders(bootstrap: str, topic: str) -> dict[int, int]:
    """partition → its leader's node id, as Metadata answers."""
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    return {p.id: p.leader for p in metadata.topics[topic].partitions.values()}


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)


def prepare_topic(cluster: Cluster, topic: str, partitions: int) -> None:
    """Have ``topic`` known to every broker of ``cluster`` (not started yet) under one topic id: created on the
    first broker alone, whose topic registry the others start from (until topics are records of the shared metadata
    log)."""
    first, *others = cluster.brokers.values()
    first.start()
    create_topic(first.bootstrap, topic, partitions)
    assert first.stop() == 0
    for broker in others:
        shutil.copy(first.data_dir / "topics.json", broker.data_dir / "topics.json")


def test_sigterm_hands_the_partitions_over_and_an_idempotent_producer_loses_nothing(tmp_path, postgres_database):
    topic, partitions = "handover", 8
    cluster = Cluster(tmp_path, postgres_database, size=2, **SLOW_CLUSTER, **{"auto.create.topics.enable": False})
    prepare_topic(cluster, topic, partitions)
    with cluster:
        for broker in cluster.brokers.values():     # broker 1 (the first, the controller) leads them all
            wait_for(f"{broker!r}'s metadata", lambda: leaders(broker.bootstrap, topic) == dict.fromkeys(
                range(partitions), 1))
        survivor = cluster.brokers[2]

        delivered: list[bytes] = []
        failed: list[str] = []
        undelivered: list[int] = []
        stop = threading.Event()

        def produce():
            producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "enable.idempotence": True,
                                 "linger.ms": 5})

            def report(error, message):
                if error is None:
                    delivered.append(message.value())
                else:
                    failed.append(str(error))
            i = 0
            while not stop.is_set():
                producer.produce(topic, key=b"%d" % i, value=b"%d" % i, on_delivery=report)
                producer.poll(0)
                i += 1
                time.sleep(0.001)
            undelivered.append(producer.flush(60))
        worker = threading.Thread(target=produce)
        worker.start()
        try:
            wait_for("records delivered", lambda: len(delivered) > 200)
            assert cluster.brokers[1].stop() == 0
            # led by the survivor long before the stopped broker's lease lapses or the survivor polls on its own
            wait_for("every partition led by node 2", lambda: set(leaders(survivor.bootstrap, topic).values()) == {2})
            count = len(delivered)
            wait_for("records delivered after the hand-over", lambda: len(delivered) > count + 200)
        finally:
            stop.set()
            worker.join(90)
        assert failed == [] and undelivered == [0]

        # read back with kcat (no consumer group: the group coordinator is not what this tests)
        read = [r.value for p in range(partitions) for r in kcat_consume(survivor.bootstrap, topic, p)]
        assert sorted(read) == sorted(delivered)        # every acknowledged record, once


def test_status_page_and_cluster_command_show_the_brokers_and_the_leaders(tmp_path, postgres_database):
    topic, partitions = "shown", 6
    cluster = Cluster(tmp_path, postgres_database, size=2, **{"trireme.status.listen": "127.0.0.1:0",
                                                              "auto.create.topics.enable": False})
    prepare_topic(cluster, topic, partitions)
    with cluster:
        found = wait_for("both brokers leading", lambda: (lambda led: led if set(led.values()) == {1, 2} else None)(
            leaders(cluster.bootstrap, topic)))
        ports = {n: b.port for n, b in cluster.brokers.items()}

        out = subprocess.run(TRIREME + ["cluster", "--describe", "--json", "--topic", topic,
                                        "--bootstrap-server", cluster.bootstrap],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        described = json.loads(out.stdout)
        assert [(b["node_id"], b["port"]) for b in described["brokers"]] == [(1, ports[1]), (2, ports[2])]
        assert [b["node_id"] for b in described["brokers"] if b["controller"]] == [described["controller_id"]]
        assert {p["partition"]: p["leader"] for p in described["partitions"]} == found
        assert all(p["leader_epoch"] >= 1 for p in described["partitions"])       # taken from the first leader
        expected = {f"{topic}-{p['partition']}": f"{p['leader']}|{p['leader_epoch']}" for p in described["partitions"]}

        def page():
            brokers, led = cluster_section(get(status_url(cluster.brokers[1]))[1])
            shown = {row.split("|")[0]: "|".join(row.split("|")[1:3]) for row in led if row.startswith(topic)}
            return (brokers, shown) if shown == expected else None
        brokers, _ = wait_for("broker 1's status page showing the same leaders", page)
        assert [row.split("|")[:3] for row in brokers] == [
            ["1 this broker", f"PLAINTEXT 127.0.0.1:{ports[1]}", "-"], ["2", f"PLAINTEXT 127.0.0.1:{ports[2]}", "-"]]
        assert all(row.split("|")[3] != "-" for row in brokers)            # their leases' time left
        assert [row.split("|")[0].split()[0] for row in brokers if row.endswith("|controller")] == [
            str(described["controller_id"])]


def elected(response) -> dict[int, int]:
    """An ElectLeaders answer (kafka-python) → partition → error code."""
    return {p[0]: p[1] for topic in response.replica_election_results for p in topic[1]}


def test_elect_leaders_and_reassignments_move_partitions_at_once(tmp_path, postgres_database):
    """ElectLeaders PREFERRED moves what the (slow) controller has not balanced yet; a reassignment's replica list
    names the partition's preferred leaders; Kafka's errors for what cannot be done."""
    topic, partitions = "reassigned", 6
    cluster = Cluster(tmp_path, postgres_database, size=2, **SLOW_CLUSTER, **{"auto.create.topics.enable": False})
    prepare_topic(cluster, topic, partitions)
    with cluster:
        for broker in cluster.brokers.values():     # broker 1 (the first, the controller) leads them all
            wait_for(f"{broker!r}'s metadata", lambda: leaders(broker.bootstrap, topic) == dict.fromkeys(
                range(partitions), 1))
        admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap)
        try:
            # preferred: the first broker in rendezvous order over both; the ones that prefer broker 2 move now
            moved = elected(admin.elect_leaders(0, {topic: list(range(partitions))}, raise_errors=False))
            assert set(moved.values()) == {E.NONE.code, E.ELECTION_NOT_NEEDED.code}
            to_two = {p for p, code in moved.items() if code == E.NONE.code}
            wait_for("the elected leaders", lambda: leaders(cluster.bootstrap, topic) == {
                p: 2 if p in to_two else 1 for p in range(partitions)})
            again = elected(admin.elect_leaders(0, {topic: list(range(partitions))}, raise_errors=False))
            assert again == dict.fromkeys(range(partitions), E.ELECTION_NOT_NEEDED.code)
            assert elected(admin.elect_leaders(0, {topic: [partitions]}, raise_errors=False)) == {
                partitions: E.UNKNOWN_TOPIC_OR_PARTITION.code}

            # reassignments: partition 0 to broker 2 first, partition 1 to broker 1 first
            first, second = (0, 1)
            answer = admin.alter_partition_reassignments({
                KafkaTopicPartition(topic, first): [2, 1], KafkaTopicPartition(topic, second): [1, 2],
                KafkaTopicPartition(topic, 2): [3], KafkaTopicPartition(topic, 3): [1, 1],
                KafkaTopicPartition(topic, 4): None})
            assert {tp.partition: 0 if error is None else error.errno for tp, error in answer.items()} == {
                first: 0, second: 0, 2: E.INVALID_REPLICA_ASSIGNMENT.code, 3: E.INVALID_REPLICA_ASSIGNMENT.code,
                4: E.NO_REASSIGNMENT_IN_PROGRESS.code}
            wait_for("the reassigned leaders", lambda: (lambda led: led[first] == 2 and led[second] == 1)(
                leaders(cluster.bootstrap, topic)))
            for broker in cluster.brokers.values():         # replicas in the assignment's order, once each polled
                wait_for(f"{broker!r}'s replicas", lambda: [list(p.replicas) for p in AdminClient(
                    {"bootstrap.servers": broker.bootstrap}).list_topics(topic, timeout=10).topics[topic].partitions
                    .values() if p.id in (first, second)] == [[2, 1], [1, 2]])
            assert admin.list_partition_reassignments() == {}          # nothing to copy: complete once stored
        finally:
            admin.close()
