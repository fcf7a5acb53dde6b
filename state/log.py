"""One partition's log: segments of v2 record batches with offset, time and aborted-transaction indexes,
crash recovery and retention."""
from __future__ import annotations

import bisect
import errno
import posixpath
import random
import re
import struct
import sys
from array import array
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import crc32c

from trireme.state.storage import TEMP_SUFFIX, AppendFile, ReadFile, Storage
from trireme.wire.primitives import CodecError
from trireme.wire.records import (ATTRIBUTES_OFFSET, BATCH_HEADER_SIZE, LOG_OVERHEAD, MIN_BATCH_LENGTH, BatchHeader,
                          parse_batch_header, set_log_append_time, decode_records, iter_batch_headers)

INDEX_INTERVAL_BYTES = 4096  # an offset index entry roughly every this many bytes of log
CHECKPOINT_NAME = "log-start-offset.checkpoint"
CLEANER_CHECKPOINT_NAME = "cleaner-offset.checkpoint"  # the first dirty offset (state/cleaner.py)
CLEANED_SUFFIX = ".cleaned"  # a cleaned segment's files as the cleaner writes them
SWAP_SUFFIX = ".swap"        # ... and while they replace the old segments (a committed swap)
SEGMENT_KINDS = ("log", "index", "timeindex", "txnindex")
RELEASE_STEP_BYTES = 4 << 20  # a dropped segment's blocks are freed this many bytes at a time (release_files)

_INT32_MAX = 2**31 - 1
_INT64_MAX = 2**63 - 1
WRITE_BEHIND_MAX = 16384  # batches this big are written by the append itself (see PartitionLog)
# After a flush round that covered at most PREALLOCATE_ROUND_BYTES of the active segment, the flusher has zeros
# written ahead of its end (AppendFile.preallocate): PREALLOCATE_ROUNDS rounds' worth, within these bounds and the
# segment's size.  An fsync over written blocks saves a round about the same time whatever its size (the metadata
# commit), while the zeros cost their bytes: worth it for small rounds, not for large ones.
PREALLOCATE_ROUND_BYTES = 256 << 10
PREALLOCATE_ROUNDS = 32
PREALLOCATE_MIN_BYTES = 64 << 10
PREALLOCATE_MAX_BYTES = 4 << 20
_READAHEAD = 8192  # bytes read at a time when hopping from batch header to batch header
_RECOVERY_CHUNK = 1 << 20
_SEGMENT_NAME = re.compile(r"(\d{20})\.(log|index|timeindex|txnindex)")
_SWAP_NAME = re.compile(r"(\d{20})\.(log|index|timeindex|txnindex)\.(cleaned|swap)")


def cleaned_name(base_offset: int, kind: str, suffix: str = CLEANED_SUFFIX) -> str:
    """The file name of a cleaned segment's `kind` file ("log", "index", "timeindex", "txnindex")."""
    return f"{base_offset:020d}.{kind}{suffix}"


# --- what a cleaning plan holds (state/cleaner.py cleans; the log plans a cleaning and swaps its result in) ---

LONG_MAX = 2**63 - 1


@dataclass(frozen=True)
class SegmentRef:
    """A rolled segment as the plan saw it."""

    base_offset: int
    next_offset: int
    size: int
    txn_count: int


@dataclass(frozen=True)
class CleaningPlan:
    """What one cleaning does; picklable, so that :func:`clean` can run in another process."""

    directory: str
    segments: tuple[SegmentRef, ...]       # the cleanable range, from the log start, in offset order
    groups: tuple[tuple[int, int], ...]    # [start, end) indexes into segments: each becomes one new segment
    txn_entries: tuple[tuple[tuple[int, int, int, int], ...], ...]  # per group: its aborted-transaction index
    #                                      entries (producer id, first offset, marker offset, LSO)
    aborted: tuple[tuple[int, int, int], ...]  # (producer id, first offset, marker offset) in the range
    first_dirty_offset: int
    end_offset: int                        # the first offset not cleaned
    now_ms: int
    delete_retention_ms: int
    max_map_keys: int
    dirty_ratio: float
    forced: bool                           # max.compaction.lag.ms passed for the first dirty segment
    durable: bool                          # fsync what is written


def dirty_ratio(clean_bytes: int, dirty_bytes: int) -> float:
    total = clean_bytes + dirty_bytes
    return dirty_bytes / total if total else 0.0


class OffsetOutOfRange(Exception):
    """An offset below the log start offset or above the log end offset (or, for delete_records, the high watermark)."""


class CorruptLog(Exception):
    """A segment that passed recovery no longer parses (the disk changed under us)."""


@dataclass(frozen=True)
class AbortedTxn:
    """One aborted transaction of a producer in this partition, as a read_committed fetch lists it.

    `first_offset` is the producer's first offset in the transaction, `last_offset` the offset of
    its ABORT control marker, `last_stable_offset` the partition's LSO just after that marker
    (kept for information, as Kafka does).
    """

    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


# A txnindex entry: producer id, first offset, last offset, LSO, then the last offset of the entry
# before it in the log (-1 for none), which chains the per-segment files together, and a CRC-32C
# of those 40 bytes, which catches a torn or garbled entry.
TXN_INDEX_ENTRY = struct.Struct(">qqqqqI")
_TXN_BODY_SIZE = TXN_INDEX_ENTRY.size - 4


def pack_txn_entry(txn: AbortedTxn, prev_last: int) -> bytes:
    body = struct.pack(">qqqqq", txn.producer_id, txn.first_offset, txn.last_offset, txn.last_stable_offset,
                       prev_last)
    return body + struct.pack(">I", crc32c.crc32c(body))


def unpack_txn_entry(data: bytes, pos: int) -> tuple[AbortedTxn, int] | None:
    """(entry, previous entry's last offset) at `pos`, or None if its checksum does not match."""
    *fields, prev_last, crc = TXN_INDEX_ENTRY.unpack_from(data, pos)
    if crc32c.crc32c(data[pos : pos + _TXN_BODY_SIZE]) != crc:
        return None
    return AbortedTxn(*fields), prev_last


# --- peeking at v2 batch headers (the only part of a batch this module ever looks at) ---------

HEADER_SIZE = BATCH_HEADER_SIZE  # 61
_INT64 = struct.Struct(">q")
_INT32 = struct.Struct(">i")
_BASE_AND_LENGTH = struct.Struct(">qi")
_LAST_DELTA_POS = 23  # lastOffsetDelta int32, after attributes
TIME_INDEX_ENTRY = struct.Struct(">qi")


def _scan(reader: ReadFile, pos: int, end: int, readahead: int = _READAHEAD) -> Iterator[tuple[bytes, int, int, int]]:
    """Yield (buf, i, file_pos, batch_size) for each batch in [pos, end); its header is buf[i:i+61].

    Reads `readahead` bytes at a time, or just a header after skipping a batch bigger than that.
    """
    want = readahead
    while pos + HEADER_SIZE <= end:
        buf = reader.read(pos, min(max(want, HEADER_SIZE), end - pos))
        if len(buf) < HEADER_SIZE:
            raise CorruptLog(f"{reader.path}: short read at {pos}")
        i = 0
        size = 0
        while i + HEADER_SIZE <= len(buf) and pos + i < end:
            length = _INT32.unpack_from(buf, i + 8)[0]
            if length < MIN_BATCH_LENGTH:
                raise CorruptLog(f"{reader.path}: bad batch length {length} at {pos + i}")
            size = length + LOG_OVERHEAD
            yield buf, i, pos + i, size
            i += size
        pos += i
        want = HEADER_SIZE if size > readahead else readahead


# --- segments ---------------------------------------------------------------------------------


