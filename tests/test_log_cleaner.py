"""The log cleaner's runtime: retention by cleanup.policy, segment.ms rolling, the log.cleaner.* properties, and
the scheduling of server/log_cleaner.py (against a stand-in of state/cleaner.py's interface until it lands)."""
from __future__ import annotations

import os
import struct
import threading
import time

import pytest
import trio
from broker_runner import run_with_broker

from tests.cleaner_stub import EndlessCore, FailingCore, StubCore
from tests.test_log import append, make_batch
from trireme.server.broker import Broker, log_settings
from trireme.server.cli import build_parser, load_config
from trireme.server.clock import now_ms
from trireme.server.config import Config, ConfigError
from trireme.server.log_cleaner import LogCleaner, Throttler
from trireme.state.log import PartitionLog
from trireme.state.storage import MemoryStorage
from trireme.wire import records as rec

DIR = "logs/t-0"
MINUTE = 60_000


def _config(tmp_path, *argv):
    return load_config(build_parser().parse_args(["serve", "--data-dir", str(tmp_path), *argv]))


# --- retention and rolling ----------------------------------------------------------------------

def _topic(**overrides) -> dict[str, str]:
    return {"cleanup.policy": "delete", "segment.bytes": "1000", "retention.ms": "5", "retention.bytes": "7",
            "segment.ms": "604800000", "segment.jitter.ms": "0", "max.compaction.lag.ms": str(2**63 - 1), **overrides}


@pytest.mark.parametrize("policy, retained", [("delete", True), ("compact", False), ("compact,delete", True),
                                              ("delete, compact", True)])
def test_time_and_size_retention_only_with_the_delete_policy(policy, retained):
    settings = log_settings(_topic(**{"cleanup.policy": policy}))
    assert (settings["retention_ms"], settings["retention_bytes"]) == ((5, 7) if retained else (-1, -1))


def test_a_compacted_topic_rolls_by_max_compaction_lag_when_shorter_than_segment_ms():
    topic = _topic(**{"segment.ms": "600000", "max.compaction.lag.ms": "60000"})
    assert log_settings(topic)["segment_ms"] == 600000
    assert log_settings({**topic, "cleanup.policy": "compact"})["segment_ms"] == 60000
    assert log_settings({**topic, "cleanup.policy": "compact", "max.compaction.lag.ms": "9000000"})["segment_ms"] \
        == 600000


def test_segment_ms_rolls_on_the_append_that_comes_after_it():
    log = PartitionLog.open(MemoryStorage(), DIR, segment_ms=10 * MINUTE, now_ms=0)
    append(log, make_batch([b"a"], timestamp=1_000))
    append(log, make_batch([b"b"], timestamp=1_000 + 10 * MINUTE))          # exactly segment.ms: no roll
    assert log.segment_base_offsets == [0]
    append(log, make_batch([b"c"], timestamp=1_001 + 10 * MINUTE))
    assert log.segment_base_offsets == [0, 2]


def test_segment_ms_after_reopening_reads_the_first_batchs_timestamp():
    storage = MemoryStorage()
    log = PartitionLog.open(storage, DIR, now_ms=0)
    append(log, make_batch([b"a"], timestamp=1_000))
    log.sync(0)
    log.close()
    log = PartitionLog.open(storage, DIR, segment_ms=MINUTE, now_ms=10**9)
    append(log, make_batch([b"b"], timestamp=1_000 + MINUTE))
    assert log.segment_base_offsets == [0]
    append(log, make_batch([b"c"], timestamp=2_000 + MINUTE))
    assert log.segment_base_offsets == [0, 2]


def test_segment_ms_without_timestamps_counts_from_the_segments_creation():
    log = PartitionLog.open(MemoryStorage(), DIR, segment_ms=MINUTE, now_ms=0)
    append(log, make_batch([b"a"], timestamp=-1), now_ms=100)
    append(log, make_batch([b"b"], timestamp=-1), now_ms=MINUTE)
    assert log.segment_base_offsets == [0]
    append(log, make_batch([b"c"], timestamp=-1), now_ms=MINUTE + 1)
    assert log.segment_base_offsets == [0, 2]


