"""The log cleaner's core: compacts a partition's rolled segments to the latest record per key, as Kafka's LogCleaner.

The interface (server/log_cleaner.py schedules it; the plan's types, CleaningPlan and SegmentRef, are state/log.py's,
since the log makes the plan):

* :class:`CleanerConfig` — a partition's settings: ``delete_retention_ms``, ``min_compaction_lag_ms``,
  ``max_compaction_lag_ms``, ``min_cleanable_dirty_ratio``, ``max_map_keys`` (our equivalent of
  ``log.cleaner.dedupe.buffer.size``: keys one cleaning may hold in its offset map) and ``throttle``, an optional
  callable taking a byte count, called per chunk read or written (the I/O throttle; it may sleep, and it may raise
  to abort the cleaning, e.g. before the partition is deleted: then call ``abandon_cleaning``).
* ``PartitionLog.cleanable(now_ms, first_unstable_offset, cfg) -> CleaningPlan | None`` (owning thread, cheap:
  segment metadata and one batch header): which rolled segments to clean, the dirty ratio, whether
  ``max_compaction_lag_ms`` forces it. None when nothing is cleanable or the ratio is below the minimum.
* :func:`clean` ``(storage, plan, throttle=None) -> CleaningResult`` (``storage``: the log's, ``PartitionLog.storage``),
  or :func:`clean_directory` ``(data_dir, plan)`` in a fresh subprocess (plan and result are picklable) — any
  thread or process: reads only the plan's rolled,
  immutable, durable segments and writes new files named ``<base>.{log,index,timeindex,txnindex}.cleaned``
  (fsynced unless the log is unsafe: a new log file every SYNC_STEP_BYTES as it is written, and at its end). Raises OSError / CorruptLog on I/O trouble: the caller logs it, calls
  ``PartitionLog.abandon_cleaning(plan)`` and tries later.
* ``PartitionLog.finish_cleaning(result) -> int`` (owning thread): swaps the cleaned segments in by rename (see
  below) and checkpoints the first dirty offset; returns how many segment groups were swapped. A group whose
  old segments changed meanwhile (retention, deletion) is dropped. An OSError from it leaves files that
  start-up recovery puts right: treat it as a failed flush (the partition's storage failed).
  ``PartitionLog.begin_finish(result)`` does the same in steps, so that the file work stays off the event loop:
  it checks the groups (owning thread), its ``files()`` does the renames, unlinks, fsyncs and index loading (any
  thread), its ``commit()`` swaps the segment list in memory (owning thread); reads see the old segments until then.
* ``abandon_cleaning``, the ``cleaning`` property, ``cleaner_checkpoint``, ``dirty_ratio``. ``cleanable`` marks the log as being cleaned (it returns None until ``finish_cleaning`` or
  ``abandon_cleaning``); ``cfg.throttle`` is not part of the plan (not picklable): pass it to ``clean``.
* ``PartitionLog.cleaner_checkpoint`` — the first dirty offset (durable, ``cleaner-offset.checkpoint``, whose
  third line, written before the first swap, is the offset below which start-up accepts offset gaps).
  ``CleaningPlan.dirty_ratio`` / ``PartitionLog.dirty_ratio(...)`` for metrics; ``CleaningResult`` carries
  bytes read and written and record counts.

What cleaning keeps (Kafka 4's Cleaner): the cleanable range is the rolled segments from the log start up to the
first of: the active segment, the first unstable offset (LSO), the high watermark, the first segment holding a
record newer than ``min_compaction_lag_ms``. It is cleaned when its dirty ratio is above
``min_cleanable_dirty_ratio`` or its first dirty batch is older than ``max_compaction_lag_ms`` (as Kafka). The
offset map (key -> latest offset) is built over the dirty part (from the checkpoint on), skipping aborted and
control batches. Then every batch of the range is filtered: a record is kept if it is the latest for its key;
keyless records go; a tombstone (null value) is kept until the delete horizon stored in its batch (attribute bit 6,
base timestamp = the horizon) passes: the first cleaning that keeps it sets horizon = now + ``delete_retention_ms``.
Records of aborted transactions go. A COMMIT/ABORT marker stays while this cleaning saw any batch of its
transaction; once none remains it gets a delete horizon, and a later cleaning past the horizon removes it (Kafka's
two passes). Offsets never change: kept batches keep their base offset and last offset delta (gaps between and
inside batches). The last data batch of each producer id in the range is kept (emptied of its records if none
remain), and its last marker when that is its last entry (Kafka 4 keeps it for the epoch), so that producer state
rebuilt from the log keeps every producer's epoch and last sequence; likewise the last batch of each new segment, so
a cleaned segment ends where the old ones did (the next segment's base offset) — that is what lets start-up check
that segments are contiguous and lets a swap be recovered. Batches wholly kept are copied byte for byte; others are
re-encoded (CRC-32C, same compression codec). The aborted-transaction index entries of the segments are carried
over, except those whose ABORT marker this cleaning removed (a read_committed consumer keeps a producer in its
aborted set from an entry's first offset until an ABORT marker: an entry without its marker would hide the
producer's later committed data). Start-up accepts the links this breaks in the index files' chain, below the
cleaned end only (``PartitionLog._load_aborted_txns``).

Crash safety (``finish_cleaning``, recovery in ``PartitionLog._recover_swaps``), per group with base B:
(1) rename ``B.*.cleaned`` -> ``B.*.swap``, the log file last, fsync the directory: the swap is committed once
``B.log.swap`` is durable; (2) remove the old segments' files, fsync the directory; (3) rename ``B.*.swap`` ->
``B.*``, fsync the directory, then the log file, fsync again (so an index ``.swap`` file without a
``B.log.swap`` always belongs to an uncommitted swap). At start-up a ``B.log.swap`` means committed: the old segments
in [B, next offset of the swap file) are removed and the swap (or still ``.cleaned``) files renamed into place;
without it the ``.cleaned`` files are removed and the old segments stand. So a crash leaves the old or the new
segments, never a mixture. Only durable data (below the high watermark) is ever cleaned.
"""
from __future__ import annotations