class _Segment:
    """One segment file and its in-memory indexes.

    Offset index: (relative base offset, file position) of a batch every INDEX_INTERVAL_BYTES.
    Time index: at the same points, (max timestamp so far, relative base offset of the batch
    that has it), only when the max timestamp grew; sealing adds a final entry.
    Aborted-transaction index: the entries whose abort markers are in this segment live in the
    log's in-memory list; the segment counts them and appends them to its own txnindex file
    (`txn_count` entries in memory, `txn_written` of them in the file, `txn_synced` fsynced,
    `txn_unwritten` the packed entries still to write).
    """

    __slots__ = ("base_offset", "path", "handle", "size", "next_offset", "index_rel", "index_pos",
                 "time_ts", "time_rel", "max_ts", "max_ts_offset", "bytes_since_index",
                 "sealed", "index_persisted", "deleted",
                 "txn_handle", "txn_on_disk", "txn_count", "txn_written", "txn_synced", "txn_unwritten",
                 "txn_pending", "tail", "tail_start", "rolling_ts", "created_ms", "roll_jitter_ms")

    def __init__(self, base_offset: int, path: str, size: int = 0, handle: ReadFile | None = None) -> None:
        self.base_offset = base_offset
        self.path = path
        self.handle = handle
        self.size = size
        self.next_offset = base_offset
        self.index_rel = array("i")
        self.index_pos = array("i")
        self.time_ts = array("q")
        self.time_rel = array("i")
        self.max_ts = -1
        self.max_ts_offset = -1
        self.bytes_since_index = 0
        self.sealed = False
        self.index_persisted = False
        self.deleted = False
        self.txn_handle: AppendFile | None = None
        self.txn_on_disk = False  # whether the txnindex file exists (so opening it creates no name)
        self.txn_count = self.txn_written = self.txn_synced = 0
        self.txn_unwritten = bytearray()
        self.txn_pending = False  # in PartitionLog._txn_pending
        # Write-behind: the appended bytes from file position tail_start on, not yet known written to the file
        # (views of the request buffers they came in); tail_start + their length == size.
        self.tail: list = []
        self.tail_start = size
        # segment.ms (Kafka's LogSegment.shouldRoll): the first batch's max timestamp (None: not read yet), when the
        # segment was created or opened, and this segment's share of segment.jitter.ms
        self.rolling_ts: int | None = None
        self.created_ms = 0
        self.roll_jitter_ms = 0

    @property
    def index_path(self) -> str:
        return self.path[: -len(".log")] + ".index"

    @property
    def txn_index_path(self) -> str:
        return self.path[: -len(".log")] + ".txnindex"

    @property
    def time_index_path(self) -> str:
        return self.path[: -len(".log")] + ".timeindex"

    def track(self, pos: int, base_offset: int, next_offset: int, max_ts: int, size: int) -> None:
        """Account for one batch written at file position `pos` (same rule on append and rebuild)."""
        if self.bytes_since_index >= INDEX_INTERVAL_BYTES:
            self._add_time_entry()
            self.index_rel.append(base_offset - self.base_offset)
            self.index_pos.append(pos)
            self.bytes_since_index = 0
        self.bytes_since_index += size
        if max_ts > self.max_ts:
            self.max_ts = max_ts
            self.max_ts_offset = base_offset
        self.next_offset = next_offset

    def _add_time_entry(self) -> None:
        if self.max_ts >= 0 and (not self.time_ts or self.max_ts > self.time_ts[-1]):
            self.time_ts.append(self.max_ts)
            self.time_rel.append(self.max_ts_offset - self.base_offset)

    def seal(self) -> None:
        """No more appends: the indexes are final."""
        self._add_time_entry()
        self.sealed = True

    def index_bytes(self) -> bytes:
        pairs = array("i", bytes(8 * len(self.index_rel)))
        pairs[0::2] = self.index_rel
        pairs[1::2] = self.index_pos
        if sys.byteorder == "little":
            pairs.byteswap()
        return pairs.tobytes()

    def time_index_bytes(self) -> bytes:
        return b"".join(TIME_INDEX_ENTRY.pack(ts, rel) for ts, rel in zip(self.time_ts, self.time_rel))

    def load_indexes(self, index: bytes, time_index: bytes) -> bool:
        """Adopt persisted indexes if they are well-formed; the caller checks they fit the file."""
        if len(index) % 8 or len(time_index) % TIME_INDEX_ENTRY.size:
            return False
        pairs = array("i")
        pairs.frombytes(index)
        if sys.byteorder == "little":
            pairs.byteswap()
        rel, pos = pairs[0::2], pairs[1::2]
        times = list(TIME_INDEX_ENTRY.iter_unpack(time_index))
        if not _strictly_increasing(rel, 1) or not _strictly_increasing(pos, 1):
            return False
        if not _strictly_increasing([t for t, _ in times], 0) or any(r < 0 for _, r in times):
            return False
        if pos and pos[-1] >= self.size:
            return False
        self.index_rel, self.index_pos = rel, pos
        self.time_ts = array("q", [t for t, _ in times])
        self.time_rel = array("i", [r for _, r in times])
        if times:
            self.max_ts, self.max_ts_offset = times[-1][0], self.base_offset + times[-1][1]
        return True


def _strictly_increasing(values: Sequence[int], floor: int) -> bool:
    prev = floor - 1
    for v in values:
        if v <= prev:
            return False
        prev = v
    return True


@dataclass(frozen=True)
class _FlushPlan:
    """What one flush must do, fixed by flush_begin so that flush can run in another thread."""

    target: int
    write_error: OSError | None     # writing a write-behind tail failed: the flush fails with it
    files: tuple[tuple[_Segment, AppendFile], ...]
    txn_files: tuple[tuple[_Segment, AppendFile | None, int, int], ...]  # (segment, handle, written, count)
    sync_dir: bool
    dir_generation: int
    seal: tuple[_Segment, ...]


class _TailReader(ReadFile):
    """A segment read while part of it is only in memory (write-behind): the file below ``tail_start``, the tail
    buffers from there."""

    __slots__ = ("file", "tail_start", "tail", "path")

    def __init__(self, file: ReadFile, tail_start: int, tail: list) -> None:
        self.file = file
        self.tail_start = tail_start
        self.tail = tail
        self.path = file.path

    @property
    def size(self) -> int:
        return self.tail_start + sum(len(b) for b in self.tail)

    def read(self, pos: int, n: int) -> bytes:
        end = pos + n
        parts = []
        if pos < self.tail_start:
            parts.append(self.file.read(pos, min(end, self.tail_start) - pos))
        at = self.tail_start
        for buf in self.tail:
            if at >= end:
                break
            following = at + len(buf)
            if following > pos:
                parts.append(buf[max(pos - at, 0):min(end, following) - at])
            at = following
        return b"".join(parts)

    def close(self) -> None:
        pass                # the segment's own handle is closed with the segment


# --- the log ----------------------------------------------------------------------------------


