"""A full disk, injected with MemoryStorage: a write refused for want of space takes its partition offline only until
the broker's retry of that write succeeds; a failed fsync keeps it offline until restart (issue 20 item 8)."""
from __future__ import annotations

import logging

import pytest
import trio

from broker_runner import run_with_broker
from trireme.server import broker as broker_module
from trireme.server import dispatch
from trireme.server.broker import Broker
from trireme.server.config import Config
from trireme.state.storage import MemoryStorage, SyncFailed, out_of_space
from trireme.state.txn_records import TxnState
from trireme.wire import error_codes as E
from trireme.wire import records as rec
from trireme.wire.codec import message

_PRODUCE = message("ProduceRequest").cls
dispatch.load_handlers()


@pytest.fixture(autouse=True)
def quick_retry(monkeypatch):
    monkeypatch.setattr(broker_module, "STORAGE_RETRY_FIRST_S", 0.01)
    monkeypatch.setattr(broker_module, "STORAGE_RETRY_MAX_S", 0.05)


def _broker(storage: MemoryStorage) -> Broker:
    broker = Broker(Config(data_dir="<memory:diskfull>"), storage)
    broker.ensure_topic("t", 1)
    return broker


async def _produce(b: Broker, values: list[bytes]) -> tuple[int, int]:
    """Produce one batch to t-0 through the Produce handler (acks=all); → (error code, base offset)."""
    batch = rec.build_batch([(None, v) for v in values])
    request = _PRODUCE(transactional_id=None, acks=-1, timeout_ms=30000, topic_data=[
        _PRODUCE.TopicProduceData(name="t", partition_data=[
            _PRODUCE.TopicProduceData.PartitionProduceData(index=0, records=batch)])])
    response = await b.local_peer.call("Produce", 9, request)
    answer = response.responses[0].partition_responses[0]
    return answer.error_code, answer.base_offset


def _values(p) -> list[bytes]:
    data = p.log.read(p.log.log_start_offset, 1 << 20, p.log.high_watermark)
    return [r.value for pos, _ in rec.iter_batch_headers(data) for r in rec.decode_records(data, pos)]


async def _until(predicate, what: str) -> None:
    with trio.fail_after(10):               # a hang guard, not a timing claim
        while not predicate():
            await trio.sleep(0.005)


def test_storage_classifies_space_and_fsync_failures():
    import errno
    assert out_of_space(OSError(errno.ENOSPC, "full")) and out_of_space(OSError(errno.EDQUOT, "quota"))
    assert not out_of_space(OSError(errno.EIO, "io"))
    assert not out_of_space(SyncFailed(errno.ENOSPC, "fsync found no space"))    # writeback lost: never retried
    storage = MemoryStorage()
    storage.makedirs("d")
    f = storage.open_append("d/f")
    f.write(b"abc")
    storage.full = True
    with pytest.raises(OSError) as refused:
        f.write(b"more")
    assert out_of_space(refused.value) and f.size == 3
    storage.full = False
    storage.fail_next_sync()
    with pytest.raises(SyncFailed):
        f.sync()
    with pytest.raises(SyncFailed):         # sticky: a later fsync never claims success
        f.sync()


@pytest.mark.parametrize("size", [100, 20000], ids=["write-behind", "direct-write"])
def test_full_disk_refuses_writes_then_the_retry_brings_the_partition_back(size, caplog):
    storage = MemoryStorage()
    broker = _broker(storage)
    p = broker.partition("t", 0)
    caplog.set_level(logging.INFO, logger="trireme.broker")

    async def body(b):
        assert await _produce(b, [b"acked-%d" % i for i in range(3)]) == (0, 0)
        storage.full = True
        error, _ = await _produce(b, [b"refused" + b"x" * size])
        assert error == E.KAFKA_STORAGE_ERROR.code
        assert p.storage_retrying and p.storage_error
        await trio.sleep(0.3)               # many retries while the disk stays full
        assert p.storage_retrying
        assert (await _produce(b, [b"while-full"]))[0] == E.KAFKA_STORAGE_ERROR.code     # refused, not queued
        assert _values(p) == [b"acked-%d" % i for i in range(3)]
        storage.full = False
        await _until(lambda: not p.storage_retrying, "the partition back online")
        assert p.storage_error is None
        assert await _produce(b, [b"after"]) == (0, p.log.log_end_offset - 1)
    run_with_broker(broker, body)
    values = _values(p)
    # acknowledged records kept; the refused one (never acknowledged) may be there, written by the retry
    assert values[:3] == [b"acked-%d" % i for i in range(3)] and values[-1] == b"after"
    assert set(values[3:-1]) <= {b"refused" + b"x" * size}
    assert p.log.high_watermark == p.log.log_end_offset
    lines = [r.getMessage() for r in caplog.records if "t-0" in r.getMessage()]
    assert len([m for m in lines if "offline: disk full" in m]) == 1, lines
    assert len([m for m in lines if "back online" in m]) == 1, lines


