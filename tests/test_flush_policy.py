"""Kafka's flush policy as an opt-in: with log.flush.interval.* set, data is acknowledged and visible once written
and fsynced on the interval; by default every acknowledgement waits for its fsync."""
import trio

from broker_runner import run_with_broker
from trireme.server.broker import Broker
from trireme.server.clock import now_ms
from trireme.server.config import Config
from trireme.wire import records as rec


def _broker(tmp_path, **props) -> Broker:
    config = Config(data_dir=str(tmp_path))
    config.update(props)
    return Broker(config)


def _append(broker, p, n):
    data = bytearray(rec.build_batch([(None, b"v%d" % i) for i in range(n)]))
    p.log.append(data, rec.validate_batches(data), now_ms())
    broker.appended(p)


async def _until_durable(p, offset: int) -> None:
    with trio.fail_after(5):
        while p.log.durable_offset < offset:
            await trio.sleep(0.005)


def _broker_with_partition(tmp_path, **props):
    """A broker with the flush policy ``props`` and the partition t-0."""
    broker = _broker(tmp_path, **props)
    broker.create_topic("t", 1)
    return broker, broker.partition("t", 0)


def test_default_acknowledges_only_what_is_fsynced(tmp_path):
    broker, p = _broker_with_partition(tmp_path)

    async def body(b):
        _append(b, p, 5)
        assert p.log.high_watermark == 0            # not visible before the fsync
        assert await b.wait_durable(p, 4)
        assert p.log.high_watermark == p.log.durable_offset == 5
    run_with_broker(broker, body)
    assert not broker.ack_before_flush


def test_flush_interval_messages(tmp_path):
    broker, p = _broker_with_partition(tmp_path, **{"log.flush.interval.messages": 10})

    async def body(b):
        _append(b, p, 5)
        assert await b.wait_durable(p, 4)            # acknowledged after the write
        assert (p.log.high_watermark, p.log.durable_offset) == (5, 0)
        await trio.sleep(0.05)
        assert p.log.durable_offset == 0             # under the interval: no fsync yet
        _append(b, p, 6)                             # 11 unflushed: over the interval
        await _until_durable(p, 11)
    run_with_broker(broker, body)
    broker.close()                                   # shutdown flushes too
    assert p.log.durable_offset == p.log.log_end_offset


def test_flush_interval_ms(tmp_path):
    broker, p = _broker_with_partition(tmp_path, **{"log.flush.interval.ms": 50})

    async def body(b):
        _append(b, p, 3)
        assert (p.log.high_watermark, p.log.durable_offset) == (3, 0)
        await _until_durable(p, 3)
    run_with_broker(broker, body)
