"""WriteTxnMarkers from a client, checked against the transaction coordinator: raw requests against a real broker.

A client's marker for a producer id the coordinator has a transaction for must be the marker the
coordinator itself would write (its prepared result, its producer epoch and coordinator epoch, a
partition the transaction added); markers into ``__consumer_offsets`` / ``__transaction_state``
are the coordinator's alone (CLUSTER_AUTHORIZATION_FAILED); a marker for a producer id the
coordinator does not know still aborts a hanging transaction (KIP-664).  Each refusal stores
nothing, and what read_committed consumers see afterwards is what the producer decided.  Markers
whose producer id, producer epoch or coordinator epoch no producer can have (or was given) are
refused before anything is appended.  Client AddPartitionsToTxn (v0-3) naming an internal topic is refused as
Kafka refuses it (TOPIC_AUTHORIZATION_FAILED).
"""
from __future__ import annotations

import shutil

import pytest

from compat_tests.clients import wait_until
from compat_tests.test_bad_input import LogWatch, RawConn, create_topic, list_offset, req, unique
from compat_tests.test_bad_transactions import (SLOW_MARKERS, add_partitions, end_txn, init, lso, markers,
                                                produce_txn, txn_batch)
from trireme.wire import error_codes as E
from trireme.wire import records
from trireme.wire.codec import message

OFFSETS = "__consumer_offsets"
TXN_STATE = "__transaction_state"
FIVE = [b"v%d" % i for i in range(5)]


@pytest.fixture
def conn(module_server):
    with RawConn(module_server.bootstrap) as c:
        yield c


def committed_values(conn: RawConn, topic: str, partition: int) -> list[bytes]:
    """The values a read_committed consumer gets from a partition: a Fetch at read_committed (up to the last stable
    offset), without the batches of the aborted transactions it lists and without control batches."""
    cls = message("FetchRequest").cls
    tcls = cls.FetchTopic
    r = conn.request("Fetch", 11, cls(
        replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, isolation_level=1, session_id=0,
        session_epoch=-1, topics=[tcls(topic=topic, partitions=[tcls.FetchPartition(
            partition=partition, fetch_offset=0, log_start_offset=-1, partition_max_bytes=1 << 20)])]))
    part = r.responses[0].partitions[0]
    assert part.error_code == 0, part
    pending = sorted((a.first_offset, a.producer_id) for a in part.aborted_transactions or [])
    data = bytes(part.records or b"")
    aborting: set[int] = set()
    out = []
    for pos, header in records.iter_batch_headers(data):
        while pending and pending[0][0] <= header.last_offset:
            aborting.add(pending.pop(0)[1])
        if header.is_control:
            (control,) = records.decode_records(data, pos)
            if control.key[2:4] == b"\x00\x00":            # ABORT: that producer's aborted range ends here
                aborting.discard(header.producer_id)
            continue
        if header.is_transactional and header.producer_id in aborting:
            continue
        out += [rec.value for rec in records.decode_records(data, pos)]
    return out


def open_on(conn: RawConn, topic: str, partitions, values=FIVE) -> tuple[str, int, int]:
    """A new transactional id with a transaction open on ``partitions`` of ``topic``, ``values`` in each."""
    tid = unique("tx")
    err, pid, epoch = init(conn, tid)
    assert err == 0
    assert add_partitions(conn, tid, pid, epoch, topic, partitions) == {(topic, p): 0 for p in partitions}
    for p in partitions:
        assert produce_txn(conn, tid, topic, p, txn_batch(pid, epoch, values=values)) == 0
    return tid, pid, epoch


def test_rogue_commit_on_one_partition_of_an_aborted_transaction(conn):
    """Issue 20: a COMMIT marker on one partition, then the producer aborts: the aborted records were visible on
    that partition and not on the other."""
    topic = unique("rogue")
    create_topic(conn, topic, partitions=2)
    tid, pid, epoch = open_on(conn, topic, [0, 1])
    assert markers(conn, pid, epoch, topic, 0, coordinator_epoch=0, commit=True) == E.INVALID_TXN_STATE.code
    assert list_offset(conn, topic, 0) == 5                          # nothing appended
    assert end_txn(conn, tid, pid, epoch, False) == 0
    wait_until(lambda: [lso(conn, topic, p) for p in (0, 1)] == [6, 6], what="the abort markers")
    assert [committed_values(conn, topic, p) for p in (0, 1)] == [[], []]