def test_a_failed_fsync_stays_offline_until_restart():
    storage = MemoryStorage()
    broker = _broker(storage)
    p = broker.partition("t", 0)

    async def body(b):
        assert (await _produce(b, [b"a"]))[0] == 0
        storage.fail_next_sync()
        assert (await _produce(b, [b"b"]))[0] == E.KAFKA_STORAGE_ERROR.code
        assert p.storage_error and not p.storage_retrying
        await trio.sleep(0.3)
        assert p.storage_error and not p.storage_retrying
        assert (await _produce(b, [b"c"]))[0] == E.KAFKA_STORAGE_ERROR.code
    run_with_broker(broker, body)


def test_transaction_coordinator_comes_back_and_resumes_the_prepared_transaction():
    """The PREPARE record of a commit finds the disk full: EndTxn gets COORDINATOR_NOT_AVAILABLE, and so does every
    InitProducerId.  Once space returns, the retry makes the PREPARE durable, its markers are written and the
    transaction completes, and new transactional ids get producer ids, all without a restart."""
    storage = MemoryStorage()
    broker = _broker(storage)
    txn = broker.transactions
    state = txn.partition

    async def body(b):
        init = await txn.init_producer_id("x", 60000)
        assert init.error == 0
        added = await txn.add_partitions("x", init.producer_id, init.producer_epoch, [("t", 0)])
        assert added.error == 0
        storage.full = True
        ended = await txn.end_txn("x", init.producer_id, init.producer_epoch, True)
        assert ended.error == E.COORDINATOR_NOT_AVAILABLE.code
        assert state.storage_retrying
        assert (await txn.init_producer_id("y", 60000)).error == E.COORDINATOR_NOT_AVAILABLE.code
        storage.full = False
        await _until(lambda: txn.coordinator.transactions["x"].state is TxnState.COMPLETE_COMMIT,
                     "the prepared transaction completed")
        assert (await txn.init_producer_id("y", 60000)).error == 0
    run_with_broker(broker, body)
    p = broker.partition("t", 0)
    headers = list(p.log.iter_batch_headers())
    assert [h.is_control for h in headers] == [True]          # the commit marker, written once
    assert not state.storage_error and not p.storage_error


def test_a_marker_refused_by_a_full_data_partition_is_written_once_space_returns():
    """The data partition is offline for want of space when the commit's markers go out: the coordinator keeps
    retrying them, and once the partition's retry brings it back the marker lands and the transaction completes."""
    storage = MemoryStorage()
    broker = _broker(storage)
    txn = broker.transactions
    p = broker.partition("t", 0)
    real_retry = broker._retry_full

    async def body(b):
        release = trio.Event()

        async def gated(partition):         # the partition's retry waits until the test lets it run
            await release.wait()
            await real_retry(partition)
        broker._retry_full = gated
        init = await txn.init_producer_id("x", 60000)
        await txn.add_partitions("x", init.producer_id, init.producer_epoch, [("t", 0)])
        storage.full = True
        assert (await _produce(b, [b"fills"]))[0] == E.KAFKA_STORAGE_ERROR.code       # t-0 offline
        storage.full = False
        ended = await txn.end_txn("x", init.producer_id, init.producer_epoch, True)
        assert ended.error == 0                                                          # PREPARE is durable
        await trio.sleep(0.3)                                                            # markers refused meanwhile
        assert p.storage_retrying and txn.coordinator.transactions["x"].state is TxnState.PREPARE_COMMIT
        release.set()
        await _until(lambda: txn.coordinator.transactions["x"].state is TxnState.COMPLETE_COMMIT,
                     "the transaction completed")
    run_with_broker(broker, body)
    assert not p.storage_error
    assert [h.is_control for h in p.log.iter_batch_headers()][-1] is True
    assert p.last_stable_offset() == p.log.high_watermark == p.log.log_end_offset


