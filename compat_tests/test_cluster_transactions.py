"""Transactions on a cluster of three brokers on one PostgreSQL, at transaction.version 1 (classic) and 2 (KIP-890):
the transaction coordinator's markers go over the wire (WriteTxnMarkers) to the leaders of the data partitions on
the other brokers, and read_committed consumers see each transaction whole, on every leader."""
from __future__ import annotations

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from compat_tests import clients
from compat_tests.broker_probe import broker_info
from compat_tests.cluster_support import Cluster, requests_handled
from compat_tests.test_cluster import coordinator_of, wait_for
from compat_tests.test_transactions_harness import close_producers, java_kind, read_to_end, rows, run_plan

pytestmark = pytest.mark.trireme_only("starts trireme serve processes on a PostgreSQL of its own")

PARTITIONS = 6          # rendezvous hashing spreads them over the three brokers
METRICS = {"trireme.metrics.listen": "127.0.0.1:0"}


def markers_handled(cluster) -> dict[int, int]:
    return {n: requests_handled(b, "WriteTxnMarkers") for n, b in cluster.brokers.items()}


def check_markers_crossed(cluster, before: dict[int, int], leaders: set[int], coordinator: int) -> None:
    """Every leader other than the coordinator's broker got WriteTxnMarkers requests; no other broker did."""
    after = markers_handled(cluster)
    got = {n for n in after if after[n] > before[n]}
    assert leaders - {coordinator}, (leaders, coordinator)      # some data partition is led elsewhere
    assert leaders - {coordinator} <= got <= leaders, (got, leaders, coordinator)


@pytest.mark.parametrize("level", [1, 2])
def test_confluent_kafka_transactions_across_brokers(tmp_path, postgres_database, level):
    """confluent-kafka commits and aborts transactions over six partitions led by three brokers; each
    broker's read_committed consumer reads exactly the committed transactions, each whole."""
    with Cluster(tmp_path, postgres_database, size=3, **{"transaction.version": level, **METRICS}) as cluster:
        wait_for("three live brokers", lambda: all(b.running for b in cluster.brokers.values()))
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        admin.create_topics([NewTopic("txn", PARTITIONS, 1)])["txn"].result(30)
        leaders = broker_info(cluster.bootstrap).leaders("txn")
        tid = f"ck-{level}"
        before = markers_handled(cluster)
        producer = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": tid})
        producer.init_transactions(30)
        committed = []
        for n, commit in enumerate([True, False, True, False, True]):
            producer.begin_transaction()
            sent = [b"t%d-%d" % (n, p) for p in range(PARTITIONS)]
            for p, value in enumerate(sent):
                producer.produce("txn", value, partition=p)
            if commit:
                producer.commit_transaction(30)
                committed += sent
            else:
                producer.flush(30)
                producer.abort_transaction(30)
        for broker in cluster.brokers.values():
            consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "reader",
                                 "isolation.level": "read_committed", "enable.auto.commit": False})
            consumer.assign([TopicPartition("txn", p, 0) for p in range(PARTITIONS)])
            got = []
            wait_for(f"the committed records through {broker.bootstrap}",
                     lambda: got.extend(m.value() for m in consumer.consume(100, timeout=0.2)
                                        if m.error() is None) or len(got) >= len(committed), timeout=30)
            consumer.close()
            assert sorted(got) == sorted(committed)
        # (a read_committed consumer got to the end: every marker is written)
        coordinator = coordinator_of(cluster.bootstrap.split(",")[0], tid, 1)
        check_markers_crossed(cluster, before, set(leaders.values()), coordinator)


@pytest.mark.parametrize("level", [1, 2])
def test_java_4_transactions_across_brokers(tmp_path, postgres_database, level):
    """The Java 4.3 client (transactions V2 at level 2, the classic protocol at 1) runs the harness' plan of
    committed and aborted transactions over three topics of two partitions; the leaders on the other brokers get
    the markers, and a read_committed consumer bootstrapped at each broker reads exactly the committed records."""
    kind = java_kind("4.3.0", transactions_v2=level == 2)
    kind.require()
    with Cluster(tmp_path, postgres_database, size=3, **{"transaction.version": level, **METRICS}) as cluster, \
            clients.java_harness("4.3.0", cluster.bootstrap) as h:
        topics = [f"java-txn-{x}" for x in "abc"]
        for t in topics:
            h.ok("create_topic", topic=t, partitions=2)
        probe = broker_info(cluster.bootstrap)
        leaders = {n for t in topics for n in probe.leaders(t).values()}
        tid = f"java-{level}"
        before = markers_handled(cluster)
        h.ok("init_producer", handle="p", config=kind.txn_config(tid))
        try:
            committed, _, _ = run_plan(h, "p", topics)
        finally:
            close_producers(h, "p")
        for broker in cluster.brokers.values():
            with clients.java_harness("4.3.0", broker.bootstrap) as reader:
                for t in topics:
                    got = rows(read_to_end(reader, kind, t, [0, 1], "read_committed")["records"])
                    for p in range(2):
                        assert [g for g in got if g[0] == p] == committed[(t, p)], (broker.bootstrap, t, p)
        check_markers_crossed(cluster, before, leaders, coordinator_of(cluster.bootstrap.split(",")[0], tid, 1))