def test_segment_jitter_takes_a_share_below_segment_ms():
    log = PartitionLog.open(MemoryStorage(), DIR, segment_ms=MINUTE, segment_jitter_ms=10 * MINUTE, now_ms=0)
    assert all(0 <= log._roll_jitter() < MINUTE for _ in range(200))


# --- broker properties ----------------------------------------------------------------------------

def test_log_roll_and_cleaner_defaults_are_kafkas(tmp_path):
    config = _config(tmp_path)
    assert config["log.roll.ms"] == 7 * 24 * 3_600_000
    assert config["log.roll.jitter.ms"] == 0
    assert config["log.cleaner.enable"] is True
    assert config["log.cleaner.threads"] == 1
    assert config["log.cleaner.backoff.ms"] == 15000
    assert config["log.cleaner.dedupe.buffer.size"] == 134217728
    assert config["log.cleaner.min.cleanable.ratio"] == 0.5
    assert config["log.cleaner.delete.retention.ms"] == 86400000
    assert config["log.cleaner.min.compaction.lag.ms"] == 0
    assert config["log.cleaner.max.compaction.lag.ms"] == 2**63 - 1
    assert config["log.cleaner.io.max.bytes.per.second"] == 1.7976931348623157e308


def test_log_roll_hours_and_cleaner_properties_set_topic_defaults(tmp_path):
    from trireme.server.config import TOPIC_DEFAULT_PROPERTIES  # noqa: PLC0415
    config = _config(tmp_path, "--set", "log.roll.hours=2", "--set", "log.cleaner.min.cleanable.ratio=0.25",
                     "--set", "log.cleaner.io.max.bytes.per.second=1048576")
    assert config["log.roll.ms"] == 2 * 3_600_000
    assert config["log.cleaner.min.cleanable.ratio"] == 0.25
    assert config["log.cleaner.io.max.bytes.per.second"] == 1048576.0
    assert TOPIC_DEFAULT_PROPERTIES["segment.ms"] == "log.roll.ms"
    assert TOPIC_DEFAULT_PROPERTIES["min.cleanable.dirty.ratio"] == "log.cleaner.min.cleanable.ratio"
    assert _config(tmp_path, "--set", "log.roll.ms=5", "--set", "log.roll.hours=2")["log.roll.ms"] == 5


@pytest.mark.parametrize("setting", ["log.cleaner.min.cleanable.ratio=1.5", "log.cleaner.min.cleanable.ratio=x",
                                     "log.cleaner.io.max.bytes.per.second=0", "log.cleaner.threads=-1",
                                     "log.roll.hours=0", "log.cleaner.max.compaction.lag.ms=0",
                                     "log.cleaner.backoff.ms=-1", "log.cleaner.enable=maybe"])
def test_bad_cleaner_and_roll_values_are_refused(tmp_path, setting):
    with pytest.raises(ConfigError):
        _config(tmp_path, "--set", setting)


# --- scheduling (server/log_cleaner.py against tests/cleaner_stub.py) ------------------------------------------


def _broker(tmp_path, **props) -> Broker:
    config = Config(data_dir=str(tmp_path))
    config.update({"log.cleaner.backoff.ms": 50, **props})
    return Broker(config)


def _alter_configs(broker, topic: str, ops) -> None:
    """IncrementalAlterConfigs on a broker not serving yet: the record written at once, as start-up writes them."""
    broker.cluster_metadata.bootstrap(broker.topics.alter_configs(topic, ops)[0])


def _fill(broker, topic: str, batches: int, *, keys: int = 10, policy: str = "compact") -> None:
    """``batches`` batches of 10 records to a new topic whose segments hold about 2 batches each."""
    broker.ensure_topic(topic, 1, {"cleanup.policy": policy, "segment.bytes": "400"})
    p = broker.partition(topic, 0)
    for b in range(batches):
        data = bytearray(rec.build_batch([(b"k%d" % ((b * 10 + i) % keys), b"v%d" % b) for i in range(10)]))
        p.log.append(data, rec.validate_batches(data), now_ms())
    p.log.flush_done(p.log.flush_begin())


