"""Operating a cluster of brokers on one PostgreSQL: controlled shutdown hands a stopping broker's partitions over;
the status page and ``trireme cluster`` show the brokers and who leads what."""
from __future__ import annotations

import json
import subprocess
import threading
import time

import psycopg
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import TopicPartition as KafkaTopicPartition
from kafka.admin import KafkaAdminClient

from compat_tests.clients import kcat_consume
from compat_tests.cluster_support import Cluster, wait_for
from compat_tests.test_admin_cli import TRIREME
from compat_tests.test_status_page import cluster_section, get, status_url
from trireme.wire import error_codes as E

pytestmark = pytest.mark.trireme_only("starts trireme serve processes on a PostgreSQL of its own")

# Long enough that nothing in a test moves because a lease lapsed or a broker polled the cluster on its own: what
# moves, moves because a broker announced it (NOTIFY).  (A broker renews its lease when it polls.)
SLOW_CLUSTER = {"broker.session.timeout.ms": 120000, "trireme.cluster.metadata.poll.ms": 60000,
                "auto.create.topics.enable": False}




def leaders(bootstrap: str, topic: str) -> dict[int, int]:
    """partition → its leader's node id, as Metadata answers."""
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    return {p.id: p.leader for p in metadata.topics[topic].partitions.values()}


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)


def announce(dsn: str) -> None:
    """Have every broker poll the cluster now, as a broker's announcement (NOTIFY trireme_cluster) does."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_notify('trireme_cluster', '0')")


def balanced(cluster: Cluster, topic: str, partitions: int) -> dict[int, int]:
    """Wait until every broker's Metadata has each partition of ``topic`` led and both brokers leading some (the
    brokers told to poll meanwhile) → partition → leader."""
    def check(broker):
        announce(cluster.dsn)
        found = leaders(broker.bootstrap, topic)
        return found if len(found) == partitions and set(found.values()) == {1, 2} else None
    seen = [wait_for(f"{broker!r}'s metadata", lambda: check(broker)) for broker in cluster.brokers.values()]
    return wait_for("the same leaders everywhere", lambda: (lambda now: now if all(
        check(b) == now for b in cluster.brokers.values()) else None)(check(cluster.brokers[1]))) or seen[0]


def test_sigterm_hands_the_partitions_over_and_an_idempotent_producer_loses_nothing(tmp_path, postgres_database):
    topic, partitions = "handover", 8
    with Cluster(tmp_path, postgres_database, size=2, **SLOW_CLUSTER) as cluster:
        create_topic(cluster.bootstrap, topic, partitions)
        balanced(cluster, topic, partitions)
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
    with Cluster(tmp_path, postgres_database, size=2, **{"trireme.status.listen": "127.0.0.1:0",
                                                         "auto.create.topics.enable": False}) as cluster:
        create_topic(cluster.bootstrap, topic, partitions)
        found = balanced(cluster, topic, partitions)
        ports = {n: b.port for n, b in cluster.brokers.items()}

        out = subprocess.run(TRIREME + ["cluster", "--describe", "--json", "--topic", topic,
                                        "--bootstrap-server", cluster.bootstrap],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        described = json.loads(out.stdout)
        assert [(b["node_id"], b["port"]) for b in described["brokers"]] == [(1, ports[1]), (2, ports[2])]
        assert [b["node_id"] for b in described["brokers"] if b["controller"]] == [described["controller_id"]]
        assert {p["partition"]: p["leader"] for p in described["partitions"]} == found
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
    """ElectLeaders PREFERRED moves a partition to its preferred leader now (here one whose reassignment the slow
    controller has not applied yet), ELECTION_NOT_NEEDED where it leads already; a reassignment's replica list
    names the partition's preferred leaders and is Metadata's replica list; Kafka's errors for what cannot be done."""
    topic, partitions = "reassigned", 8
    with Cluster(tmp_path, postgres_database, size=2, **SLOW_CLUSTER) as cluster:
        create_topic(cluster.bootstrap, topic, partitions)
        led = balanced(cluster, topic, partitions)
        admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap)
        try:
            everything = {topic: list(range(partitions))}
            assert elected(admin.elect_leaders(0, everything, raise_errors=False)) == dict.fromkeys(
                range(partitions), E.ELECTION_NOT_NEEDED.code)
            assert elected(admin.elect_leaders(0, {topic: [partitions]}, raise_errors=False)) == {
                partitions: E.UNKNOWN_TOPIC_OR_PARTITION.code}

            # a reassignment stored without telling anyone (the controller polls once a minute): not applied yet
            moving = 0
            other = 3 - led[moving]
            with psycopg.connect(postgres_database, autocommit=True) as conn:
                conn.execute("UPDATE trireme_partition SET assigned_replicas = %s WHERE partition = %s AND "
                             "leader_id = %s", ([other, led[moving]], moving, led[moving]))
            assert leaders(cluster.bootstrap, topic)[moving] == led[moving]
            assert elected(admin.elect_leaders(0, everything, raise_errors=False)) == {
                p: E.NONE.code if p == moving else E.ELECTION_NOT_NEEDED.code for p in range(partitions)}
            wait_for("the elected leader", lambda: leaders(cluster.bootstrap, topic) == {**led, moving: other})

            # reassignments through the admin API apply at once
            first, second = 1, 2
            answer = admin.alter_partition_reassignments({
                KafkaTopicPartition(topic, first): [2, 1], KafkaTopicPartition(topic, second): [1, 2],
                KafkaTopicPartition(topic, 3): [3], KafkaTopicPartition(topic, 0): [1, 1],
                KafkaTopicPartition(topic, partitions): [1]})
            assert {tp.partition: 0 if error is None else error.errno for tp, error in answer.items()} == {
                first: 0, second: 0, 3: E.INVALID_REPLICA_ASSIGNMENT.code, 0: E.INVALID_REPLICA_ASSIGNMENT.code,
                partitions: E.UNKNOWN_TOPIC_OR_PARTITION.code}
            cancel = admin.alter_partition_reassignments({KafkaTopicPartition(topic, 3): None})
            assert [error.errno for error in cancel.values()] == [E.NO_REASSIGNMENT_IN_PROGRESS.code]
            wait_for("the reassigned leaders", lambda: (lambda now: now[first] == 2 and now[second] == 1)(
                leaders(cluster.bootstrap, topic)))
            for broker in cluster.brokers.values():         # replicas in the assignment's order, once each polled
                wait_for(f"{broker!r}'s replicas", lambda: [list(p.replicas) for p in AdminClient(
                    {"bootstrap.servers": broker.bootstrap}).list_topics(topic, timeout=10).topics[topic].partitions
                    .values() if p.id in (first, second)] == [[2, 1], [1, 2]])
            assert admin.list_partition_reassignments() == {}          # nothing to copy: complete once stored
        finally:
            admin.close()