def test_a_producer_id_block_that_cannot_be_reserved_is_coordinator_not_available():
    storage = MemoryStorage()
    broker = _broker(storage)               # no producer id handed out yet: the first one reserves a block

    async def body(b):
        storage.full = True
        assert (await b.transactions.init_producer_id("x", 60000)).error == E.COORDINATOR_NOT_AVAILABLE.code
        storage.full = False                # the reservation is a record of __cluster_metadata: once it is back
        await _until(lambda: not b.cluster_metadata.partition.storage_error, "__cluster_metadata writable")
        assert (await b.transactions.init_producer_id("x", 60000)).error == 0
    run_with_broker(broker, body)


def test_an_idempotent_producers_id_block_that_cannot_be_reserved_is_coordinator_not_available(caplog):
    """A non-transactional InitProducerId that needs a new block on a full disk: a retriable error and one log line,
    not an OSError out of the handler (a traceback every 1,000 producers)."""
    storage = MemoryStorage()
    broker = _broker(storage)
    request = message("InitProducerIdRequest").cls(transactional_id=None, transaction_timeout_ms=-1,
                                                   producer_id=-1, producer_epoch=-1)

    async def body(b):
        storage.full = True
        for _ in range(2):
            answer = await b.local_peer.call("InitProducerId", 4, request)
            assert (answer.error_code, answer.producer_id) == (E.COORDINATOR_NOT_AVAILABLE.code, -1)
        storage.full = False
        await _until(lambda: not b.cluster_metadata.partition.storage_error, "__cluster_metadata writable")
        answer = await b.local_peer.call("InitProducerId", 4, request)
        assert answer.error_code == 0 and answer.producer_id >= 0
    run_with_broker(broker, body)
    assert sum("cannot reserve producer ids" in r.getMessage() for r in caplog.records) == 1


def test_delete_records_on_a_full_disk_is_a_storage_error_and_changes_nothing():
    storage = MemoryStorage()
    broker = _broker(storage)
    p = broker.partition("t", 0)
    cls = message("DeleteRecordsRequest").cls

    async def delete(b, offset):
        request = cls(topics=[cls.DeleteRecordsTopic(name="t", partitions=[
            cls.DeleteRecordsTopic.DeleteRecordsPartition(partition_index=0, offset=offset)])], timeout_ms=1000)
        return (await b.local_peer.call("DeleteRecords", 2, request)).topics[0].partitions[0]

    async def body(b):
        assert (await _produce(b, [b"a", b"b", b"c"]))[0] == 0
        storage.full = True
        answer = await delete(b, 2)
        assert (answer.error_code, answer.low_watermark) == (E.KAFKA_STORAGE_ERROR.code, -1)
        assert p.log.log_start_offset == 0
        storage.full = False
        answer = await delete(b, 2)
        assert (answer.error_code, answer.low_watermark) == (0, 2)
    run_with_broker(broker, body)


def test_segment_rolls_and_their_indexes_recover_and_survive_a_restart():
    """Small segments: appends roll while the disk is full (the sealed segments' indexes cannot be written either);
    after the retry every acknowledged record is there, and a restart finds the same log."""
    storage = MemoryStorage()
    broker = Broker(Config(data_dir="<memory:diskfull>"), storage)
    broker.ensure_topic("t", 1, {"segment.bytes": "300"})
    p = broker.partition("t", 0)
    acked: list[bytes] = []

    async def body(b):
        for i in range(5):
            value = b"before-%d-" % i + b"x" * 100
            assert (await _produce(b, [value]))[0] == 0
            acked.append(value)
        storage.full = True
        assert (await _produce(b, [b"full-" + b"x" * 100]))[0] == E.KAFKA_STORAGE_ERROR.code
        storage.full = False
        await _until(lambda: not p.storage_retrying, "t-0 back online")
        for i in range(5):
            value = b"after-%d-" % i + b"x" * 100
            assert (await _produce(b, [value]))[0] == 0
            acked.append(value)
    run_with_broker(broker, body)
    assert len(p.log.segment_base_offsets) > 5
    before = _values(p)
    assert [v for v in before if not v.startswith(b"full-")] == acked
    broker.close()
    again = Broker(Config(data_dir="<memory:diskfull>"), storage).partition("t", 0)
    assert _values(again) == before