def test_rogue_commit_into_consumer_offsets(conn):
    """Issue 20: a COMMIT marker into __consumer_offsets made an aborted transactional offset commit visible."""
    topic, group = unique("rogue"), unique("group")
    create_topic(conn, topic)
    tid, pid, epoch = open_on(conn, topic, [0])
    assert conn.request("AddOffsetsToTxn", 3, req("AddOffsetsToTxn", transactional_id=tid, producer_id=pid,
                                                  producer_epoch=epoch, group_id=group)).error_code == 0
    cls = message("TxnOffsetCommitRequest").cls
    tcls = cls.TxnOffsetCommitRequestTopic
    r = conn.request("TxnOffsetCommit", 3, cls(
        transactional_id=tid, group_id=group, producer_id=pid, producer_epoch=epoch, generation_id=-1,
        member_id="", group_instance_id=None, topics=[tcls(name=topic, partitions=[
            tcls.TxnOffsetCommitRequestPartition(partition_index=0, committed_offset=42, committed_leader_epoch=-1,
                                                 committed_metadata="")])]))
    assert r.topics[0].partitions[0].error_code == 0
    offsets_end = list_offset(conn, OFFSETS, 0)
    assert markers(conn, pid, epoch, OFFSETS, 0, coordinator_epoch=0, commit=True) == \
        E.CLUSTER_AUTHORIZATION_FAILED.code
    assert list_offset(conn, OFFSETS, 0) == offsets_end
    assert end_txn(conn, tid, pid, epoch, False) == 0

    def committed():
        r = conn.request("OffsetFetch", 7, req("OffsetFetch", group_id=group, require_stable=True, topics=[
            message("OffsetFetchRequest").cls.OffsetFetchRequestTopic(name=topic, partition_indexes=[0])]))
        p = r.topics[0].partitions[0]
        return None if p.error_code else (p.committed_offset,)
    assert wait_until(committed, what="the offsets to be stable") == (-1,)
    # Not even for a producer id nobody knows, and not into the transaction log.
    for internal in (OFFSETS, TXN_STATE):
        assert markers(conn, pid + 10**6, 0, internal, 0, coordinator_epoch=0) == E.CLUSTER_AUTHORIZATION_FAILED.code


def test_rogue_abort_at_the_last_epoch_before_a_commit(conn):
    """Issue 20: an ABORT marker with epoch 32767 made a commit that returned OK invisible (and its own markers
    were then refused for ever)."""
    topic = unique("rogue")
    create_topic(conn, topic)
    tid, pid, epoch = open_on(conn, topic, [0])
    assert markers(conn, pid, 32767, topic, 0, coordinator_epoch=0) == E.INVALID_TXN_STATE.code
    assert list_offset(conn, topic, 0) == 5
    assert end_txn(conn, tid, pid, epoch, True) == 0
    wait_until(lambda: lso(conn, topic, 0) == 6, what="the commit marker")
    assert committed_values(conn, topic, 0) == FIVE
    # The coordinator records the transaction complete (its COMPLETE record) once the answers to its markers are
    # back, a moment after the partition's last stable offset moved: until then the transaction is PrepareCommit,
    # and a marker for one of its partitions INVALID_TXN_STATE (CI met that moment once).
    wait_until(lambda: describe_state(conn, tid) == "CompleteCommit",
               what="the coordinator to complete the transaction")
    # With the transaction complete, a marker at an epoch the coordinator never gave the producer is refused too
    # (it would fence the producer on this partition), and one above the coordinator's epoch (it would fence the
    # coordinator's next markers here).
    assert markers(conn, pid, 32767, topic, 0, coordinator_epoch=0) == E.INVALID_PRODUCER_EPOCH.code
    assert markers(conn, pid, epoch, topic, 0, coordinator_epoch=1000) == E.TRANSACTION_COORDINATOR_FENCED.code
    assert markers(conn, pid, epoch, topic, 0, coordinator_epoch=0, commit=True) == E.INVALID_TXN_STATE.code
    assert list_offset(conn, topic, 0) == 6
    assert add_partitions(conn, tid, pid, epoch, topic, [0]) == {(topic, 0): 0}
    assert produce_txn(conn, tid, topic, 0, txn_batch(pid, epoch, seq=5, values=[b"next"])) == 0
    assert end_txn(conn, tid, pid, epoch, True) == 0
    wait_until(lambda: lso(conn, topic, 0) == 8, what="the second commit marker")
    assert committed_values(conn, topic, 0) == FIVE + [b"next"]