import bisect
import struct
from dataclasses import dataclass, field
from typing import Callable, Iterator

from trireme.state.log import (HEADER_SIZE, LONG_MAX, AbortedTxn, CleaningPlan, CorruptLog, SegmentRef, pack_txn_entry,
                               _Segment, cleaned_name)
from trireme.state.storage import AppendFile, FileStorage, ReadFile, Storage
from trireme.wire.primitives import CodecError
from trireme.wire.records import (CONTROL_ABORT, CONTROL_COMMIT, LOG_OVERHEAD, MIN_BATCH_LENGTH, BatchHeader,
                                  decode_records, parse_batch_header, parse_control_record, rebuild_batch,
                                  scan_keys)

_CHUNK = 1 << 20
# A durable cleaning fsyncs its new segment every this many bytes as it writes, not only at the end: one fsync of
# a whole large segment makes every other file's fsync (the broker's acknowledgements) wait while it is written out.
SYNC_STEP_BYTES = 4 << 20
_INT32 = struct.Struct(">i")


@dataclass(frozen=True)
class CleanerConfig:
    """One partition's cleaning settings (topic configs over broker defaults, resolved by the caller)."""

    delete_retention_ms: int = 86_400_000
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = LONG_MAX
    min_cleanable_dirty_ratio: float = 0.5
    max_map_keys: int = 1_000_000     # ~100 MB of Python dict for short keys
    throttle: Callable[[int], None] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class GroupResult:
    """One group's new segment (files ``<base>.*.cleaned``)."""

    base_offset: int
    old_bases: tuple[int, ...]
    old_sizes: tuple[int, ...]
    next_offset: int
    size: int
    txn_entries: tuple[tuple[int, int, int, int], ...] = ()   # the index entries kept (markers still there)


@dataclass(frozen=True)
class CleaningResult:
    """What :func:`clean` wrote; hand it to ``PartitionLog.finish_cleaning``."""

    directory: str
    groups: tuple[GroupResult, ...]   # groups left out were unchanged (nothing to rewrite)
    end_offset: int                   # the new first dirty offset
    bytes_read: int
    bytes_written: int
    records_read: int
    records_kept: int
    batches_removed: int


