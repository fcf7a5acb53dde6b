"""An AddPartitionsToTxn answered before its fsync has its record written to the file first (a process crash keeps it);
its record, and a transaction's COMPLETE record, get no flush round of their own: the next round anyone needs covers
them (or one of their own after UNAWAITED_FLUSH_S)."""

import trio
import trio.testing

from broker_runner import run_with_broker
from trireme.server import broker as B
from trireme.server.broker import Broker
from trireme.server.clock import now_ms
from trireme.server.config import Config
from trireme.state.transactions import COMPLETE_COMMIT
from trireme.wire import records as rec


def _broker(tmp_path) -> Broker:
    broker = Broker(Config(data_dir=str(tmp_path)))
    broker.ensure_topic("t", 1)
    return broker


def _written_end(tmp_path) -> int:
    """The offset after the last whole batch in the coordinator's segment file (zeros written ahead after it are
    no batch)."""
    data = (tmp_path / "logs" / "__transaction_state-0" / f"{0:020d}.log").read_bytes()
    end = 0
    try:
        for _, header in rec.iter_batch_headers(data):
            end = header.next_offset
    except rec.CodecError:
        pass                                                    # the zeros after the last batch
    return end


async def _init(b, tid):
    outcome = await b.transactions.init_producer_id(tid, 60000)
    assert outcome.error == 0
    return outcome.producer_id, outcome.producer_epoch


def test_add_answered_when_staged_is_written_before_the_answer(tmp_path):
    broker = _broker(tmp_path)

    async def body(b):
        pid, epoch = await _init(b, "tx")
        plog = b.transactions.partition.log
        outcome = await b.transactions.add_partitions("tx", pid, epoch, [("t", 0)], answer_when_staged=True)
        assert outcome.error == 0 and outcome.partition_errors == {("t", 0): 0}
        assert plog.high_watermark < plog.log_end_offset          # answered before the fsync...
        assert _written_end(tmp_path) == plog.log_end_offset     # ...but written to the file
        await b.transactions.wait_replayed()
    run_with_broker(broker, body)
    broker.close()


def test_add_whose_write_fails_waits_for_the_flush(tmp_path, monkeypatch):
    broker = _broker(tmp_path)
    monkeypatch.setattr(broker, "write_appended", lambda partition: False)

    async def body(b):
        pid, epoch = await _init(b, "tx")
        plog = b.transactions.partition.log
        outcome = await b.transactions.add_partitions("tx", pid, epoch, [("t", 0)], answer_when_staged=True)
        assert outcome.error == 0
        assert plog.high_watermark == plog.log_end_offset         # not answered before it was durable
    run_with_broker(broker, body)
    broker.close()


def _produce(b, p, pid, epoch, sequence) -> int:
    """A transactional batch appended to ``p`` as Produce appends it (a flush round is due for it) → its offset."""
    data = bytearray(rec.build_batch([(None, b"v", [], now_ms())], producer_id=pid, producer_epoch=epoch,
                                     base_sequence=sequence, transactional=True))
    _, last, _ = p.log.append(data, rec.validate_batches(data), now_ms())
    b.appended(p)
    return last


def test_the_add_record_is_flushed_by_the_next_round_someone_needs(tmp_path, monkeypatch):
    monkeypatch.setattr(B, "UNAWAITED_FLUSH_S", 60.0)     # however slow the machine, only the Produce starts the round
    broker = _broker(tmp_path)

    async def body(b):
        pid, epoch = await _init(b, "tx")
        plog = b.transactions.partition.log
        rounds = b.metrics.fsync.count
        await b.transactions.add_partitions("tx", pid, epoch, [("t", 0)], answer_when_staged=True)
        await trio.testing.wait_all_tasks_blocked()
        assert plog.high_watermark < plog.log_end_offset and b.metrics.fsync.count == rounds   # no round of its own
        data = b.partition("t", 0)
        with trio.fail_after(10):
            assert await b.wait_durable(data, _produce(b, data, pid, epoch, 0))
        assert plog.high_watermark == plog.log_end_offset         # the Produce's round covered it
        assert b.metrics.fsync.count == rounds + 1
    run_with_broker(broker, body)
    broker.close()


def test_the_add_record_alone_gets_a_round_of_its_own_after_a_while(tmp_path):
    broker = _broker(tmp_path)

    async def body(b):
        pid, epoch = await _init(b, "tx")
        plog = b.transactions.partition.log
        await b.transactions.add_partitions("tx", pid, epoch, [("t", 0)], answer_when_staged=True)
        with trio.fail_after(10):
            assert await b.wait_durable(b.transactions.partition, plog.log_end_offset - 1)
    run_with_broker(broker, body)
    broker.close()


def test_the_complete_record_waits_for_the_next_round(tmp_path, monkeypatch):
    monkeypatch.setattr(B, "UNAWAITED_FLUSH_S", 60.0)
    broker = _broker(tmp_path)

    async def body(b):
        pid, epoch = await _init(b, "tx")
        plog = b.transactions.partition.log
        data = b.partition("t", 0)
        await b.transactions.add_partitions("tx", pid, epoch, [("t", 0)])
        with trio.fail_after(10):
            assert await b.wait_durable(data, _produce(b, data, pid, epoch, 0))
            assert (await b.transactions.end_txn("tx", pid, epoch, True)).error == 0
            prepared = plog.log_end_offset                        # PrepareCommit is durable when EndTxn answers
            while plog.log_end_offset == prepared:
                await trio.sleep(0.001)                           # the markers are written, durable, then COMPLETE
        assert data.log.high_watermark == data.log.log_end_offset  # the marker is durable...
        await trio.testing.wait_all_tasks_blocked()
        assert plog.high_watermark == prepared < plog.log_end_offset   # ...COMPLETE is written but waits for a round
        assert b.transactions.coordinator.describe("tx").state is not COMPLETE_COMMIT
        rounds = b.metrics.fsync.count
        b.appended(data)                                          # one that someone needs
        with trio.fail_after(10):
            await b.transactions.wait_replayed()
        assert b.transactions.coordinator.describe("tx").state is COMPLETE_COMMIT
        assert b.metrics.fsync.count == rounds + 1
    run_with_broker(broker, body)
    broker.close()


def test_an_operation_that_waits_for_an_unawaited_record_makes_its_round_due(tmp_path, monkeypatch):
    """EndTxn right after AddPartitionsToTxn (nothing produced): the Ongoing record is in flight, so EndTxn waits for
    it, and starts its round rather than waiting UNAWAITED_FLUSH_S."""
    monkeypatch.setattr(B, "UNAWAITED_FLUSH_S", 60.0)
    broker = _broker(tmp_path)

    async def body(b):
        pid, epoch = await _init(b, "tx")
        await b.transactions.add_partitions("tx", pid, epoch, [("t", 0)], answer_when_staged=True)
        with trio.fail_after(10):
            assert (await b.transactions.end_txn("tx", pid, epoch, False)).error == 0
    run_with_broker(broker, body)
    broker.close()
