"""Faults on a three-broker cluster on PostgreSQL under transactional load: kill -9 of a random broker every few
seconds, and a crash of PostgreSQL itself, while transactional producers (confluent-kafka; the Java client 4.3.0 too
under the kills) commit transactions that span every partition and the exactly-once consume-transform-produce worker
(eos_worker.py) runs.

Checked by key, as test_eos_loop.py does: every acknowledged transaction is read whole by a read_committed consumer
and only once, an aborted one not at all, one whose outcome the client could not learn either whole or not at all;
the worker's output holds every input key exactly once.  Every client carries on after the leaders and coordinators
moved.  The kills are seeded (TRIREME_CLUSTER_FAULT_SEED); `make cluster-fault-loop` runs many of them
(TRIREME_CLUSTER_FAULT_KILLS), `make test` a few.
"""
from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psycopg
import pytest
from confluent_kafka import KafkaException, Producer

from compat_tests.cluster_support import Cluster, wait_for
from compat_tests.python_clients import create_topics
from compat_tests.test_cluster import coordinator_of, metadata_leaders
from compat_tests.test_eos_loop import WORKER, _check_exactly_once, _setup, read_committed_keys

pytestmark = pytest.mark.trireme_only("starts trireme serve processes on a PostgreSQL of its own")

KILLS = int(os.environ.get("TRIREME_CLUSTER_FAULT_KILLS", "5"))
SEED = int(os.environ.get("TRIREME_CLUSTER_FAULT_SEED", "25"))
PARTITIONS = 3
EOS_RECORDS = int(os.environ.get("TRIREME_CLUSTER_FAULT_RECORDS", "20000"))
# Produce errors a client retries (Kafka's RetriableException): NOT_LEADER_OR_FOLLOWER, REQUEST_TIMED_OUT,
# NOT_ENOUGH_REPLICAS, NOT_ENOUGH_REPLICAS_AFTER_APPEND, KAFKA_STORAGE_ERROR.
RETRIABLE = {6, 7, 19, 20, 56}
TXN_SIZE = 12           # records per transaction, spread over every partition
RECONNECT = {"reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 500, "retry.backoff.ms": 50}


class TransactionalLoad(threading.Thread):
    """One transactional producer committing transaction after transaction of TXN_SIZE keyed records (key
    ``<name>-<n>-<i>``) over every partition of ``topic``, until stopped.  Each transaction ends up in
    ``committed`` (commit_transaction returned), ``aborted`` (abort_transaction returned) or ``in_doubt`` (the
    producer failed fatally first: a new one, same transactional id, fences it and carries on)."""

    def __init__(self, bootstrap: str, topic: str, name: str):
        super().__init__(daemon=True, name=name)
        self.bootstrap, self.topic, self.name_ = bootstrap, topic, name
        self.committed: list[int] = []
        self.aborted: list[int] = []
        self.in_doubt: list[int] = []
        self.errors: list[str] = []
        self.stopping = threading.Event()

    def keys(self, n: int) -> list[bytes]:
        return [f"{self.name_}-{n}-{i}".encode() for i in range(TXN_SIZE)]

    def _producer(self) -> Producer:
        return Producer({"bootstrap.servers": self.bootstrap, "transactional.id": self.name_,
                         "transaction.timeout.ms": 10000, "linger.ms": 5, **RECONNECT})

    def run(self) -> None:
        producer, n = None, 0
        while not self.stopping.is_set():
            if producer is None:
                producer = self._producer()
                try:
                    producer.init_transactions(30)
                except KafkaException as e:
                    self.errors.append(f"init: {e}")
                    producer = None
                    continue
            n += 1
            try:
                producer.begin_transaction()
                for i, key in enumerate(self.keys(n)):
                    producer.produce(self.topic, key=key, value=b"%d" % n, partition=i % PARTITIONS)
                while True:
                    try:
                        producer.commit_transaction(30)
                        break
                    except KafkaException as e:
                        if not e.args[0].retriable():
                            raise
                        self.errors.append(f"commit {n} (retried): {e}")
                self.committed.append(n)
            except KafkaException as e:
                self.errors.append(f"transaction {n}: {e}")
                if e.args[0].txn_requires_abort():
                    try:
                        producer.abort_transaction(30)
                        self.aborted.append(n)
                        continue
                    except KafkaException as abort_error:
                        self.errors.append(f"abort {n}: {abort_error}")
                self.in_doubt.append(n)
                producer = None

    def stop(self) -> None:
        self.stopping.set()
        self.join(120)
        assert not self.is_alive(), f"{self.name_} did not stop"


class JavaTransactionalLoad(TransactionalLoad):
    """The same load from the Java client 4.3.0 (compat_tests' harness): begin, send, commit.  A failed step is
    followed by abortTransaction; where that fails too the harness is replaced (the new producer's
    initTransactions fences the old one) and the transaction is in doubt."""

    VERSION = "4.3.0"
    CONFIG = {"transaction.timeout.ms": 10000, "linger.ms": 5, "reconnect.backoff.max.ms": 500,
              "request.timeout.ms": 10000, "delivery.timeout.ms": 30000, "max.block.ms": 30000}

    def run(self) -> None:
        from compat_tests import clients
        harness, n = None, 0
        while not self.stopping.is_set():
            try:
                if harness is None:
                    harness = clients.java_harness(self.VERSION, self.bootstrap)
                    harness.ok("init_producer", handle="p", config={"transactional.id": self.name_, **self.CONFIG},
                               timeout=90)
                n += 1
                harness.ok("begin_txn", handle="p")
                harness.ok("send", topic=self.topic, handle="p",
                           records=[clients.record(b"%d" % n, key=key, partition=i % PARTITIONS)
                                    for i, key in enumerate(self.keys(n))])
                harness.ok("commit_txn", handle="p", timeout=90)
                self.committed.append(n)
            except (clients.HarnessError, AssertionError, OSError, ValueError) as e:
                self.errors.append(f"transaction {n}: {str(e)[:300]}")
                if harness is not None and harness.proc.poll() is None and \
                        harness.call("abort_txn", handle="p", timeout=90).get("ok"):
                    self.aborted.append(n)
                    continue
                if n:
                    self.in_doubt.append(n)
                if harness is not None:
                    harness.kill()
                    harness.close()
                harness = None
        if harness is not None:
            harness.close()


def check_transactions(bootstrap: str, topic: str, loads: list[TransactionalLoad], maybe: frozenset = frozenset()) -> int:
    """No acknowledged transaction lost, none duplicated, none torn (records with a key in ``maybe``: at most once);
    → how many were committed."""
    counts = read_committed_keys(bootstrap, topic)
    duplicated = {k: c for k, c in counts.items() if c != 1}
    assert not duplicated, f"{len(duplicated)} keys read more than once: {list(duplicated.items())[:5]}"
    expected = set()
    for load in loads:
        for n in load.committed:
            missing = [k for k in load.keys(n) if k not in counts]
            assert not missing, f"acknowledged transaction {load.name_}-{n} lost {len(missing)} of {TXN_SIZE} records"
            expected.update(load.keys(n))
        for n in load.aborted:
            seen = [k for k in load.keys(n) if k in counts]
            assert not seen, f"aborted transaction {load.name_}-{n} visible: {seen}"
        for n in load.in_doubt:
            seen = [k for k in load.keys(n) if k in counts]
            assert len(seen) in (0, TXN_SIZE), \
                f"transaction {load.name_}-{n} torn: {len(seen)} of {TXN_SIZE} read; the producer's errors: {load.errors}"
            expected.update(seen)
    unexplained = set(counts) - expected - maybe
    assert not unexplained, f"{len(unexplained)} records of no transaction: {sorted(unexplained)[:5]}"
    return sum(len(load.committed) for load in loads)


class EosWorker:
    """eos_worker.py over the cluster's bootstrap list, started again whenever it exits short of done (as a
    supervisor would: after an error, or its watchdog)."""

    def __init__(self, bootstrap: str, source: str, sink: str, group: str, log: Path):
        self.args = [sys.executable, str(WORKER), bootstrap, source, sink, group, "eos-" + group, str(PARTITIONS)]
        self.log = open(log, "ab")
        self.restarts = 0
        self.started = time.monotonic()
        self.done_after: float | None = None       # seconds from its first start to its "done"
        self.proc = self._start()

    def _start(self) -> subprocess.Popen:
        return subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=self.log, text=True)

    def tend(self) -> bool:
        """Start it again if it exited with an error; → done."""
        code = self.proc.poll()
        if code == 0:
            if self.done_after is None:
                self.done_after = time.monotonic() - self.started
            return True
        if code is not None:
            self.restarts += 1
            self.proc = self._start()
        return False

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        self.log.close()


