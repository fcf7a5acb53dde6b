"""A partition's leader-epoch cache (Kafka's LeaderEpochFileCache): for each leader epoch, the offset of its first batch.

Kept in memory only: it is rebuilt from the batches' partition_leader_epoch when a partition is loaded, and an
entry (epoch, log end offset) is added when a broker takes the partition at a new epoch.  The rules follow Kafka's:

- ``assign(epoch, start)`` adds an entry unless the latest entry has that epoch and a start no later; entries that
  would break monotonicity (an epoch ≥ the new one, or a start ≥ the new one's) go first.
- ``truncate_from_start(offset)`` (the log start moved): entries starting at or below ``offset`` go, except the
  last of them, which now starts at ``offset``.
- ``end_offset_for(requested, log_end)`` answers OffsetsForLeaderEpoch: the largest epoch ≤ ``requested`` and the
  start of the first epoch after ``requested`` (the log end for the latest epoch); (-1, -1) for the undefined
  epoch -1 or one later than every entry; ``requested`` itself when no entry is ≤ it.
- ``epoch_for_offset(offset)``: the epoch of the batch at ``offset`` (the last entry starting at or below it), as
  ListOffsets answers it for the offset it found.
"""
from __future__ import annotations

import bisect

UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1


class LeaderEpochCache:
    """(epoch, start offset) entries, both strictly increasing."""

    __slots__ = ("_epochs", "_starts")

    def __init__(self, entries=()) -> None:
        self._epochs: list[int] = []
        self._starts: list[int] = []
        for epoch, start in entries:
            self.assign(epoch, start)

    def entries(self) -> list[tuple[int, int]]:
        return list(zip(self._epochs, self._starts))

    @property
    def latest_epoch(self) -> int:
        """The latest entry's epoch (-1: none)."""
        return self._epochs[-1] if self._epochs else UNDEFINED_EPOCH

    def assign(self, epoch: int, start_offset: int) -> None:
        if epoch < 0 or start_offset < 0:
            raise ValueError(f"invalid leader epoch entry ({epoch}, {start_offset})")
        if self._epochs and self._epochs[-1] == epoch and self._starts[-1] <= start_offset:
            return
        while self._epochs and (self._epochs[-1] >= epoch or self._starts[-1] >= start_offset):
            self._epochs.pop()
            self._starts.pop()
        self._epochs.append(epoch)
        self._starts.append(start_offset)

    def truncate_from_start(self, offset: int) -> None:
        cut = bisect.bisect_right(self._starts, offset)
        if cut:
            epoch = self._epochs[cut - 1]
            del self._epochs[:cut], self._starts[:cut]
            self._epochs.insert(0, epoch)
            self._starts.insert(0, offset)

    def epoch_for_offset(self, offset: int) -> int:
        """The epoch that ``offset`` was written in (-1: before every entry)."""
        at = bisect.bisect_right(self._starts, offset)
        return self._epochs[at - 1] if at else UNDEFINED_EPOCH

    def end_offset_for(self, requested: int, log_end_offset: int) -> tuple[int, int]:
        """→ (epoch, end offset) as Kafka's leader answers OffsetsForLeaderEpoch for ``requested``."""
        if requested == UNDEFINED_EPOCH:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if self._epochs and requested == self._epochs[-1]:
            return requested, log_end_offset
        higher = bisect.bisect_right(self._epochs, requested)
        if higher == len(self._epochs):
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if higher == 0:
            return requested, self._starts[0]
        return self._epochs[higher - 1], self._starts[higher]
