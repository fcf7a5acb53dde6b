"""Several brokers on one PostgreSQL (trireme.storage=postgresql): registration with leases, the controller,
leadership spread over the live brokers and moved when one is lost, and a deposed leader fenced."""
from __future__ import annotations

import subprocess
import time

import psycopg
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from compat_tests.cluster_support import Cluster, cluster_config, wait_for
from compat_tests.conftest import server_command, write_toml

pytestmark = pytest.mark.trireme_only("starts trireme serve processes on a PostgreSQL of its own")


def brokers_table(dsn: str) -> dict[int, bool]:
    """node id → live, as the database has it."""
    with psycopg.connect(dsn) as conn:
        return dict(conn.execute("SELECT node_id, lease_expires_at > clock_timestamp() FROM trireme_broker"))


def controller(dsn: str) -> int | None:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT controller_id FROM trireme_cluster").fetchone()[0]




def test_brokers_register_and_one_becomes_the_controller(tmp_path, postgres_database):
    with Cluster(tmp_path, postgres_database, size=3):
        wait_for("three live brokers", lambda: brokers_table(postgres_database) == {1: True, 2: True, 3: True})
        assert controller(postgres_database) in (1, 2, 3)


def test_a_second_broker_with_a_live_node_id_is_refused(tmp_path, postgres_database):
    """Kafka refuses a duplicate broker registration while the first one's session lasts: the second process exits
    with one line naming the node id."""
    with Cluster(tmp_path, postgres_database, size=1):
        config = tmp_path / "twin.toml"
        write_toml(config, cluster_config(postgres_database, 1))
        done = subprocess.run(server_command() + ["--data-dir", str(tmp_path / "twin"), "--listen", "127.0.0.1:0",
                                                  "--config", str(config)],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode != 0
        assert "node.id 1 is registered by a live broker" in done.stderr, done.stderr[-2000:]


def test_a_broker_killed_and_restarted_on_its_directory_comes_back_at_once(tmp_path, postgres_database):
    """Its lease is still live, but it is its own data directory's (the directory lock proves the old process is
    gone): no wait for the session to end."""
    with Cluster(tmp_path, postgres_database, size=1, **{"broker.session.timeout.ms": 60000}) as cluster:
        broker = cluster.brokers[1]
        started = time.monotonic()
        broker.kill9()
        assert broker.running and time.monotonic() - started < 30


def test_the_controller_role_moves_when_its_broker_stops(tmp_path, postgres_database):
    with Cluster(tmp_path, postgres_database, size=2) as cluster:
        first = wait_for("a controller", lambda: controller(postgres_database))
        cluster.brokers[first].kill()
        other = 2 if first == 1 else 1
        wait_for("the other broker as controller", lambda: controller(postgres_database) == other)
        assert brokers_table(postgres_database)[first] is False


def metadata_leaders(bootstrap: str, topic: str) -> dict[int, int]:
    """partition → leader, as Metadata through ``bootstrap`` answers ({} while the topic is not there)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    md = admin.list_topics(topic, timeout=10).topics[topic]
    return {} if md.error is not None else {p: md.partitions[p].leader for p in md.partitions}


def test_a_topic_created_on_the_controller_is_led_by_every_broker_and_served_by_all(tmp_path, postgres_database):
    """Every broker follows __cluster_metadata: a topic created through one broker is described by all three, its
    partitions spread over the three as leaders; a producer that knows only one broker writes every partition
    (librdkafka goes to each leader), and every record is read back, through any broker.  Each partition's first
    leader leads it at leader epoch 0, as Kafka's (the epoch in Metadata and in every batch it appends)."""
    with Cluster(tmp_path, postgres_database, size=3) as cluster:
        wait_for("three live brokers", lambda: brokers_table(postgres_database) == {1: True, 2: True, 3: True})
        first = cluster.brokers[1].bootstrap
        admin = AdminClient({"bootstrap.servers": first})
        admin.create_topics([NewTopic("spread", 12, 3)])["spread"].result(30)
        for b in cluster.brokers.values():
            found = wait_for(f"the topic and its leaders on {b.bootstrap}",
                             lambda: _all_led(metadata_leaders(b.bootstrap, "spread"), 12))
        assert set(found.values()) == {1, 2, 3}
        producer = Producer({"bootstrap.servers": cluster.brokers[2].bootstrap, "acks": "all",
                             "enable.idempotence": True})
        acked = []
        for i in range(600):
            producer.produce("spread", b"%d" % i, partition=i % 12, on_delivery=lambda e, m: acked.append(e))
        assert producer.flush(30) == 0
        assert acked == [None] * 600
        consumer = Consumer({"bootstrap.servers": cluster.brokers[3].bootstrap, "group.id": "unused",
                             "enable.auto.commit": False})
        consumer.assign([TopicPartition("spread", p, 0) for p in range(12)])
        got = []
        deadline = time.monotonic() + 30
        while len(got) < 600 and time.monotonic() < deadline:
            for m in consumer.consume(100, timeout=0.5):
                assert m.error() is None, m.error()
                assert m.leader_epoch() == 0, (m.partition(), m.leader_epoch())
                got.append(int(m.value()))
        consumer.close()
        assert sorted(got) == list(range(600))


def _all_led(found: dict[int, int], count: int) -> dict[int, int] | None:
    return found if len(found) == count and all(leader >= 0 for leader in found.values()) else None


def test_brokers_hand_out_producer_ids_from_blocks_of_their_own(tmp_path, postgres_database):
    """InitProducerId (idempotent, no transactional id) through each of three brokers: the two that are not the
    controller get blocks of their own from it (AllocateProducerIds), so no id is handed out twice."""
    from compat_tests.test_bad_input import RawConn, req
    with Cluster(tmp_path, postgres_database, size=3) as cluster:
        wait_for("three live brokers", lambda: brokers_table(postgres_database) == {1: True, 2: True, 3: True})
        def init_producer_id(bootstrap: str):
            with RawConn(bootstrap) as conn:
                answer = conn.request("InitProducerId", 4, req("InitProducerId", transactional_id=None,
                                                              transaction_timeout_ms=-1, producer_id=-1,
                                                              producer_epoch=-1))
            # COORDINATOR_NOT_AVAILABLE (retriable, as clients retry it) until the controller knows the broker
            return answer.producer_id if answer.error_code == 0 else None
        ids = [wait_for(f"a producer id from {b.bootstrap}", lambda b=b: init_producer_id(b.bootstrap))
               for _ in range(3) for b in cluster.brokers.values()]
        assert len(set(ids)) == 9, ids
        with psycopg.connect(postgres_database) as conn:
            controller_id = conn.execute("SELECT controller_id FROM trireme_cluster").fetchone()[0]
        assert controller_id in (1, 2, 3)


def test_a_deposed_leader_that_wakes_up_cannot_append(tmp_path, postgres_database):
    """The leader of a partition is stopped (SIGSTOP) past its session: the controller names the other broker, which
    takes the partition with a new leader epoch and is written to.  Woken (SIGCONT), the old leader is sent a
    produce at once, before anything tells it: it does not acknowledge it (its commit is fenced by the row: another
    leader), and the partition holds only what the new leader acknowledged."""
    import signal
    from compat_tests.test_bad_input import RawConn, produce
    from trireme.wire import records
    with Cluster(tmp_path, postgres_database, size=2) as cluster:
        wait_for("two live brokers", lambda: brokers_table(postgres_database) == {1: True, 2: True})
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        wait_for("both listed", lambda: len(admin.list_topics(timeout=10).brokers) == 2)
        admin.create_topics([NewTopic("fenced", 2, 2)])["fenced"].result(30)
        found = wait_for("leaders", lambda: _all_led(metadata_leaders(cluster.bootstrap, "fenced"), 2))
        old = found[0]
        new = 2 if old == 1 else 1
        stopped = cluster.brokers[old]
        batch = records.build_batch([(None, b"before")])

        def written() -> bool:      # NOT_LEADER_OR_FOLLOWER (retriable) until the leader has opened the partition
            with RawConn(stopped.bootstrap) as conn:
                return produce(conn, "fenced", {0: batch})[0].error_code == 0
        wait_for("the leader taking the write", written)
        stopped.proc.send_signal(signal.SIGSTOP)
        try:
            wait_for("the partition led by the other broker",
                     lambda: metadata_leaders(cluster.brokers[new].bootstrap, "fenced").get(0) == new, timeout=30)
            with RawConn(cluster.brokers[new].bootstrap) as conn:
                assert produce(conn, "fenced", {0: records.build_batch([(None, b"after")])})[0].error_code == 0
            conn = RawConn(stopped.bootstrap, timeout=30)
        finally:
            stopped.proc.send_signal(signal.SIGCONT)
        with conn:
            [answer] = produce(conn, "fenced", {0: records.build_batch([(None, b"zombie")])})
        assert answer.error_code != 0, answer
        consumer = Consumer({"bootstrap.servers": cluster.brokers[new].bootstrap, "group.id": "unused",
                             "enable.auto.commit": False})
        consumer.assign([TopicPartition("fenced", 0, 0)])
        got = []
        deadline = time.monotonic() + 20
        while len(got) < 2 and time.monotonic() < deadline:
            got += [m.value() for m in consumer.consume(10, timeout=0.5) if m.error() is None]
        time.sleep(1)
        got += [m.value() for m in consumer.consume(10, timeout=0.5) if m.error() is None]
        consumer.close()
        assert got == [b"before", b"after"]


def coordinator_of(bootstrap: str, key: str, key_type: int) -> int:
    """The node FindCoordinator (v4) through ``bootstrap`` names for a group (0) or transactional id (1); -1: none."""
    from compat_tests.test_bad_input import RawConn, req
    with RawConn(bootstrap) as conn:
        answer = conn.request("FindCoordinator", 4, req("FindCoordinator", key_type=key_type, coordinator_keys=[key]))
    [found] = answer.coordinators
    return found.node_id if found.error_code == 0 else -1


def read_committed(bootstrap: str, topic: str, partitions: int, expected: int) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader", "enable.auto.commit": False,
                         "isolation.level": "read_committed"})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got = []
    deadline = time.monotonic() + 30
    while len(got) < expected and time.monotonic() < deadline:
        for m in consumer.consume(100, timeout=0.5):
            if m.error() is None:
                got.append(m.value())
    consumer.close()
    return got


