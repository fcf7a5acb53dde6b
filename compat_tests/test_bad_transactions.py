"""Bad transactional input over the wire: each call gets Kafka's error code and nothing is stored.

Raw requests (our codec over a socket, helpers from test_bad_input.py) against a real broker:
transactional calls with wrong ids, epochs and states; markers with stale producer or coordinator
epochs; transactional batches for partitions never added; EndTxn while the previous one completes;
KIP-939 2PC refused while disabled (InitProducerId v6, served with unstable.api.versions.enable).  After each, the partition's log is checked unchanged.
"""
from __future__ import annotations

import time

import pytest

from compat_tests.clients import wait_until
from compat_tests.test_bad_input import RawConn, batch, create_topic, list_offset, produce, req, unique
from trireme.wire import error_codes as E
from trireme.wire.codec import message

TIMEOUT = 60000
SLOW_MARKERS = {"trireme.debug.transaction.marker.delay.ms": 1500}
# InitProducerId v6 (KIP-939) is an unstable version in Kafka's definition: served only with this, as on Kafka.
UNSTABLE_VERSIONS = {"unstable.api.versions.enable": True}


def init(conn: RawConn, txn_id: str, version: int = 4, timeout_ms: int = TIMEOUT, **fields):
    r = conn.request("InitProducerId", version, req("InitProducerId", transactional_id=txn_id,
                                                    transaction_timeout_ms=timeout_ms, producer_id=-1,
                                                    producer_epoch=-1, **fields))
    return r.error_code, r.producer_id, r.producer_epoch


def add_partitions(conn: RawConn, txn_id: str, pid: int, epoch: int, topic: str, partitions, version: int = 3):
    cls = message("AddPartitionsToTxnRequest").cls
    r = conn.request("AddPartitionsToTxn", version, cls(
        v3_and_below_transactional_id=txn_id, v3_and_below_producer_id=pid, v3_and_below_producer_epoch=epoch,
        v3_and_below_topics=[cls.AddPartitionsToTxnTopic(name=topic, partitions=list(partitions))]))
    return {(t.name, p.partition_index): p.partition_error_code
            for t in r.results_by_topic_v3_and_below for p in t.results_by_partition}


def end_txn(conn: RawConn, txn_id: str, pid: int, epoch: int, commit: bool, version: int = 3) -> int:
    return conn.request("EndTxn", version, req("EndTxn", transactional_id=txn_id, producer_id=pid,
                                               producer_epoch=epoch, committed=commit)).error_code


def txn_batch(pid: int, epoch: int, seq: int = 0, values=(b"x",)) -> bytes:
    return batch(list(values), producer_id=pid, producer_epoch=epoch, base_sequence=seq, transactional=True)


def produce_txn(conn: RawConn, txn_id: str, topic: str, partition: int, data: bytes) -> int:
    cls = message("ProduceRequest").cls
    tcls = cls.TopicProduceData
    r = conn.request("Produce", 9, cls(transactional_id=txn_id, acks=-1, timeout_ms=10000, topic_data=[
        tcls(name=topic, partition_data=[tcls.PartitionProduceData(index=partition, records=data)])]))
    return r.responses[0].partition_responses[0].error_code


def markers(conn: RawConn, pid: int, epoch: int, topic: str, partition: int, coordinator_epoch: int,
            commit: bool = False, version: int = 1, transaction_version: int = 0) -> int:
    cls = message("WriteTxnMarkersRequest").cls
    m = cls.WritableTxnMarker
    r = conn.request("WriteTxnMarkers", version, cls(markers=[m(
        producer_id=pid, producer_epoch=epoch, transaction_result=commit, coordinator_epoch=coordinator_epoch,
        transaction_version=transaction_version,
        topics=[m.WritableTxnMarkerTopic(name=topic, partition_indexes=[partition])])]))
    return r.markers[0].topics[0].partitions[0].error_code


def open_transaction(conn: RawConn, topic: str) -> tuple[str, int, int]:
    """A new transactional id with a transaction open on partition 0 of ``topic`` holding one batch → (id, pid, epoch)."""
    tid = unique("tx")
    _, pid, epoch = init(conn, tid)
    assert add_partitions(conn, tid, pid, epoch, topic, [0]) == {(topic, 0): 0}
    assert produce_txn(conn, tid, topic, 0, txn_batch(pid, epoch)) == 0
    return tid, pid, epoch


@pytest.fixture
def conn(module_server):
    with RawConn(module_server.bootstrap) as c:
        yield c