def start_round(bootstrap: str, tmp_path: Path) -> tuple[dict[str, str], EosWorker]:
    """Input and output topics for the worker, EOS_RECORDS input records (test_eos_loop's), and the worker on them."""
    source, sink, group, _ = _setup(bootstrap, "f", EOS_RECORDS)
    topics = {"in": source, "out": sink, "group": group}
    return topics, EosWorker(bootstrap, source, sink, group, tmp_path / f"worker-{group}.log")


def start_load(cluster: Cluster, java: bool = False) -> tuple[str, list[TransactionalLoad]]:
    """A topic and two transactional producers (confluent-kafka; and a third, Java, with ``java``) committing to it;
    → (topic, loads)."""
    bootstrap = cluster.bootstrap
    wait_for("three brokers listed", lambda: len(metadata_brokers(bootstrap)) == 3, timeout=30)
    tag = uuid.uuid4().hex[:8]
    topic = f"txn-{tag}"
    create_topics(bootstrap, [topic], PARTITIONS)
    loads = [TransactionalLoad(bootstrap, topic, f"tx{i}-{tag}") for i in range(2)]
    if java:
        loads.append(JavaTransactionalLoad(bootstrap, topic, f"java-{tag}"))
    for load in loads:
        load.start()
    return topic, loads