def _cleaner(broker, core=None, isolation="thread") -> LogCleaner:
    """The broker's cleaner on the stand-in core; its task does not run with the broker's (tests call clean_once or
    start ``run`` themselves)."""
    cleaner = LogCleaner(broker, core or StubCore(), isolation=isolation)
    broker.log_cleaner = LogCleaner(broker, StubCore(), isolation=isolation)
    broker.log_cleaner.enabled = False
    broker.log_cleaner.in_progress = cleaner.in_progress          # retention sees the one in the test
    return cleaner


def test_the_dirtiest_cleanable_compacted_partition_goes_first(tmp_path):
    broker = _broker(tmp_path)
    _fill(broker, "little", 4)
    _fill(broker, "much", 12)
    _fill(broker, "deleted-only", 12, policy="delete")
    cleaner = _cleaner(broker)
    core = cleaner.core
    core.first_dirty[broker.partition("little", 0)] = 0
    core.first_dirty[broker.partition("much", 0)] = 0

    async def body(b):
        assert await cleaner.clean_once()
        assert await cleaner.clean_once()
        assert not await cleaner.clean_once()         # both clean now: nothing left
    run_with_broker(broker, body)
    names = [p.topic.name for p, _ in core.finished]
    assert sorted(names[:2]) == ["little", "much"]
    assert "deleted-only" not in {p.topic.name for p, _ in core.planned}
    assert cleaner.cleanings == 2 and cleaner.bytes_read > 0
    assert cleaner.stats(broker.partition("much", 0)).cleanings == 1


def test_the_highest_dirty_ratio_wins(tmp_path):
    broker = _broker(tmp_path)
    _fill(broker, "a", 12)
    _fill(broker, "b", 12)
    cleaner = _cleaner(broker)
    a, b = broker.partition("a", 0), broker.partition("b", 0)
    cleaner.core.first_dirty[a] = a.log.segment_base_offsets[1]      # a: a segment clean already
    partition, plan = cleaner.grab_filthiest(now_ms())
    assert partition is b and plan.dirty_ratio == 1.0
    assert cleaner.busy(b)
    partition, plan = cleaner.grab_filthiest(now_ms())               # b is in progress: the next one is a
    assert partition is a and plan.dirty_ratio < 1.0
    assert cleaner.dirty_ratios(now_ms())[("a", 0)] == plan.dirty_ratio


def test_min_cleanable_dirty_ratio_from_the_topic_and_the_broker_default(tmp_path):
    broker = _broker(tmp_path, **{"log.cleaner.min.cleanable.ratio": 0.9})
    _fill(broker, "t", 12)
    cleaner = _cleaner(broker)
    p = broker.partition("t", 0)
    cleaner.core.first_dirty[p] = p.log.segment_base_offsets[3]      # dirty ratio below 0.9
    assert cleaner.grab_filthiest(now_ms()) is None
    _alter_configs(broker, "t", [("min.cleanable.dirty.ratio", 0, "0.1")])
    assert cleaner.grab_filthiest(now_ms())[0] is p


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_cleaning_runs_off_the_event_loop_and_finishes_on_it(tmp_path, isolation):
    broker = _broker(tmp_path)
    _fill(broker, "t", 12)
    cleaner = _cleaner(broker, isolation=isolation)
    loop_thread = []
    core = cleaner.core
    finish = core.finish
    core.finish = lambda partition, result: (loop_thread.append(threading.get_ident()), finish(partition, result))

    async def body(b):
        ticks = 0

        async def tick():
            nonlocal ticks
            while True:
                await trio.sleep(0)
                ticks += 1
        async with trio.open_nursery() as nursery:
            nursery.start_soon(tick)
            assert await cleaner.clean_once()
            nursery.cancel_scope.cancel()
        assert ticks > 0                                 # the event loop ran during the cleaning
    run_with_broker(broker, body)
    assert loop_thread == [threading.get_ident()]
    (_, result), = core.finished
    assert result.bytes_read == sum(size for _, size in result.plan.segments) and result.keys == 10


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_shutdown_ends_a_long_cleaning(tmp_path, isolation):
    broker = _broker(tmp_path)
    _fill(broker, "t", 12)
    cleaner = _cleaner(broker, EndlessCore(), isolation=isolation)
    ended = []

    async def body(b):
        with trio.move_on_after(0.5 if isolation == "thread" else 3):
            await cleaner.clean_once()
        ended.append(time.monotonic())
    run_with_broker(broker, body)
    assert ended and not cleaner.in_progress and cleaner.cleanings == 0 and not cleaner.core.finished
    assert [p.topic.name for p, _ in cleaner.core.abandoned] == ["t"]      # its files removed, a later one may start