def test_rogue_v2_commit_with_the_bumped_epoch_on_an_open_v2_transaction(conn):
    """Transactions V2: the coordinator's markers carry the epoch EndTxn v5 bumps to, so a client's marker at that
    epoch passes the partition's strictly-newer check; it must not commit a transaction still open."""
    from compat_tests.test_transactions_v2_wire import end_v5, produce_v12
    topic = unique("rogue")
    create_topic(conn, topic, partitions=2)
    tid = unique("tx")
    _, pid, epoch = init(conn, tid)
    for p in (0, 1):                                           # Produce v12 adds each partition itself
        assert produce_v12(conn, tid, topic, p, txn_batch(pid, epoch, values=FIVE)).error_code == 0
    assert markers(conn, pid, epoch + 1, topic, 0, coordinator_epoch=0, commit=True, version=2,
                   transaction_version=2) == E.INVALID_TXN_STATE.code
    assert end_v5(conn, tid, pid, epoch, False) == (0, pid, epoch + 1)
    wait_until(lambda: [lso(conn, topic, p) for p in (0, 1)] == [6, 6], what="the abort markers")
    assert [committed_values(conn, topic, p) for p in (0, 1)] == [[], []]


@pytest.mark.server_config(SLOW_MARKERS)
def test_markers_for_a_prepared_transaction_must_be_its_own(server):
    """While the coordinator writes a prepared commit's markers (held back 1.5 s per partition here), a client's
    marker is refused unless it is exactly the coordinator's: result, producer epoch, coordinator epoch, partition."""
    with RawConn(server.bootstrap) as conn:
        topic = unique("rogue")
        create_topic(conn, topic, partitions=3)
        tid, pid, epoch = open_on(conn, topic, [0, 1])
        assert end_txn(conn, tid, pid, epoch, True) == 0            # PrepareCommit; markers 1.5 s apart
        assert markers(conn, pid, epoch, topic, 0, coordinator_epoch=0) == E.INVALID_TXN_STATE.code
        assert markers(conn, pid, 32767, topic, 0, coordinator_epoch=0, commit=True) == E.INVALID_PRODUCER_EPOCH.code
        assert markers(conn, pid, epoch + 1, topic, 0, coordinator_epoch=0, commit=True) == \
            E.INVALID_PRODUCER_EPOCH.code
        assert markers(conn, pid, epoch, topic, 0, coordinator_epoch=7, commit=True) == \
            E.TRANSACTION_COORDINATOR_FENCED.code
        assert markers(conn, pid, epoch, topic, 2, coordinator_epoch=0, commit=True) == E.INVALID_TXN_STATE.code
        assert [list_offset(conn, topic, p) for p in range(3)] == [5, 5, 0]
        # Exactly the coordinator's marker (the one it is about to write): written, and changes nothing.
        assert markers(conn, pid, epoch, topic, 1, coordinator_epoch=0, commit=True) == 0
        wait_until(lambda: [lso(conn, topic, p) for p in (0, 1)] == [6, 7], timeout=20, what="the markers")
        assert end_txn(conn, tid, pid, epoch, True) == 0            # complete: the retry answers OK
        assert [committed_values(conn, topic, p) for p in (0, 1)] == [FIVE, FIVE]


def describe_state(conn: RawConn, tid: str) -> str:
    r = conn.request("DescribeTransactions", 0, req("DescribeTransactions", transactional_ids=[tid]))
    return r.transaction_states[0].transaction_state


@pytest.mark.server_config(SLOW_MARKERS)
def test_a_clients_copy_of_a_v2_marker_does_not_wedge_the_transaction(server):
    """A client's exact copy of the coordinator's V2 marker passes; the coordinator's own marker then finds the
    partition at that epoch with nothing open (V2 markers must be strictly newer, so Kafka would refuse it and the
    transaction would stay PrepareCommit): it counts as written, and the transaction completes."""
    from compat_tests.test_transactions_v2_wire import end_v5, produce_v12
    with RawConn(server.bootstrap) as conn:
        topic = unique("rogue")
        create_topic(conn, topic, partitions=2)
        tid = unique("tx")
        _, pid, epoch = init(conn, tid)
        for p in (0, 1):
            assert produce_v12(conn, tid, topic, p, txn_batch(pid, epoch, values=FIVE)).error_code == 0
        assert end_v5(conn, tid, pid, epoch, True) == (0, pid, epoch + 1)     # markers held back 1.5 s each
        assert markers(conn, pid, epoch + 1, topic, 1, coordinator_epoch=0, commit=True, version=2,
                       transaction_version=2) == 0
        wait_until(lambda: describe_state(conn, tid) == "CompleteCommit", timeout=20, what="the transaction to end")
        assert [list_offset(conn, topic, p) for p in (0, 1)] == [6, 6]     # one marker each
        assert [committed_values(conn, topic, p) for p in (0, 1)] == [FIVE, FIVE]