# --- reading ------------------------------------------------------------------------------------------------


def _iter_batches(reader: ReadFile, size: int, throttle, counter: list) -> Iterator[tuple[BatchHeader, memoryview]]:
    """(header, batch bytes) of every batch of a segment, read a chunk at a time."""
    pos = 0
    buf = memoryview(b"")
    buf_start = 0
    while pos + HEADER_SIZE <= size:
        if pos + HEADER_SIZE > buf_start + len(buf):
            buf, buf_start = memoryview(reader.read(pos, min(_CHUNK, size - pos))), pos
            counter[0] += len(buf)
            if throttle is not None:
                throttle(len(buf))
        i = pos - buf_start
        length = _INT32.unpack_from(buf, i + 8)[0]
        batch_size = length + LOG_OVERHEAD
        if length < MIN_BATCH_LENGTH or pos + batch_size > size:
            raise CorruptLog(f"{reader.path}: bad batch at {pos}")
        if i + batch_size > len(buf):
            buf, buf_start, i = memoryview(reader.read(pos, max(_CHUNK, batch_size))), pos, 0
            counter[0] += len(buf)
            if throttle is not None:
                throttle(len(buf))
            if len(buf) < batch_size:
                raise CorruptLog(f"{reader.path}: short read at {pos}")
        yield parse_batch_header(buf, i), buf[i:i + batch_size]
        pos += batch_size


class _Aborted:
    """The aborted transactions of the range: is a data batch aborted; which were seen this cleaning."""

    def __init__(self, aborted) -> None:
        self.by_pid: dict[int, tuple[list[int], list[int]]] = {}
        for pid, first, last in sorted(aborted, key=lambda t: t[2]):
            firsts, lasts = self.by_pid.setdefault(pid, ([], []))
            firsts.append(first)
            lasts.append(last)
        self.observed: set[tuple[int, int]] = set()

    def containing(self, pid: int, offset: int) -> int | None:
        """The marker offset of `pid`'s aborted transaction holding `offset`, if any."""
        entry = self.by_pid.get(pid)
        if entry is None:
            return None
        firsts, lasts = entry
        k = bisect.bisect_right(lasts, offset)   # first entry whose marker is after offset
        if k < len(lasts) and firsts[k] <= offset:
            return lasts[k]
        return None


# --- cleaning -----------------------------------------------------------------------------------------------


def clean_directory(data_dir: str, plan: CleaningPlan) -> CleaningResult:
    """:func:`clean` on the data directory's files, for a fresh subprocess (no throttle callback)."""
    return clean(FileStorage(data_dir), plan)