def test_a_failed_cleaning_leaves_the_partition_alone_for_a_while(tmp_path):
    broker = _broker(tmp_path)
    _fill(broker, "t", 12)
    cleaner = _cleaner(broker, FailingCore())

    async def body(b):
        assert await cleaner.clean_once()
        assert not await cleaner.clean_once()
    run_with_broker(broker, body)
    stats = cleaner.stats(broker.partition("t", 0))
    assert cleaner.failures == 1 and "Input/output error" in stats.last_error
    assert stats.uncleanable_until_ms > now_ms() and not cleaner.in_progress
    assert [p.topic.name for p, _ in cleaner.core.abandoned] == ["t"]


def test_the_cleaner_task_backs_off_and_cleans(tmp_path):
    broker = _broker(tmp_path)
    cleaner = _cleaner(broker)

    async def body(b):
        async with trio.open_nursery() as nursery:
            await nursery.start(cleaner.run)
            await trio.sleep(0.2)                        # nothing cleanable: backing off
            _fill(b, "t", 12)
            with trio.fail_after(10):
                while not cleaner.cleanings:
                    await trio.sleep(0.02)
            nursery.cancel_scope.cancel()
    run_with_broker(broker, body)


def test_log_cleaner_enable_false_runs_nothing(tmp_path):
    broker = _broker(tmp_path, **{"log.cleaner.enable": False})
    _fill(broker, "t", 12)
    cleaner = _cleaner(broker)

    async def body(b):
        async with trio.open_nursery() as nursery:
            await nursery.start(cleaner.run)
            await trio.sleep(0.3)
            nursery.cancel_scope.cancel()
    run_with_broker(broker, body)
    assert cleaner.cleanings == 0 and not cleaner.core.planned


def test_retention_leaves_a_partition_being_cleaned_alone(tmp_path):
    broker = _broker(tmp_path, **{"log.retention.check.interval.ms": 10})
    _fill(broker, "t", 12, policy="compact,delete")
    _alter_configs(broker, "t", [("retention.bytes", 0, "100")])
    cleaner = _cleaner(broker)
    p = broker.partition("t", 0)
    cleaner.in_progress.add(p)

    async def body(b):
        await trio.sleep(0.2)
        assert p.log.log_start_offset == 0
        cleaner.in_progress.discard(p)
        with trio.fail_after(5):
            while p.log.log_start_offset == 0:
                await trio.sleep(0.01)
    run_with_broker(broker, body)


def test_throttler_sleeps_down_to_the_rate():
    clock = [0.0]
    slept = []
    throttler = Throttler(1000.0, clock=lambda: clock[0], sleep=lambda s: (slept.append(s), clock.__setitem__(0, clock[0] + s)))
    throttler(100)
    clock[0] = 0.1
    throttler(100)                                      # not yet a check interval: no sleep
    assert slept == []
    clock[0] = 0.4
    throttler(800)                                      # 1000 bytes in 0.4 s at 1000 B/s: 0.6 s more
    assert slept == [pytest.approx(0.6)]
    clock[0] += 1.0
    throttler(100)                                      # 100 bytes in 1 s: under the rate
    assert slept == [pytest.approx(0.6)]
    unlimited = Throttler(1.7976931348623157e308, sleep=lambda s: slept.append(s))
    unlimited(10**12)
    assert len(slept) == 1