def metadata_brokers(bootstrap: str) -> list[int]:
    from confluent_kafka.admin import AdminClient
    return sorted(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).brokers)


def carry_on(loads: list[TransactionalLoad], workers: list[EosWorker]) -> None:
    """Every producer commits more transactions, and every worker gets to the end of its input."""
    marks = [len(load.committed) for load in loads]
    deadline = time.monotonic() + 180
    while not all([w.tend() for w in workers]):
        assert time.monotonic() < deadline, f"a worker did not finish ({[w.restarts for w in workers]} restarts)"
        time.sleep(0.5)
    for load, mark in zip(loads, marks):
        try:
            wait_for(f"{load.name_} committing again", lambda: len(load.committed) >= mark + 3, timeout=90)
        except AssertionError as e:
            raise AssertionError(f"{e}; its last errors: {load.errors[-5:]}") from None


def summary(loads: list[TransactionalLoad], rounds: list[tuple[dict, EosWorker]]) -> str:
    committed = sum(len(x.committed) for x in loads)
    java = sum(len(x.committed) for x in loads if isinstance(x, JavaTransactionalLoad))
    return (f"{committed} transactions ({committed * TXN_SIZE} records) committed ({java} by the Java client), "
            f"{sum(len(x.aborted) for x in loads)} aborted, {sum(len(x.in_doubt) for x in loads)} in doubt; "
            f"{len(rounds) * EOS_RECORDS} records through the exactly-once worker in {len(rounds)} rounds "
            f"({sum(w.restarts for _, w in rounds)} worker restarts); producer errors: "
            f"{sum(len(x.errors) for x in loads)} {[e for x in loads for e in x.errors][:8]}")


def test_random_brokers_killed_under_transactions_and_the_exactly_once_loop(tmp_path, postgres_database):
    """KILLS times, a seeded random broker is killed (-9), stays down 0-3.5 s (longer than its 2 s session now and
    then: its partitions and coordinators move to the others) and is started again on its data directory.  The
    worker runs round after round (new topics each time its input is done) until the last kill; the Java client
    4.3.0 commits transactions beside the two confluent-kafka producers."""
    from compat_tests import clients
    clients.require_java(JavaTransactionalLoad.VERSION)
    rng = random.Random(SEED)
    with Cluster(tmp_path, postgres_database, size=3) as cluster:
        txn_topic, loads = start_load(cluster, java=True)
        rounds = [start_round(cluster.bootstrap, tmp_path)]
        epochs = leader_epochs(postgres_database)
        started = time.monotonic()
        try:
            for _ in range(KILLS):
                time.sleep(rng.uniform(1.0, 3.0))
                if rounds[-1][1].tend():
                    rounds.append(start_round(cluster.bootstrap, tmp_path))
                victim = cluster.brokers[rng.choice(sorted(cluster.brokers))]
                victim.kill9(between=lambda: time.sleep(rng.uniform(0, 3.5)))
            carry_on(loads, [w for _, w in rounds])
        finally:
            for load in loads:
                load.stop()
            for _, w in rounds:
                w.close()
        elapsed = time.monotonic() - started
        moves = leader_epochs(postgres_database) - epochs
        check_transactions(cluster.bootstrap, txn_topic, loads)
        for topics, _ in rounds:
            _check_exactly_once(cluster.bootstrap, topics["in"], topics["out"], topics["group"], EOS_RECORDS)
        assert moves > 0, "no partition changed leader: the kills tested nothing"
        print(f"\ncluster faults: {KILLS} kills (seed {SEED}) in {elapsed:.0f}s, {moves} leadership changes; "
              + summary(loads, rounds))


def leader_epochs(dsn: str) -> int:
    """The sum of every partition's leader epoch: it grows with each leadership change."""
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT coalesce(sum(leader_epoch), 0) FROM trireme_partition").fetchone()[0]


@pytest.fixture
def own_postgres(own_postgres):
    """The test's own PostgreSQL (conftest.py; it is crashed), with a database ``faults``."""
    own_postgres.create_database("faults")
    return own_postgres