def test_admin_abort_of_a_truly_hanging_transaction(server):
    """KIP-664: a transaction open on a partition whose coordinator lost it (its log deleted here) is aborted by a
    client's ABORT marker with the producer id, epoch and coordinator epoch that DescribeProducers shows."""
    with RawConn(server.bootstrap) as conn:
        topic = unique("hanging")
        create_topic(conn, topic)
        _, pid, epoch = open_on(conn, topic, [0])
    server.stop()
    shutil.rmtree(server.data_dir / "logs" / f"{TXN_STATE}-0")
    server.start(port=0)
    with RawConn(server.bootstrap) as conn:
        assert lso(conn, topic, 0) == 0
        assert markers(conn, pid, epoch, topic, 0, coordinator_epoch=-1) == 0
        assert lso(conn, topic, 0) == 6
        assert committed_values(conn, topic, 0) == []


def test_impossible_markers_are_refused_before_anything_is_appended(module_server, conn):
    """Issue 20 item 7: a marker with producer epoch -2 for a producer the partition did not know was appended,
    then producer state raised (the log and producer state disagreed).  Also: a producer id below 0 or one never
    handed out."""
    log = LogWatch(module_server)
    topic = unique("rogue")
    create_topic(conn, topic)
    # An idempotent producer's id: handed out, unknown to this partition and to the transaction coordinator.
    r = conn.request("InitProducerId", 4, req("InitProducerId", transactional_id=None, transaction_timeout_ms=-1,
                                              producer_id=-1, producer_epoch=-1))
    assert r.error_code == 0
    stranger = r.producer_id
    assert markers(conn, stranger, -2, topic, 0, coordinator_epoch=0) == E.INVALID_PRODUCER_EPOCH.code
    assert markers(conn, stranger, -32768, topic, 0, coordinator_epoch=0, commit=True) == \
        E.INVALID_PRODUCER_EPOCH.code
    assert markers(conn, stranger, 0, topic, 0, coordinator_epoch=-2) == E.TRANSACTION_COORDINATOR_FENCED.code
    assert markers(conn, -1, 0, topic, 0, coordinator_epoch=0) == E.INVALID_REQUEST.code
    assert markers(conn, -5, 3, topic, 0, coordinator_epoch=0, commit=True) == E.INVALID_REQUEST.code
    # A producer id never handed out: no transaction can be open under it, and a marker would wait, with its epoch
    # and coordinator epoch, for the producer that gets the id later.
    for future in (stranger + 1, stranger + 1000, 2**63 - 1):
        assert markers(conn, future, 0, topic, 0, coordinator_epoch=1000) == E.UNKNOWN_PRODUCER_ID.code
    # Transaction version 2 markers carry a bumped epoch: -1 is no epoch at all.
    assert markers(conn, stranger, -1, topic, 0, coordinator_epoch=0, version=2, transaction_version=2) == \
        E.INVALID_PRODUCER_EPOCH.code
    assert list_offset(conn, topic, 0) == 0
    # The next valid requests work: a marker for that producer, and a whole transaction.
    assert markers(conn, stranger, 0, topic, 0, coordinator_epoch=0) == 0
    assert list_offset(conn, topic, 0) == 1
    tid, pid, epoch = open_on(conn, topic, [0])
    assert end_txn(conn, tid, pid, epoch, True) == 0
    wait_until(lambda: lso(conn, topic, 0) == 7, what="the commit marker")
    assert committed_values(conn, topic, 0) == FIVE
    text = log.text()
    assert "Traceback" not in text and "ProducerStateError" not in text, text[-4000:]


def test_client_add_partitions_naming_internal_topics(conn):
    """AddPartitionsToTxn v0-3 (the client form) naming an internal topic: TOPIC_AUTHORIZATION_FAILED for it and
    OPERATION_NOT_ATTEMPTED for the rest, as Kafka (internal topics are left out of the topics a client may add);
    nothing is added."""
    topic = unique("rogue")
    create_topic(conn, topic)
    tid = unique("tx")
    _, pid, epoch = init(conn, tid)
    cls = message("AddPartitionsToTxnRequest").cls
    for version in (0, 3):
        for internal in (OFFSETS, TXN_STATE):
            r = conn.request("AddPartitionsToTxn", version, cls(
                v3_and_below_transactional_id=tid, v3_and_below_producer_id=pid, v3_and_below_producer_epoch=epoch,
                v3_and_below_topics=[cls.AddPartitionsToTxnTopic(name=internal, partitions=[0, 9]),
                                     cls.AddPartitionsToTxnTopic(name=topic, partitions=[0])]))
            assert {(t.name, p.partition_index): p.partition_error_code for t in r.results_by_topic_v3_and_below
                    for p in t.results_by_partition} == {
                (internal, 0): E.TOPIC_AUTHORIZATION_FAILED.code, (internal, 9): E.TOPIC_AUTHORIZATION_FAILED.code,
                (topic, 0): E.OPERATION_NOT_ATTEMPTED.code}
    assert end_txn(conn, tid, pid, epoch, True) == E.INVALID_TXN_STATE.code     # still Empty: nothing was added