def test_unknown_or_mismatched_producer(conn):
    topic = unique("badtx")
    create_topic(conn, topic)
    assert add_partitions(conn, unique("never-inited"), 123, 0, topic, [0]) == \
        {(topic, 0): E.INVALID_PRODUCER_ID_MAPPING.code}
    tid = unique("tx")
    err, pid, epoch = init(conn, tid)
    assert err == 0 and epoch == 0
    assert add_partitions(conn, tid, pid + 1, epoch, topic, [0]) == {(topic, 0): E.INVALID_PRODUCER_ID_MAPPING.code}
    assert add_partitions(conn, tid, pid, epoch + 1, topic, [0]) == {(topic, 0): E.PRODUCER_FENCED.code}
    # AddPartitionsToTxn below v2 does not know PRODUCER_FENCED: INVALID_PRODUCER_EPOCH.
    assert add_partitions(conn, tid, pid, epoch + 1, topic, [0], version=1) == \
        {(topic, 0): E.INVALID_PRODUCER_EPOCH.code}
    assert end_txn(conn, tid, pid + 1, epoch, True) == E.INVALID_PRODUCER_ID_MAPPING.code
    assert end_txn(conn, tid, pid, epoch + 1, True) == E.PRODUCER_FENCED.code
    assert end_txn(conn, tid, pid, epoch + 1, True, version=1) == E.INVALID_PRODUCER_EPOCH.code
    assert end_txn(conn, tid, pid, epoch, True) == E.INVALID_TXN_STATE.code      # nothing to end (Empty)
    assert list_offset(conn, topic, 0) == 0


def test_unknown_partition_is_not_attempted(conn):
    topic = unique("badtx")
    create_topic(conn, topic, partitions=1)
    tid = unique("tx")
    _, pid, epoch = init(conn, tid)
    assert add_partitions(conn, tid, pid, epoch, topic, [0, 7]) == {
        (topic, 0): E.OPERATION_NOT_ATTEMPTED.code, (topic, 7): E.UNKNOWN_TOPIC_OR_PARTITION.code}
    assert end_txn(conn, tid, pid, epoch, True) == E.INVALID_TXN_STATE.code      # still Empty


def test_bad_timeouts(conn):
    assert init(conn, unique("tx"), timeout_ms=0)[0] == E.INVALID_TRANSACTION_TIMEOUT.code
    assert init(conn, unique("tx"), timeout_ms=10**9)[0] == E.INVALID_TRANSACTION_TIMEOUT.code


@pytest.mark.server_config(UNSTABLE_VERSIONS)
def test_2pc_while_disabled(server):
    with RawConn(server.bootstrap) as conn:
        assert init(conn, unique("tx"), version=6, enable2_pc=True)[0] == \
            E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED.code


def test_transactional_batch_for_a_partition_never_added(conn):
    topic = unique("badtx")
    create_topic(conn, topic, partitions=2)
    tid = unique("tx")
    _, pid, epoch = init(conn, tid)
    assert add_partitions(conn, tid, pid, epoch, topic, [0]) == {(topic, 0): 0}
    assert produce_txn(conn, tid, topic, 1, txn_batch(pid, epoch)) == E.INVALID_TXN_STATE.code
    assert list_offset(conn, topic, 1) == 0
    assert produce_txn(conn, tid, topic, 0, txn_batch(pid, epoch - 1 if epoch else 5)) in (
        E.INVALID_PRODUCER_EPOCH.code,)
    assert list_offset(conn, topic, 0) == 0
    # Without the request's transactional id a transactional batch is refused too, as Kafka's authorization
    # step refuses it: before the records are looked at.
    assert produce(conn, topic, {0: txn_batch(pid, epoch)})[0].error_code == \
        E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED.code
    assert produce_txn(conn, tid, topic, 0, txn_batch(pid, epoch)) == 0
    assert list_offset(conn, topic, 0) == 1
    assert end_txn(conn, tid, pid, epoch, False) == 0


def test_stale_markers_are_refused_and_store_nothing(conn):
    topic = unique("badtx")
    create_topic(conn, topic)
    tid, pid, epoch = open_transaction(conn, topic)
    assert end_txn(conn, tid, pid, epoch, True) == 0
    wait_until(lambda: list_offset(conn, topic, 0) == 2, what="the commit marker")
    # A new InitProducerId bumps the epoch; the next transaction's marker carries coordinator epoch 0.
    _, pid2, epoch2 = init(conn, tid)
    assert (pid2, epoch2) == (pid, epoch + 1)
    assert markers(conn, pid, epoch, topic, 0, coordinator_epoch=0) == 0       # same epoch: written (no-op)
    end = list_offset(conn, topic, 0)
    assert add_partitions(conn, tid, pid, epoch2, topic, [0]) == {(topic, 0): 0}
    assert produce_txn(conn, tid, topic, 0, txn_batch(pid, epoch2)) == 0
    assert markers(conn, pid, epoch2 - 1, topic, 0, coordinator_epoch=0) == E.INVALID_PRODUCER_EPOCH.code
    assert markers(conn, pid, epoch2, topic, 0, coordinator_epoch=-1) == E.TRANSACTION_COORDINATOR_FENCED.code
    assert list_offset(conn, topic, 0) == end + 1                              # only the data batch since
    # Transaction version 2 markers carry the bumped epoch: one equal to the producer's is stale.
    assert markers(conn, pid, epoch2, topic, 0, coordinator_epoch=0, version=2, transaction_version=2) == \
        E.INVALID_PRODUCER_EPOCH.code
    assert list_offset(conn, topic, 0) == end + 1
    assert end_txn(conn, tid, pid, epoch2, False) == 0