# --- visibility ------------------------------------------------------------------------------------------------

def test_metrics_and_status_page_show_the_cleaning(tmp_path):
    from trireme.server.metrics import render_broker
    from trireme.server.status_page import StatusPage
    broker = _broker(tmp_path, **{"trireme.metrics.log.cleaner.max.partitions": 1})
    _fill(broker, "dirtier", 12)
    _fill(broker, "cleaner", 12)
    _fill(broker, "plain", 12, policy="delete")
    cleaner = _cleaner(broker)
    broker.log_cleaner = cleaner
    cleaner.enabled = False                             # cleaned by the test's clean_once only
    cleaner.core.first_dirty[broker.partition("cleaner", 0)] = broker.partition("cleaner", 0).log.segment_base_offsets[2]
    text = render_broker(broker)
    assert 'trireme_log_cleaner_dirty_ratio{topic="dirtier",partition="0"} 1' in text
    assert 'topic="cleaner"' not in text.split("trireme_log_cleaner_dirty_ratio", 1)[1].split("# HELP", 1)[0]
    assert "trireme_log_cleaner_max_dirty_ratio 1" in text
    assert "trireme_log_cleaner_cleanings_total 0" in text

    async def body(b):
        assert await cleaner.clean_once()
    run_with_broker(broker, body)
    text = render_broker(broker)
    assert "trireme_log_cleaner_cleanings_total 1" in text
    read = cleaner.bytes_read
    assert read > 0 and f"trireme_log_cleaner_bytes_read_total {read}" in text
    assert "trireme_log_cleaner_last_cleaning_timestamp_seconds 0\n" not in text
    page = StatusPage(broker).render()
    assert "compaction</th>" in page and "cleaned " in page and "dirty 60%" in page


