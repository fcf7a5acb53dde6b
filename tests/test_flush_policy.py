"""Kafka's flush policy as an opt-in: with log.flush.interval.* set, data is acknowledged and visible once written
and fsynced on the interval; by default every acknowledgement waits for its fsync."""
import threading

import pytest
import trio

from broker_runner import run_with_broker
from trireme.server import broker as broker_mod
from trireme.server.broker import Broker
from trireme.server.clock import now_ms
from trireme.server.config import Config, ConfigError
from trireme.state import log as log_mod
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


def _rounds_by_thread(tmp_path, monkeypatch, rounds: int, slow_round: int | None = None,
                      pause: float = 0.002, busy: bool = False) -> tuple[Broker, list]:
    """``rounds`` flush rounds of one small append each on t-0, ``pause`` apart → the broker and, per round, the name
    of the thread its fsync ran in.  Every fsync is reported as short but round ``slow_round``'s, reported as taking
    1 s (the durations are the test's, not the disk's).  ``busy``: meanwhile a task is always ready to run."""
    broker, p = _broker_with_partition(tmp_path)
    seen = []
    real_flush = p.log.flush

    def flush(target):
        seen.append(threading.current_thread().name)
        real_flush(target)
    monkeypatch.setattr(p.log, "flush", flush)
    real_flush_all = broker._flush_all

    def flush_all(batch, fan_out):
        failures, _seconds = real_flush_all(batch, fan_out)
        return failures, (1.0 if len(seen) - 1 == slow_round else 0.0)
    monkeypatch.setattr(broker, "_flush_all", flush_all)

    async def rounds_of_appends(b):
        for _ in range(rounds):
            _append(b, p, 3)
            assert await b.wait_durable(p, p.log.log_end_offset - 1)
            await trio.sleep(pause)                 # the zeros written ahead meanwhile

    async def body(b):
        async with trio.open_nursery() as nursery:
            if busy:
                nursery.start_soon(_spin)
            await rounds_of_appends(b)
            nursery.cancel_scope.cancel()
    run_with_broker(broker, body)
    return broker, seen


async def _spin():
    while True:
        await trio.lowlevel.checkpoint()


def test_short_fsyncs_of_data_alone_run_on_the_event_loop_once_they_were_short_often_enough(tmp_path, monkeypatch):
    """A round of one partition whose appends lie over zeros written ahead has data alone to sync; after
    INLINE_FSYNC_STREAK such short fsyncs in the flush thread, the next run on the event loop (Broker._fsync_round),
    sparing the round the hops to the thread and back."""
    loop = threading.current_thread().name          # run_with_broker runs trio here
    streak = broker_mod.INLINE_FSYNC_STREAK
    broker, seen = _rounds_by_thread(tmp_path, monkeypatch, streak + 12)
    assert loop not in seen[:streak + 1]            # the first round made the segment: it had metadata to sync
    assert seen[-10:].count(loop) >= 8              # (a round whose loop was busy, by a timer, goes to the thread)
    assert broker.metrics.fsyncs_inline == seen.count(loop)


def test_an_fsync_that_took_long_sends_the_next_ones_to_the_flush_thread(tmp_path, monkeypatch):
    """A disk that turns slow stalls the event loop once, by one fsync: the rounds after it fsync in the flush thread
    until INLINE_FSYNC_STREAK of them were short again."""
    loop = threading.current_thread().name
    streak = broker_mod.INLINE_FSYNC_STREAK
    slow = streak + 6
    broker, seen = _rounds_by_thread(tmp_path, monkeypatch, 2 * streak + 12, slow_round=slow)
    assert loop in seen[:slow]
    assert loop not in seen[slow + 1: slow + 1 + streak]
    assert loop in seen[slow + 1 + streak:]


def test_a_streak_of_short_fsyncs_from_long_ago_does_not_count(tmp_path, monkeypatch):
    monkeypatch.setattr(broker_mod, "INLINE_FSYNC_STREAK_S", 0.05)
    loop = threading.current_thread().name
    _broker, seen = _rounds_by_thread(tmp_path, monkeypatch, broker_mod.INLINE_FSYNC_STREAK + 6, pause=0.1)
    assert loop not in seen


def test_no_fsync_runs_on_a_busy_event_loop(tmp_path, monkeypatch):
    """A task that is always ready to run keeps the loop from going idle: every round fsyncs in the flush thread."""
    loop = threading.current_thread().name
    _broker, seen = _rounds_by_thread(tmp_path, monkeypatch, broker_mod.INLINE_FSYNC_STREAK + 8, busy=True)
    assert len(seen) == broker_mod.INLINE_FSYNC_STREAK + 8 and loop not in seen


def test_a_deleted_topics_files_count_as_to_release_until_their_blocks_are_freed(tmp_path, monkeypatch):
    """trireme_segment_files_to_release: what a benchmark (bench/kafka_side_by_side.py) or an operator waits on
    before the disk's space, and its fsyncs, are back to normal."""
    from trireme.server.metrics import render_broker
    monkeypatch.setattr(broker_mod, "RELEASE_PAUSE_S", 0.1)      # a cut of 64 KiB every 0.1 s: the file, with its
                                                                    # zeros written ahead, goes in several cuts
    monkeypatch.setattr(log_mod, "RELEASE_STEP_BYTES", 64 << 10)
    broker, p = _broker_with_partition(tmp_path)
    seen = []

    async def body(b):
        for _ in range(4):
            _append(b, p, 200)
        assert await b.wait_durable(p, p.log.log_end_offset - 1)
        assert b.files_to_release == 0
        await b.delete_topic("t")
        seen.append(b.files_to_release)
        seen.append(render_broker(b))
        with trio.fail_after(10):
            while b.files_to_release:
                await trio.sleep(0.005)
    run_with_broker(broker, body)
    assert seen[0] == 1 and "trireme_segment_files_to_release 1" in seen[1]
    assert "trireme_segment_files_to_release 0" in render_broker(broker)
