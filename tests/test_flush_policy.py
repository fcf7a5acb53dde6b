"""Kafka's flush policy as an opt-in: with log.flush.interval.* set, data is acknowledged and visible once written
and fsynced on the interval; by default every acknowledgement waits for its fsync."""
import threading

import pytest
import trio

from broker_runner import run_with_broker
from trireme.server.broker import Broker
from trireme.server.clock import now_ms
from trireme.server.config import Config, ConfigError
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
    broker.ensure_topic("t", 1)
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


def test_a_round_over_many_partitions_fsyncs_them_at_once_and_keeps_each_failure_its_own(tmp_path, monkeypatch):
    """The flush round's fsyncs run at once (the flush thread and its helpers), and a partition whose fsync fails
    fails alone: the others of the same round become durable."""
    at_once = 4
    broker = _broker(tmp_path, **{"trireme.fsync.threads": at_once})
    broker.ensure_topic("t", 6)
    parts = [broker.partition("t", i) for i in range(6)]
    together = threading.Barrier(at_once, timeout=10)       # only passes if they run at once
    threads = set()
    for i, p in enumerate(parts[:at_once]):
        real = p.log.flush

        def flush(target, real=real, failing=(i == 1)):
            threads.add(threading.current_thread().name)
            together.wait()
            if failing:
                raise OSError(5, "injected fsync failure")
            real(target)
        monkeypatch.setattr(p.log, "flush", flush)

    async def body(b):
        for p in parts:
            _append(b, p, 2)
        with trio.fail_after(10):
            while any(p.log.durable_offset < 2 for i, p in enumerate(parts) if i != 1) or parts[1].storage_error is None:
                await trio.sleep(0.005)
    run_with_broker(broker, body)
    assert len(threads) == at_once
    assert parts[1].storage_error is not None and parts[1].log.durable_offset == 0
    assert all(p.log.durable_offset == 2 and p.storage_error is None for i, p in enumerate(parts) if i != 1)


def test_with_one_fsync_thread_a_round_fsyncs_one_partition_after_another(tmp_path, monkeypatch):
    broker = _broker(tmp_path, **{"trireme.fsync.threads": 1})
    broker.ensure_topic("t", 3)
    parts = [broker.partition("t", i) for i in range(3)]
    threads = []
    for p in parts:
        real = p.log.flush

        def flush(target, real=real):
            threads.append(threading.current_thread().name)
            real(target)
        monkeypatch.setattr(p.log, "flush", flush)

    async def body(b):
        for p in parts:
            _append(b, p, 1)
        await _until_durable(parts[0], 1)
        for p in parts:
            await _until_durable(p, 1)
    run_with_broker(broker, body)
    assert threads == ["trireme-flush"] * 3


def test_the_fsync_threads_must_be_from_1_to_64():
    config = Config(data_dir="/data")
    for bad in ("0", "65", "-1"):
        with pytest.raises(ConfigError, match="from 1 to 64"):
            config.set("trireme.fsync.threads", bad)
    config.set("trireme.fsync.threads", "1")
    assert config["trireme.fsync.threads"] == 1


def test_after_a_small_round_the_flush_thread_writes_zeros_ahead_once_the_round_is_answered(tmp_path, monkeypatch):
    """Appends that follow then write over written blocks (AppendFile.preallocate): the zeros are written in the
    flush thread after the round's high watermark moved, so no answer waits for them."""
    broker, p = _broker_with_partition(tmp_path)
    handle = p.log._segments[-1].handle
    calls = []
    real = handle.preallocate

    def preallocate(end):
        calls.append((threading.current_thread().name, p.log.high_watermark, end))
        real(end)
    monkeypatch.setattr(handle, "preallocate", preallocate)

    async def body(b):
        _append(b, p, 5)
        assert await b.wait_durable(p, 4)
        with trio.fail_after(5):
            while not calls:
                await trio.sleep(0.005)
    run_with_broker(broker, body)
    [(thread, high_watermark, end)] = calls
    assert thread == "trireme-flush" and high_watermark == 5 and end > p.log.size_bytes
    assert (tmp_path / "logs" / "t-0" / "00000000000000000000.log").stat().st_size == end
    broker.close()                                  # and a closed log keeps no zeros
    assert (tmp_path / "logs" / "t-0" / "00000000000000000000.log").stat().st_size == p.log.size_bytes


def test_without_fsync_nothing_is_written_ahead(tmp_path):
    broker, p = _broker_with_partition(tmp_path, **{"trireme.fsync.enable": "false"})

    async def body(b):
        _append(b, p, 5)
        assert await b.wait_durable(p, 4)
        await trio.sleep(0.05)
    run_with_broker(broker, body)
    assert (tmp_path / "logs" / "t-0" / "00000000000000000000.log").stat().st_size == p.log.size_bytes


def test_nothing_is_written_ahead_when_the_file_system_is_short_of_space(tmp_path, monkeypatch):
    broker, p = _broker_with_partition(tmp_path)
    monkeypatch.setattr(broker.storage, "available_bytes", lambda path: 100 << 20)

    async def body(b):
        for _ in range(3):
            _append(b, p, 5)
            assert await b.wait_durable(p, p.log.log_end_offset - 1)
            await trio.sleep(0.02)
    run_with_broker(broker, body)
    assert (tmp_path / "logs" / "t-0" / "00000000000000000000.log").stat().st_size == p.log.size_bytes