def test_every_broker_outlives_a_postgresql_restart(tmp_path, own_postgres):
    """Found by the crash below: a broker that follows __cluster_metadata (not the controller) read its rows on a
    connection the restart had broken and exited on the error.  Idle brokers, PostgreSQL restarted (immediate): a
    few polls later all three still run and each answers Metadata with every broker."""
    with Cluster(tmp_path, own_postgres.dsn_for("faults"), size=3) as cluster:
        wait_for("three brokers listed", lambda: len(metadata_brokers(cluster.bootstrap)) == 3, timeout=30)
        own_postgres.restart()
        time.sleep(3)           # fifteen polls (trireme.cluster.metadata.poll.ms=200)
        assert [n for n, b in cluster.brokers.items() if b.proc.poll() is not None] == []
        for b in cluster.brokers.values():
            wait_for(f"three brokers listed by {b.bootstrap}", lambda: len(metadata_brokers(b.bootstrap)) == 3,
                     timeout=30)


def test_postgresql_crash_under_transactions_and_the_exactly_once_loop(tmp_path, own_postgres):
    """PostgreSQL stops at once (immediate: a crash) in the middle of the load and comes back 3 s later on the same
    data and port.  Meanwhile a produce is answered with a retriable error; afterwards every broker names a leader
    for every partition and the coordinators again, the producers commit again and the worker finishes, without a
    word from the test to the brokers; nothing acknowledged is lost."""
    from compat_tests.test_bad_input import RawConn, produce
    from trireme.wire import records
    pg = own_postgres
    with Cluster(tmp_path, pg.dsn_for("faults"), size=3) as cluster:
        txn_topic, loads = start_load(cluster)
        topics, worker = start_round(cluster.bootstrap, tmp_path)
        try:
            time.sleep(3)
            leaders = metadata_leaders(cluster.bootstrap, txn_topic)
            pg.stop("immediate")
            time.sleep(1)
            leader = cluster.brokers[leaders[0]]
            with RawConn(leader.bootstrap, timeout=30) as conn:
                [during] = produce(conn, txn_topic, {0: records.build_batch([(b"probe", b"during")])})
            time.sleep(2)
            pg.start()
            for b in cluster.brokers.values():
                wait_for(f"every partition led, through {b.bootstrap}",
                         lambda: all(n >= 0 for n in metadata_leaders(b.bootstrap, txn_topic).values()),
                         timeout=60)
                for key, key_type in [(topics["group"], 0), (loads[0].name_, 1)]:
                    wait_for(f"a coordinator for {key}, through {b.bootstrap}",
                             lambda: coordinator_of(b.bootstrap, key, key_type) > 0, timeout=60)
            carry_on(loads, [worker])
        finally:
            for load in loads:
                load.stop()
            worker.close()
        print(f"\nduring the outage: {during}")
        assert during.error_code in RETRIABLE, during
        # An error answer does not say the record was not written (its commit's outcome is unknown): at most once.
        check_transactions(cluster.bootstrap, txn_topic, loads, maybe=frozenset([b"probe"]))
        _check_exactly_once(cluster.bootstrap, topics["in"], topics["out"], topics["group"], EOS_RECORDS)
        print(f"\nPostgreSQL crash: worker done after {worker.done_after:.0f}s; " + summary(loads, [(topics, worker)]))


def test_an_acknowledged_add_partitions_survives_a_kill_on_postgresql(tmp_path, own_postgres):
    """Found by the kill loop (a transaction torn: committed on two partitions, not on the third): AddPartitionsToTxn
    was answered once its record was written to the broker's segment cache, which on the PostgreSQL engine survives
    nothing; a kill or a move lost the acknowledged add, the next coordinator re-sent the previous transaction's
    COMMIT markers, and they committed the new transaction's records.  With PostgreSQL down nothing can be made
    durable: an add answered then and the broker killed (-9), the add must be there once both are back."""
    from compat_tests.test_bad_input import RawConn, create_topic
    from compat_tests.test_bad_transactions import add_partitions, init
    from compat_tests.test_crash_transactions import describe_transactions, kill_now
    with Cluster(tmp_path, own_postgres.dsn_for("faults"), size=1) as cluster:
        broker = cluster.brokers[1]
        with RawConn(broker.bootstrap) as conn:
            create_topic(conn, "adds", partitions=1)
            _, pid, epoch = wait_for("a producer id", lambda: (lambda r: r if r[0] == 0 else None)(init(conn, "t")))
        own_postgres.stop("immediate")
        try:
            with RawConn(broker.bootstrap, timeout=5) as conn:
                answer = add_partitions(conn, "t", pid, epoch, "adds", [0])[("adds", 0)]
        except OSError:             # not answered while the database is away
            answer = None
        kill_now(broker)
        own_postgres.start()
        broker.kill9()
        def described():
            with RawConn(broker.bootstrap) as conn:
                found = describe_transactions(conn, ["t"])["t"]
            return found if found[0] == 0 else None
        _, state, partitions = wait_for("the transaction described", described, timeout=30)
        if answer == 0:
            assert state == "Ongoing" and ("adds", 0) in partitions, (state, partitions)
