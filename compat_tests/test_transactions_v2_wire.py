"""Transactions V2 and the transaction.version feature over the wire: raw requests (our codec over a socket) against a real broker.

* ApiVersions v3 leaves out the supported transaction.version (its minimum is 0; KAFKA-17492) but
  lists the finalized level; v4 lists both, with the finalized-features epoch.
* UpdateFeatures: a level outside 0-2, an unknown feature, or a downgrade with upgrade type 1 is
  refused with INVALID_UPDATE_VERSION and changes nothing; ValidateOnly changes nothing; a
  change raises the epoch and survives a restart.
* Produce v12 adds a partition to the producer's transaction (no AddPartitionsToTxn); EndTxn v5
  bumps the epoch and answers it; its retry with the old epoch gets the same answer; a late
  Produce with the old epoch is refused (INVALID_PRODUCER_EPOCH), stores nothing and never pins
  the last stable offset; the next transaction runs at the new epoch with sequence 0.
* TxnOffsetCommit v5 adds the group's offsets partition itself (no AddOffsetsToTxn); the offsets
  are visible after the commit.
* An EndTxn v5 abort with nothing open, sent as soon as the commit before it returned (its markers
  still going out, the epoch already bumped), is not fenced: Kafka answers CONCURRENT_TRANSACTIONS
  until the commit completes and the retry bumps the epoch again (KAFKA-18464); the broker waits
  for the markers itself and answers that.
"""
from __future__ import annotations

import pytest

from compat_tests.clients import wait_until
from compat_tests.test_bad_input import RawConn, create_topic, list_offset, req, unique
from compat_tests.test_bad_transactions import init, txn_batch
from trireme.wire import error_codes as E
from trireme.wire.codec import message


@pytest.fixture
def conn(server):
    with RawConn(server.bootstrap) as c:
        yield c


def api_versions(conn: RawConn, version: int):
    return conn.request("ApiVersions", version, req("ApiVersions", client_software_name="trireme-test",
                                                    client_software_version="1.0"))


def update(conn: RawConn, level: int, version: int = 1, feature: str = "transaction.version",
           upgrade_type: int = 1, validate_only: bool = False):
    cls = message("UpdateFeaturesRequest").cls
    return conn.request("UpdateFeatures", version, cls(timeout_ms=10000, validate_only=validate_only, feature_updates=[
        cls.FeatureUpdateKey(feature=feature, max_version_level=level, upgrade_type=upgrade_type,
                             allow_downgrade=upgrade_type != 1)]))


def finalized(conn: RawConn) -> tuple[dict, int]:
    r = api_versions(conn, 4)
    return {f.name: f.max_version_level for f in r.finalized_features}, r.finalized_features_epoch


def test_api_versions_lists_the_feature(conn):
    v3 = api_versions(conn, 3)
    assert [f.name for f in v3.supported_features] == []
    assert [(f.name, f.min_version_level, f.max_version_level) for f in v3.finalized_features] == \
        [("transaction.version", 2, 2)]
    v4 = api_versions(conn, 4)
    assert [(f.name, f.min_version, f.max_version) for f in v4.supported_features] == [("transaction.version", 0, 2)]
    assert v4.finalized_features_epoch == v3.finalized_features_epoch >= 1


def test_update_features_refusals_change_nothing(conn):
    before = finalized(conn)
    for version in (0, 1, 2):
        r = update(conn, 3, version=version)
        assert r.error_code == E.INVALID_UPDATE_VERSION.code and "0-2" in r.error_message
        assert update(conn, 1, version=version, feature="no.such.feature").error_code == E.INVALID_UPDATE_VERSION.code
    r = update(conn, 1, upgrade_type=1)
    assert r.error_code == E.INVALID_UPDATE_VERSION.code and "downgrade" in r.error_message
    r = update(conn, 1, upgrade_type=2, validate_only=True)
    assert r.error_code == 0 and [(x.feature, x.error_code) for x in r.results] == [("transaction.version", 0)]
    assert finalized(conn) == before


def test_update_features_changes_the_level_durably(server, conn):
    levels, epoch = finalized(conn)
    assert levels == {"transaction.version": 2}
    r = update(conn, 1, version=2, upgrade_type=2)
    assert r.error_code == 0 and r.error_message is None
    assert finalized(conn) == ({"transaction.version": 1}, epoch + 1)
    assert update(conn, 1, version=2, upgrade_type=2).error_code == 0
    assert finalized(conn) == ({"transaction.version": 1}, epoch + 1)          # no change, no new epoch
    assert update(conn, 0, version=0, upgrade_type=2).error_code == 0          # v0: AllowDowngrade, level 0 removes
    assert finalized(conn) == ({}, epoch + 2)
    server.restart()
    with RawConn(server.bootstrap) as again:
        assert finalized(again) == ({}, epoch + 2)


def produce_v12(conn: RawConn, tid: str, topic: str, partition: int, data: bytes, version: int = 12):
    cls = message("ProduceRequest").cls
    tcls = cls.TopicProduceData
    r = conn.request("Produce", version, cls(transactional_id=tid, acks=-1, timeout_ms=10000, topic_data=[
        tcls(name=topic, partition_data=[tcls.PartitionProduceData(index=partition, records=data)])]))
    return r.responses[0].partition_responses[0]


def end_v5(conn: RawConn, tid: str, pid: int, epoch: int, commit: bool):
    r = conn.request("EndTxn", 5, req("EndTxn", transactional_id=tid, producer_id=pid, producer_epoch=epoch,
                                      committed=commit))
    return r.error_code, r.producer_id, r.producer_epoch


