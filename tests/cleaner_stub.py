"""A stand-in for state/cleaner.py's interface (issue 22's brief) until cleaner-core's lands: it plans by dirty
bytes, and its clean reads and decodes every record of the dirty segments (the CPU work of a real cleaning) and
removes nothing."""
from __future__ import annotations

import dataclasses

from trireme.server.log_cleaner import CleanerCore
from trireme.wire import records as rec

CHUNK = 1 << 20


@dataclasses.dataclass(frozen=True)
class CleanerConfig:
    delete_retention_ms: int
    min_compaction_lag_ms: int
    max_compaction_lag_ms: int
    min_cleanable_dirty_ratio: float
    max_map_keys: int = 1_000_000


@dataclasses.dataclass(frozen=True)
class Plan:
    directory: str
    segments: tuple[tuple[int, int], ...]     # (base offset, size) of the dirty rolled segments
    end_offset: int
    dirty_ratio: float
    forced: bool = False


@dataclasses.dataclass(frozen=True)
class Result:
    plan: Plan
    bytes_read: int
    bytes_written: int
    keys: int


def clean(storage, plan: Plan, throttle) -> Result:
    keys: dict = {}
    read = 0
    for base, size in plan.segments:
        f = storage.open_read(f"{plan.directory}/{base:020d}.log")
        try:
            pos = 0
            while pos < size:
                data = f.read(pos, min(CHUNK, size - pos) + CHUNK)     # whole batches: read past the chunk
                throttle(len(data))
                used = 0
                for bpos, header in rec.iter_batch_headers(data):
                    if bpos >= CHUNK or pos + bpos >= size:
                        break
                    if not header.is_control:
                        for r in rec.decode_records(data, bpos):
                            keys[r.key] = r.offset
                    used = bpos + header.batch_length + rec.LOG_OVERHEAD
                if used == 0:
                    break
                read += used
                pos += used
        finally:
            f.close()
    return Result(plan, read, 0, len(keys))


class StubCore(CleanerCore):
    """The runtime's calls, answered by this stand-in; the checkpoint (first dirty offset) lives here."""

    def __init__(self):
        import tests.cleaner_stub as module
        super().__init__(module)
        self.first_dirty: dict = {}
        self.planned: list = []
        self.finished: list = []
        self.abandoned: list = []
        self.cleaning: set = set()

    def dirty_ratio(self, partition, now, cfg):
        plan = self._plan(partition, cfg)
        return 0.0 if plan is None else plan.dirty_ratio

    def abandon(self, partition, plan):
        self.cleaning.discard(partition)
        self.abandoned.append((partition, plan))

    def cleanable(self, partition, now, cfg):
        if partition in self.cleaning:
            return None
        plan = self._plan(partition, cfg)
        if plan is None or plan.dirty_ratio < cfg.min_cleanable_dirty_ratio:
            return None
        self.cleaning.add(partition)
        self.planned.append((partition, plan))
        return plan

    def _plan(self, partition, cfg):
        plog = partition.log
        first_dirty = self.first_dirty.get(partition, 0)
        unstable = partition.producers.first_unstable_offset()
        bases = plog.segment_base_offsets
        sizes = [seg.size for seg in plog._segments]
        clean_bytes = dirty_bytes = 0
        dirty = []
        end = first_dirty
        for i, base in enumerate(bases[:-1]):
            nxt = bases[i + 1]
            if nxt > plog.high_watermark or (unstable is not None and nxt > unstable):
                break
            if nxt <= first_dirty:
                clean_bytes += sizes[i]
            else:
                dirty_bytes += sizes[i]
                dirty.append((base, sizes[i]))
                end = nxt
        if not dirty:
            return None
        return Plan(plog._directory, tuple(dirty), end, dirty_bytes / (clean_bytes + dirty_bytes))

    def begin_finish(self, partition, result):
        return _StubFinish(lambda: self.finish(partition, result))

    def finish(self, partition, result):
        self.cleaning.discard(partition)
        self.first_dirty[partition] = result.plan.end_offset
        self.finished.append((partition, result))


@dataclasses.dataclass
class _StubFinish:
    """The stand-in's swap: no file work; the commit on the event loop is ``finish``."""

    commit: object

    def files(self) -> None:
        pass


def endless_clean(storage, plan: Plan, throttle) -> Result:
    """A cleaning that never ends by itself: only its throttle callback (an abort) or a kill ends it."""
    while True:
        throttle(1)


def failing_clean(storage, plan: Plan, throttle) -> Result:
    raise OSError(5, "Input/output error")


class EndlessCore(StubCore):
    def clean_function(self):
        return endless_clean


class FailingCore(StubCore):
    def clean_function(self):
        return failing_clean