@pytest.mark.server_config(SLOW_MARKERS)
def test_end_txn_while_the_previous_one_completes(server):
    with RawConn(server.bootstrap) as conn:
        topic = unique("badtx")
        create_topic(conn, topic)
        tid, pid, epoch = open_transaction(conn, topic)
        assert end_txn(conn, tid, pid, epoch, True) == 0            # prepared; markers held 1.5 s
        assert list_offset(conn, topic, 0) == 1                    # no marker yet
        # Kafka answers CONCURRENT_TRANSACTIONS while the markers go out and the client retries; the broker
        # waits for them itself, then answers what the retry gets.
        assert end_txn(conn, tid, pid, epoch, False) == E.INVALID_TXN_STATE.code
        assert list_offset(conn, topic, 0) == 2                    # the commit's marker, no second one ever
        assert end_txn(conn, tid, pid, epoch, True) == 0
        assert list_offset(conn, topic, 0) == 2


@pytest.mark.server_config({"trireme.debug.transaction.marker.delay.ms": 6000})
def test_classic_commit_while_the_previous_abort_completes_is_concurrent(server):
    """Kafka checks a transition in flight (the previous transaction's markers) before the state: a commit that
    arrives before the next transaction's AddPartitionsToTxn gets CONCURRENT_TRANSACTIONS (retriable), not
    INVALID_TXN_STATE (fatal to the client), and the transaction it then opens commits."""
    with RawConn(server.bootstrap) as conn:
        topic = unique("badtx")
        create_topic(conn, topic)
        tid, pid, epoch = open_transaction(conn, topic)
        assert end_txn(conn, tid, pid, epoch, False) == 0           # prepared; markers held 6 s
        # Longer than the broker waits for a transition in flight (5 s): the client is told to retry.
        assert end_txn(conn, tid, pid, epoch, True) == E.CONCURRENT_TRANSACTIONS.code
        assert add_partitions(conn, tid, pid, epoch, topic, [0]) == {(topic, 0): 0}     # waits for the markers
        assert list_offset(conn, topic, 0) == 2
        assert produce_txn(conn, tid, topic, 0, txn_batch(pid, epoch, seq=1)) == 0
        assert end_txn(conn, tid, pid, epoch, True) == 0
        wait_until(lambda: lso(conn, topic, 0) == 4, timeout=20, what="the commit marker")


def lso(conn: RawConn, topic: str, partition: int) -> int:
    """ListOffsets latest at read_committed: the last stable offset."""
    cls = message("ListOffsetsRequest").cls
    tcls = cls.ListOffsetsTopic
    r = conn.request("ListOffsets", 7, cls(replica_id=-1, isolation_level=1, topics=[tcls(name=topic, partitions=[
        tcls.ListOffsetsPartition(partition_index=partition, timestamp=-1)])]))
    return r.topics[0].partitions[0].offset


@pytest.mark.server_config({"transaction.two.phase.commit.enable": True,
                            "transaction.abort.timed.out.transaction.cleanup.interval.ms": 100,
                            **UNSTABLE_VERSIONS})
def test_two_phase_commit_prepared_transaction_survives_a_producer_restart(server):
    """KIP-939 at the protocol level (the Java 4.3 client's public API does not expose it): a 2PC transaction
    never times out; InitProducerId v6 with KeepPreparedTxn keeps it open for the external coordinator, reports
    it in OngoingTxnProducerId/Epoch and fences the instance before; EndTxn with the new epoch commits it."""
    with RawConn(server.bootstrap) as conn:
        topic = unique("twopc")
        create_topic(conn, topic)
        tid = unique("tx")
        err, pid, epoch = init(conn, tid, version=6, enable2_pc=True)
        assert err == 0
        assert add_partitions(conn, tid, pid, epoch, topic, [0]) == {(topic, 0): 0}
        assert produce_txn(conn, tid, topic, 0, txn_batch(pid, epoch, values=(b"a", b"b"))) == 0
        time.sleep(0.5)                                       # five cleanup rounds: a 2PC transaction stays
        assert lso(conn, topic, 0) == 0
        r = conn.request("InitProducerId", 6, req("InitProducerId", transactional_id=tid, transaction_timeout_ms=TIMEOUT,
                                                  producer_id=-1, producer_epoch=-1, enable2_pc=True,
                                                  keep_prepared_txn=True))
        assert (r.error_code, r.producer_id, r.producer_epoch) == (0, pid, epoch + 1)
        assert (r.ongoing_txn_producer_id, r.ongoing_txn_producer_epoch) == (pid, epoch)
        assert lso(conn, topic, 0) == 0                       # still prepared, not aborted
        assert end_txn(conn, tid, pid, epoch, True) == E.PRODUCER_FENCED.code
        assert end_txn(conn, tid, pid, epoch + 1, True) == 0  # the external coordinator's decision
        wait_until(lambda: lso(conn, topic, 0) == 3, what="the commit marker")
    server.restart()
    with RawConn(server.bootstrap) as conn:
        assert lso(conn, topic, 0) == 3
        assert init(conn, tid, version=6, enable2_pc=True)[1:] == (pid, epoch + 2)