def test_coordinator_compaction_at_start_up_on_a_full_disk_waits_for_space():
    """Start-up compacts a long __transaction_state; with the disk full the compaction is left undone, the broker
    starts, and once space returns the coordinator serves again."""
    storage = MemoryStorage()
    broker = _broker(storage)

    async def many(b):
        for _ in range(1200):               # one live key, many records: compaction is due at the next start
            assert (await b.transactions.init_producer_id("x", 60000)).error == 0
    run_with_broker(broker, many)
    broker.close()
    storage.full = True
    broker = Broker(Config(data_dir="<memory:diskfull>"), storage)
    state = broker.transactions.partition
    assert state.storage_retrying

    async def body(b):
        assert (await b.transactions.init_producer_id("x", 60000)).error == E.COORDINATOR_NOT_AVAILABLE.code
        storage.full = False
        await _until(lambda: not state.storage_error, "__transaction_state back online")
        outcome = await b.transactions.init_producer_id("x", 60000)
        assert (outcome.error, outcome.producer_epoch) == (0, 1200)
    run_with_broker(broker, body)


def test_group_coordinator_refuses_offset_commits_while_full_and_takes_them_after():
    storage = MemoryStorage()
    broker = _broker(storage)
    cls = message("OffsetCommitRequest").cls
    fetch_cls = message("OffsetFetchRequest").cls

    async def commit(b, offset):
        T = cls.OffsetCommitRequestTopic
        request = cls(group_id="g", generation_id_or_member_epoch=-1, member_id="", group_instance_id=None,
                      retention_time_ms=-1, topics=[T(name="t", partitions=[T.OffsetCommitRequestPartition(
                          partition_index=0, committed_offset=offset, committed_leader_epoch=-1,
                          commit_timestamp=-1, committed_metadata="")])])
        return (await b.local_peer.call("OffsetCommit", 8, request)).topics[0].partitions[0].error_code

    async def body(b):
        assert await commit(b, 1) == 0
        storage.full = True
        assert await commit(b, 2) == E.NOT_COORDINATOR.code       # retriable: the client finds the coordinator again
        assert b.groups.partition.storage_retrying
        storage.full = False
        await _until(lambda: not b.groups.partition.storage_error, "__consumer_offsets back online")
        assert await commit(b, 3) == 0
        T = fetch_cls.OffsetFetchRequestTopic
        answer = await b.local_peer.call("OffsetFetch", 7, fetch_cls(
            group_id="g", topics=[T(name="t", partition_indexes=[0])], require_stable=False))
        assert answer.topics[0].partitions[0].committed_offset == 3
    run_with_broker(broker, body)


@pytest.mark.parametrize("write_behind", [True, False], ids=["write-behind", "write-through"])
def test_a_sealed_segments_index_write_that_finds_no_space_is_retried_by_the_next_flush(write_behind):
    """The data is fsynced but the rolled segment's indexes cannot be written: the flush fails as a write that found
    no space (retriable), the high watermark stays, and the next flush writes them; a reopen trusts them."""
    from trireme.state.log import PartitionLog
    storage = MemoryStorage()
    plog = PartitionLog.open(storage, "d", segment_bytes=200, retention_ms=-1, retention_bytes=-1, now_ms=0,
                             write_behind=write_behind)
    for i in range(6):
        batch = bytearray(rec.build_batch([(None, b"%d-" % i + b"x" * 80)]))
        plog.append(batch, rec.validate_batches(batch), 0)
    assert len(plog.segment_base_offsets) > 1 and plog.sealed_segments_unflushed
    target = plog.flush_begin()             # (write-behind: the data is written here)
    storage.full = True                     # ... and the disk fills before the indexes are written
    with pytest.raises(OSError) as refused:
        plog.flush(target)
    assert out_of_space(refused.value) and plog.high_watermark == 0
    assert not [name for name in storage.list("d") if name.endswith(".tmp")]
    storage.full = False
    assert plog.sync() == 6 and not plog.sealed_segments_unflushed
    plog.close()
    again = PartitionLog.open(storage, "d", segment_bytes=200, retention_ms=-1, retention_bytes=-1, now_ms=0)
    assert again.log_end_offset == 6 and again.segment_base_offsets == plog.segment_base_offsets