class PartitionLog:
    """A partition's log. All methods but `flush` belong to one thread (the trio thread).

    Durability: appends only write. `high_watermark` is the offset below which everything is
    fsynced. A flush is flush_begin (plan, owning thread) → flush (fsyncs, any thread) →
    flush_done (owning thread). With `write_behind` (fsync on, acknowledging after the flush) an append
    of a small batch does not write: it keeps a view of the batch bytes as they came, and flush_begin
    writes everything appended since the last flush with one `pwritev` per segment (one system call per
    partition and flush round instead of one per request); reads of those bytes meanwhile are served
    from memory (`_TailReader`). A batch of WRITE_BEHIND_MAX bytes or more is written at once when
    nothing is pending before it. `write_tails` writes the tails at once, for an answer that goes out
    before the flush and must survive a process crash. A sealed segment's indexes are persisted only
    after its data was fsynced, so on open a segment with indexes is known durable; every segment from the
    first one without them is validated batch by batch and truncated at the first bad batch.

    Aborted transactions: the broker reports each ABORT marker it appends (`add_aborted_txn`),
    and at start-up replays every marker of the log, which re-adds whatever a crash lost, since
    an entry not beyond the last one indexed is a duplicate. The entries are kept in memory in
    last-offset order, so `aborted_txns` reads no file, and appended (no fsync) to the
    txnindex file of the segment holding the marker. A flush fsyncs those files along with the
    data, so the high watermark never passes an entry that is not durable.
    """

    def __init__(self, storage: Storage, directory: str, *, segment_bytes: int, retention_ms: int,
                 retention_bytes: int, unsafe_no_fsync: bool, ack_before_flush: bool = False,
                 write_behind: bool = False, segment_ms: int = _INT64_MAX, segment_jitter_ms: int = 0) -> None:
        self._storage = storage
        self._directory = directory
        self._unsafe = unsafe_no_fsync
        self._ack_before_flush = ack_before_flush
        # Only where nothing is visible or acknowledged before its flush: bytes not yet written would be lost
        # by a process crash, which the page cache survives.
        self._write_behind = write_behind and not unsafe_no_fsync and not ack_before_flush
        self.configure(segment_bytes=segment_bytes, retention_ms=retention_ms, retention_bytes=retention_bytes,
                       segment_ms=segment_ms, segment_jitter_ms=segment_jitter_ms)
        self._segments: list[_Segment] = []
        self._bases: list[int] = []
        self._log_start = 0
        self._hw = 0
        self._unpersisted: list[_Segment] = []  # sealed segments whose indexes are not yet on disk
        # Aborted transactions of every segment, in last-offset order (a segment's entries are a run).
        self._aborted: list[AbortedTxn] = []
        self._aborted_last = array("q")  # their last offsets, for bisect
        self._aborted_floor = array("q")  # [j]: the least first offset of entries j and after
        self._last_aborted = -1  # last offset of the last entry ever indexed (survives retention)
        self._txn_pending: list[_Segment] = []  # segments whose txnindex has entries not yet written or fsynced
        self._plans: dict[int, _FlushPlan] = {}
        self._round_end = 0     # the active segment's size at the last `preallocation`
        self._dir_generation = 0  # bumped when a segment file is created
        self._dir_synced_generation = 0
        self._closed = False
        self._deleted = False
        self._cleaner_checkpoint = 0  # the first dirty offset: below it the log was cleaned (state/cleaner.py)
        self._cleaning: object | None = None  # the plan being cleaned, if any
        # Segments gone below the log start at runtime (retention, DeleteRecords): unlinked, their blocks not yet
        # freed: (writable handles of their log files, their other open handles) for take_retired.
        self._retired: tuple[list, list] = ([], [])
        self.on_retired: Callable[[], object] | None = None   # told when _retired gains something
        self.on_log_start_moved: Callable[[], object] | None = None   # told when the log start offset moves
        # told [(first offset, end offset)] of each range a cleaning's swap replaced (a copy of the log elsewhere
        # replaces them too)
        self.on_cleaned: Callable[[list[tuple[int, int]]], object] | None = None

    def configure(self, *, segment_bytes: int, retention_ms: int, retention_bytes: int,
                  segment_ms: int = _INT64_MAX, segment_jitter_ms: int = 0) -> None:
        """Change the segment size and age and retention limits (applies to later appends and retention runs)."""
        self.segment_bytes = max(HEADER_SIZE, min(segment_bytes, _INT32_MAX))
        self.segment_ms = max(1, segment_ms)
        self.segment_jitter_ms = max(0, segment_jitter_ms)
        self.retention_ms = retention_ms
        self.retention_bytes = retention_bytes

    # --- opening and recovery ---

    @classmethod
    def open(cls, storage: Storage, directory: str, *, segment_bytes: int = 1073741824,
             retention_ms: int = 604800000, retention_bytes: int = -1, now_ms: int,
             unsafe_no_fsync: bool = False, ack_before_flush: bool = False,
             write_behind: bool = False, segment_ms: int = _INT64_MAX, segment_jitter_ms: int = 0) -> PartitionLog:
        """Open (or create) the log in `directory`, recovering the tail after a crash.

        With `ack_before_flush` (Kafka's flush policy, log.flush.interval.*) the high watermark is the
        log end offset: data is visible once written, and flushes (still with every durability rule)
        only move `durable_offset`.  `write_behind` (ignored with either of the others) leaves the writes
        to the flush (see the class).
        """
        log = cls(storage, directory, segment_bytes=segment_bytes, retention_ms=retention_ms,
                  retention_bytes=retention_bytes, unsafe_no_fsync=unsafe_no_fsync,
                  ack_before_flush=ack_before_flush, write_behind=write_behind, segment_ms=segment_ms,
                  segment_jitter_ms=segment_jitter_ms)
        log._load()
        for seg in log._segments:
            seg.created_ms = now_ms
        log._segments[-1].roll_jitter_ms = log._roll_jitter()
        return log

    def _load(self) -> None:
        storage, directory = self._storage, self._directory
        if not storage.exists(directory):
            storage.makedirs(directory)
            if not self._unsafe:  # make the new directory's own name durable, up to the storage root
                parent = directory
                while parent:
                    parent = posixpath.dirname(parent)
                    storage.sync_dir(parent)
        self._recover_swaps()
        self._cleaner_checkpoint = self._read_offset_file(CLEANER_CHECKPOINT_NAME)
        # Offsets may have gaps below this: the end of the last cleaning begun (its swaps may have finished).
        cleaned_below = max(self._cleaner_checkpoint, self._read_offset_file(CLEANER_CHECKPOINT_NAME, line=2))
        names = storage.list(directory)
        logs = {int(m.group(1)) for m in map(_SEGMENT_NAME.fullmatch, names) if m and m.group(2) == "log"}
        txn_indexes = {int(m.group(1)) for m in map(_SEGMENT_NAME.fullmatch, names) if m and m.group(2) == "txnindex"}
        bases = sorted(logs)
        for name in names:
            m = _SEGMENT_NAME.fullmatch(name)
            if name.endswith(TEMP_SUFFIX) or (m and int(m.group(1)) not in logs):
                storage.remove(self._path(name), missing_ok=True)
        checkpoint = self._read_checkpoint()
        segments = [_Segment(b, self._segment_path(b), storage.size(self._segment_path(b))) for b in bases]

        # Segments wholly below the checkpointed log start offset were deleted before a crash.
        while len(segments) > 1 and segments[1].base_offset <= checkpoint:
            self._remove_files(segments.pop(0))

        # Sealed segments whose persisted indexes fit are durable; from the first that is not, validate.
        expected: int | None = None
        trusted = 0
        for seg in segments[:-1]:
            if not self._adopt_indexes(seg) or (expected is not None and seg.base_offset != expected):
                break
            seg.sealed = seg.index_persisted = True
            expected = seg.next_offset
            trusted += 1
        recovered: list[_Segment] = []
        for i in range(trusted, len(segments)):
            seg = segments[i]
            if expected is not None and seg.base_offset != expected:
                for gone in segments[i:]:
                    self._remove_files(gone)
                del segments[i:]
                break
            seg.handle = storage.open_append(seg.path)
            recovered.append(seg)
            valid_end = self._recover_segment(seg, allow_gaps=seg.base_offset < cleaned_below)
            expected = seg.next_offset
            if valid_end < seg.size:
                # zeros written ahead before it rolled (preallocation): cut only them, the later segments stay
                zeros_only = i < len(segments) - 1 and self._zeros_from(seg, valid_end)
                seg.handle.truncate(valid_end)
                seg.size = valid_end
                if zeros_only:
                    continue
                for gone in segments[i + 1 :]:
                    self._remove_files(gone)
                del segments[i + 1 :]
                break

        self._log_start = max(checkpoint, segments[0].base_offset if segments else 0)
        if not segments or segments[-1].next_offset < self._log_start:
            for gone in segments:
                self._remove_files(gone)
            fresh = _Segment(self._log_start, self._segment_path(self._log_start))
            fresh.handle = storage.open_append(fresh.path)
            fresh.handle.truncate(0)
            segments = [fresh]
            recovered = [fresh]

        active = segments[-1]
        if not isinstance(active.handle, AppendFile):
            if active.handle is not None:
                active.handle.close()
            active.handle = storage.open_append(active.path)
        if active.sealed:  # a sealed segment's indexes become stale once it is appended to again
            storage.remove(active.index_path, missing_ok=True)
            storage.remove(active.time_index_path, missing_ok=True)
            active.sealed = active.index_persisted = False
            active.bytes_since_index = self._bytes_since_last_index(active)
        for seg in segments[:-1]:
            if not seg.sealed:
                seg.seal()
        self._load_aborted_txns(segments, recovered, txn_indexes, cleaned_below)

        if not self._unsafe:
            for seg in recovered:
                seg.handle.sync()
            storage.sync_dir(directory)
        for seg in segments[:-1]:
            if not seg.index_persisted:
                try:
                    self._persist_indexes(seg, durable=not self._unsafe)
                    seg.index_persisted = True
                except OSError:
                    self._unpersisted.append(seg)  # an optimisation only: the next flush retries

        self._segments = segments
        self._bases = [s.base_offset for s in segments]
        self._hw = self.log_end_offset

    def _load_aborted_txns(self, segments: list[_Segment], recovered: list[_Segment], present: set[int],
                           cleaned_below: int = 0) -> None:
        """Adopt the txnindex entries that fit the recovered log; cut the files after the last one kept.

        An entry is kept if its checksum matches, its marker lies in its segment below the log end
        offset, and it follows the previous entry kept: its recorded predecessor is that entry
        (or, for the first, one below the first segment). So the entries kept are a prefix of
        those ever added, in order, even if a crash kept a later segment's file but not all of an
        earlier one's; start-up replay re-adds the rest. Truncations, and the files of recovered
        segments, are fsynced, as recovered data is.
        """
        prev_last: int | None = None
        size = TXN_INDEX_ENTRY.size
        broken = False
        recovered_ids = {id(seg) for seg in recovered}
        for seg in segments:
            if seg.base_offset not in present:
                continue
            try:
                data = self._storage.read_all(seg.txn_index_path)
            except FileNotFoundError:
                continue
            seg.txn_on_disk = True
            kept = 0
            pos = 0
            while not broken and pos + size <= len(data):
                unpacked = unpack_txn_entry(data, pos)
                if unpacked is None:
                    break
                txn, link = unpacked
                if not (link == prev_last if prev_last is not None else link < segments[0].base_offset):
                    # The cleaner drops the entries of the markers it removes, all below cleaned_below, where
                    # no entry is lost otherwise (they are durable): a predecessor there need not be the last kept.
                    if not (link < cleaned_below and txn.last_offset > (-1 if prev_last is None else prev_last)):
                        break
                if (not seg.base_offset <= txn.last_offset < seg.next_offset or txn.producer_id < 0
                        or not 0 <= txn.first_offset <= txn.last_offset):
                    break
                self._aborted.append(txn)
                self._aborted_last.append(txn.last_offset)
                prev_last = txn.last_offset
                kept += 1
                pos += size
            seg.txn_count = seg.txn_written = seg.txn_synced = kept
            if pos < len(data):
                broken = True  # entries after a bad one, in this file and later ones, are dropped
                seg.txn_handle = self._storage.open_append(seg.txn_index_path)
                seg.txn_handle.truncate(pos)
                if not self._unsafe:
                    seg.txn_handle.sync()
            elif id(seg) in recovered_ids and data and not self._unsafe:
                seg.txn_handle = self._storage.open_append(seg.txn_index_path)
                seg.txn_handle.sync()
        floor = array("q", (t.first_offset for t in self._aborted))
        for j in range(len(floor) - 2, -1, -1):
            floor[j] = min(floor[j], floor[j + 1])
        self._aborted_floor = floor
        self._last_aborted = -1 if prev_last is None else prev_last

    def _adopt_indexes(self, seg: _Segment) -> bool:
        """Load a sealed segment's persisted indexes and find its next offset, if they fit the file."""
        try:
            index = self._storage.read_all(seg.index_path)
            time_index = self._storage.read_all(seg.time_index_path)
        except FileNotFoundError:
            return False
        if seg.size < HEADER_SIZE or not seg.load_indexes(index, time_index):
            return False
        seg.handle = self._storage.open_read(seg.path)
        start = seg.index_pos[-1] if seg.index_pos else 0
        expected_base = seg.base_offset + (seg.index_rel[-1] if seg.index_rel else 0)
        end = start
        try:
            for buf, i, pos, size in _scan(seg.handle, start, seg.size):
                base, magic = _INT64.unpack_from(buf, i)[0], buf[i + 16]
                if magic != 2 or (pos == start and (base != expected_base if seg.index_rel else base < expected_base)):
                    break
                seg.next_offset = base + _INT32.unpack_from(buf, i + _LAST_DELTA_POS)[0] + 1
                end = pos + size
        except CorruptLog:
            pass
        if end < seg.size and self._zeros_from(seg, end):    # zeros written ahead, not cut before a crash
            cut = self._storage.open_append(seg.path)
            try:
                cut.truncate(end)
            finally:
                cut.close()
            seg.size = end
        if end != seg.size or any(r >= seg.next_offset - seg.base_offset for r in seg.time_rel[-1:]):
            seg.handle.close()
            seg.handle = None
            seg.index_rel, seg.index_pos = array("i"), array("i")
            seg.time_ts, seg.time_rel = array("q"), array("i")
            seg.max_ts = seg.max_ts_offset = -1
            seg.next_offset = seg.base_offset
            return False
        return True

    def _recover_segment(self, seg: _Segment, allow_gaps: bool = False) -> int:
        """Validate every batch and rebuild the indexes; return the position of the first bad batch (or the size).

        Offsets must follow on from batch to batch, except in a cleaned segment (`allow_gaps`: below the cleaner
        checkpoint), where they only increase."""
        reader = seg.handle
        pos, size, next_offset = 0, seg.size, seg.base_offset
        buf, buf_start = memoryview(b""), 0
        while pos + HEADER_SIZE <= size:
            if pos + HEADER_SIZE > buf_start + len(buf):
                buf, buf_start = memoryview(reader.read(pos, min(_RECOVERY_CHUNK, size - pos))), pos
            i = pos - buf_start
            base, length = _BASE_AND_LENGTH.unpack_from(buf, i)
            batch_size = length + LOG_OVERHEAD
            if length < MIN_BATCH_LENGTH or pos + batch_size > size:
                break
            if i + batch_size > len(buf):
                buf, buf_start, i = memoryview(reader.read(pos, max(_RECOVERY_CHUNK, batch_size))), pos, 0
            try:
                header = parse_batch_header(buf, i)  # checks magic 2
            except CodecError:
                break
            last_delta = header.last_offset_delta
            if ((base < next_offset if allow_gaps else base != next_offset) or last_delta < 0
                    or base + last_delta - seg.base_offset > _INT32_MAX
                    or crc32c.crc32c(buf[i + ATTRIBUTES_OFFSET : i + batch_size]) != header.crc):
                break
            next_offset = base + last_delta + 1
            seg.track(pos, base, next_offset, header.max_timestamp, batch_size)
            pos += batch_size
        return pos

    def _zeros_from(self, seg: _Segment, pos: int) -> bool:
        """Whether the segment's file holds only zeros from `pos` to its end, and no more than preallocation
        writes."""
        if seg.size - pos > PREALLOCATE_MAX_BYTES:
            return False
        while pos < seg.size:
            chunk = seg.handle.read(pos, min(_RECOVERY_CHUNK, seg.size - pos))
            if not chunk or chunk.count(0) != len(chunk):
                return False
            pos += len(chunk)
        return True

    def _bytes_since_last_index(self, seg: _Segment) -> int:
        return seg.size - (seg.index_pos[-1] if seg.index_pos else 0)

    def _read_checkpoint(self) -> int:
        return self._read_offset_file(CHECKPOINT_NAME)

    def _read_offset_file(self, name: str, line: int = 1) -> int:
        try:
            lines = self._storage.read_all(self._path(name)).decode("ascii").split("\n")
            if lines[0] == "0" and len(lines) > line and lines[line]:
                return max(0, int(lines[line]))
        except (FileNotFoundError, UnicodeDecodeError, ValueError):
            pass
        return 0

    # --- offsets ---

    @property
    def log_start_offset(self) -> int:
        return self._log_start

    @property
    def log_end_offset(self) -> int:
        """The offset the next appended record gets."""
        return self._segments[-1].next_offset

    @property
    def high_watermark(self) -> int:
        """What consumers may read: everything below it is durable (fsynced), unless the log acknowledges before
        flushing, where it is the log end offset."""
        return self.log_end_offset if self._ack_before_flush else self._hw

    @property
    def durable_offset(self) -> int:
        """Everything below this offset is durable (fsynced)."""
        return self._hw

    @property
    def sealed_segments_unflushed(self) -> bool:
        """A segment was rolled and its data and indexes are not yet flushed (Kafka flushes at a roll)."""
        return bool(self._unpersisted)

    @property
    def size_bytes(self) -> int:
        return sum(seg.size for seg in self._segments)

    @property
    def segment_base_offsets(self) -> list[int]:
        return list(self._bases)

    # --- append ---

    def append(self, buf: bytearray | memoryview, batches: Sequence[tuple[int, object]], now_ms: int,
               log_append_time: bool = False, *, keep_offsets: bool = False) -> tuple[int, int, int]:
        """Assign offsets to validated, contiguous v2 batches in `buf` and write them; no fsync.

        Rewrites each batch's base offset in place (and with `log_append_time` its timestamp
        type and max timestamp, recomputing the CRC). Returns (first offset, last offset,
        log append time or -1).  With `keep_offsets` the batches keep the offsets they carry (a copy of a log
        kept elsewhere, as Kafka's appendAsFollower): the first must not be below the log end, and offsets may
        leave gaps, as a cleaned log's do.
        """
        self._check_open()
        if not batches:
            raise ValueError("nothing to append")
        first_pos = batches[0][0]
        end = first_pos
        count = 0
        for pos, header in batches:
            if pos != end:
                raise ValueError("batches must be contiguous in buf")
            end = pos + header.batch_length + LOG_OVERHEAD
            count += header.last_offset_delta + 1
        total = end - first_pos
        if keep_offsets:
            base_offset = batches[0][1].base_offset
            last_offset = batches[-1][1].base_offset + batches[-1][1].last_offset_delta
            if base_offset < self.log_end_offset:
                raise ValueError(f"batch at {base_offset} is below the log end {self.log_end_offset}")
        else:
            base_offset = self.log_end_offset
            last_offset = base_offset + count - 1

        seg = self._segments[-1]
        if seg.size > 0 and (seg.size + total > self.segment_bytes or last_offset - seg.base_offset > _INT32_MAX
                             or self._reached_roll_ms(seg, now_ms, batches, log_append_time)):
            seg = self._roll(now_ms)

        view = memoryview(buf)
        if not keep_offsets:
            offset = base_offset
            for pos, header in batches:
                _INT64.pack_into(view, pos, offset)
                if log_append_time:
                    set_log_append_time(view, pos, now_ms)
                offset += header.last_offset_delta + 1

        if self._write_behind and (seg.tail or total < WRITE_BEHIND_MAX):
            if not seg.tail:
                seg.tail_start = seg.size
            seg.tail.append(view[first_pos:end])        # written by the flush
        else:
            try:
                seg.handle.write(view[first_pos:end])
            except OSError:
                try:  # leave no partial batch behind for recovery to resurrect
                    seg.handle.truncate(seg.size)
                except OSError:
                    pass
                raise  # nothing else has changed

        file_pos = seg.size
        if file_pos == 0:
            seg.rolling_ts = now_ms if log_append_time else batches[0][1].max_timestamp
        offset = base_offset
        for pos, header in batches:
            size = header.batch_length + LOG_OVERHEAD
            if keep_offsets:
                offset = header.base_offset
            next_offset = offset + header.last_offset_delta + 1
            seg.track(file_pos, offset, next_offset, now_ms if log_append_time else header.max_timestamp, size)
            file_pos += size
            offset = next_offset
        seg.size = file_pos
        return base_offset, last_offset, now_ms if log_append_time else -1

    def _reached_roll_ms(self, seg: _Segment, now_ms: int, batches: Sequence[tuple[int, object]],
                         log_append_time: bool) -> bool:
        """Kafka's segment.ms rule: the appended batches' max timestamp is more than segment.ms (less this segment's
        jitter) past the segment's first batch's, or, where the segment has no timestamp, it was created that long
        ago."""
        if self.segment_ms >= _INT64_MAX:
            return False
        if seg.rolling_ts is None:
            seg.rolling_ts = -1
            try:
                head = self._reader(seg).read(0, BATCH_HEADER_SIZE)
                if len(head) == BATCH_HEADER_SIZE:
                    seg.rolling_ts = parse_batch_header(head, 0).max_timestamp
            except (OSError, CodecError):
                pass
        if seg.rolling_ts < 0:
            return now_ms - seg.created_ms > self.segment_ms - seg.roll_jitter_ms
        if log_append_time:
            max_timestamp = now_ms
        elif len(batches) == 1:
            max_timestamp = batches[0][1].max_timestamp
        else:
            max_timestamp = max(header.max_timestamp for _, header in batches)
        waited = max_timestamp - seg.rolling_ts
        return waited > self.segment_ms - seg.roll_jitter_ms

    def _roll_jitter(self) -> int:
        """Kafka's randomSegmentJitter: a random share of segment.jitter.ms (below segment.ms), per segment."""
        if self.segment_jitter_ms <= 0:
            return 0
        return random.randrange(min(self.segment_jitter_ms, self.segment_ms))

    def _roll(self, now_ms: int = 0) -> _Segment:
        """Seal the active segment and start a new one at the log end offset."""
        base = self.log_end_offset
        new = _Segment(base, self._segment_path(base))
        new.created_ms = now_ms
        new.roll_jitter_ms = self._roll_jitter()
        new.handle = self._storage.open_append(new.path)
        if new.handle.size:
            new.handle.truncate(0)
        old = self._segments[-1]
        old.seal()
        try:
            old.handle.cut_ahead()
        except OSError:
            pass                # recovery cuts the zeros after a crash (_load)
        self._segments.append(new)
        self._bases.append(base)
        self._dir_generation += 1
        if self._unsafe:
            try:
                self._persist_indexes(old, durable=False)
                old.index_persisted = True
            except OSError:
                pass  # rebuilt on open
        else:
            self._unpersisted.append(old)
        return new

    # --- aborted transactions ---

    def add_aborted_txn(self, txn: AbortedTxn) -> bool:
        """Index an aborted transaction whose ABORT marker, at `txn.last_offset`, was just appended.

        Call it before the next `flush_begin`, so that the flush covering the marker covers the
        entry too. The entry goes to the txnindex of the segment holding the marker (a write, no
        fsync). Returns False, changing nothing, for a duplicate: an entry whose last offset is
        not beyond that of the last entry indexed, as when start-up replay meets a marker whose
        entry survived. If writing the file fails the entry is still indexed in memory; the write
        is retried by later calls and flushes, and until it succeeds every flush raises OSError.
        """
        self._check_open()
        if txn.producer_id < 0 or not 0 <= txn.first_offset <= txn.last_offset:
            raise ValueError(f"malformed aborted transaction {txn}")
        if not self._segments[0].base_offset <= txn.last_offset < self.log_end_offset:
            raise ValueError(f"abort marker offset {txn.last_offset} is not in the log {self._directory}")
        if txn.last_offset <= self._last_aborted:
            return False
        seg = self._segments[bisect.bisect_right(self._bases, txn.last_offset) - 1]
        seg.txn_unwritten += pack_txn_entry(txn, self._last_aborted)
        seg.txn_count += 1
        self._aborted.append(txn)
        self._aborted_last.append(txn.last_offset)
        floor = self._aborted_floor
        j = len(floor) - 1
        while j >= 0 and floor[j] > txn.first_offset:  # stops at once unless txn began before others ended
            floor[j] = txn.first_offset
            j -= 1
        floor.append(txn.first_offset)
        self._last_aborted = txn.last_offset
        if not seg.txn_pending:
            seg.txn_pending = True
            self._txn_pending.append(seg)
        try:
            self._write_txns(seg)
        except OSError:
            pass  # retried later; flushes fail meanwhile (see _FlushPlan.txn_files)
        return True

    def aborted_txns(self, start_offset: int, end_offset: int) -> list[AbortedTxn]:
        """The indexed aborted transactions overlapping [start_offset, end_offset), in last-offset order.

        That is those with `last_offset >= start_offset` and `first_offset < end_offset`: what a
        read_committed fetch returning data from start_offset up to end_offset must list. Reads
        no file: a bisect, then a walk that stops once no later entry began below end_offset.
        """
        self._check_open()
        floor, aborted = self._aborted_floor, self._aborted
        out: list[AbortedTxn] = []
        for j in range(bisect.bisect_left(self._aborted_last, start_offset), len(aborted)):
            if floor[j] >= end_offset:
                break
            if aborted[j].first_offset < end_offset:
                out.append(aborted[j])
        return out

    def _write_txns(self, seg: _Segment) -> None:
        """Append the segment's unwritten txnindex entries to its file (owning thread; raises OSError)."""
        if not seg.txn_unwritten:
            return
        end = seg.txn_written * TXN_INDEX_ENTRY.size
        if seg.txn_handle is None:
            created = not seg.txn_on_disk
            seg.txn_handle = self._storage.open_append(seg.txn_index_path)
            seg.txn_on_disk = True
            if created:
                self._dir_generation += 1
        if seg.txn_handle.size != end:  # a stray file where a new segment's index goes: ours wins
            seg.txn_handle.truncate(end)
        try:
            # a copy: a failed write's OSError, which a flush plan keeps, holds the storage's view of what it was
            # given, and a bytearray with a view alive cannot grow (the next entry would raise BufferError)
            seg.txn_handle.write(bytes(seg.txn_unwritten))
        except OSError:
            try:  # leave no partial entry behind (recovery would drop it anyway)
                seg.txn_handle.truncate(end)
            except OSError:
                pass
            raise
        seg.txn_written = seg.txn_count
        seg.txn_unwritten = bytearray()

    # --- durability ---

    def flush_begin(self) -> int:
        """Plan a flush of everything appended so far; returns its target offset."""
        target = self.log_end_offset
        txn_error = None
        for seg in self._txn_pending:  # retry failed txnindex writes; may create a file (dir sync)
            if seg.txn_unwritten and not seg.deleted:
                try:
                    self._write_txns(seg)
                except OSError as e:
                    txn_error = txn_error or e  # the plan records it and its flush fails with it
        if self._unsafe:
            self._drop_settled_txn_pending()
            return target
        planned = self._unflushed()
        self._plans[target] = _FlushPlan(
            target=target,
            write_error=self._write_tails(planned) or txn_error,
            files=planned,
            txn_files=tuple((seg, seg.txn_handle, seg.txn_written, seg.txn_count)
                            for seg in sorted(self._txn_pending, key=lambda s: s.base_offset)),
            sync_dir=self._dir_generation > self._dir_synced_generation,
            dir_generation=self._dir_generation,
            seal=tuple(self._unpersisted),
        )
        return target

    def flush_syncs_data_only(self, target: int, max_bytes: int) -> bool:
        """Whether the flush to ``target`` (planned by flush_begin) has data alone to make durable, at most
        ``max_bytes`` of it: its bytes were written over blocks its file had at its last sync
        (`AppendFile.extent_synced`), and it has no index, transaction index or directory to sync.  Such an fsync is
        short (server/broker.py, Broker._flush_inline)."""
        plan = self._plans.get(target)
        if plan is None or plan.write_error is not None or plan.txn_files or plan.sync_dir or plan.seal:
            return False
        return all(isinstance(handle, AppendFile) and handle.extent_synced for _seg, handle in plan.files) \
            and sum(handle.unsynced_bytes for _seg, handle in plan.files) <= max_bytes

    def _write_tails(self, planned) -> OSError | None:
        """Write the write-behind tails of the segments a flush covers, one `pwritev` each, in order; → the error
        that stopped it (its tail and those after it stay in memory for the next flush to write)."""
        for seg, handle in planned:
            if seg.tail:
                try:
                    handle.write_vectored(seg.tail)
                except OSError as e:
                    return e
                seg.tail = []
                seg.tail_start = seg.size
        return None

    def _unflushed(self) -> tuple:
        """(segment, handle) of every segment holding data a flush has not covered yet, in offset order."""
        files: dict[int, tuple[_Segment, AppendFile]] = {}
        for seg in reversed(self._segments):
            if seg.next_offset <= self._hw:
                break
            files[seg.base_offset] = (seg, seg.handle)
        for seg in self._unpersisted:
            files[seg.base_offset] = (seg, seg.handle)
        return tuple(files[b] for b in sorted(files))

    def write_tails(self) -> None:
        """Hand every write-behind tail to the OS now, without fsync (owning thread): what was appended then
        survives a crash of the process (the page cache keeps it), though not a power loss.  For an answer given
        before the flush.  Raises the OSError that stopped it (that tail and later ones stay for the flush)."""
        error = self._write_tails(self._unflushed())
        if error is not None:
            raise error

    def flush(self, target: int) -> None:
        """Make everything below `target` durable (blocking; safe in a worker thread). Raises OSError."""
        if self._unsafe:
            return
        plan = self._plans.get(target)
        if plan is None:
            self.flush_begin()  # only valid from the owning thread
            plan = self._plans[self.log_end_offset]
        if plan.write_error is not None:
            raise plan.write_error
        for seg, handle in plan.files:
            try:
                handle.sync()
            except OSError:
                if seg.deleted:
                    continue  # removed by retention meanwhile; its data no longer matters
                raise
        for seg, txn_handle, written, count in plan.txn_files:  # in segment order, so a later
            if seg.deleted:                                     # file is never ahead of an earlier one
                continue
            if written < count or txn_handle is None:
                raise OSError(errno.EIO, f"{seg.txn_index_path}: {count - written} aborted transaction "
                                         f"index entries could not be written")
            try:
                txn_handle.sync()
            except OSError:
                if seg.deleted:
                    continue
                raise
        if self._deleted:
            return
        if plan.sync_dir:
            self._storage.sync_dir(self._directory)
        for seg in plan.seal:
            if not seg.deleted:
                self._persist_indexes(seg, durable=True)

    def preallocation(self) -> tuple[AppendFile, int] | None:
        """After a flush round (owning thread): the active segment's file and how far it should have zeros written
        ahead (for `AppendFile.preallocate`, any thread), or None: nothing due, or the round covered too little of
        it to gain (PREALLOCATE_ROUND_BYTES)."""
        if self._closed:
            return None
        seg = self._segments[-1]
        covered = seg.size - self._round_end if seg.size >= self._round_end else seg.size
        self._round_end = seg.size
        handle = seg.handle
        if self._unsafe or not 0 < covered <= PREALLOCATE_ROUND_BYTES or not isinstance(handle, AppendFile):
            return None
        step = min(max(covered * PREALLOCATE_ROUNDS, PREALLOCATE_MIN_BYTES), PREALLOCATE_MAX_BYTES)
        end = min(seg.size + step, self.segment_bytes)
        if handle.allocated - seg.size >= step // 2 or end <= handle.allocated:
            return None
        return handle, end

    def flush_done(self, target: int) -> None:
        """Record that the flush to `target` succeeded: the high watermark advances."""
        self._hw = max(self._hw, min(target, self.log_end_offset))
        plan = self._plans.pop(target, None)
        for stale in [t for t in self._plans if t < target]:
            del self._plans[stale]
        if plan is not None:
            for seg in plan.seal:
                seg.index_persisted = True
            self._unpersisted = [s for s in self._unpersisted if not s.index_persisted]
            for seg, _handle, written, _count in plan.txn_files:
                seg.txn_synced = max(seg.txn_synced, written)
            self._drop_settled_txn_pending()
            if plan.sync_dir:
                self._dir_synced_generation = max(self._dir_synced_generation, plan.dir_generation)

    def _drop_settled_txn_pending(self) -> None:
        """Forget the segments whose txnindex entries are all written (and, unless unsafe, fsynced)."""
        keep = []
        for seg in self._txn_pending:
            settled = seg.txn_written == seg.txn_count and (self._unsafe or seg.txn_synced == seg.txn_count)
            if settled or seg.deleted:
                seg.txn_pending = False
            else:
                keep.append(seg)
        self._txn_pending = keep

    def sync(self, now_ms: int = 0) -> int:
        """flush_begin, flush and flush_done in one go (tests, shutdown); returns the high watermark."""
        target = self.flush_begin()
        self.flush(target)
        self.flush_done(target)
        return self._hw

    def _persist_indexes(self, seg: _Segment, durable: bool) -> None:
        self._storage.write_atomic(seg.time_index_path, seg.time_index_bytes(), durable=durable)
        self._storage.write_atomic(seg.index_path, seg.index_bytes(), durable=durable)

    # --- reads ---

    def read(self, fetch_offset: int, max_bytes: int, max_offset: int, *, min_one_batch: bool = True,
             first_batch_max: int | None = None) -> bytes:
        """Whole batches from the one containing `fetch_offset`, up to `max_bytes`, all based below `max_offset`.

        The first batch is returned even if it alone exceeds `max_bytes` (KIP-74), unless
        `min_one_batch` is false (for partitions after the first non-empty one of a fetch) or it
        exceeds `first_batch_max` (what the broker's response memory has room for): then nothing is.
        """
        self._check_open()
        if fetch_offset < self._log_start or fetch_offset > self.log_end_offset:
            raise OffsetOutOfRange(
                f"offset {fetch_offset} outside [{self._log_start}, {self.log_end_offset}] in {self._directory}")
        max_offset = min(max_offset, self.log_end_offset)
        if fetch_offset >= max_offset:
            return b""
        parts: list[bytes] = []
        remaining = max_bytes
        i = bisect.bisect_right(self._bases, fetch_offset) - 1
        offset = fetch_offset
        while i < len(self._segments):
            seg = self._segments[i]
            if seg.base_offset >= max_offset:
                break
            data, to_segment_end = self._read_segment(seg, offset, remaining, max_offset,
                                                      first=min_one_batch and not parts, first_max=first_batch_max)
            if data:
                parts.append(data)
                remaining -= len(data)
            if not to_segment_end or remaining <= 0:
                break
            i += 1
            if i < len(self._segments):
                offset = self._segments[i].base_offset
        if len(parts) == 1:
            return parts[0]
        return b"".join(parts)

    def _read_segment(self, seg: _Segment, offset: int, max_bytes: int, max_offset: int,
                      first: bool, first_max: int | None = None) -> tuple[bytes, bool]:
        reader = self._reader(seg)
        size = seg.size
        if offset >= seg.next_offset:
            return b"", True
        start, _base, first_size = self._locate(seg, reader, offset)
        if max_offset >= seg.next_offset:
            bound = size
        else:
            bound, base, bound_size = self._locate(seg, reader, max_offset)
            if base < max_offset:  # a batch straddling max_offset starts below it, so it is included
                bound += bound_size
        if bound <= start:
            return b"", False
        if bound - start <= max_bytes:
            end = bound
        else:
            end = self._boundary_at_or_before(seg, reader, start, start + max(max_bytes, 0))
            if end == start:
                if not first or (first_max is not None and first_size > first_max):
                    return b"", False
                end = start + first_size
        return reader.read(start, end - start), end == size

    def _locate(self, seg: _Segment, reader: ReadFile, offset: int) -> tuple[int, int, int]:
        """(file position, base offset, size) of the batch containing `offset`, via the offset index."""
        k = bisect.bisect_right(seg.index_rel, offset - seg.base_offset) - 1
        start = seg.index_pos[k] if k >= 0 else 0
        for buf, i, pos, size in _scan(reader, start, seg.size):
            base = _INT64.unpack_from(buf, i)[0]
            if base + _INT32.unpack_from(buf, i + _LAST_DELTA_POS)[0] >= offset:
                return pos, base, size
        return seg.size, seg.next_offset, 0

    def _boundary_at_or_before(self, seg: _Segment, reader: ReadFile, start: int, limit: int) -> int:
        """The last batch boundary in [start, limit]; `start` is a boundary."""
        k = bisect.bisect_right(seg.index_pos, limit) - 1
        from_pos = max(start, seg.index_pos[k] if k >= 0 else 0)
        for _buf, _i, pos, size in _scan(reader, from_pos, seg.size):
            if pos + size > limit:
                return pos
        return seg.size

    def _reader(self, seg: _Segment) -> ReadFile:
        if seg.handle is None:
            seg.handle = self._storage.open_read(seg.path)
        if seg.tail:
            return _TailReader(seg.handle, seg.tail_start, seg.tail)
        return seg.handle

    # --- timestamps ---

    def offset_for_timestamp(self, ts: int) -> tuple[int, int] | None:
        """(offset, timestamp) answering ListOffsets for `ts`, at batch granularity, or None.

        The base offset (clamped to the log start offset) and max timestamp of the first batch
        whose max timestamp is >= `ts`. Kafka answers with the first *record* whose timestamp is
        >= `ts`; that record is in this batch, at or after the offset returned. Not bounded by
        the high watermark: the caller compares with the offset it may expose.
        """
        self._check_open()
        for seg in self._segments:
            if seg.next_offset <= self._log_start or seg.max_ts < ts:
                continue
            k = bisect.bisect_left(seg.time_ts, ts) - 1  # entries up to k all have max timestamps < ts
            from_offset = max(seg.base_offset + (seg.time_rel[k] if k >= 0 else 0), self._log_start)
            reader = self._reader(seg)
            for buf, i, _pos, _size in _scan(reader, self._locate(seg, reader, from_offset)[0], seg.size):
                header = parse_batch_header(buf, i)
                if header.max_timestamp >= ts and header.last_offset >= self._log_start:
                    return max(header.base_offset, self._log_start), header.max_timestamp
        return None

    def first_record_at_or_after(self, offset: int, ts: int, max_offset: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record at or after ``offset`` (below ``max_offset``) whose
        timestamp is >= ``ts``: Kafka's per-record ListOffsets answer, refining the batch that
        :meth:`offset_for_timestamp` or :meth:`max_timestamp` found.  Decodes the records of the
        batches it reads — a ListOffsets path, never produce or fetch."""
        while offset < max_offset:
            data = self.read(offset, 1, max_offset)
            if not data:
                return None
            for pos, header in iter_batch_headers(data):
                if header.max_timestamp >= ts and not header.is_control:
                    for record in decode_records(data, pos):
                        if record.offset >= offset and record.timestamp >= ts:
                            return record.offset, record.timestamp
                offset = header.next_offset
        return None

    def max_timestamp(self) -> tuple[int, int]:
        """(base offset, timestamp) of the earliest batch with the largest max timestamp; (-1, -1) if none."""
        best = (-1, -1)
        for seg in self._segments:
            if seg.next_offset > self._log_start and seg.max_ts > best[1]:
                best = (max(seg.max_ts_offset, self._log_start), seg.max_ts)
        return best

    # --- deletion ---

    def delete_records(self, before_offset: int) -> int:
        """Advance the log start offset to `before_offset` (-1: the high watermark); returns the new one."""
        self._check_open()
        if before_offset == -1:
            before_offset = self._hw
        if before_offset < 0 or before_offset > self._hw:
            raise OffsetOutOfRange(f"cannot delete records before {before_offset}: high watermark is {self._hw}")
        if before_offset > self._log_start:
            self._advance_log_start(before_offset)
        return self._log_start

    def apply_retention(self, now_ms: int) -> int:
        """Delete the oldest sealed, durable segments beyond retention.ms or retention.bytes; returns how many.

        By time: segments whose max timestamp is more than retention_ms before now_ms (segments
        without timestamps are kept). By size, as Kafka does: a segment goes only if the log
        stays at least retention_bytes big without it.
        """
        self._check_open()
        total = self.size_bytes
        doomed = 0
        for seg in self._segments[:-1]:
            if seg.next_offset > self._hw:
                break
            too_old = self.retention_ms >= 0 and seg.max_ts >= 0 and now_ms - seg.max_ts > self.retention_ms
            too_big = self.retention_bytes >= 0 and total - seg.size >= self.retention_bytes
            if not (too_old or too_big):
                break
            total -= seg.size
            doomed += 1
        if doomed:
            self._advance_log_start(max(self._log_start, self._segments[doomed].base_offset))
        return doomed

    def _advance_log_start(self, offset: int) -> None:
        """Checkpoint the new log start offset durably, then drop the segments wholly below it."""
        data = f"0\n{offset}\n".encode("ascii")
        self._storage.write_atomic(self._path(CHECKPOINT_NAME), data, durable=not self._unsafe)
        self._log_start = offset
        if self.on_log_start_moved is not None:
            self.on_log_start_moved()
        while len(self._segments) > 1 and self._segments[1].base_offset <= offset:
            seg = self._segments.pop(0)
            self._bases.pop(0)
            if seg in self._unpersisted:
                self._unpersisted.remove(seg)
            if seg.txn_count:  # the first segment's entries are the first ones
                del self._aborted[: seg.txn_count]
                del self._aborted_last[: seg.txn_count]
                del self._aborted_floor[: seg.txn_count]
            if seg.txn_pending:
                self._txn_pending.remove(seg)
                seg.txn_pending = False
            self._retire(seg)
        self._notify_retired()

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Drop every segment and start the log empty at `offset` (Kafka's truncateFullyAndStartAt: a copy of a log
        kept elsewhere whose start is past everything here).  The new log start is checkpointed first; the old
        segments are retired as retention's are."""
        self._check_open()
        if self._cleaning is not None:
            raise ValueError("cannot truncate a log while it is being cleaned")
        self._storage.write_atomic(self._path(CHECKPOINT_NAME), f"0\n{offset}\n".encode("ascii"),
                                   durable=not self._unsafe)
        for seg in self._segments:
            self._retire(seg)
        fresh = _Segment(offset, self._segment_path(offset))
        fresh.handle = self._storage.open_append(fresh.path)
        fresh.handle.truncate(0)
        self._segments, self._bases = [fresh], [offset]
        self._log_start = self._hw = offset
        self._unpersisted = []
        self._aborted, self._aborted_last, self._aborted_floor = [], array("q"), array("q")
        self._txn_pending = []
        self._plans.clear()
        self._dir_generation += 1
        self._notify_retired()

    def _retire(self, seg: _Segment) -> None:
        """A segment gone below the log start at runtime: its files are unlinked now (cheap while one is open) and
        its blocks freed later by ``release_files(*take_retired())`` off the owning thread, as Kafka deletes
        segments asynchronously: the last close of a large unlinked file frees its blocks and page cache, tens to
        hundreds of milliseconds for a big segment.  A crash before that leaves nothing: the files are gone."""
        seg.deleted = True
        writable, handles = self._retired
        writable.extend(self._unlink_segment(seg))
        handles.extend(h for h in (seg.handle, seg.txn_handle) if h is not None)

    def _unlink_segment(self, seg: _Segment) -> list:
        """Remove a segment's files (any thread) → a writable handle of its log file, opened first, for
        ``release_files`` to free its blocks in steps (none if it could not be opened: the last close frees them)."""
        try:
            writable = [self._storage.open_append(seg.path)]
        except OSError:
            writable = []
        for path in (seg.path, seg.index_path, seg.time_index_path, seg.txn_index_path):
            self._storage.remove(path, missing_ok=True)
        return writable

    def _notify_retired(self) -> None:
        """Retired segments are waiting: the ``on_retired`` listener frees them (take_retired), or, with none, this
        thread does at once."""
        if self._retired[0] or self._retired[1]:
            if self.on_retired is not None:
                self.on_retired()
            else:
                release_files(*self.take_retired())

    def take_retired(self) -> tuple[list, list]:
        """The retired segments' files not yet released (see ``_retire``), for ``release_files`` in any thread."""
        retired, self._retired = self._retired, ([], [])
        return retired

    def _remove_files(self, seg: _Segment) -> None:
        seg.deleted = True
        for handle in (seg.handle, seg.txn_handle):
            if handle is not None:
                handle.close()
        for path in (seg.path, seg.index_path, seg.time_index_path, seg.txn_index_path):
            self._storage.remove(path, missing_ok=True)

    # --- start-up scans ---

    def iter_batch_headers(self, from_offset: int | None = None) -> Iterator[BatchHeader]:
        """The headers of all batches from the log start offset (or the batch containing `from_offset`).

        Reads headers only, hopping from one to the next. A control batch's type (commit or
        abort) lives in its record: read that batch with `read` if needed.
        """
        self._check_open()
        offset = self._log_start if from_offset is None else max(from_offset, self._log_start)
        i = max(0, bisect.bisect_right(self._bases, offset) - 1)
        for seg in self._segments[i:]:
            if seg.deleted or offset >= seg.next_offset:
                continue
            reader = self._reader(seg)
            start = self._locate(seg, reader, offset)[0] if offset > seg.base_offset else 0
            for buf, j, _pos, _size in _scan(reader, start, seg.size):
                yield parse_batch_header(buf, j)

    # --- compaction (the cleaner's core is state/cleaner.py; its module docstring is the interface) ---

    @property
    def cleaning(self):
        """The plan of the cleaning under way (from `cleanable` to `finish_cleaning` / `abandon_cleaning`), or None."""
        return self._cleaning

    @property
    def cleaner_checkpoint(self) -> int:
        """The first dirty offset: the log below it was cleaned (0 when never cleaned)."""
        return self._cleaner_checkpoint

    def _first_dirty_offset(self) -> int:
        first = self._cleaner_checkpoint
        return self._log_start if first < self._log_start or first > self.log_end_offset else first

    def _cleanable_segments(self, now_ms: int, first_unstable_offset: int | None, cfg) -> list[_Segment]:
        """The rolled segments, from the first, that cleaning may read (durable, settled, below the LSO and
        what min.compaction.lag.ms protects)."""
        bound = min(self._segments[-1].base_offset, self._hw)
        if first_unstable_offset is not None:
            bound = min(bound, first_unstable_offset)
        out = []
        for seg in self._segments[:-1]:
            if (seg.next_offset > bound or not seg.sealed or not seg.index_persisted or seg.tail
                    or seg.txn_pending or seg.txn_written != seg.txn_count
                    or (cfg.min_compaction_lag_ms > 0 and seg.max_ts >= 0
                        and now_ms - seg.max_ts < cfg.min_compaction_lag_ms)):
                break
            out.append(seg)
        return out

    def dirty_ratio(self, now_ms: int, first_unstable_offset: int | None, cfg) -> float:
        """The cleanable dirty bytes over the cleanable bytes (Kafka's cleanable ratio), for metrics."""
        segs = self._cleanable_segments(now_ms, first_unstable_offset, cfg)
        first_dirty = self._first_dirty_offset()
        dirty = sum(s.size for s in segs if s.next_offset > first_dirty)
        return dirty_ratio(sum(s.size for s in segs) - dirty, dirty)

    def cleanable(self, now_ms: int, first_unstable_offset: int | None, cfg):
        """A CleaningPlan if the log should be cleaned now, else None (owning thread; see state/cleaner.py)."""
        self._check_open()
        if self._cleaning is not None:
            return None
        segs = self._cleanable_segments(now_ms, first_unstable_offset, cfg)
        first_dirty = self._first_dirty_offset()
        dirty_segs = [s for s in segs if s.next_offset > first_dirty]
        if not dirty_segs:
            return None
        dirty = sum(s.size for s in dirty_segs)
        ratio = dirty_ratio(sum(s.size for s in segs) - dirty, dirty)
        forced = False
        if cfg.max_compaction_lag_ms < LONG_MAX:
            first_ts = self._first_batch_timestamp(dirty_segs[0])
            forced = first_ts > 0 and now_ms - first_ts > cfg.max_compaction_lag_ms
        if ratio <= cfg.min_cleanable_dirty_ratio and not forced:      # as Kafka: strictly above the minimum
            return None
        # Groups of consecutive segments, each to become one segment (at most segment.bytes, offsets in int32).
        groups: list[tuple[int, int]] = []
        start = 0
        total = 0
        for i, seg in enumerate(segs):
            if i > start and (total + seg.size > self.segment_bytes
                              or seg.next_offset - 1 - segs[start].base_offset > _INT32_MAX):
                groups.append((start, i))
                start, total = i, 0
            total += seg.size
        groups.append((start, len(segs)))
        # Each group's aborted-transaction index entries (segs starts at the first segment, whose entries are the
        # first ones).
        txn_entries = []
        k = 0
        for a, b in groups:
            n = sum(s.txn_count for s in segs[a:b])
            txn_entries.append(tuple((t.producer_id, t.first_offset, t.last_offset, t.last_stable_offset)
                                     for t in self._aborted[k:k + n]))
            k += n
        end = segs[-1].next_offset
        aborted = tuple((t.producer_id, t.first_offset, t.last_offset) for t in self.aborted_txns(0, end))
        plan = CleaningPlan(
            directory=self._directory,
            segments=tuple(SegmentRef(s.base_offset, s.next_offset, s.size, s.txn_count) for s in segs),
            groups=tuple(groups), txn_entries=tuple(txn_entries), aborted=aborted, first_dirty_offset=first_dirty,
            end_offset=end, now_ms=now_ms, delete_retention_ms=cfg.delete_retention_ms,
            max_map_keys=cfg.max_map_keys, dirty_ratio=ratio, forced=forced, durable=not self._unsafe)
        self._cleaning = plan
        return plan

    def _first_batch_timestamp(self, seg: _Segment) -> int:
        reader = self._reader(seg)
        for buf, i, _pos, _size in _scan(reader, 0, seg.size, HEADER_SIZE):
            return parse_batch_header(buf, i).max_timestamp
        return -1

    @property
    def storage(self) -> Storage:
        """Where this log's files are (state/cleaner.clean reads the plan's segments through it)."""
        return self._storage

    def abandon_cleaning(self, plan=None) -> None:
        """A cleaning failed or is given up: remove its files (owning thread); a later one may start."""
        self._cleaning = None
        if self._closed or self._deleted:
            return
        for name in self._storage.list(self._directory):
            if name.endswith(CLEANED_SUFFIX):
                self._storage.remove(self._path(name), missing_ok=True)

    def finish_cleaning(self, result) -> int:
        """Swap the cleaned segments in (owning thread; see state/cleaner.py); returns how many groups.  The same
        as ``begin_finish`` → its ``files()`` → its ``commit()`` on this thread."""
        finish = self.begin_finish(result)
        finish.files()
        return finish.commit()

    def begin_finish(self, result) -> "CleaningFinish":
        """The swap of ``finish_cleaning`` in three steps, so that its file work (renames, unlinks, fsyncs, the new
        segments' indexes) may run in a worker thread: this call (owning thread, cheap) checks each group against
        the segments now and opens the old segments' files (reads keep using them once unlinked); ``files()`` (any
        thread, once) does the file work in the crash-safe order; ``commit()`` (owning thread) swaps the segment
        list in memory and retires the old segments' files as retention does (``_notify_retired``: their blocks are
        freed off this thread).  Until ``commit`` the log reads the old segments; the log stays marked as being cleaned
        (retention and cleaning leave it alone) and must not be closed meanwhile."""
        self._check_open()
        groups, dropped = [], []
        complete = True
        for group in result.groups:
            i = bisect.bisect_left(self._bases, group.base_offset)
            old = self._segments[i:i + len(group.old_bases)]
            if (i + len(group.old_bases) >= len(self._segments)   # the active segment is never replaced
                    or tuple(s.base_offset for s in old) != group.old_bases
                    or tuple(s.size for s in old) != group.old_sizes
                    or old[-1].next_offset != group.next_offset
                    or any(s.tail or s.txn_pending or s.deleted for s in old)):
                complete = False
                dropped.append(group.base_offset)
                continue
            for seg in old:
                self._reader(seg)
            groups.append((group, tuple(old)))
        checkpoint = result.end_offset if complete else self._cleaner_checkpoint
        return CleaningFinish(self, result, groups, dropped, checkpoint)

    def _swap_files(self, finish: "CleaningFinish") -> None:
        """CleaningFinish.files: touches only files (and the new, not yet shared, segments)."""
        storage, result = self._storage, finish.result
        if result.groups:   # first record (durably) that the log may have gaps up to the end of this cleaning
            self._write_cleaner_checkpoint(finish.checkpoint_before, result.end_offset)
        for base in finish.dropped:
            for kind in SEGMENT_KINDS:
                storage.remove(self._path(cleaned_name(base, kind)), missing_ok=True)
        for group, old in finish.groups:
            finish.new.append(self._swap_in_files(old, group, finish.releasing))
        self._write_cleaner_checkpoint(finish.checkpoint, max(result.end_offset, finish.checkpoint))

    def _commit_finish(self, finish: "CleaningFinish") -> int:
        """CleaningFinish.commit: the segment list swap, in memory only."""
        self._check_open()
        self._cleaning = None
        for (group, old), new in zip(finish.groups, finish.new):
            i = bisect.bisect_left(self._bases, group.base_offset)
            if tuple(self._segments[i:i + len(old)]) != old:
                raise OSError(errno.EIO, f"the segments of {self._directory} from offset {group.base_offset} "
                              "changed while their cleaned replacement was swapped in")
            self._swap_in_memory(i, list(old), new, group, self._retired[1])
        if self.on_cleaned is not None and finish.new:
            self.on_cleaned([(group.base_offset, old[-1].next_offset) for group, old in finish.groups])
        self._retired[0].extend(finish.releasing)
        finish.releasing = []
        self._cleaner_checkpoint = finish.checkpoint
        self._notify_retired()
        return len(finish.new)

    def _write_cleaner_checkpoint(self, first_dirty: int, gaps_below: int) -> None:
        """cleaner-offset.checkpoint: version 0, the first dirty offset, the offset below which gaps may be."""
        self._storage.write_atomic(self._path(CLEANER_CHECKPOINT_NAME),
                                   f"0\n{first_dirty}\n{gaps_below}\n".encode("ascii"), durable=not self._unsafe)

    def _sync_dir(self) -> None:
        if not self._unsafe:
            self._storage.sync_dir(self._directory)

    def _swap_in_files(self, old: Sequence[_Segment], group, releasing: list) -> _Segment:
        storage, base = self._storage, group.base_offset
        indexes = [k for k in SEGMENT_KINDS if k != "log"]
        # 1. .cleaned -> .swap, the log file last: the swap is committed once <base>.log.swap is durable.
        for kind in indexes + ["log"]:
            storage.rename(self._path(cleaned_name(base, kind)), self._path(cleaned_name(base, kind, SWAP_SUFFIX)))
        self._sync_dir()
        # 2. The old segments go.
        for seg in old:       # unlinked only: their open files serve reads until the swap in memory
            releasing.extend(self._unlink_segment(seg))
        self._sync_dir()
        # 3. .swap -> final names, the index files durably before the log file: so once <base>.log.swap is gone,
        # no index .swap file of this swap is left, and at start-up any such file belongs to an uncommitted one.
        for kind in indexes:
            storage.rename(self._path(cleaned_name(base, kind, SWAP_SUFFIX)), self._path(f"{base:020d}.{kind}"))
        self._sync_dir()
        storage.rename(self._path(cleaned_name(base, "log", SWAP_SUFFIX)), self._path(f"{base:020d}.log"))
        self._sync_dir()
        new = _Segment(base, self._segment_path(base), storage.size(self._segment_path(base)))
        if not self._adopt_indexes(new):
            new.handle = storage.open_read(new.path)
            self._recover_segment(new, allow_gaps=True)
        new.sealed = new.index_persisted = True
        return new

    def _swap_in_memory(self, i: int, old: list[_Segment], new: _Segment, group, closing: list) -> None:
        first = sum(s.txn_count for s in self._segments[:i])
        kept = [AbortedTxn(*e) for e in group.txn_entries]
        self._aborted[first:first + sum(s.txn_count for s in old)] = kept
        self._aborted_last = array("q", (t.last_offset for t in self._aborted))
        floor = array("q", (t.first_offset for t in self._aborted))
        for j in range(len(floor) - 2, -1, -1):
            floor[j] = min(floor[j], floor[j + 1])
        self._aborted_floor = floor
        new.txn_count = new.txn_written = new.txn_synced = len(kept)
        new.txn_on_disk = True
        self._segments[i:i + len(old)] = [new]
        self._bases[i:i + len(old)] = [new.base_offset]
        for seg in old:
            seg.deleted = True
            closing.extend(h for h in (seg.handle, seg.txn_handle) if h is not None)
            if seg in self._unpersisted:
                self._unpersisted.remove(seg)

    def _recover_swaps(self) -> None:
        """Finish or undo a segment swap a crash interrupted (see state/cleaner.py): a durable <base>.log.swap
        means committed, anything else means the old segments stand."""
        storage = self._storage
        names = storage.list(self._directory)
        found = {}
        for name in names:
            m = _SWAP_NAME.fullmatch(name)
            if m:
                found.setdefault(int(m.group(1)), set()).add((m.group(2), m.group(3)))
        if not found:
            return
        logs = sorted(int(m.group(1)) for m in map(_SEGMENT_NAME.fullmatch, names) if m and m.group(2) == "log")
        for base, files in sorted(found.items()):
            swap = self._path(cleaned_name(base, "log", SWAP_SUFFIX))
            next_offset = self._file_next_offset(swap) if ("log", "swap") in files else -1
            if next_offset > base:
                for old in logs:
                    if base <= old < next_offset:
                        for kind in SEGMENT_KINDS:
                            if old != base or kind == "log":
                                storage.remove(self._path(f"{old:020d}.{kind}"), missing_ok=True)
                for kind in SEGMENT_KINDS:
                    for suffix in (SWAP_SUFFIX, CLEANED_SUFFIX):
                        if (kind, suffix[1:]) in files:
                            storage.rename(self._path(cleaned_name(base, kind, suffix)),
                                           self._path(f"{base:020d}.{kind}"))
                            files.discard((kind, "swap"))
                            files.discard((kind, "cleaned"))
                            break
            else:   # not committed: the old segments stand
                for kind, suffix in files:
                    storage.remove(self._path(cleaned_name(base, kind, "." + suffix)), missing_ok=True)
        self._sync_dir()

    def _file_next_offset(self, path: str) -> int:
        """The offset after the last whole batch of a segment file (a fsynced one: a swap file)."""
        reader = self._storage.open_read(path)
        try:
            next_offset = -1
            try:
                for buf, i, pos, size in _scan(reader, 0, reader.size):
                    if pos + size > reader.size:
                        break
                    next_offset = _INT64.unpack_from(buf, i)[0] + _INT32.unpack_from(buf, i + _LAST_DELTA_POS)[0] + 1
            except CorruptLog:
                pass
            return next_offset
        finally:
            reader.close()

    # --- lifecycle ---

    def close(self) -> None:
        """Close every file (no flush: call `sync` first for a clean shutdown)."""
        if self._closed:
            return
        self._closed = True
        release_files(*self.take_retired())
        active = self._segments[-1].handle if self._segments else None
        if isinstance(active, AppendFile):
            try:
                active.cut_ahead()
            except OSError:
                pass            # recovery cuts the zeros
        for seg in self._segments:
            for handle in (seg.handle, seg.txn_handle):
                if handle is not None:
                    handle.close()

    def delete(self) -> None:
        """Remove the log's files and directory (topic deletion).  With an ``on_retired`` listener the segments'
        blocks are left for it to free (``take_retired``, as for retention), else they are freed here."""
        self._deleted = True
        if not self._closed:
            self._closed = True
            for seg in self._segments:
                self._retire(seg)
        self.remove_files(self._storage, self._directory)
        self._notify_retired()

    @staticmethod
    def remove_files(storage: Storage, directory: str) -> None:
        """Remove a partition directory and everything in it, without opening (or recovering) it."""
        for name in storage.list(directory):
            storage.remove(posixpath.join(directory, name), missing_ok=True)
        storage.remove_dir(directory)

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"log {self._directory} is closed")

    def _path(self, name: str) -> str:
        return posixpath.join(self._directory, name)

    def _segment_path(self, base_offset: int) -> str:
        return self._path(f"{base_offset:020d}.log")


