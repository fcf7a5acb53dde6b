"""Tests for state.log.PartitionLog: offsets, reads, segments, indexes, recovery, crash safety, retention."""
from __future__ import annotations

import bisect
import posixpath
import random
import struct
import threading

import crc32c
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from trireme.state import log as log_mod
from trireme.state.log import CHECKPOINT_NAME, AbortedTxn, OffsetOutOfRange, PartitionLog
from trireme.state.storage import FileStorage, MemoryStorage
from trireme.wire.records import parse_batch_header

DIR = "logs/t-0"


# --- building and parsing v2 batches (test helpers) -------------------------------------------


def _varint(n: int) -> bytes:
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def make_batch(values: list[bytes], timestamp: int = 1_000, *, max_timestamp: int | None = None,
               producer_id: int = -1, attributes: int = 0) -> bytes:
    """A valid v2 batch (base offset 0) whose records carry `values`."""
    records = bytearray()
    for i, value in enumerate(values):
        body = b"\x00" + _varint(i) + _varint(i) + _varint(-1) + _varint(len(value)) + value + _varint(0)
        records += _varint(len(body)) + body
    max_ts = timestamp + len(values) - 1 if max_timestamp is None else max_timestamp
    after_crc = struct.pack(">hiqqqhii", attributes, len(values) - 1, timestamp, max_ts, producer_id, 0, 0,
                            len(values)) + records
    return struct.pack(">qiibI", 0, 9 + len(after_crc), 0, 2, crc32c.crc32c(after_crc)) + after_crc


def headers(buf) -> list:
    out, pos = [], 0
    while pos < len(buf):
        h = parse_batch_header(buf, pos)
        out.append((pos, h))
        pos += h.size
    assert pos == len(buf), "read returned a partial batch"
    return out


def crc_ok(buf, pos, h) -> bool:
    return crc32c.crc32c(bytes(buf[pos + 21 : pos + h.size])) == h.crc


def append(log: PartitionLog, *batches: bytes, now_ms: int = 5_000, log_append_time: bool = False):
    buf = bytearray(b"".join(batches))
    return log.append(buf, headers(buf), now_ms, log_append_time)


def values_of(buf) -> list[bytes]:
    """Decode record values (test-only; the log itself never does this)."""
    out = []
    for pos, h in headers(buf):
        p = pos + log_mod.HEADER_SIZE
        for _ in range(h.records_count):
            length, p = _read_varint(buf, p)
            end = p + length
            p += 1
            for _ in range(3):
                _, p = _read_varint(buf, p)
            vlen, p = _read_varint(buf, p)
            out.append(bytes(buf[p : p + vlen]))
            p = end
    return out


def _read_varint(buf, p):
    shift = z = 0
    while True:
        b = buf[p]
        p += 1
        z |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return (z >> 1) ^ -(z & 1), p


def read_all(log: PartitionLog, from_offset: int | None = None, max_offset: int | None = None) -> bytes:
    offset = log.log_start_offset if from_offset is None else from_offset
    end = log.log_end_offset if max_offset is None else max_offset
    out = bytearray()
    while offset < end:
        data = log.read(offset, 1 << 30, end)
        assert data
        out += data
        offset = headers(data)[-1][1].next_offset
    return bytes(out)


# --- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(params=["file", "memory"])
def storage(request, tmp_path):
    return FileStorage(tmp_path) if request.param == "file" else MemoryStorage()


WRITE_BEHIND = {"write_behind": False}


@pytest.fixture(autouse=True, params=[False, True], ids=["write-through", "write-behind"])
def write_mode(request):
    """Every test runs with appends written at once and with appends written by the flush (write-behind)."""
    WRITE_BEHIND["write_behind"] = request.param
    yield request.param
    WRITE_BEHIND["write_behind"] = False


def open_log(storage, **kw) -> PartitionLog:
    kw.setdefault("now_ms", 0)
    kw.setdefault("write_behind", WRITE_BEHIND["write_behind"])
    return PartitionLog.open(storage, DIR, **kw)


def value(i: int, size: int = 20) -> bytes:
    return (b"v%d-" % i).ljust(size, b".")


# --- append and read --------------------------------------------------------------------------


def test_append_assigns_dense_offsets_and_read_round_trips(storage):
    log = open_log(storage)
    assert (log.log_start_offset, log.log_end_offset, log.high_watermark) == (0, 0, 0)
    assert append(log, make_batch([b"a", b"b", b"c"])) == (0, 2, -1)
    assert append(log, make_batch([b"d"]), make_batch([b"e", b"f"])) == (3, 5, -1)
    assert log.log_end_offset == 6 and log.high_watermark == 0
    assert log.read(0, 1 << 20, log.high_watermark) == b""  # nothing durable yet
    log.sync(0)
    assert log.high_watermark == 6
    data = log.read(0, 1 << 20, log.high_watermark)
    hs = headers(data)
    assert [h.base_offset for _, h in hs] == [0, 3, 4]
    assert all(crc_ok(data, p, h) for p, h in hs)
    assert values_of(data) == [b"a", b"b", b"c", b"d", b"e", b"f"]
    assert log.size_bytes == len(data)


def test_append_rewrites_base_offset_in_callers_buffer(storage):
    log = open_log(storage)
    append(log, make_batch([b"x"] * 7))
    buf = bytearray(make_batch([b"y"]) + make_batch([b"z"]))
    log.append(buf, headers(buf), 0)
    assert [h.base_offset for _, h in headers(buf)] == [7, 8]


def test_append_rejects_gaps_between_batches(storage):
    log = open_log(storage)
    buf = bytearray(make_batch([b"a"]) + b"\0\0" + make_batch([b"b"]))
    first = parse_batch_header(buf, 0)
    second = parse_batch_header(buf, first.size + 2)
    with pytest.raises(ValueError):
        log.append(buf, [(0, first), (first.size + 2, second)], 0)
    assert log.log_end_offset == 0


def test_read_from_middle_of_batch_returns_whole_batch(storage):
    log = open_log(storage)
    append(log, make_batch([b"a", b"b"]))
    append(log, make_batch([b"c", b"d", b"e", b"f"]))
    log.sync()
    for fetch in (2, 3, 5):
        hs = headers(log.read(fetch, 1 << 20, 6))
        assert hs[0][1].base_offset == 2
    assert headers(log.read(1, 1 << 20, 6))[0][1].base_offset == 0


