"""The log cleaner's runtime: retention by cleanup.policy, segment.ms rolling, the log.cleaner.* properties, and
the scheduling of server/log_cleaner.py (against a stand-in of state/cleaner.py's interface until it lands)."""
from __future__ import annotations

import pytest

from tests.test_log import append, make_batch
from trireme.server.broker import log_settings
from trireme.server.cli import build_parser, load_config
from trireme.server.config import ConfigError
from trireme.state.log import PartitionLog
from trireme.state.storage import MemoryStorage

DIR = "logs/t-0"
MINUTE = 60_000


def _config(tmp_path, *argv):
    return load_config(build_parser().parse_args(["serve", "--data-dir", str(tmp_path), *argv]))


# --- retention and rolling ----------------------------------------------------------------------

def _topic(**overrides) -> dict[str, str]:
    return {"cleanup.policy": "delete", "segment.bytes": "1000", "retention.ms": "5", "retention.bytes": "7",
            "segment.ms": "604800000", "segment.jitter.ms": "0", **overrides}


@pytest.mark.parametrize("policy, retained", [("delete", True), ("compact", False), ("compact,delete", True),
                                              ("delete, compact", True)])
def test_time_and_size_retention_only_with_the_delete_policy(policy, retained):
    settings = log_settings(_topic(**{"cleanup.policy": policy}))
    assert (settings["retention_ms"], settings["retention_bytes"]) == ((5, 7) if retained else (-1, -1))


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
    from trireme.server.config import TOPIC_DEFAULT_PROPERTIES
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