def test_file_storage_removes_what_a_failed_atomic_write_left(tmp_path, monkeypatch):
    import errno
    import os
    from trireme.state import storage as storage_module
    files = storage_module.FileStorage(tmp_path)
    files.write_atomic("f", b"old")

    def no_space(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(storage_module.os, "write", no_space)
    with pytest.raises(OSError) as refused:
        files.write_atomic("f", b"new")
    monkeypatch.undo()
    assert out_of_space(refused.value)
    assert sorted(os.listdir(tmp_path)) == ["f"] and files.read_all("f") == b"old"


def test_an_offline_partition_shows_in_the_metrics():
    from trireme.server.metrics import _PARTITION_GAUGES
    offline = {name: value for name, _, value in _PARTITION_GAUGES}["trireme_partition_offline"]
    storage = MemoryStorage()
    broker = _broker(storage)
    p = broker.partition("t", 0)

    async def body(b):
        assert offline(p) == 0
        storage.full = True
        assert (await _produce(b, [b"x"]))[0] == E.KAFKA_STORAGE_ERROR.code
        assert offline(p) == 1
        storage.full = False
        await _until(lambda: not p.storage_error, "t-0 back online")
        assert offline(p) == 0
    run_with_broker(broker, body)


def test_a_complete_record_refused_while_full_is_written_once_space_returns():
    """The markers are written but __transaction_state has filled meanwhile: the COMPLETE record is refused and the
    marker task ends; once __transaction_state's retry succeeds the transaction's markers are resumed and it
    completes."""
    storage = MemoryStorage()
    config = Config(data_dir="<memory:diskfull>")
    config.update({"trireme.debug.transaction.marker.delay.ms": 200})      # time to fill the disk before the markers
    broker = Broker(config, storage)
    broker.ensure_topic("t", 1)
    txn = broker.transactions
    state, p = txn.partition, broker.partition("t", 0)
    real_retry = broker._retry_full

    async def body(b):
        release = trio.Event()

        async def gated(partition):         # __transaction_state's retry waits until the test lets it run
            if partition is state and not release.is_set():
                return
            await real_retry(partition)
        broker._retry_full = gated
        init = await txn.init_producer_id("x", 60000)
        await txn.add_partitions("x", init.producer_id, init.producer_epoch, [("t", 0)])
        assert (await txn.end_txn("x", init.producer_id, init.producer_epoch, True)).error == 0
        storage.full = True
        assert (await txn.init_producer_id("y", 60000)).error == E.COORDINATOR_NOT_AVAILABLE.code
        assert state.storage_retrying
        await _until(lambda: p.storage_retrying, "the marker found t-0 full")
        storage.full = False
        await _until(lambda: "x" in txn._not_durable, "the COMPLETE record refused")
        assert any(h.is_control for h in p.log.iter_batch_headers())       # the marker is written
        assert txn.coordinator.transactions["x"].state is TxnState.PREPARE_COMMIT
        release.set()
        await _until(lambda: txn.coordinator.transactions["x"].state is TxnState.COMPLETE_COMMIT,
                     "the transaction completed")
        assert (await txn.init_producer_id("y", 60000)).error == 0
    run_with_broker(broker, body)


def test_an_operator_completed_transaction_whose_complete_record_was_refused_completes_once_space_returns():
    """An operator's `complete` wrote the refused marker (with the coordinator epoch the partition reported), then
    the COMPLETE record was refused for want of space.  Once __transaction_state is writable again the transaction
    completes and is no longer listed as stuck (the staged record is written by the storage retry; a transaction
    still prepared then would get only its record, not markers the partition would refuse)."""
    from trireme.server.transactions import NotStuck
    storage = MemoryStorage()
    config = Config(data_dir="<memory:diskfull>")
    config.update({"trireme.debug.transaction.marker.refuse": "t-0"})      # the coordinator's own marker is refused
    broker = Broker(config, storage)
    broker.ensure_topic("t", 1)
    txn = broker.transactions
    real_complete = txn._complete
    filled = []

    async def complete_on_a_full_disk(job, **kwargs):   # the disk fills between the operator's marker and the record
        if not filled:
            filled.append(True)
            storage.full = True
        return await real_complete(job, **kwargs)
    txn._complete = complete_on_a_full_disk

    async def body(b):
        init = await txn.init_producer_id("x", 60000)
        await txn.add_partitions("x", init.producer_id, init.producer_epoch, [("t", 0)])
        assert (await txn.end_txn("x", init.producer_id, init.producer_epoch, True)).error == 0
        await _until(lambda: "x" in txn.stuck, "the refused marker left the transaction stuck")
        with pytest.raises(NotStuck, match="COMPLETE"):
            await txn.complete_stuck("x")
        assert txn.stuck["x"].partitions == {}                      # its marker is written: only the record is left
        storage.full = False
        await _until(lambda: txn.coordinator.transactions["x"].state is TxnState.COMPLETE_COMMIT,
                     "the transaction completed")
        assert txn.stuck_transactions() == []
    run_with_broker(broker, body)
