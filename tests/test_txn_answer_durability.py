"""An AddPartitionsToTxn answered before its fsync has its record written to the file first (a process crash keeps it)."""
import os

from broker_runner import run_with_broker
from trireme.server.broker import Broker
from trireme.server.config import Config


def _broker(tmp_path) -> Broker:
    broker = Broker(Config(data_dir=str(tmp_path)))
    broker.ensure_topic("t", 1)
    return broker


def _segment_size(tmp_path) -> int:
    return os.path.getsize(tmp_path / "logs" / "__transaction_state-0" / f"{0:020d}.log")


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
        assert _segment_size(tmp_path) == plog.size_bytes        # ...but written to the file
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