def lso(conn: RawConn, topic: str, partition: int = 0) -> int:
    return list_offset(conn, topic, partition, isolation_level=1)


def test_produce_v12_adds_and_end_txn_v5_bumps(conn):
    topic = unique("v2")
    create_topic(conn, topic, partitions=2)
    tid = unique("tx")
    err, pid, epoch = init(conn, tid)
    assert err == 0
    # No AddPartitionsToTxn: Produce v12 adds both partitions.
    for p in (0, 1):
        r = produce_v12(conn, tid, topic, p, txn_batch(pid, epoch, values=(b"a", b"b")))
        assert (r.error_code, r.base_offset) == (0, 0)
    assert lso(conn, topic) == 0
    assert end_v5(conn, tid, pid, epoch, True) == (0, pid, epoch + 1)
    assert end_v5(conn, tid, pid, epoch, True) == (0, pid, epoch + 1)      # the retry: the same answer
    assert end_v5(conn, tid, pid, epoch, False)[0] == E.INVALID_TXN_STATE.code
    wait_until(lambda: lso(conn, topic, 0) == 3 and lso(conn, topic, 1) == 3, timeout=10, what="markers")
    # A late batch of the finished transaction (the old epoch) is refused and opens nothing.
    late = produce_v12(conn, tid, topic, 0, txn_batch(pid, epoch, seq=2, values=(b"late",)))
    assert late.error_code == E.INVALID_PRODUCER_EPOCH.code
    assert list_offset(conn, topic, 0) == 3 and lso(conn, topic) == 3
    # The next transaction: the bumped epoch, sequences from 0, aborted this time.
    r = produce_v12(conn, tid, topic, 0, txn_batch(pid, epoch + 1, seq=0, values=(b"c",)))
    assert (r.error_code, r.base_offset) == (0, 3)
    assert lso(conn, topic) == 3
    assert end_v5(conn, tid, pid, epoch + 1, False) == (0, pid, epoch + 2)
    wait_until(lambda: lso(conn, topic) == 5, timeout=10, what="abort marker")
    # EndTxn v4 (classic) of a V2 producer's id works too and keeps the epoch.
    r = produce_v12(conn, tid, topic, 1, txn_batch(pid, epoch + 2, seq=0, values=(b"d",)))
    assert r.error_code == 0
    assert conn.request("EndTxn", 4, req("EndTxn", transactional_id=tid, producer_id=pid, producer_epoch=epoch + 2,
                                         committed=True)).error_code == 0
    wait_until(lambda: lso(conn, topic, 1) == 5, timeout=10, what="classic commit marker")


def test_txn_offset_commit_v5_adds_the_offsets_partition(conn):
    topic = unique("v2")
    create_topic(conn, topic)
    tid, group = unique("tx"), unique("group")
    _, pid, epoch = init(conn, tid)
    assert produce_v12(conn, tid, topic, 0, txn_batch(pid, epoch)).error_code == 0
    cls = message("TxnOffsetCommitRequest").cls
    tcls = cls.TxnOffsetCommitRequestTopic

    def commit_offset(version: int) -> int:
        r = conn.request("TxnOffsetCommit", version, cls(
            transactional_id=tid, group_id=group, producer_id=pid, producer_epoch=epoch, generation_id=-1,
            member_id="", group_instance_id=None, topics=[tcls(name=topic, partitions=[
                tcls.TxnOffsetCommitRequestPartition(partition_index=0, committed_offset=42,
                                                     committed_leader_epoch=-1, committed_metadata="")])]))
        return r.topics[0].partitions[0].error_code
    # v4 only verifies: the offsets partition was never added (no AddOffsetsToTxn).
    assert commit_offset(4) == E.INVALID_TXN_STATE.code
    assert commit_offset(5) == 0
    assert end_v5(conn, tid, pid, epoch, True)[0] == 0

    def committed() -> int:
        r = conn.request("OffsetFetch", 7, req("OffsetFetch", group_id=group, require_stable=True, topics=[
            message("OffsetFetchRequest").cls.OffsetFetchRequestTopic(name=topic, partition_indexes=[0])]))
        return r.topics[0].partitions[0].committed_offset
    wait_until(lambda: committed() == 42, timeout=10, what="the transaction's offsets")


@pytest.mark.server_config({"trireme.debug.transaction.marker.delay.ms": 1500})
def test_abort_right_after_a_commit_waits_for_its_markers(server):
    with RawConn(server.bootstrap) as conn:
        topic = unique("v2")
        create_topic(conn, topic)
        tid = unique("tx")
        _, pid, epoch = init(conn, tid)
        assert produce_v12(conn, tid, topic, 0, txn_batch(pid, epoch)).error_code == 0
        assert end_v5(conn, tid, pid, epoch, True) == (0, pid, epoch + 1)     # markers held 1.5 s
        assert lso(conn, topic) == 0
        assert end_v5(conn, tid, pid, epoch + 1, False) == (0, pid, epoch + 2)
        assert lso(conn, topic) == 2                                          # the commit completed first
        wait_until(lambda: describe_state(conn, tid) == "CompleteAbort", timeout=10, what="the empty abort")
        # The next transaction runs at the epoch the abort answered.
        assert produce_v12(conn, tid, topic, 0, txn_batch(pid, epoch + 2, values=(b"n",))).error_code == 0
        assert end_v5(conn, tid, pid, epoch + 2, True) == (0, pid, epoch + 3)
        wait_until(lambda: lso(conn, topic) == 4, timeout=10, what="the last commit")


def describe_state(conn: RawConn, tid: str) -> str:
    r = conn.request("DescribeTransactions", 0, req("DescribeTransactions", transactional_ids=[tid]))
    return r.transaction_states[0].transaction_state