def test_dump_log_prints_batches_and_records_as_kafka_dump_log(tmp_path, capsys):
    from trireme.server.cli import main
    broker = _broker(tmp_path)
    broker.ensure_topic("t", 1, {"cleanup.policy": "compact"})
    p = broker.partition("t", 0)
    batches = [rec.build_batch([(b"k1", b"v1"), (b"k2", None)], producer_id=7, producer_epoch=3, base_sequence=5,
                               transactional=True, base_timestamp=1000),
               rec.build_control_batch(rec.CONTROL_COMMIT, producer_id=7, producer_epoch=3, coordinator_epoch=2,
                                       timestamp=2000)]
    for batch in batches:
        data = bytearray(batch)
        p.log.append(data, rec.validate_batches(data), now_ms())
    p.log.flush_done(p.log.flush_begin())
    broker.close()
    with open(tmp_path / "logs" / "t-0" / "00000000000000000000.log", "ab") as f:
        f.write(b"\x00\x00\x00\x00\x07\x00\x00")                   # a torn tail
    assert main(["dump-log", "--files", str(tmp_path / "logs" / "t-0"), "--print-data-log"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("Dumping ") and lines[0].endswith("00000000000000000000.log")
    assert lines[1] == "Log starting offset: 0"
    assert lines[2].startswith("baseOffset: 0 lastOffset: 1 count: 2 baseSequence: 5 lastSequence: 6 producerId: 7 "
                               "producerEpoch: 3 ")
    assert "isTransactional: true isControl: false deleteHorizonMs: OptionalLong.empty position: 0 " \
           "CreateTime: 1000 " in lines[2] and "compresscodec: none" in lines[2] and lines[2].endswith("isvalid: true")
    assert lines[3] == ("| offset: 0 CreateTime: 1000 keySize: 2 valueSize: 2 sequence: 5 headerKeys: [] "
                        "key: k1 payload: v1")
    assert lines[4] == ("| offset: 1 CreateTime: 1000 keySize: 2 valueSize: -1 sequence: 6 headerKeys: [] "
                        "key: k2 payload: null")
    assert lines[5].startswith("baseOffset: 2 lastOffset: 2 count: 1 baseSequence: -1 lastSequence: -1 producerId: 7")
    assert "isTransactional: true isControl: true" in lines[5]
    assert lines[6].endswith("endTxnMarker: COMMIT coordinatorEpoch: 2")
    assert lines[7] == "Found 7 invalid bytes at the end of 00000000000000000000.log"
    assert main(["dump-log", "--files", str(tmp_path / "logs" / "t-0" / "00000000000000000000.log")]) == 0
    assert [line[:12] for line in capsys.readouterr().out.splitlines()[2:]] == ["baseOffset: ", "baseOffset: ",
                                                                               "Found 7 inva"]
    with open(tmp_path / "logs" / "t-0" / "00000000000000000000.log", "r+b") as f:
        f.truncate(os.path.getsize(f.name) - 7)
        f.seek(0, os.SEEK_END)
        f.write(bytes(4096))                                    # zeros written ahead for appends
    assert main(["dump-log", "--files", str(tmp_path / "logs" / "t-0" / "00000000000000000000.log")]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == \
        "Found 4096 bytes of zeros (written ahead for appends) at the end of 00000000000000000000.log"
    assert main(["dump-log", "--files", str(tmp_path / "missing.log")]) == 1


# --- with the core (state/cleaner.py) ---------------------------------------------------------------------------

def _live(p) -> dict:
    """key → (offset, value) of every record left in the partition's log."""
    out = {}
    data = p.log.read(p.log.log_start_offset, 1 << 30, p.log.high_watermark)
    for pos, header in rec.iter_batch_headers(data):
        for r in rec.decode_records(data, pos):
            out.setdefault(r.key, []).append((r.offset, r.value))
    return out


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_the_core_cleans_to_the_latest_value_per_key(tmp_path, isolation):
    broker = _broker(tmp_path)
    _fill(broker, "t", 12)
    p = broker.partition("t", 0)
    before = _live(p)
    cleaner = LogCleaner(broker, isolation=isolation)
    broker.log_cleaner.enabled = False

    async def body(b):
        assert await cleaner.clean_once()
    run_with_broker(broker, body)
    after = _live(p)
    cleaned_below = p.log.cleaner_checkpoint
    assert cleaned_below > 0 and cleaner.cleanings == 1 and cleaner.bytes_written > 0
    for key, versions in before.items():
        kept = [v for v in after[key] if v[0] < cleaned_below]
        assert kept == [max(v for v in versions if v[0] < cleaned_below)]      # the latest below the checkpoint
    assert not [n for n in os.listdir(tmp_path / "logs" / "t-0") if n.endswith((".cleaned", ".swap"))]


def test_a_cleaning_cut_short_in_its_throttle_sleep_leaves_the_old_segments_and_no_files(tmp_path):
    """Shutdown during the throttle's sleep (thread isolation; a child process is killed, see
    test_shutdown_ends_a_long_cleaning): the cleaning ends at once, its files go."""
    broker = _broker(tmp_path, **{"log.cleaner.io.max.bytes.per.second": 1.0})   # throttled to a crawl
    _fill(broker, "t", 12)
    p = broker.partition("t", 0)
    before = _live(p)
    cleaner = LogCleaner(broker, isolation="thread")
    broker.log_cleaner.enabled = False

    async def body(b):
        await trio.sleep(0.35)                  # a throttle check interval since it began: the first call sleeps
        with trio.move_on_after(1):
            await cleaner.clean_once()
    started = time.monotonic()
    run_with_broker(broker, body)
    assert time.monotonic() - started < 30          # not the hours its throttle asked for
    assert cleaner._throttler.throttled_s > 100           # it was asleep: kilobytes at 1 byte/s
    assert cleaner.cleanings == 0 and not cleaner.in_progress
    assert _live(p) == before and p.log.cleaner_checkpoint == 0
    assert not [n for n in os.listdir(tmp_path / "logs" / "t-0") if n.endswith((".cleaned", ".swap"))]
    assert p.log.cleanable(now_ms(), None, cleaner.cleaner_config(p)) is not None      # a later one may start


def test_a_partition_deleted_during_its_cleaning_is_given_up_quietly(tmp_path, caplog):
    broker = _broker(tmp_path)
    _fill(broker, "t", 12)
    cleaner = _cleaner(broker, FailingCore())
    core = cleaner.core
    clean = core.clean_function()

    token = []

    def delete_then_fail(storage, plan, throttle):
        trio.from_thread.run(broker.delete_topic, "t", trio_token=token[0])
        return clean(storage, plan, throttle)
    core.clean_function = lambda: delete_then_fail

    async def body(b):
        token.append(trio.lowlevel.current_trio_token())
        assert await cleaner.clean_once()
    run_with_broker(broker, body)
    assert cleaner.failures == 0 and not core.finished
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


def _policy_and_nice(pid: int) -> tuple[int, int]:
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return int(fields[38]), int(fields[16])          # policy (field 41), nice (field 19)


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE") or not os.path.exists("/proc/self/stat"),
                    reason="SCHED_IDLE and /proc are Linux's")
def test_a_cleaner_child_runs_at_idle_priority_and_a_starving_one_goes_on_at_nice_19(monkeypatch):
    """run_when_idle puts a child at SCHED_IDLE; keep_from_starving moves one that got (almost) no CPU over a window
    to normal scheduling at nice 19, and leaves one that got its share alone."""
    import subprocess

    from trireme.server import log_cleaner
    monkeypatch.setattr(log_cleaner, "STARVED_WINDOW_S", 0.05)
    starving = subprocess.Popen(["sleep", "30"])                      # uses no CPU: starving, as far as anyone can tell
    fed = subprocess.Popen(["sleep", "30"])
    try:
        for child in (starving, fed):
            assert log_cleaner.run_when_idle(child.pid)
            assert _policy_and_nice(child.pid) == (os.SCHED_IDLE, 0)

        async def watch(pid):
            with trio.fail_after(10):
                await log_cleaner.keep_from_starving(pid)
        trio.run(watch, starving.pid)
        assert _policy_and_nice(starving.pid) == (os.SCHED_OTHER, 19)

        real = log_cleaner.process_cpu_seconds
        readings = iter([1.0, 1.02, 1.04, None])                       # 20 ms a 50 ms window: 40 % of a core
        monkeypatch.setattr(log_cleaner, "process_cpu_seconds", lambda pid: next(readings))
        trio.run(watch, fed.pid)
        assert _policy_and_nice(fed.pid) == (os.SCHED_IDLE, 0)
    finally:
        for child in (starving, fed):
            child.kill()
            child.wait()
    assert real(starving.pid) is None                                 # gone: nothing to read


def _segment_with_indexes(tmp_path) -> str:
    """A partition whose first segment (offsets 0-6, one 1.5 kB batch each, timestamps 1000, 1010, …) is rolled, so
    its offset and time indexes are on disk, with one aborted transaction indexed; returns the segment's path stem."""
    from trireme.state.log import AbortedTxn
    from trireme.state.storage import FileStorage
    log = PartitionLog.open(FileStorage(tmp_path), DIR, segment_bytes=12_000, now_ms=0)
    for i in range(10):
        append(log, make_batch([b"x" * 1500], timestamp=1000 + 10 * i, producer_id=9 if i == 2 else -1))
        if i == 3:
            log.add_aborted_txn(AbortedTxn(producer_id=9, first_offset=2, last_offset=3, last_stable_offset=4))
    log.sync()
    assert log.segment_base_offsets == [0, 7]
    log.close()
    return str(tmp_path / DIR / "00000000000000000000")


def test_dump_log_prints_index_files_as_kafka_dump_log(tmp_path, capsys):
    from trireme.server.cli import main
    stem = _segment_with_indexes(tmp_path)
    with open(stem + ".log", "rb") as f:
        batches = {pos: h for pos, h in rec.iter_batch_headers(f.read())}        # position → header
    unknown = stem + ".log.swap"
    open(unknown, "wb").close()
    assert main(["dump-log", "--files", f"{stem}.index,{stem}.timeindex,{stem}.txnindex,{unknown}"]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert lines[0] == f"Dumping {stem}.index"
    index = [line.split() for line in lines[1:lines.index(f"Dumping {stem}.timeindex")]]
    assert len(index) >= 2
    for words in index:                             # offset: O position: P, P where the batch of base offset O is
        assert words[0] == "offset:" and words[2] == "position:"
        assert batches[int(words[3])].base_offset == int(words[1])
    at = lines.index(f"Dumping {stem}.timeindex")
    times = [line.split() for line in lines[at + 1:lines.index(f"Dumping {stem}.txnindex")]]
    by_offset = {h.base_offset: h.max_timestamp for h in batches.values()}
    assert len(times) >= 2 and [int(w[1]) for w in times] == sorted({int(w[1]) for w in times})
    for words in times:                             # timestamp: T offset: O, T the max timestamp of batch O
        assert words[0] == "timestamp:" and words[2] == "offset:"
        assert by_offset[int(words[3])] == int(words[1])
    at = lines.index(f"Dumping {stem}.txnindex")
    assert lines[at + 1:] == ["version: 0 producerId: 9 firstOffset: 2 lastOffset: 3 lastStableOffset: 4",
                              f"Dumping {unknown}"]
    assert captured.err == f"Ignoring unknown file {unknown}\n"

    # What does not match the segment is listed on stderr after all files, as Kafka's tool does.
    first_index = (int(index[0][1]), int(index[0][3]))
    with open(stem + ".index", "r+b") as f:
        f.write(struct.pack(">ii", first_index[0], first_index[1] + 1))
        f.seek(0, os.SEEK_END)
        f.write(b"\x01\x02\x03")
    with open(stem + ".timeindex", "wb") as f:
        for ts, rel in [(1020, 2), (1010, 1), (1061, 6), (1070, 99)]:
            f.write(struct.pack(">qi", ts, rel))
    with open(stem + ".txnindex", "ab") as f:
        f.write(b"\x00" * 48)                       # an entry whose checksum does not hold
    empty = str(tmp_path / DIR / "00000000000000000007.index")
    open(empty, "wb").close()
    args = ["dump-log", "--files", f"{stem}.index,{stem}.timeindex,{stem}.txnindex,{empty}"]
    assert main(args) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert f"offset: {first_index[0]} position: {first_index[1] + 1}" in lines
    assert "Found 3 invalid bytes at the end of 00000000000000000000.index" in lines
    assert lines[-4:] == ["version: 0 producerId: 9 firstOffset: 2 lastOffset: 3 lastStableOffset: 4",
                          "Found 48 invalid bytes at the end of 00000000000000000000.txnindex",
                          f"Dumping {empty}", f"{empty} is empty."]
    assert captured.err.splitlines() == [
        f"Mismatches in :{stem}.index", f"  Index offset: {first_index[0]}, log offset: -1",
        f"Found timestamp mismatch in :{stem}.timeindex", "  Index timestamp: 1061, log timestamp: 1060",
        f"Found out of order timestamp in :{stem}.timeindex",
        "  Index timestamp: 1010, Previously indexed timestamp: 1020",
        "The following indexed offsets are not found in the log.", "Indexed offset: 99, found log offset: -1"]
    assert main([*args, "--verify-index-only"]) == 0
    captured = capsys.readouterr()
    assert not [line for line in captured.out.splitlines() if line.startswith(("offset: ", "timestamp: "))]
    assert len(captured.err.splitlines()) == 8