def test_coordinators_live_on_their_partitions_leader_and_move_when_its_broker_dies(tmp_path, postgres_database):
    """Three brokers: the group and transaction coordinators are where ``__consumer_offsets``' and
    ``__transaction_state``'s partitions are led.  A transactional producer commits across partitions led by the
    other brokers (its markers cross brokers: read_committed sees them) and a consumer group commits its offsets.
    Then the coordinators' brokers are killed (-9): FindCoordinator names a live broker, the transaction in flight
    completes or aborts whole, the group rebalances on the new coordinator and keeps its committed offsets."""
    with Cluster(tmp_path, postgres_database, size=3) as cluster:
        wait_for("three live brokers", lambda: brokers_table(postgres_database) == {1: True, 2: True, 3: True})
        first = cluster.brokers[1].bootstrap
        admin = AdminClient({"bootstrap.servers": first})
        admin.create_topics([NewTopic("work", 6, 3)])["work"].result(30)
        leaders = wait_for("leaders", lambda: _all_led(metadata_leaders(first, "work"), 6))
        group_node = wait_for("a group coordinator", lambda: max(coordinator_of(first, "g", 0), 0))
        txn_node = wait_for("a transaction coordinator", lambda: max(coordinator_of(first, "tx", 1), 0))
        for b in cluster.brokers.values():          # every broker names the same coordinators
            assert (coordinator_of(b.bootstrap, "g", 0), coordinator_of(b.bootstrap, "tx", 1)) == (group_node, txn_node)
        elsewhere = [p for p, leader in leaders.items() if leader != txn_node]
        assert elsewhere, leaders                   # rendezvous spreads six partitions over three brokers

        producer = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": "tx",
                             "transaction.timeout.ms": 10000})
        producer.init_transactions(30)
        producer.begin_transaction()
        for i in range(60):
            producer.produce("work", b"c%d" % i, partition=i % 6)
        producer.commit_transaction(30)
        committed = read_committed(first, "work", 6, 60)
        assert sorted(committed) == sorted(b"c%d" % i for i in range(60))   # markers written on every leader

        consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "g", "enable.auto.commit": False,
                             "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
        consumer.subscribe(["work"])
        seen = 0
        deadline = time.monotonic() + 30
        while seen < 60 and time.monotonic() < deadline:
            seen += sum(1 for m in consumer.consume(100, timeout=0.5) if m.error() is None)
        assert seen == 60
        consumer.commit(asynchronous=False)
        offsets = {tp.partition: tp.offset for tp in consumer.committed(
            [TopicPartition("work", p) for p in range(6)], timeout=10)}
        assert sum(offsets.values()) >= 60, offsets
        consumer.close()

        # A transaction in flight when the coordinators' brokers die.
        producer.begin_transaction()
        for i in range(30):
            producer.produce("work", b"f%d" % i, partition=i % 6)
        producer.flush(30)
        killed = {group_node, txn_node}
        for node in killed:
            cluster.brokers[node].kill()
        survivor = next(b.bootstrap for n, b in cluster.brokers.items() if n not in killed)
        new_group = wait_for("a live group coordinator",
                             lambda: (lambda n: n if n > 0 and n not in killed else None)(coordinator_of(survivor, "g", 0)),
                             timeout=60)
        new_txn = wait_for("a live transaction coordinator",
                           lambda: (lambda n: n if n > 0 and n not in killed else None)(coordinator_of(survivor, "tx", 1)),
                           timeout=60)
        assert new_group not in killed and new_txn not in killed
        try:
            producer.commit_transaction(60)
            outcome = "committed"
        except Exception:                           # aborted by the new coordinator (or abortable): all of it gone
            outcome = "aborted"
        after = read_committed(survivor, "work", 6, 90 if outcome == "committed" else 60)
        flight = sorted(v for v in after if v.startswith(b"f"))
        assert flight in ([], sorted(b"f%d" % i for i in range(30))), (outcome, flight)
        assert sorted(v for v in after if v.startswith(b"c")) == sorted(b"c%d" % i for i in range(60))

        consumer = Consumer({"bootstrap.servers": survivor, "group.id": "g", "enable.auto.commit": False,
                             "auto.offset.reset": "earliest"})
        consumer.subscribe(["work"])
        wait_for("an assignment from the new coordinator", lambda: consumer.poll(0.5) is not None or consumer.assignment())
        again = {tp.partition: tp.offset for tp in consumer.committed(
            [TopicPartition("work", p) for p in range(6)], timeout=10)}
        consumer.close()
        assert again == offsets                     # no committed offset lost