def clean(storage: Storage, plan: CleaningPlan, throttle: Callable[[int], None] | None = None) -> CleaningResult:
    """Clean the plan's segments into ``.cleaned`` files; safe in any thread or process (see the module)."""
    counter = [0]
    aborted = _Aborted(plan.aborted)
    segs = plan.segments

    def reader_of(ref: SegmentRef) -> ReadFile:
        return storage.open_read(f"{plan.directory}/{ref.base_offset:020d}.log")

    # Pass 1: the offset map over the dirty part, and each producer's last data batch in the range.
    offset_map: dict[bytes, int] = {}
    last_of_producer: dict[int, int] = {}   # producer id -> last offset of its last data batch in the range
    last_entry: dict[int, int] = {}         # producer id -> last offset of its last batch, marker or data
    end_index = len(segs)
    for n, ref in enumerate(segs):
        reader = reader_of(ref)
        try:
            dirty = ref.next_offset > plan.first_dirty_offset
            if not dirty:
                for header, _batch in _iter_headers(reader, ref.size):
                    if header.producer_id >= 0:
                        last_entry[header.producer_id] = header.last_offset
                        if not header.is_control:
                            last_of_producer[header.producer_id] = header.last_offset
                continue
            if len(offset_map) >= plan.max_map_keys and n > 0 and segs[n - 1].next_offset > plan.first_dirty_offset:
                end_index = n            # the map is full: clean up to here, the rest next time
                break
            for header, batch in _iter_batches(reader, ref.size, throttle, counter):
                if header.producer_id >= 0:
                    last_entry[header.producer_id] = header.last_offset
                    if not header.is_control:
                        last_of_producer[header.producer_id] = header.last_offset
                if header.is_control or header.last_offset < plan.first_dirty_offset:
                    continue
                if header.is_transactional and aborted.containing(header.producer_id, header.base_offset) is not None:
                    continue
                first_dirty = plan.first_dirty_offset
                for offset, key, _has_value in scan_keys(batch):
                    if key is not None and offset >= first_dirty:
                        offset_map[key] = offset
        finally:
            reader.close()
    # the groups, cut at the last segment the map covers
    groups = [(a, min(b, end_index)) for a, b in plan.groups if a < end_index]
    end_offset = segs[groups[-1][1] - 1].next_offset if groups else plan.first_dirty_offset

    # Pass 2: filter every batch of each group into its new segment.
    stats = {"read": 0, "kept": 0, "removed": 0, "written": 0}
    ongoing_committed: set[int] = set()
    removed_markers: set[tuple[int, int]] = set()   # (producer id, offset) of the markers removed
    prev_entry = -1                                  # last offset of the last index entry kept so far
    results = []
    horizon = plan.now_ms + plan.delete_retention_ms
    for gi, (a, b) in enumerate(groups):
        group_refs = segs[a:b]
        base = group_refs[0].base_offset
        names = {kind: f"{plan.directory}/{cleaned_name(base, kind)}" for kind in ("log", "index", "timeindex",
                                                                                     "txnindex")}
        out = storage.open_append(names["log"])
        try:
            if out.size:
                out.truncate(0)
            seg = _Segment(base, names["log"])
            changed = False
            pending: list = []   # buffered output
            synced = 0           # bytes of it fsynced so far
            pending_size = 0
            last_ref = group_refs[-1]
            for ref in group_refs:
                reader = reader_of(ref)
                try:
                    for header, batch in _iter_batches(reader, ref.size, throttle, counter):
                        pid_last = header.producer_id >= 0 and (
                            last_entry[header.producer_id] == header.last_offset if header.is_control
                            else last_of_producer[header.producer_id] == header.last_offset)
                        keep_empty = pid_last or (ref is last_ref and header.next_offset == ref.next_offset)
                        new = _filter_batch(header, batch, offset_map, aborted, ongoing_committed, plan.now_ms,
                                            horizon, keep_empty, stats)
                        if new is None:
                            changed = True
                            stats["removed"] += 1
                            if header.is_control:
                                removed_markers.add((header.producer_id, header.last_offset))
                            continue
                        if new is not batch:
                            changed = True
                        seg.track(seg.size, header.base_offset, header.next_offset,
                                  parse_batch_header(new).max_timestamp, len(new))
                        seg.size += len(new)
                        pending.append(new)
                        pending_size += len(new)
                        if pending_size >= _CHUNK:
                            _write(out, pending, throttle)
                            pending, pending_size = [], 0
                            if plan.durable and out.size - synced >= SYNC_STEP_BYTES:
                                out.sync()
                                synced = out.size
                finally:
                    reader.close()
            if pending:
                _write(out, pending, throttle)
            # A removed ABORT marker takes its index entry along: a read_committed consumer would otherwise keep
            # its producer in the aborted set past the (gone) marker and drop its later committed data.
            kept_entries = tuple(e for e in plan.txn_entries[gi] if (e[0], e[2]) not in removed_markers)
            if not changed:
                out.close()
                storage.remove(names["log"], missing_ok=True)
                if kept_entries:
                    prev_entry = kept_entries[-1][2]
                continue
            txn_bytes = bytearray()
            for pid, first, last, lso in kept_entries:
                txn_bytes += pack_txn_entry(AbortedTxn(pid, first, last, lso), prev_entry)
                prev_entry = last
            seg.seal()
            if plan.durable:
                out.sync()
            out.close()
            stats["written"] += seg.size
            for kind, data in (("index", seg.index_bytes()), ("timeindex", seg.time_index_bytes()),
                               ("txnindex", bytes(txn_bytes))):
                f = storage.open_append(names[kind])
                try:
                    if f.size:
                        f.truncate(0)
                    f.write(data)
                    if plan.durable:
                        f.sync()
                finally:
                    f.close()
            results.append(GroupResult(base, tuple(r.base_offset for r in group_refs),
                                       tuple(r.size for r in group_refs), seg.next_offset, seg.size, kept_entries))
        except BaseException:
            out.close()
            raise
    return CleaningResult(plan.directory, tuple(results), end_offset, counter[0], stats["written"],
                          stats["read"], stats["kept"], stats["removed"])