class CleaningFinish:
    """The swap of one cleaning's result, in steps (``PartitionLog.begin_finish``)."""

    __slots__ = ("log", "result", "groups", "dropped", "checkpoint", "checkpoint_before", "new", "releasing")

    def __init__(self, log: "PartitionLog", result, groups, dropped, checkpoint: int) -> None:
        self.log, self.result, self.groups, self.dropped = log, result, groups, dropped
        self.checkpoint = checkpoint
        self.checkpoint_before = log._cleaner_checkpoint
        self.new: list[_Segment] = []
        self.releasing: list = []       # the old log files, writable (files()): retired by commit()

    def files(self) -> None:
        """The renames, unlinks and fsyncs, and the new segments' indexes: any thread."""
        self.log._swap_files(self)

    def commit(self) -> int:
        """The swap in memory (owning thread) → how many groups were swapped in."""
        return self.log._commit_finish(self)



def release_files(writable: list, handles: list, pause: Callable[[], object] | None = None) -> int:
    """Free the blocks of unlinked segment files and close them (any thread): ``writable``, writable handles of
    their log files, are first cut down RELEASE_STEP_BYTES at a time with ``pause()`` between the cuts (when
    given), then closed, then ``handles``.  Freeing a whole large segment's blocks at once (and, on a filesystem
    mounted with ``discard``, trimming them) holds up the fsyncs of every other file for tens of milliseconds; a
    step at a time, each holds them up little.  → the bytes of ``writable`` (as they were)."""
    freed = 0
    for handle in writable:
        try:
            size = handle.size
            freed += size
            while pause is not None and size > RELEASE_STEP_BYTES:
                size -= RELEASE_STEP_BYTES
                handle.truncate(size)
                pause()
        except OSError:
            pass                    # best effort: the last close below frees the rest
        handle.close()
    for handle in handles:
        handle.close()
    return freed