def test_max_bytes_returns_whole_batches_and_kip74(storage):
    log = open_log(storage)
    batches = [make_batch([value(i, 100)]) for i in range(10)]
    for b in batches:
        append(log, b)
    log.sync()
    size = len(batches[0])
    data = log.read(0, size * 3 + size // 2, 10)
    assert len(data) == size * 3 and [h.base_offset for _, h in headers(data)] == [0, 1, 2]
    data = log.read(4, size * 2, 10)
    assert [h.base_offset for _, h in headers(data)] == [4, 5]
    # KIP-74: a first batch bigger than max_bytes comes back whole
    assert [h.base_offset for _, h in headers(log.read(7, 10, 10))] == [7]
    assert [h.base_offset for _, h in headers(log.read(7, 0, 10))] == [7]
    assert log.read(7, 10, 10, min_one_batch=False) == b""
    assert [h.base_offset for _, h in headers(log.read(7, size, 10, min_one_batch=False))] == [7]
    # first_batch_max (the response budget's room): the KIP-74 first batch only if it fits, else nothing
    assert [h.base_offset for _, h in headers(log.read(7, 10, 10, first_batch_max=size))] == [7]
    assert log.read(7, 10, 10, first_batch_max=size - 1) == b""
    assert log.read(7, 0, 10, first_batch_max=0) == b""


def test_max_offset_bound(storage):
    log = open_log(storage)
    for i in range(5):
        append(log, make_batch([value(i), value(i)]))  # offsets 2i, 2i+1
    log.sync()
    assert [h.base_offset for _, h in headers(log.read(0, 1 << 20, 6))] == [0, 2, 4]
    assert [h.base_offset for _, h in headers(log.read(0, 1 << 20, 5))] == [0, 2, 4]  # batch 4 starts below 5
    assert [h.base_offset for _, h in headers(log.read(3, 1 << 20, 4))] == [2]
    assert log.read(6, 1 << 20, 6) == b""
    assert log.read(8, 1 << 20, 6) == b""
    assert log.read(10, 1 << 20, 10) == b""  # at the log end offset
    assert log.read(0, 1 << 20, 1000) == read_all(log)  # bounded by the log end offset


def test_offset_out_of_range(storage):
    log = open_log(storage)
    append(log, make_batch([b"a"] * 3))
    log.sync()
    with pytest.raises(OffsetOutOfRange):
        log.read(4, 100, 3)
    with pytest.raises(OffsetOutOfRange):
        log.read(-1, 100, 3)
    assert log.read(3, 100, 3) == b""
    log.delete_records(2)
    with pytest.raises(OffsetOutOfRange):
        log.read(1, 100, 3)
    assert headers(log.read(2, 100, 3))[0][1].base_offset == 0  # the batch containing 2
    with pytest.raises(OffsetOutOfRange):
        log.delete_records(4)  # beyond the high watermark


def test_log_append_time(storage):
    log = open_log(storage)
    assert append(log, make_batch([b"a", b"b"], timestamp=10), now_ms=777, log_append_time=True) == (0, 1, 777)
    log.sync()
    data = log.read(0, 1000, 2)
    (pos, h), = headers(data)
    assert h.attributes & 0x08 and h.max_timestamp == 777 and h.base_timestamp == 10
    assert crc_ok(data, pos, h)
    assert log.max_timestamp() == (0, 777)


# --- segments and indexes -----------------------------------------------------------------------


def fill(log: PartitionLog, n: int, size: int = 200, ts0: int = 1_000) -> list[bytes]:
    out = []
    for i in range(n):
        out.append(value(i, size))
        append(log, make_batch([out[-1]], timestamp=ts0 + i))
    return out


def test_segment_roll_and_reads_across_segments(storage):
    log = open_log(storage, segment_bytes=2_000)
    vals = fill(log, 40)  # ~280 bytes per batch: 7 per segment
    log.sync()
    bases = log.segment_base_offsets
    assert len(bases) == 6 and bases[0] == 0 and bases == sorted(bases)
    names = storage.list(DIR)
    assert all(f"{b:020d}.log" in names for b in bases)
    assert all(f"{b:020d}.index" in names and f"{b:020d}.timeindex" in names for b in bases[:-1])
    assert all(storage.size(f"{DIR}/{b:020d}.log") <= 2_000 for b in bases)
    whole = log.read(0, 1 << 30, 40)  # one read spans every segment
    assert values_of(whole) == vals
    assert [h.base_offset for _, h in headers(whole)] == list(range(40))
    for fetch in range(40):
        assert values_of(log.read(fetch, 1 << 30, 40)) == vals[fetch:]
    # a bounded read stops inside a later segment at whole batches
    size = len(make_batch([vals[0]]))
    assert [h.base_offset for _, h in headers(log.read(5, size * 4 + size // 2, 40))] == [5, 6, 7, 8]


def test_oversized_batch_gets_own_segment(storage):
    log = open_log(storage, segment_bytes=1_000)
    append(log, make_batch([b"small"]))
    append(log, make_batch([b"x" * 3_000]))
    append(log, make_batch([b"small"]))
    log.sync()
    assert log.segment_base_offsets == [0, 1, 2]
    assert values_of(log.read(1, 10, 3)) == [b"x" * 3_000]


def test_index_is_used_and_rebuilt_on_reopen(storage):
    log = open_log(storage, segment_bytes=100_000)
    vals = fill(log, 1_000, size=100)  # ~180 KB: two segments, many index entries
    log.sync()
    seg0 = log._segments[0]
    assert len(seg0.index_rel) > 20 and len(seg0.time_ts) > 20
    index0 = (seg0.index_rel.tolist(), seg0.index_pos.tolist(), seg0.time_ts.tolist(), seg0.time_rel.tolist())
    active = log._segments[-1]
    active_index = (active.index_rel.tolist(), active.index_pos.tolist())
    log.close()

    log = open_log(storage, segment_bytes=100_000)  # persisted indexes for the sealed segment
    seg0 = log._segments[0]
    assert (seg0.index_rel.tolist(), seg0.index_pos.tolist(), seg0.time_ts.tolist(), seg0.time_rel.tolist()) == index0
    assert (log._segments[-1].index_rel.tolist(), log._segments[-1].index_pos.tolist()) == active_index
    log.close()

    for name in storage.list(DIR):
        if name.endswith("index"):
            storage.remove(f"{DIR}/{name}")
    log = open_log(storage, segment_bytes=100_000)  # rebuilt from batch headers
    seg0 = log._segments[0]
    assert (seg0.index_rel.tolist(), seg0.index_pos.tolist(), seg0.time_ts.tolist(), seg0.time_rel.tolist()) == index0
    assert log.log_end_offset == 1_000 and log.high_watermark == 1_000
    for fetch in (0, 1, 333, 555, 998, 999):
        assert values_of(log.read(fetch, 500, 1_000))[0] == vals[fetch]
    assert values_of(read_all(log)) == vals


def test_garbage_index_file_is_rejected(storage):
    log = open_log(storage, segment_bytes=50_000)
    vals = fill(log, 500, size=100)
    log.sync()
    log.close()
    storage.write_atomic(f"{DIR}/{0:020d}.index", struct.pack(">ii", 3, 17) * 2)
    log = open_log(storage, segment_bytes=50_000)
    assert values_of(read_all(log)) == vals


def test_reopen_continues_appending(storage):
    log = open_log(storage, segment_bytes=1_000)
    fill(log, 10)
    log.sync()
    log.close()
    log = open_log(storage, segment_bytes=1_000)
    assert (log.log_end_offset, log.high_watermark) == (10, 10)
    assert append(log, make_batch([b"next"])) == (10, 10, -1)
    log.sync()
    assert values_of(log.read(10, 100, 11)) == [b"next"]


def test_iter_batch_headers(storage):
    log = open_log(storage, segment_bytes=1_000)
    fill(log, 12)
    append(log, make_batch([b"big" * 5_000]))
    append(log, make_batch([b"p"] * 3, producer_id=42))
    assert [h.base_offset for h in log.iter_batch_headers()] == list(range(14))
    hs = list(log.iter_batch_headers(5))
    assert hs[0].base_offset == 5 and hs[-1].producer_id == 42 and hs[-1].last_offset == 15
    assert [h.base_offset for h in log.iter_batch_headers(14)] == [13]


# --- recovery ---------------------------------------------------------------------------------


def last_segment_path(log: PartitionLog) -> str:
    return f"{DIR}/{log.segment_base_offsets[-1]:020d}.log"


def corrupt(storage, path: str, pos: int, cut: bool) -> None:
    f = storage.open_append(path)
    if cut:
        f.truncate(pos)
    else:
        data = bytearray(storage.read_all(path))
        data[pos] ^= 0x5A
        f.truncate(0)
        f.write(data)
    f.sync()
    f.close()


@pytest.mark.parametrize("cut", [True, False], ids=["cut-mid-batch", "garbled"])
def test_recovery_truncates_torn_tail(storage, cut):
    log = open_log(storage, segment_bytes=3_000)
    vals = fill(log, 25)
    log.sync()
    path = last_segment_path(log)
    size = storage.size(path)
    last_batch = len(make_batch([vals[-1]]))
    log.close()
    corrupt(storage, path, size - last_batch // 2, cut)
    log = open_log(storage, segment_bytes=3_000)
    assert (log.log_end_offset, log.high_watermark) == (24, 24)
    assert storage.size(path) == size - last_batch
    assert values_of(read_all(log)) == vals[:24]
    assert append(log, make_batch([b"again"])) == (24, 24, -1)
    log.sync()
    assert values_of(read_all(log)) == vals[:24] + [b"again"]


def test_recovery_rejects_garbage_header(storage):
    log = open_log(storage)
    vals = fill(log, 5)
    log.sync()
    path = last_segment_path(log)
    log.close()
    f = storage.open_append(path)
    f.write(b"\0" * 100)  # e.g. blocks allocated but never written
    f.sync()
    f.close()
    log = open_log(storage)
    assert log.log_end_offset == 5 and values_of(read_all(log)) == vals


def test_recovery_rejects_non_dense_offsets(storage):
    log = open_log(storage)
    fill(log, 3)
    log.sync()
    path = last_segment_path(log)
    log.close()
    rogue = bytearray(make_batch([b"rogue"]))
    struct.pack_into(">q", rogue, 0, 7)
    f = storage.open_append(path)
    f.write(rogue)
    f.close()
    log = open_log(storage)
    assert log.log_end_offset == 3


def closed_log_of_segments(storage) -> tuple[list[bytes], list[int]]:
    """A log of 20 batches in 1,000-byte segments, flushed and closed → (values, segment base offsets)."""
    log = open_log(storage, segment_bytes=1_000)
    vals = fill(log, 20)
    log.sync()
    bases = log.segment_base_offsets
    log.close()
    return vals, bases


def forget_indexes(storage, base: int) -> str:
    """Remove a segment's indexes, as if a crash came before it was known durable → its path without suffix."""
    stem = f"{DIR}/{base:020d}"
    storage.remove(stem + ".index")
    storage.remove(stem + ".timeindex")
    return stem


def test_recovery_of_unindexed_sealed_segment_drops_later_segments(storage):
    vals, bases = closed_log_of_segments(storage)
    # Simulate a crash before the second segment was known durable: no indexes, torn tail.
    second = forget_indexes(storage, bases[1])
    corrupt(storage, second + ".log", storage.size(second + ".log") - 10, cut=True)
    log = open_log(storage, segment_bytes=1_000)
    assert log.segment_base_offsets == bases[:2]
    assert log.log_end_offset == bases[2] - 1
    assert values_of(read_all(log)) == vals[: bases[2] - 1]
    assert all(not n.startswith(f"{b:020d}") for b in bases[2:] for n in storage.list(DIR))


# --- zeros written ahead (preallocation) ---------------------------------------------------------------


def test_preallocation_after_small_rounds_only(storage):
    log = open_log(storage, segment_bytes=1 << 30)
    fill(log, 2)
    log.sync()
    handle, end = log.preallocation()
    assert end == log.size_bytes + log_mod.PREALLOCATE_MIN_BYTES        # at least this much
    handle.preallocate(end)
    path = last_segment_path(log)
    assert storage.size(path) == end and handle.allocated == end
    assert storage.read(path, log.size_bytes, end) == bytes(end - log.size_bytes)
    fill(log, 3)
    log.sync()
    assert log.preallocation() is None          # still far enough ahead
    assert storage.size(path) == end
    append(log, make_batch([b"x" * (log_mod.PREALLOCATE_ROUND_BYTES + 1)]))
    log.sync()
    assert log.preallocation() is None          # a large round gains too little from zeros
    assert storage.size(path) == log.size_bytes > end
    assert values_of(read_all(log))[-1] == b"x" * (log_mod.PREALLOCATE_ROUND_BYTES + 1)


def test_a_flush_over_zeros_written_ahead_syncs_data_only(storage):
    log = open_log(storage, segment_bytes=4_000)
    big = 1 << 20
    fill(log, 2)
    assert not log.flush_syncs_data_only(log.flush_begin(), big)    # a new segment: its file and directory
    log.sync()
    handle, end = log.preallocation()
    handle.preallocate(end)
    fill(log, 3)
    target = log.flush_begin()
    assert log.flush_syncs_data_only(target, big)                   # over the zeros
    assert not log.flush_syncs_data_only(target, 100)               # but more than 100 bytes of it
    log.sync()
    abort(log, 7)
    assert not log.flush_syncs_data_only(log.flush_begin(), big)    # an aborted transaction's index entry
    log.sync()
    fill(log, 30)                                                   # past the zeros, and rolls
    assert not log.flush_syncs_data_only(log.flush_begin(), big)
    log.sync()
    assert not log.flush_syncs_data_only(log.log_end_offset + 1, big)   # no such plan


def test_preallocation_stops_at_the_segment_size_and_the_roll_cuts_it(storage):
    log = open_log(storage, segment_bytes=3_000)
    vals = fill(log, 5)
    log.sync()
    handle, end = log.preallocation()
    assert end == 3_000
    handle.preallocate(end)
    path = last_segment_path(log)
    assert storage.size(path) == 3_000
    vals += fill(log, 20)                           # rolls: the sealed segment ends with its last batch
    log.sync()
    assert storage.size(path) == log._segments[0].size < 3_000
    handle.preallocate(5_000)                       # too late: a sealed segment takes no more zeros
    assert storage.size(path) == log._segments[0].size
    assert values_of(read_all(log)) == vals


def test_close_cuts_the_zeros_and_reopen_continues(storage):
    log = open_log(storage, segment_bytes=1 << 20)
    vals = fill(log, 4)
    log.sync()
    handle, end = log.preallocation()
    handle.preallocate(end)
    size = log.size_bytes
    log.close()
    assert storage.size(last_segment_path(log)) == size
    log = open_log(storage, segment_bytes=1 << 20)
    vals += fill(log, 2)
    log.sync()
    assert values_of(read_all(log)) == vals


def test_recovery_cuts_zeros_written_ahead_and_keeps_later_segments(storage):
    """A crash after a roll, before the sealed segment's zeros were cut on disk: recovery cuts only the zeros;
    the segments after it stay (a torn tail there would drop them)."""
    vals, bases = closed_log_of_segments(storage)
    second = forget_indexes(storage, bases[1])      # not known durable: recovered batch by batch
    size = storage.size(second + ".log")
    f = storage.open_append(second + ".log")
    f.preallocate(size + 700)
    f.close()
    log = open_log(storage, segment_bytes=1_000)
    assert log.segment_base_offsets == bases
    assert storage.size(second + ".log") == size
    assert values_of(read_all(log)) == vals


def test_a_sealed_segment_with_its_indexes_and_zeros_left_after_it_is_adopted_and_cut(storage, monkeypatch):
    recovered = []
    real = PartitionLog._recover_segment

    def recover(self, seg, allow_gaps=False):
        recovered.append(seg.base_offset)
        return real(self, seg, allow_gaps)
    monkeypatch.setattr(PartitionLog, "_recover_segment", recover)
    vals, bases = closed_log_of_segments(storage)
    first = f"{DIR}/{bases[0]:020d}.log"
    size = storage.size(first)
    f = storage.open_append(first)
    f.preallocate(size + 500)                       # a cut that failed, or never reached the disk
    f.close()
    recovered.clear()
    log = open_log(storage, segment_bytes=1_000)
    assert log.segment_base_offsets == bases and storage.size(first) == size
    assert recovered == bases[-1:]                  # the sealed segments were not read batch by batch
    assert values_of(read_all(log)) == vals


def test_crash_after_preallocation_keeps_the_data():
    storage = MemoryStorage()
    log = open_log(storage, segment_bytes=1 << 20)
    vals = fill(log, 6)
    log.sync()
    handle, end = log.preallocation()
    handle.preallocate(end)
    vals += fill(log, 3)
    log.sync()
    fill(log, 2)                                    # never flushed
    log = open_log(storage.crash(torn_tail=True), segment_bytes=1 << 20)
    assert values_of(read_all(log))[:9] == vals and log.log_end_offset in (9, 10, 11)


# --- crash model (MemoryStorage) ----------------------------------------------------------------


def test_crash_keeps_exactly_what_was_flushed():
    storage = MemoryStorage()
    log = open_log(storage, segment_bytes=1_500)
    vals = fill(log, 12)
    log.sync()
    fill(log, 10)  # never flushed
    log = open_log(storage.crash(), segment_bytes=1_500)
    assert log.log_end_offset == 12 and values_of(read_all(log)) == vals


def test_crash_with_torn_tail_keeps_flushed_and_a_valid_prefix():
    for seed in range(30):
        rng = random.Random(seed)
        storage = MemoryStorage()
        log = open_log(storage, segment_bytes=1_500)
        vals = fill(log, 12)
        log.sync()
        vals += fill(log, 10)
        crashed = storage.crash(torn_tail=True, rng=rng)
        log = open_log(crashed, segment_bytes=1_500)
        assert 12 <= log.log_end_offset <= 22
        got = values_of(read_all(log))
        assert got == vals[: log.log_end_offset]
        # and the recovered state is itself durable
        log = open_log(crashed.crash(torn_tail=True, rng=rng), segment_bytes=1_500)
        assert values_of(read_all(log)) == got


def test_flush_between_flush_begin_and_done_covers_only_target():
    storage = MemoryStorage()
    log = open_log(storage)
    fill(log, 3)
    target = log.flush_begin()
    fill(log, 2)  # appended while the flush runs
    log.flush(target)
    log.flush_done(target)
    assert log.high_watermark == 3 == target
    assert log.read(0, 1 << 20, log.high_watermark) == read_all(log, max_offset=3)


def test_new_segment_names_are_made_durable_by_flush():
    storage = MemoryStorage()
    log = open_log(storage, segment_bytes=500)
    vals = fill(log, 6)
    dir_syncs = storage.dir_syncs
    log.sync()
    assert storage.dir_syncs > dir_syncs
    log = open_log(storage.crash(), segment_bytes=500)
    assert values_of(read_all(log)) == vals


def test_unsafe_no_fsync_mode():
    storage = MemoryStorage()
    log = open_log(storage, segment_bytes=500, unsafe_no_fsync=True)
    vals = fill(log, 6)
    syncs = storage.syncs
    log.flush_done(log.flush_begin())
    assert log.high_watermark == 6 and storage.syncs == syncs
    assert values_of(read_all(log)) == vals
    log.close()
    log = open_log(storage, segment_bytes=500, unsafe_no_fsync=True)  # process restart: page cache intact
    assert values_of(read_all(log)) == vals


_APPEND = st.tuples(st.just("append"), st.lists(st.integers(1, 4), min_size=1, max_size=3), st.integers(1, 300))
_FLUSH = st.tuples(st.just("flush"), st.just(0), st.just(0))
# What the random crash tests do besides appending: flush, begin a flush, crash, inject a failure, trim.
_CRASH_OPS = (
    _FLUSH,
    st.tuples(st.just("begin"), st.just(0), st.just(0)),
    st.tuples(st.just("crash"), st.booleans(), st.integers(0, 2**32)),
    st.tuples(st.just("fail"), st.booleans(), st.integers(0, 3)),
    st.tuples(st.just("trim"), st.integers(0, 4), st.just(0)),
    st.tuples(st.just("preallocate"), st.just(0), st.just(0)),
)
_OPS = st.one_of(_APPEND, _APPEND, _APPEND, _APPEND, _FLUSH, *_CRASH_OPS)


def _healthy(storage: MemoryStorage) -> None:
    """No failure left pending (before a crash or a restart)."""
    storage.fail_next_write(0)
    storage.fail_next_sync(0)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(_OPS, min_size=10, max_size=60), final_seed=st.integers(0, 2**32))
def test_random_append_flush_crash(ops, final_seed):
    """No flushed batch is ever lost, offsets stay dense, and recovery never yields a corrupt log."""
    seg = 600
    storage = MemoryStorage()
    log = open_log(storage, segment_bytes=seg)
    values: list[bytes] = []  # the value at each offset appended (and not lost)
    flushed = 0
    pending: int | None = None
    counter = 0
    ambiguous_starts: list[int] = []  # a failed delete_records may or may not have taken effect

    def assert_contents(log: PartitionLog) -> None:
        start, end = log.log_start_offset, log.log_end_offset
        first = headers(log.read(start, 1, end))[0][1].base_offset if start < end else start
        assert values_of(read_all(log)) == values[first:end], "corrupt or non-dense log"

    def check_after_crash(log: PartitionLog, start: int) -> list[bytes]:
        end = log.log_end_offset
        assert flushed <= end <= len(values), "a flushed batch was lost"
        assert log.log_start_offset in (start, *ambiguous_starts), "the log start offset checkpoint was lost"
        ambiguous_starts.clear()
        assert_contents(log)
        event("crash kept unflushed data" if end > flushed else "crash kept exactly the flushed data")
        event(f"segments after crash: {min(len(log.segment_base_offsets), 3)}+")
        return values[:end]

    for op, a, b in ops:
        if op == "append":
            batches = []
            for n in a:
                vs = [value(counter + k, b) for k in range(n)]
                counter += n
                batches.append((vs, make_batch(vs)))
            try:
                first, last, _ = append(log, *[raw for _, raw in batches])
            except OSError:
                event("append failed")
                continue
            assert first == len(values)
            for vs, _ in batches:
                values += vs
            assert last == len(values) - 1 == log.log_end_offset - 1
        elif op == "flush":
            target = pending if pending is not None else log.flush_begin()
            pending = None
            try:
                log.flush(target)
            except OSError:
                event("flush failed")
                log.close()
                _healthy(storage)
                log = open_log(storage, segment_bytes=seg)  # restart after a failed fsync; page cache intact
                if WRITE_BEHIND["write_behind"]:
                    # what the failed flush did not write is gone (it was never acknowledged); the rest stays
                    assert flushed <= log.log_end_offset <= len(values)
                    values = values[:log.log_end_offset]
                flushed = log.high_watermark
                assert flushed == len(values)
                assert_contents(log)
                continue
            log.flush_done(target)
            flushed = max(flushed, target)
            assert log.high_watermark == flushed
        elif op == "begin":
            pending = log.flush_begin()
        elif op == "preallocate":       # what the flusher does after a round: zeros ahead of the active segment
            ahead = log.preallocation()
            if ahead is not None:
                try:
                    ahead[0].preallocate(ahead[1])
                except OSError:
                    event("preallocate failed")     # its fsync: sticky, the next flush fails
        elif op == "fail":
            getattr(storage, "fail_next_write" if a else "fail_next_sync")(after=b)
        elif op == "trim":
            start = log.log_start_offset
            before = start + (log.high_watermark - start) * a // 4
            try:
                log.delete_records(before)
            except OSError:
                event("delete_records failed")
                assert log.log_start_offset == start
                ambiguous_starts.append(before)
        else:
            _healthy(storage)
            start = log.log_start_offset
            storage = storage.crash(torn_tail=a, rng=random.Random(b))
            log = open_log(storage, segment_bytes=seg)
            pending = None
            values = check_after_crash(log, start)
            flushed = log.high_watermark
    _healthy(storage)
    start = log.log_start_offset
    storage = storage.crash(torn_tail=True, rng=random.Random(final_seed))
    log = open_log(storage, segment_bytes=seg)
    values = check_after_crash(log, start)
    offsets = [h.base_offset for h in log.iter_batch_headers()]
    # The recovered log start (which a delete_records whose checkpoint write failed may or may not have moved)
    # lies within the first batch.
    assert offsets == sorted(set(offsets)) and (not offsets or offsets[0] <= log.log_start_offset)


# --- injected failures --------------------------------------------------------------------------


@pytest.mark.parametrize("write_mode", [False], indirect=True, ids=["write-through"])   # appends write
def test_write_failure_leaves_log_intact(write_mode):
    storage = MemoryStorage()
    log = open_log(storage)
    vals = fill(log, 3)
    storage.fail_next_write()
    with pytest.raises(OSError):
        append(log, make_batch([b"lost"]))
    assert log.log_end_offset == 3
    assert append(log, make_batch([b"ok"])) == (3, 3, -1)
    log.sync()
    assert values_of(read_all(log)) == vals + [b"ok"]
    log = open_log(storage.crash())
    assert values_of(read_all(log)) == vals + [b"ok"]


@pytest.mark.parametrize("write_mode", [False], indirect=True, ids=["write-through"])   # appends write
def test_write_failure_on_roll_leaves_log_intact(write_mode):
    storage = MemoryStorage()
    log = open_log(storage, segment_bytes=500)
    vals = fill(log, 2)
    storage.fail_next_write()
    with pytest.raises(OSError):
        append(log, make_batch([value(9, 200)]))
    assert log.log_end_offset == 2
    vals += fill(log, 3)
    log.sync()
    log = open_log(storage.crash(), segment_bytes=500)
    assert values_of(read_all(log)) == vals


def test_fsync_failure_does_not_advance_high_watermark():
    storage = MemoryStorage()
    log = open_log(storage)
    vals = fill(log, 2)
    log.sync()
    vals += fill(log, 2)
    storage.fail_next_sync()
    with pytest.raises(OSError):
        log.sync()
    assert log.high_watermark == 2
    with pytest.raises(OSError):
        log.sync()  # sticky: the page cache may have dropped the data
    assert log.high_watermark == 2
    assert values_of(log.read(0, 1 << 20, 4)) == vals  # still readable
    log.close()
    log = open_log(storage)  # restart
    assert log.high_watermark == 4 and values_of(read_all(log)) == vals


@pytest.mark.parametrize("fault", ["sync", "write"])
def test_every_failure_point_in_a_flush_keeps_the_promise(fault):
    """Fail each fsync (files, directory, index files) or index write of a flush in turn."""
    for skip in range(12):
        storage = MemoryStorage()
        log = open_log(storage, segment_bytes=500)
        vals = fill(log, 1)
        log.sync()
        vals += fill(log, 4)  # rolls: sealed segments need fsync, dir sync and indexes
        getattr(storage, f"fail_next_{fault}")(after=skip)
        try:
            log.sync()
        except OSError:
            assert log.high_watermark == 1
            storage.fail_next_sync(0)
            storage.fail_next_write(0)
            reopened = open_log(storage.crash(), segment_bytes=500)
            assert 1 <= reopened.log_end_offset and values_of(read_all(reopened)) == vals[: reopened.log_end_offset]
            log.close()
            log = open_log(storage, segment_bytes=500)  # restart without a crash: nothing lost...
            if WRITE_BEHIND["write_behind"] and fault == "write":
                # ...but what the failed flush did not write (never acknowledged)
                assert 1 <= log.log_end_offset and values_of(read_all(log)) == vals[:log.log_end_offset]
                vals = vals[:log.log_end_offset]
            else:
                assert values_of(read_all(log)) == vals and log.high_watermark == 5
        else:
            assert log.high_watermark == 5
        log = open_log(storage.crash(), segment_bytes=500)
        assert values_of(read_all(log)) == vals


def test_open_cleans_up_leftovers(storage):
    log = open_log(storage, segment_bytes=500)
    fill(log, 5)
    log.sync()
    log.close()
    storage.write_atomic(f"{DIR}/{99:020d}.index", b"orphan")
    storage.write_atomic(f"{DIR}/{0:020d}.index.tmp", b"half")
    log = open_log(storage, segment_bytes=500)
    names = storage.list(DIR)
    assert f"{99:020d}.index" not in names and not any(n.endswith(".tmp") for n in names)
    assert log.log_end_offset == 5


def test_configure_changes_segment_size(storage):
    log = open_log(storage, segment_bytes=1 << 20)
    fill(log, 5)
    log.configure(segment_bytes=300, retention_ms=-1, retention_bytes=-1)
    fill(log, 3)
    assert len(log.segment_base_offsets) == 4


def test_flush_in_worker_thread_while_appending(tmp_path):
    storage = FileStorage(tmp_path)
    log = PartitionLog.open(storage, DIR, segment_bytes=4_000, now_ms=0)
    done = 0
    for _ in range(20):
        target = log.flush_begin()
        worker = threading.Thread(target=log.flush, args=(target,))
        worker.start()
        fill(log, 5)
        worker.join()
        log.flush_done(target)
        assert log.high_watermark == target
        done += 5
    log.sync()
    assert log.high_watermark == done == log.log_end_offset
    assert [h.base_offset for h in log.iter_batch_headers()] == list(range(done))


# --- retention and delete_records ----------------------------------------------------------------


def test_delete_records(storage):
    log = open_log(storage, segment_bytes=1_000)
    vals = fill(log, 20)
    log.sync()
    bases = log.segment_base_offsets
    assert log.delete_records(bases[2] + 1) == bases[2] + 1
    assert log.log_start_offset == bases[2] + 1
    assert log.segment_base_offsets == bases[2:]
    assert not any(n.startswith(f"{bases[0]:020d}") for n in storage.list(DIR))
    with pytest.raises(OffsetOutOfRange):
        log.read(bases[2], 100, 20)
    assert values_of(read_all(log, bases[2] + 1)) == vals[bases[2] + 1 :]
    assert log.delete_records(3) == bases[2] + 1  # never moves backwards
    log.close()
    log = open_log(storage, segment_bytes=1_000)
    assert log.log_start_offset == bases[2] + 1 and log.log_end_offset == 20
    assert log.delete_records(-1) == 20
    assert log.read(20, 100, 20) == b""
    log.close()
    log = open_log(storage, segment_bytes=1_000)
    assert (log.log_start_offset, log.log_end_offset) == (20, 20)
    assert append(log, make_batch([b"z"])) == (20, 20, -1)


def test_segments_below_the_log_start_are_unlinked_at_once_and_released_later(storage, monkeypatch):
    """Retention and DeleteRecords unlink the segments' files at once (a restart finds nothing of them) and tell
    on_retired; their blocks are freed by release_files(*take_retired()) in steps, or by close()."""
    import trireme.state.log as log_mod
    monkeypatch.setattr(log_mod, "RELEASE_STEP_BYTES", 128)
    log = open_log(storage, segment_bytes=1_000, retention_ms=10_000)
    told = []
    log.on_retired = lambda: told.append(1)
    fill(log, 30, ts0=1_000)
    log.sync()
    bases = log.segment_base_offsets
    log.delete_records(bases[1])
    assert told == [1]
    assert not any(n.startswith(f"{bases[0]:020d}") for n in storage.list(DIR))
    writable, handles = log.take_retired()
    assert len(writable) == 1 and writable[0].size > 128 and handles
    assert log.take_retired() == ([], [])
    size, cuts = writable[0].size, []
    log_mod.release_files(writable, handles, lambda: cuts.append(writable[0].size))
    assert cuts == list(range(size - 128, 0, -128)) and len(cuts) == -(-size // 128) - 1
    with pytest.raises(OSError):
        handles[0].read(0, 1)                         # closed
    assert log.apply_retention(now_ms=10**9) > 0     # retention: the same way
    assert len(told) == 2
    retired = log._retired
    assert retired[0] and retired[1]
    log.close()                                      # what was not taken yet is released by close
    assert log._retired == ([], [])
    with pytest.raises(OSError):
        retired[1][0].read(0, 1)
    log = open_log(storage, segment_bytes=1_000)
    assert log.segment_base_offsets == bases[-1:]


def test_checkpoint_survives_crash_and_resurrected_segments_are_dropped():
    storage = MemoryStorage()
    log = open_log(storage, segment_bytes=1_000)
    fill(log, 20)
    log.sync()
    bases = log.segment_base_offsets
    log.delete_records(bases[1])  # checkpointed durably, the removals are not dir-synced
    crashed = storage.crash()
    assert CHECKPOINT_NAME in crashed.list(DIR)
    log = open_log(crashed, segment_bytes=1_000)
    assert log.log_start_offset == bases[1] and log.segment_base_offsets == bases[1:]


def test_retention_by_time(storage):
    log = open_log(storage, segment_bytes=1_000, retention_ms=10_000)
    fill(log, 20, ts0=1_000)  # timestamps 1000..1019
    log.sync()
    bases = log.segment_base_offsets
    assert log.apply_retention(now_ms=5_000) == 0
    seg1_max = 1_000 + bases[2] - 1
    assert log.apply_retention(now_ms=seg1_max + 10_001) == 2
    assert log.log_start_offset == bases[2] and log.segment_base_offsets == bases[2:]
    assert log.apply_retention(now_ms=10**9) == len(bases) - 3  # never the active segment
    assert log.segment_base_offsets == bases[-1:]


def test_retention_by_size(storage):
    log = open_log(storage, segment_bytes=1_000, retention_bytes=2_500)
    fill(log, 30)
    log.sync()
    before = log.size_bytes
    deleted = log.apply_retention(now_ms=0)
    assert deleted > 0
    assert log.size_bytes >= 2_500  # Kafka keeps at least retention.bytes
    assert log.size_bytes - storage.size(f"{DIR}/{log.segment_base_offsets[0]:020d}.log") < 2_500
    assert before > log.size_bytes
    assert log.log_start_offset == log.segment_base_offsets[0]


def test_retention_skips_data_not_yet_durable(storage):
    log = open_log(storage, segment_bytes=1_000, retention_ms=1)
    fill(log, 20)
    assert log.apply_retention(now_ms=10**9) == 0
    log.sync()
    assert log.apply_retention(now_ms=10**9) > 0


# --- timestamps ------------------------------------------------------------------------------------


def test_offset_for_timestamp(storage):
    log = open_log(storage, segment_bytes=20_000)
    for i in range(300):  # one batch of 2 records per timestamp step of 10
        append(log, make_batch([value(i, 100), value(i, 100)], timestamp=10 * i, max_timestamp=10 * i + 5))
    log.sync()
    assert len(log.segment_base_offsets) > 1
    assert log.offset_for_timestamp(0) == (0, 5)
    assert log.offset_for_timestamp(5) == (0, 5)
    assert log.offset_for_timestamp(6) == (2, 15)
    assert log.offset_for_timestamp(1_234) == (2 * 123, 1_235)
    assert log.offset_for_timestamp(2_995) == (598, 2_995)
    assert log.offset_for_timestamp(2_996) is None
    assert log.max_timestamp() == (598, 2_995)
    log.delete_records(101)
    assert log.offset_for_timestamp(0) == (101, 505)
    log.close()
    log = open_log(storage, segment_bytes=20_000)
    assert log.offset_for_timestamp(1_234) == (2 * 123, 1_235)
    assert log.max_timestamp() == (598, 2_995)


def test_first_record_at_or_after_answers_per_record(storage):
    from trireme.wire.records import build_batch
    log = open_log(storage)
    # Timestamps inside a batch are not ordered: the batch's max (300) is its second record.
    append(log, bytearray(build_batch([(None, b"a", [], 100), (None, b"b", [], 300), (None, b"c", [], 200)])))
    append(log, bytearray(build_batch([(None, b"d", [], 250), (None, b"e", [], 400)])))
    log.sync()
    hw = log.high_watermark
    assert log.first_record_at_or_after(0, 150, hw) == (1, 300)
    assert log.first_record_at_or_after(0, 100, hw) == (0, 100)
    assert log.first_record_at_or_after(2, 150, hw) == (2, 200)    # starts inside the first batch
    assert log.first_record_at_or_after(0, 350, hw) == (4, 400)    # found in a later batch
    assert log.first_record_at_or_after(0, 401, hw) is None
    assert log.first_record_at_or_after(0, 350, 3) is None          # bounded by max_offset
    offset, stamp = log.max_timestamp()
    assert log.first_record_at_or_after(offset, stamp, hw) == (4, 400)


def test_timestamps_out_of_order(storage):
    log = open_log(storage)
    for ts in (100, 50, 300, 200, 400):
        append(log, make_batch([b"x"], timestamp=ts))
    assert log.offset_for_timestamp(150) == (2, 300)
    assert log.offset_for_timestamp(350) == (4, 400)
    assert log.max_timestamp() == (4, 400)


def test_empty_log_timestamps(storage):
    log = open_log(storage)
    assert log.max_timestamp() == (-1, -1)
    assert log.offset_for_timestamp(0) is None


# --- lifecycle ---------------------------------------------------------------------------------------


def test_delete_removes_everything(storage):
    log = open_log(storage, segment_bytes=1_000)
    fill(log, 10)
    log.sync()
    log.delete()
    assert not storage.exists(DIR)


def test_closed_log_refuses_use(storage):
    log = open_log(storage)
    log.close()
    with pytest.raises(ValueError):
        log.read(0, 1, 1)


# --- aborted-transaction index ------------------------------------------------------------------

EVERYTHING = (0, 1 << 62)
TXN_ENTRY_SIZE = log_mod.TXN_INDEX_ENTRY.size


def abort(log: PartitionLog, producer_id: int, first_offset: int | None = None, lso: int | None = None) -> AbortedTxn:
    """Append an ABORT marker batch for `producer_id` and index it (the log never looks inside the batch)."""
    last = append(log, make_batch([b"abort"], producer_id=producer_id, attributes=0x30))[1]
    txn = AbortedTxn(producer_id, last if first_offset is None else first_offset, last,
                     last + 1 if lso is None else lso)
    assert log.add_aborted_txn(txn)
    return txn


def txn_path(base: int) -> str:
    return f"{DIR}/{base:020d}.txnindex"


def test_aborted_txns_query_boundaries(storage):
    log = open_log(storage)
    fill(log, 5)                       # 0..4
    a = abort(log, 1, first_offset=2)  # marker at 5
    fill(log, 4)                       # 6..9
    b = abort(log, 2, first_offset=7)  # 10
    fill(log, 9)                       # 11..19
    c = abort(log, 3, first_offset=0, lso=0)  # 20: began before a and b, ended after them
    assert (a.last_offset, b.last_offset, c.last_offset) == (5, 10, 20)
    assert log.aborted_txns(*EVERYTHING) == [a, b, c]
    assert log.aborted_txns(5, 6) == [a, c]      # ending exactly at start_offset: included
    assert log.aborted_txns(6, 100) == [b, c]
    assert log.aborted_txns(0, 2) == [c]         # first_offset == end_offset: excluded
    assert log.aborted_txns(0, 3) == [a, c]
    assert log.aborted_txns(11, 15) == [c]       # c spans the range without a marker in it
    assert log.aborted_txns(21, 100) == []
    assert log.aborted_txns(0, 0) == []
    assert log.aborted_txns(10, 8) == [b, c]     # b began at 7, before 8
    log.sync()
    assert log.aborted_txns(*EVERYTHING) == [a, b, c]


def test_duplicate_and_invalid_aborted_txns(storage):
    log = open_log(storage)
    fill(log, 3)
    a = abort(log, 7, first_offset=1)
    assert not log.add_aborted_txn(a)
    assert not log.add_aborted_txn(AbortedTxn(8, 0, 2, 3))  # before the last entry: a replayed duplicate
    with pytest.raises(ValueError):
        log.add_aborted_txn(AbortedTxn(9, 0, 4, 5))  # no marker there yet (beyond the log end offset)
    with pytest.raises(ValueError):
        log.add_aborted_txn(AbortedTxn(9, 4, 3, 5))  # first offset after the marker
    with pytest.raises(ValueError):
        log.add_aborted_txn(AbortedTxn(-1, 0, 3, 5))
    assert log.aborted_txns(*EVERYTHING) == [a]
    log.sync()
    assert storage.size(txn_path(0)) == TXN_ENTRY_SIZE


def test_aborted_txns_survive_reopen_and_replay_is_idempotent(storage):
    log = open_log(storage, segment_bytes=1_000)
    txns = []
    for i in range(12):
        start = log.log_end_offset
        fill(log, 2)
        txns.append(abort(log, i, first_offset=start))
    log.sync()
    bases = log.segment_base_offsets
    assert len(bases) > 3
    per_segment = {b: sum(1 for t in txns if b <= t.last_offset < e) for b, e in zip(bases, bases[1:] + [1 << 62])}
    for base, n in per_segment.items():
        assert (storage.size(txn_path(base)) if n else 0) == n * TXN_ENTRY_SIZE
    log.close()
    log = open_log(storage, segment_bytes=1_000)
    assert log.aborted_txns(*EVERYTHING) == txns
    assert not any(log.add_aborted_txn(t) for t in txns)  # start-up replay finds them all indexed
    later = abort(log, 99, first_offset=txns[3].first_offset)
    assert log.aborted_txns(*EVERYTHING) == txns + [later]
    assert log.aborted_txns(txns[5].last_offset, txns[5].last_offset + 1) == [txns[5], later]


def test_aborted_txn_across_segment_roll_found_from_earlier_segment(storage):
    log = open_log(storage, segment_bytes=1_000)
    fill(log, 2)  # ~280 bytes a batch: 3 per segment
    begin = log.log_end_offset
    fill(log, 10)  # the transaction's records, rolling into later segments
    txn = abort(log, 5, first_offset=begin)
    bases = log.segment_base_offsets
    assert bases[0] <= begin < bases[1] and txn.last_offset >= bases[2]
    for start in (0, begin, bases[1], txn.last_offset):
        assert log.aborted_txns(start, log.log_end_offset) == [txn]
    for start in (begin, bases[1], txn.last_offset):
        assert log.aborted_txns(start, start + 1) == [txn]
    assert log.aborted_txns(0, begin) == []
    log.sync()
    marker_base = bases[bisect.bisect_right(bases, txn.last_offset) - 1]
    assert [n for n in storage.list(DIR) if n.endswith(".txnindex")] == [f"{marker_base:020d}.txnindex"]


def test_crash_before_flush_loses_only_unflushed_aborted_txns():
    storage = MemoryStorage()
    log = open_log(storage, segment_bytes=1_000)
    fill(log, 2)
    kept = [abort(log, 1, first_offset=0)]
    fill(log, 5)
    kept.append(abort(log, 2, first_offset=3))
    log.sync()
    lost = []
    for i in range(6):  # never flushed, some in new segments
        fill(log, 2)
        lost.append(abort(log, 10 + i))
    log = open_log(storage.crash(), segment_bytes=1_000)
    assert log.log_end_offset == kept[-1].last_offset + 1
    assert log.aborted_txns(*EVERYTHING) == kept


def test_crash_with_torn_tails_keeps_a_prefix_of_aborted_txns_within_the_log():
    for seed in range(40):
        rng = random.Random(seed)
        storage = MemoryStorage()
        log = open_log(storage, segment_bytes=800)
        txns = []
        for i in range(4):
            fill(log, 1)
            txns.append(abort(log, i))
        log.sync()
        flushed = log.high_watermark
        for i in range(8):
            fill(log, 1)
            txns.append(abort(log, 10 + i, first_offset=txns[-1].last_offset))
        log = open_log(storage.crash(torn_tail=True, rng=rng), segment_bytes=800)
        end = log.log_end_offset
        got = log.aborted_txns(*EVERYTHING)
        possible = [t for t in txns if t.last_offset < end]
        assert got == possible[: len(got)]  # a prefix, never an entry beyond the log end offset
        assert all(t in got for t in txns if t.last_offset < flushed)
        for t in possible:  # start-up replay restores the rest
            log.add_aborted_txn(t)
        assert log.aborted_txns(*EVERYTHING) == possible


def test_txnindex_entries_beyond_recovered_log_end_are_dropped(storage):
    log = open_log(storage)
    fill(log, 3)
    a = abort(log, 1)
    fill(log, 2)
    b = abort(log, 2, first_offset=a.last_offset + 1)  # the last batch
    log.sync()
    log.close()
    path = last_segment_path(log)
    corrupt(storage, path, storage.size(path) - 5, cut=True)  # the marker of b is lost
    log = open_log(storage)
    assert log.log_end_offset == b.last_offset
    assert log.aborted_txns(*EVERYTHING) == [a]
    assert storage.size(txn_path(0)) == TXN_ENTRY_SIZE
    c = abort(log, 3)  # the offset is reused
    assert c.last_offset == b.last_offset and log.aborted_txns(*EVERYTHING) == [a, c]


@pytest.mark.parametrize("damage", ["partial", "garbled", "zeroed"])
def test_torn_trailing_txnindex_entry_is_truncated(storage, damage):
    log = open_log(storage)
    txns = []
    for i in range(3):
        fill(log, 2)
        txns.append(abort(log, i))
    log.sync()
    log.close()
    f = storage.open_append(txn_path(0))
    if damage == "partial":
        f.write(log_mod.pack_txn_entry(AbortedTxn(5, 0, 8, 9), txns[-1].last_offset)[:20])
    else:
        data = bytearray(storage.read_all(txn_path(0)))
        if damage == "garbled":
            data[-TXN_ENTRY_SIZE + 7] ^= 0x01  # the last entry's producer id: only its CRC tells
        else:
            data[-TXN_ENTRY_SIZE:] = bytes(TXN_ENTRY_SIZE)
        f.truncate(0)
        f.write(data)
    f.sync()
    f.close()
    log = open_log(storage)
    expected = txns if damage == "partial" else txns[:-1]
    assert log.aborted_txns(*EVERYTHING) == expected
    assert storage.size(txn_path(0)) == len(expected) * TXN_ENTRY_SIZE
    assert [log.add_aborted_txn(t) for t in txns] == [False] * len(expected) + [True] * (3 - len(expected))
    assert log.aborted_txns(*EVERYTHING) == txns


def test_lost_entries_of_an_earlier_segment_drop_the_later_segments_entries(storage):
    """A crash may keep a later txnindex file but cut an earlier one: the entries must stay a prefix."""
    log = open_log(storage, segment_bytes=1_000)
    txns = []
    for i in range(10):
        fill(log, 2)
        txns.append(abort(log, i))
    log.sync()
    bases = log.segment_base_offsets
    first = next(b for b in bases if storage.exists(txn_path(b)) and storage.size(txn_path(b)) > TXN_ENTRY_SIZE)
    log.close()
    f = storage.open_append(txn_path(first))
    f.truncate(f.size - TXN_ENTRY_SIZE)  # its last entry cleanly lost
    f.sync()
    f.close()
    log = open_log(storage, segment_bytes=1_000)
    got = log.aborted_txns(*EVERYTHING)
    cut = next(i for i, t in enumerate(txns) if t not in got)
    assert got == txns[:cut] and txns[cut].last_offset < bases[bases.index(first) + 1]
    assert all(storage.size(txn_path(b)) == 0 for b in bases if b > first and storage.exists(txn_path(b)))
    for t in txns:
        log.add_aborted_txn(t)
    assert log.aborted_txns(*EVERYTHING) == txns
    log.sync()
    log.close()
    assert open_log(storage, segment_bytes=1_000).aborted_txns(*EVERYTHING) == txns


def test_txnindex_is_fsynced_by_the_flush():
    storage = MemoryStorage()
    log = open_log(storage)
    fill(log, 2)
    log.sync()
    txn = abort(log, 4, first_offset=1)
    storage.fail_next_sync(after=1)  # the data file's fsync succeeds, the txnindex file's fails
    with pytest.raises(OSError):
        log.sync()
    assert log.high_watermark == 2
    storage.fail_next_sync(0)
    log.close()
    log = open_log(storage)  # restart without a crash: the recovered txnindex is fsynced on open
    assert log.aborted_txns(*EVERYTHING) == [txn]
    log = open_log(storage.crash())
    assert log.aborted_txns(*EVERYTHING) == [txn]


def test_new_txnindex_file_name_is_made_durable_by_flush():
    storage = MemoryStorage()
    log = open_log(storage, segment_bytes=500)
    fill(log, 4)
    log.sync()
    txns = [abort(log, 1, first_offset=0)]
    fill(log, 4)
    txns.append(abort(log, 2))
    log.sync()
    log = open_log(storage.crash(), segment_bytes=500)
    assert log.aborted_txns(*EVERYTHING) == txns


def test_txnindex_write_failure_keeps_entry_and_blocks_flush_until_written():
    storage = MemoryStorage()
    log = open_log(storage)
    fill(log, 2)
    log.sync()
    append(log, make_batch([b"abort"], producer_id=3, attributes=0x30))
    storage.fail_next_write(count=2)  # the add's write and the retry in flush_begin
    txn = AbortedTxn(3, 0, 2, 3)
    assert log.add_aborted_txn(txn)
    assert log.aborted_txns(*EVERYTHING) == [txn]  # fetches still see it
    with pytest.raises(OSError):
        log.sync()
    assert log.high_watermark == 2
    assert log.sync() == 3  # the retry succeeds
    log = open_log(storage.crash())
    assert log.aborted_txns(*EVERYTHING) == [txn]


def test_retention_removes_txnindex_of_deleted_segments(storage):
    log = open_log(storage, segment_bytes=1_000)
    txns = []
    for i in range(12):
        fill(log, 2)
        txns.append(abort(log, i))
    log.sync()
    bases = log.segment_base_offsets
    assert storage.exists(txn_path(bases[0]))
    log.delete_records(bases[2])
    assert log.segment_base_offsets == bases[2:]
    assert not storage.exists(txn_path(bases[0])) and not storage.exists(txn_path(bases[1]))
    remaining = [t for t in txns if t.last_offset >= bases[2]]
    assert log.aborted_txns(*EVERYTHING) == remaining
    assert log.aborted_txns(bases[2], remaining[0].last_offset + 1) == remaining[:1]
    later = abort(log, 50)
    log.sync()
    log.close()
    log = open_log(storage, segment_bytes=1_000)
    assert log.aborted_txns(*EVERYTHING) == remaining + [later]
    log.configure(segment_bytes=1_000, retention_ms=-1, retention_bytes=0)
    assert log.apply_retention(now_ms=0) > 0
    assert [n for n in storage.list(DIR) if n.endswith(".txnindex")] == \
        [f"{b:020d}.txnindex" for b in log.segment_base_offsets if storage.exists(txn_path(b))]
    assert log.aborted_txns(*EVERYTHING) == [t for t in remaining + [later]
                                             if t.last_offset >= log.segment_base_offsets[0]]
    log.delete()
    assert not storage.exists(DIR)


def test_open_removes_orphaned_txnindex(storage):
    log = open_log(storage, segment_bytes=500)
    fill(log, 5)
    log.sync()
    log.close()
    storage.write_atomic(txn_path(99), b"orphan")
    storage.write_atomic(txn_path(0) + ".tmp", b"half")
    log = open_log(storage, segment_bytes=500)
    names = storage.list(DIR)
    assert f"{99:020d}.txnindex" not in names and not any(n.endswith(".tmp") for n in names)
    assert log.aborted_txns(*EVERYTHING) == []


def test_unsafe_no_fsync_aborted_txns():
    storage = MemoryStorage()
    log = open_log(storage, segment_bytes=500, unsafe_no_fsync=True)
    txns = []
    for i in range(5):
        fill(log, 2)
        txns.append(abort(log, i))
    syncs = storage.syncs
    log.flush_done(log.flush_begin())
    assert storage.syncs == syncs and log.high_watermark == log.log_end_offset
    log.close()
    log = open_log(storage, segment_bytes=500, unsafe_no_fsync=True)  # page cache intact
    assert log.aborted_txns(*EVERYTHING) == txns


@st.composite
def _aborted_txn_lists(draw):
    n = draw(st.integers(0, 40))
    lasts = sorted(draw(st.sets(st.integers(0, 199), min_size=n, max_size=n)))
    txns = []
    for i, last in enumerate(lasts):
        first = draw(st.integers(max(0, last - draw(st.sampled_from([3, 20, 200]))), last))
        txns.append(AbortedTxn(draw(st.integers(0, 5)), first, last, draw(st.integers(0, 200))))
    return txns


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(txns=_aborted_txn_lists(), duplicates=st.lists(st.integers(0, 199), max_size=5),
       queries=st.lists(st.tuples(st.integers(-5, 210), st.integers(-5, 210)), min_size=1, max_size=30))
def test_aborted_txns_matches_brute_force(txns, duplicates, queries):
    storage = MemoryStorage()
    log = open_log(storage, segment_bytes=700)
    for i in range(20):
        append(log, make_batch([value(i, 30)] * 10))  # offsets 0..199 in several segments
    for txn in txns:
        assert log.add_aborted_txn(txn)
        for d in duplicates:
            if d <= txn.last_offset:
                assert not log.add_aborted_txn(AbortedTxn(1, 0, d, 0))

    def check(log: PartitionLog) -> None:
        for start, end in queries:
            expected = [t for t in txns if t.last_offset >= start and t.first_offset < end]
            assert log.aborted_txns(start, end) == expected

    check(log)
    log.sync()
    log.close()
    log = open_log(storage, segment_bytes=700)
    check(log)
    if txns:
        event("entries in several segments" if log.segment_base_offsets[
            bisect.bisect_right(log.segment_base_offsets, txns[0].last_offset) - 1] != log.segment_base_offsets[
            bisect.bisect_right(log.segment_base_offsets, txns[-1].last_offset) - 1] else "entries in one segment")


_ABORT = st.tuples(st.just("abort"), st.integers(0, 30), st.integers(0, 9))
_TXN_OPS = st.one_of(st.tuples(st.just("append"), st.integers(1, 3), st.integers(1, 200)), _ABORT, _ABORT,
                     *_CRASH_OPS)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(_TXN_OPS, min_size=10, max_size=60), final_seed=st.integers(0, 2**32))
def test_random_aborted_txns_with_flush_crash_and_failures(ops, final_seed):
    """After any crash or restart the entries are a prefix of those added, include every one a
    completed flush covered, lie within the log, and start-up replay restores exactly the entries
    whose markers survived."""
    seg = 600
    storage = MemoryStorage()
    log = open_log(storage, segment_bytes=seg)
    added: list[AbortedTxn] = []  # entries added whose markers are still in the log
    durable: set[AbortedTxn] = set()  # entries indexed when a flush that completed began
    planned: dict[int, set[AbortedTxn]] = {}
    pending: int | None = None

    def begin() -> int:
        target = log.flush_begin()
        planned[target] = set(log.aborted_txns(*EVERYTHING))
        return target

    def check_reopened(log: PartitionLog) -> None:
        nonlocal added
        base, end = log.segment_base_offsets[0], log.log_end_offset
        added = [t for t in added if t.last_offset < end]  # markers lost with the tail are gone for good
        possible = [t for t in added if t.last_offset >= base]
        got = log.aborted_txns(*EVERYTHING)
        assert got == possible[: len(got)], "not a prefix of the entries added"
        assert all(t in got for t in durable if t.last_offset >= base), "a flushed entry was lost"
        event("crash lost entries" if len(got) < len(possible) else "crash kept every entry")
        for t in possible:  # start-up replay
            log.add_aborted_txn(t)
        assert log.aborted_txns(*EVERYTHING) == possible

    for op, a, b in ops:
        if op in ("append", "abort"):
            if op == "append":  # a records of b bytes
                batch = make_batch([value(k, b) for k in range(a)])
            else:  # producer b's ABORT marker for a transaction begun up to a offsets before it
                batch = make_batch([b"abort"], producer_id=b, attributes=0x30)
            try:
                last = append(log, batch)[1]
            except OSError:
                event("append failed")
                continue
            if op == "abort":
                txn = AbortedTxn(b, max(0, last - a), last, last + 1)
                assert log.add_aborted_txn(txn)
                added.append(txn)
        elif op == "flush":
            target = pending if pending is not None else begin()
            pending = None
            try:
                log.flush(target)
            except OSError:
                event("flush failed")
                log.close()
                _healthy(storage)
                log = open_log(storage, segment_bytes=seg)  # restart; page cache intact
                check_reopened(log)
                continue
            log.flush_done(target)
            durable |= planned.pop(target)
        elif op == "begin":
            pending = begin()
        elif op == "fail":
            getattr(storage, "fail_next_write" if a else "fail_next_sync")(after=b)
        elif op == "trim":
            start = log.log_start_offset
            try:
                log.delete_records(start + (log.high_watermark - start) * a // 4)
            except OSError:
                event("delete_records failed")
            assert log.aborted_txns(*EVERYTHING) == [t for t in added if t.last_offset >= log.segment_base_offsets[0]]
        else:
            _healthy(storage)
            storage = storage.crash(torn_tail=a, rng=random.Random(b))
            log = open_log(storage, segment_bytes=seg)
            pending = None
            check_reopened(log)
    _healthy(storage)
    storage = storage.crash(torn_tail=True, rng=random.Random(final_seed))
    log = open_log(storage, segment_bytes=seg)
    check_reopened(log)


# --- write-behind ---------------------------------------------------------------------------------


def _segment_file_bytes(storage, log: PartitionLog) -> int:
    return sum(storage.size(posixpath.join(DIR, name)) for name in storage.list(DIR) if name.endswith(".log"))


@pytest.mark.parametrize("write_mode", [True], indirect=True, ids=["write-behind"])
def test_write_behind_writes_at_the_flush_and_reads_from_memory_meanwhile(storage, write_mode):
    log = open_log(storage, segment_bytes=1_500)
    vals = fill(log, 12)                            # rolls segments: sealed ones keep unwritten tails too
    assert _segment_file_bytes(storage, log) == 0   # nothing written yet
    assert values_of(read_all(log)) == vals         # served from the appended buffers
    assert log.offset_for_timestamp(0) is not None
    log.sync()
    assert _segment_file_bytes(storage, log) == log.size_bytes
    vals += fill(log, 3)
    assert values_of(read_all(log)) == vals         # file below, memory above
    log.sync()
    log.close()
    assert values_of(read_all(open_log(storage, segment_bytes=1_500))) == vals


@pytest.mark.parametrize("write_mode", [True], indirect=True, ids=["write-behind"])
def test_write_tails_hands_the_tails_to_the_os_before_the_flush(storage, write_mode):
    log = open_log(storage, segment_bytes=1_500)
    vals = fill(log, 12)                            # several segments, each with a tail
    log.write_tails()
    assert _segment_file_bytes(storage, log) == log.size_bytes     # written, not yet fsynced
    assert log.high_watermark == 0
    assert values_of(read_all(log)) == vals
    vals += fill(log, 2)
    log.sync()                                      # writes only the two appended since, once
    assert _segment_file_bytes(storage, log) == log.size_bytes
    log.close()
    assert values_of(read_all(open_log(storage, segment_bytes=1_500))) == vals


@pytest.mark.parametrize("write_mode", [True], indirect=True, ids=["write-behind"])
def test_write_behind_failed_write_is_retried_by_the_next_flush_without_duplicates(write_mode):
    storage = MemoryStorage()
    log = open_log(storage)
    vals = fill(log, 4)
    storage.fail_next_write()                       # half the bytes land, then ENOSPC
    target = log.flush_begin()
    with pytest.raises(OSError):
        log.flush(target)
    vals += fill(log, 2)
    log.sync()                                      # a new plan writes all six, once
    assert log.high_watermark == 6
    log = open_log(storage.crash())
    assert values_of(read_all(log)) == vals


@pytest.mark.parametrize("write_mode", [True], indirect=True, ids=["write-behind"])
def test_write_behind_overlapping_plans_write_each_byte_once(write_mode):
    storage = MemoryStorage()
    log = open_log(storage)
    vals = fill(log, 3)
    first = log.flush_begin()
    vals += fill(log, 2)
    second = log.flush_begin()                      # takes all five again
    log.flush(first)
    log.flush(second)                               # writes only the two the first did not
    log.flush_done(second)
    assert log.high_watermark == 5
    assert _segment_file_bytes(storage, log) == log.size_bytes
    log = open_log(storage.crash())
    assert values_of(read_all(log)) == vals


@pytest.mark.parametrize("write_mode", [True], indirect=True, ids=["write-behind"])
def test_write_behind_writes_large_batches_at_once_unless_small_ones_are_pending(storage, write_mode):
    big = log_mod.WRITE_BEHIND_MAX
    log = open_log(storage)
    first = [value(0, big)]
    append(log, make_batch(first))                  # nothing pending: written by the append
    assert _segment_file_bytes(storage, log) == log.size_bytes
    small = [value(1)]
    append(log, make_batch(small))                  # pending in memory
    written = _segment_file_bytes(storage, log)
    assert written < log.size_bytes
    second = [value(2, big)]
    append(log, make_batch(second))                 # behind a pending one: pending too, in order
    assert _segment_file_bytes(storage, log) == written
    assert values_of(read_all(log)) == first + small + second
    log.sync()
    assert _segment_file_bytes(storage, log) == log.size_bytes
    log.close()
    assert values_of(read_all(open_log(storage))) == first + small + second


# --- a copy of a log kept elsewhere (the PostgreSQL engine's cache) ---------------------------------------------


def test_appending_with_kept_offsets_copies_another_logs_batches_gaps_included(storage):
    """keep_offsets: the batches keep the offsets they carry, gaps (a cleaned log's) stay gaps, reads find them by
    offset, and the log end follows the last batch; a batch below the log end is refused and changes nothing."""
    source = PartitionLog.open(storage, "source", now_ms=0, **WRITE_BEHIND)
    for i in range(4):
        append(source, make_batch([b"v%d" % i, b"w%d" % i]))
    source.sync()
    copied = bytearray(read_all(source))
    hs = headers(copied)
    gap = bytearray(b"".join(bytes(copied[p:p + h.size]) for p, h in (hs[0], hs[2], hs[3])))
    copy = PartitionLog.open(storage, "copy", now_ms=0, **WRITE_BEHIND)
    first, last, _ = copy.append(gap, headers(gap), 5_000, keep_offsets=True)
    assert (first, last, copy.log_end_offset) == (0, 7, 8)
    copy.sync()
    assert [h.base_offset for _, h in headers(read_all(copy))] == [0, 4, 6]
    assert [h.base_offset for _, h in headers(copy.read(2, 1 << 20, 8))] == [4, 6]
    assert values_of(read_all(copy)) == [b"v0", b"w0", b"v2", b"w2", b"v3", b"w3"]
    again = bytearray(copied[hs[1][0]:hs[1][0] + hs[1][1].size])
    with pytest.raises(ValueError):
        copy.append(again, headers(again), 5_000, keep_offsets=True)
    assert copy.log_end_offset == 8


def test_truncate_fully_and_start_at_empties_the_log_and_starts_it_at_the_offset(storage):
    """Everything goes; the log is empty from the new start (checkpointed: a reopen keeps it), and appends go on
    from there."""
    log = PartitionLog.open(storage, "p", now_ms=0, segment_bytes=200, **WRITE_BEHIND)
    for i in range(6):
        append(log, make_batch([b"x" * 60]))
    log.add_aborted_txn(AbortedTxn(7, 1, 2, 1))
    log.sync()
    assert len(log.segment_base_offsets) > 1
    log.truncate_fully_and_start_at(40)
    assert (log.log_start_offset, log.log_end_offset, log.high_watermark) == (40, 40, 40)
    assert log.segment_base_offsets == [40] and log.aborted_txns(0, 100) == []
    assert append(log, make_batch([b"after"]))[0] == 40
    log.sync()
    log.close()
    reopened = PartitionLog.open(storage, "p", now_ms=0, **WRITE_BEHIND)
    assert (reopened.log_start_offset, reopened.log_end_offset) == (40, 41)
    assert values_of(read_all(reopened)) == [b"after"]
    assert sorted(n for n in storage.list("p") if n.endswith(".log")) == [f"{40:020d}.log"]