def _iter_headers(reader: ReadFile, size: int) -> Iterator[tuple[BatchHeader, None]]:
    """Headers only, hopping from batch to batch (the clean part needs no records in pass 1)."""
    from trireme.state.log import _scan
    for buf, i, _pos, _size in _scan(reader, 0, size):
        yield parse_batch_header(buf, i), None


def _write(out: AppendFile, parts: list, throttle) -> None:
    out.write_vectored(parts)
    if throttle is not None:
        throttle(sum(len(p) for p in parts))


def _filter_batch(header: BatchHeader, batch: memoryview, offset_map: dict, aborted: _Aborted,
                  ongoing_committed: set, now_ms: int, horizon: int, keep_empty: bool, stats: dict):
    """The batch to write for `batch` (itself when unchanged, new bytes, or None to drop it)."""
    pid = header.producer_id
    if header.is_control:
        # Kafka's CleanedTransactionMetadata.onControlBatchRead: may the marker go?
        records = decode_records(batch)
        stats["read"] += len(records)
        if not records:
            return batch if keep_empty else None   # an empty control batch was cleaned already
        try:
            control_type, _ = parse_control_record(records[0])
        except CodecError:
            control_type = -1
        if control_type == CONTROL_ABORT:
            discardable = (pid, header.last_offset) not in aborted.observed
        elif control_type == CONTROL_COMMIT:
            discardable = pid not in ongoing_committed
        else:
            discardable = False
        ongoing_committed.discard(pid)
        if keep_empty:
            discardable = False               # the producer's last entry (its epoch fences) or the group's last
        if not discardable:
            stats["kept"] += len(records)
            return batch
        if header.has_delete_horizon and header.base_timestamp <= now_ms:
            return None                       # no data of its transaction remains and the horizon passed
        stats["kept"] += len(records)
        if header.has_delete_horizon:
            return batch
        return memoryview(rebuild_batch(header, records, delete_horizon_ms=horizon))

    scanned = scan_keys(batch)
    stats["read"] += len(scanned)
    if header.is_transactional:
        marker = aborted.containing(pid, header.base_offset)
        if marker is not None:
            aborted.observed.add((pid, marker))
            if not keep_empty:
                return None
            return batch if not scanned else memoryview(rebuild_batch(header, []))
        ongoing_committed.add(pid)
    keep = []
    tombstones = False
    horizon_passed = header.has_delete_horizon and header.base_timestamp <= now_ms
    for n, (offset, key, has_value) in enumerate(scanned):
        if key is None:
            continue                          # Kafka drops keyless records from a compacted log
        latest = offset_map.get(key)
        if latest is not None and offset < latest:
            continue
        if not has_value:
            if horizon_passed:
                continue                      # the tombstone's delete horizon passed
            tombstones = True
        keep.append(n)
    stats["kept"] += len(keep)
    if not keep:
        if keep_empty:
            return batch if not scanned else memoryview(rebuild_batch(header, []))
        return None
    set_horizon = tombstones and not header.has_delete_horizon
    if len(keep) == len(scanned) and not set_horizon:
        return batch
    records = decode_records(batch)
    return memoryview(rebuild_batch(header, [records[n] for n in keep],
                                    delete_horizon_ms=horizon if set_horizon else None))
