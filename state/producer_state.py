"""Idempotent-producer bookkeeping for one partition: epoch fencing, sequence checks and duplicate detection.

The rules follow Kafka's ``ProducerAppendInfo`` / ``ProducerStateManager`` (Kafka 2.5 and later,
transaction version 1):

* A batch without a producer id (``-1``) is not idempotent and is always accepted.
* Duplicates are looked up first, in the *committed* state only: a batch whose producer epoch equals
  the producer's current epoch and whose first and last sequence equal those of one of the last five
  batches is a duplicate.  Kafka answers such a produce with NONE and the original base offset and
  does not append it; :attr:`CheckResult.duplicate` carries that original batch.
* A producer epoch lower than the current one is rejected with INVALID_PRODUCER_EPOCH (47); Kafka sends
  this rather than PRODUCER_FENCED for produce requests since 2.7.
* A producer epoch different from (so higher than) the current one must start at sequence 0, else
  OUT_OF_ORDER_SEQUENCE_NUMBER (45) -- unless the producer has no state at all, in which case any
  sequence is accepted (state may have been lost to retention, DeleteRecords or expiry).
* Within the current epoch the base sequence must be the last sequence plus one, where 0 follows
  2147483647; anything else, including a retry of a batch older than the five cached ones, is
  OUT_OF_ORDER_SEQUENCE_NUMBER.  Kafka no longer uses DUPLICATE_SEQUENCE_NUMBER (46) on this path.
* A non-transactional batch while the producer has a transaction open is INVALID_TXN_STATE (48).

Checking never mutates the manager.  A produce request may carry several batches for one producer, so
checks and commits go through a :class:`ProducerAppend` overlay obtained from
:meth:`ProducerStateManager.begin`; only :meth:`ProducerAppend.apply` changes the manager.
"""
from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Iterable, NamedTuple, Protocol

from trireme.wire import error_codes as E

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
MAX_SEQUENCE = 2**31 - 1
BATCHES_TO_RETAIN = 5
DEFAULT_PRODUCER_ID_EXPIRATION_MS = 86_400_000
SNAPSHOT_VERSION = 1


class Outcome(enum.IntEnum):
    """What a check decided, valued with the Kafka error code that names it."""

    ACCEPT = 0
    OUT_OF_ORDER_SEQUENCE_NUMBER = 45
    DUPLICATE_SEQUENCE_NUMBER = 46
    INVALID_PRODUCER_EPOCH = 47
    INVALID_TXN_STATE = 48


class ProducerStateError(Exception):
    """A commit that the producer state does not allow, or an unreadable snapshot."""


def increment_sequence(sequence: int, increment: int) -> int:
    """``sequence + increment`` on Kafka's sequence ring, where 0 follows 2147483647."""
    if sequence > MAX_SEQUENCE - increment:
        return increment - (MAX_SEQUENCE - sequence) - 1
    return sequence + increment


def in_sequence(last_sequence: int, next_sequence: int) -> bool:
    """Whether ``next_sequence`` directly follows ``last_sequence``."""
    return next_sequence == last_sequence + 1 or (next_sequence == 0 and last_sequence == MAX_SEQUENCE)


class BatchMetadata(NamedTuple):
    """What is remembered of one appended batch (a tuple: made for every idempotent batch appended or replayed, and
    a frozen dataclass costs several times as much to make)."""

    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    max_timestamp: int


@dataclass(frozen=True)
class CheckResult:
    """The verdict on one batch; ``duplicate`` is the original batch when the outcome is DUPLICATE."""

    outcome: Outcome
    duplicate: BatchMetadata | None = None
    message: str = ""

    @property
    def accepted(self) -> bool:
        """The batch may be appended."""
        return self.outcome is Outcome.ACCEPT

    @property
    def is_duplicate(self) -> bool:
        return self.outcome is Outcome.DUPLICATE_SEQUENCE_NUMBER

    @property
    def error_code(self) -> int:
        """The error code for the produce response: NONE for an accepted batch and for a duplicate."""
        if self.outcome in (Outcome.ACCEPT, Outcome.DUPLICATE_SEQUENCE_NUMBER):
            return 0
        return int(self.outcome)


ACCEPTED = CheckResult(Outcome.ACCEPT)


class BatchHeader(Protocol):
    """The fields of a record batch header that producer state replays from the log."""

    producer_id: int
    producer_epoch: int
    base_sequence: int
    last_offset_delta: int
    base_offset: int
    max_timestamp: int
    is_control: bool
    is_transactional: bool


@dataclass
class ProducerEntry:
    """The state of one producer id in one partition; read it, do not mutate it from outside."""

    producer_id: int
    producer_epoch: int = NO_PRODUCER_EPOCH
    batches: list[BatchMetadata] = field(default_factory=list)
    last_timestamp: int = -1
    current_txn_first_offset: int | None = None
    coordinator_epoch: int = -1         # of the last transaction marker; DescribeProducers reports it

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    @property
    def last_offset(self) -> int:
        return self.batches[-1].last_offset if self.batches else -1

    def find_duplicate(self, producer_epoch: int, first_seq: int, last_seq: int) -> BatchMetadata | None:
        if producer_epoch != self.producer_epoch:
            return None
        for batch in self.batches:
            if batch.first_seq == first_seq and batch.last_seq == last_seq:
                return batch
        return None

    def copy(self) -> ProducerEntry:
        return ProducerEntry(self.producer_id, self.producer_epoch, list(self.batches),
                             self.last_timestamp, self.current_txn_first_offset, self.coordinator_epoch)

    def _update_epoch(self, producer_epoch: int) -> None:
        # A new epoch starts a new sequence space, so the cached batches no longer apply.
        if producer_epoch != self.producer_epoch:
            self.batches.clear()
            self.producer_epoch = producer_epoch

    def _add_batch(self, producer_epoch: int, batch: BatchMetadata) -> None:
        self._update_epoch(producer_epoch)
        if len(self.batches) == BATCHES_TO_RETAIN:
            del self.batches[0]
        self.batches.append(batch)
        self.last_timestamp = batch.max_timestamp


class ProducerStateManager:
    """All producers' state for one partition, plus the log offset up to which it is known."""

    def __init__(self, producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS) -> None:
        self.producer_id_expiration_ms = producer_id_expiration_ms
        self._producers: dict[int, ProducerEntry] = {}
        self._open_txns: dict[int, int] = {}     # producer id → first offset of its open transaction
        self.map_end_offset = 0

    # --- reading -----------------------------------------------------------------------------

    def entry(self, producer_id: int) -> ProducerEntry | None:
        return self._producers.get(producer_id)

    def entries(self) -> list[ProducerEntry]:
        """Every producer's state, e.g. for DescribeProducers."""
        return list(self._producers.values())

    def __len__(self) -> int:
        return len(self._producers)

    def open_transactions(self) -> list[tuple[int, int, int]]:
        """(producer id, producer epoch, first offset) of every open transaction."""
        return [(pid, self._producers[pid].producer_epoch, first) for pid, first in self._open_txns.items()]

    def first_unstable_offset(self) -> int | None:
        """The first offset of the oldest open transaction, or None when none is open."""
        return min(self._open_txns.values()) if self._open_txns else None

    def _track(self, entry: ProducerEntry) -> None:
        """Keep the open-transaction index in step with ``entry`` (every fetch asks for the LSO)."""
        if entry.current_txn_first_offset is None:
            self._open_txns.pop(entry.producer_id, None)
        else:
            self._open_txns[entry.producer_id] = entry.current_txn_first_offset

    # --- appending ---------------------------------------------------------------------------

    def begin(self) -> ProducerAppend:
        """An overlay for checking and committing the batches of one request."""
        return ProducerAppend(self)

    def check(self, producer_id: int, producer_epoch: int, base_sequence: int,
              last_offset_delta: int, is_transactional: bool) -> CheckResult:
        """Whether one batch may be appended now; nothing is changed."""
        return self.begin().check(producer_id, producer_epoch, base_sequence, last_offset_delta,
                                  is_transactional)

    def commit(self, producer_id: int, producer_epoch: int, base_sequence: int,
               last_offset_delta: int, base_offset: int, max_timestamp: int,
               is_transactional: bool = False) -> None:
        """Record one appended batch; raises ProducerStateError if a check would not accept it."""
        append = self.begin()
        append.commit(producer_id, producer_epoch, base_sequence, last_offset_delta, base_offset,
                      max_timestamp, is_transactional)
        append.apply()

    def check_marker(self, producer_id: int, producer_epoch: int, coordinator_epoch: int, *,
                     strict_epoch: bool = False) -> tuple[int, str]:
        """Whether a COMMIT/ABORT marker may be written → (error code, message); (0, "") to write it.

        As Kafka: refused only for an older producer epoch (INVALID_PRODUCER_EPOCH; under transaction
        version 2, whose markers carry the bumped epoch, it must be strictly newer) or an older coordinator
        epoch (TRANSACTION_COORDINATOR_FENCED).  A producer this partition does not know is checked as one with
        no epoch and no coordinator epoch yet (-1), as Kafka checks it: so an epoch or coordinator epoch below
        -1 is refused here, before anything is appended (:meth:`commit_end_txn` would refuse it after).  A
        producer id below 0 names no producer, so there is nothing a marker could end: INVALID_REQUEST.
        """
        if producer_id < 0:
            return E.INVALID_REQUEST.code, f"marker for no producer id ({producer_id})"
        entry = self._producers.get(producer_id) or ProducerEntry(producer_id)
        if producer_epoch < entry.producer_epoch:
            return (int(Outcome.INVALID_PRODUCER_EPOCH),
                    f"marker epoch {producer_epoch} is older than the producer's epoch {entry.producer_epoch}")
        if strict_epoch and producer_epoch <= entry.producer_epoch:
            return (int(Outcome.INVALID_PRODUCER_EPOCH),
                    f"transaction version 2 marker epoch {producer_epoch} is not above {entry.producer_epoch}")
        if coordinator_epoch < entry.coordinator_epoch:
            return (E.TRANSACTION_COORDINATOR_FENCED.code,
                    f"coordinator epoch {coordinator_epoch} is older than {entry.coordinator_epoch}")
        return 0, ""

    def marker_applied(self, producer_id: int, producer_epoch: int) -> bool:
        """Whether a transaction version 2 marker at ``producer_epoch`` has nothing left to do here: the producer is
        at that epoch with no transaction open, so a marker at that epoch was written already (a copy of the
        coordinator's own, or the coordinator's after its fsync failed) — :meth:`check_marker` refuses it as not
        strictly newer."""
        entry = self._producers.get(producer_id)
        return entry is not None and entry.producer_epoch == producer_epoch and entry.current_txn_first_offset is None

    def commit_end_txn(self, producer_id: int, producer_epoch: int, offset: int,
                       timestamp: int, coordinator_epoch: int = -1) -> int | None:
        """Record an appended COMMIT/ABORT marker; returns the first offset of the transaction it ends."""
        append = self.begin()
        first_offset = append.commit_end_txn(producer_id, producer_epoch, offset, timestamp, coordinator_epoch)
        append.apply()
        return first_offset

    # --- recovery ----------------------------------------------------------------------------

    def rebuild(self, headers: Iterable[BatchHeader]) -> None:
        """Forget everything and replay the log's batch headers in offset order."""
        self._producers.clear()
        self._open_txns.clear()
        self.map_end_offset = 0
        for header in headers:
            self.load_batch(header)

    def load_batch(self, header: BatchHeader, coordinator_epoch: int = -1) -> int | None:
        """Replay one batch read from the log, trusting it; batches already covered are skipped.

        For a marker (``coordinator_epoch`` read from its control record) → the first offset of the
        transaction it ended, if one was open.
        """
        last_offset = header.base_offset + header.last_offset_delta
        if last_offset < self.map_end_offset:
            return None
        pid = header.producer_id
        first_offset = None
        if pid != NO_PRODUCER_ID:
            entry = self._producers.get(pid)
            if entry is None:
                entry = self._producers[pid] = ProducerEntry(pid)
            if header.is_control:
                first_offset = entry.current_txn_first_offset
                _apply_end_txn(entry, header.producer_epoch, header.max_timestamp, coordinator_epoch)
            else:
                _apply_data_batch(entry, header.producer_epoch, header.base_sequence,
                                  header.last_offset_delta, header.base_offset,
                                  header.max_timestamp, header.is_transactional)
            self._track(entry)
        self.map_end_offset = last_offset + 1
        return first_offset

    def expire(self, now_ms: int) -> list[int]:
        """Forget producers idle for ``producer.id.expiration.ms``, except those with an open transaction."""
        expired = [pid for pid, e in self._producers.items()
                   if e.current_txn_first_offset is None
                   and now_ms - e.last_timestamp >= self.producer_id_expiration_ms]
        for pid in expired:
            del self._producers[pid]
        return expired

    # --- snapshots ---------------------------------------------------------------------------

    def snapshot(self) -> bytes:
        """The whole state as bytes; it covers the log below :attr:`map_end_offset`."""
        producers = [
            {"id": e.producer_id, "epoch": e.producer_epoch, "last_timestamp": e.last_timestamp,
             "txn_first_offset": e.current_txn_first_offset, "coordinator_epoch": e.coordinator_epoch,
             "batches": [[b.first_seq, b.last_seq, b.first_offset, b.last_offset, b.max_timestamp]
                         for b in e.batches]}
            for e in sorted(self._producers.values(), key=lambda e: e.producer_id)
        ]
        doc = {"version": SNAPSHOT_VERSION, "offset": self.map_end_offset, "producers": producers}
        return json.dumps(doc, separators=(",", ":")).encode()

    def load_snapshot(self, data: bytes) -> int:
        """Replace the state with a snapshot's; returns the offset from which the log must be replayed.

        The caller must discard a snapshot whose offset lies beyond the log end offset (the log lost
        its tail) and rebuild instead.  Raises ProducerStateError for a malformed snapshot, leaving
        the state untouched.
        """
        producers, offset = _parse_snapshot(data)
        self._producers = producers
        self._open_txns = {}
        for entry in producers.values():
            self._track(entry)
        self.map_end_offset = offset
        return offset


class ProducerAppend:
    """Pending changes for the batches of one request, checked against each other and the manager."""

    def __init__(self, manager: ProducerStateManager) -> None:
        self._manager = manager
        self._updated: dict[int, ProducerEntry] = {}
        self._map_end_offset = manager.map_end_offset

    def check(self, producer_id: int, producer_epoch: int, base_sequence: int,
              last_offset_delta: int, is_transactional: bool) -> CheckResult:
        """Whether one batch may follow the manager's state plus the batches committed here so far."""
        if producer_id == NO_PRODUCER_ID:
            return ACCEPTED
        last_seq = increment_sequence(base_sequence, last_offset_delta)
        committed = self._manager.entry(producer_id)
        if committed is not None:
            duplicate = committed.find_duplicate(producer_epoch, base_sequence, last_seq)
            if duplicate is not None:
                return CheckResult(Outcome.DUPLICATE_SEQUENCE_NUMBER, duplicate,
                                   f"duplicate of the batch at offset {duplicate.first_offset}")
        entry = self._updated.get(producer_id, committed)
        if entry is None:
            return ACCEPTED  # no state: any sequence is accepted
        if producer_epoch < entry.producer_epoch:
            return CheckResult(Outcome.INVALID_PRODUCER_EPOCH, None,
                               f"producer epoch {producer_epoch} is smaller than the last seen "
                               f"epoch {entry.producer_epoch}")
        if producer_epoch != entry.producer_epoch:
            if base_sequence != 0 and entry.producer_epoch != NO_PRODUCER_EPOCH:
                return CheckResult(Outcome.OUT_OF_ORDER_SEQUENCE_NUMBER, None,
                                   f"invalid sequence number {base_sequence} for new producer "
                                   f"epoch {producer_epoch}")
        elif entry.batches and not in_sequence(entry.last_seq, base_sequence):
            return CheckResult(Outcome.OUT_OF_ORDER_SEQUENCE_NUMBER, None,
                               f"out of order sequence number {base_sequence}, expected "
                               f"{increment_sequence(entry.last_seq, 1)}")
        elif not entry.batches and base_sequence != 0 and entry.producer_epoch != NO_PRODUCER_EPOCH:
            return CheckResult(Outcome.OUT_OF_ORDER_SEQUENCE_NUMBER, None,
                               f"out of order sequence number {base_sequence}, expected 0")
        if entry.current_txn_first_offset is not None and not is_transactional:
            return CheckResult(Outcome.INVALID_TXN_STATE, None,
                               "non-transactional batch while a transaction is open")
        return ACCEPTED

    def commit(self, producer_id: int, producer_epoch: int, base_sequence: int,
               last_offset_delta: int, base_offset: int, max_timestamp: int,
               is_transactional: bool = False) -> None:
        """Add an appended batch to the pending changes; raises ProducerStateError unless it checks."""
        result = self.check(producer_id, producer_epoch, base_sequence, last_offset_delta,
                            is_transactional)
        if not result.accepted:
            raise ProducerStateError(f"producer {producer_id}: {result.outcome.name}: {result.message}")
        if producer_id != NO_PRODUCER_ID:
            _apply_data_batch(self._pending(producer_id), producer_epoch, base_sequence,
                              last_offset_delta, base_offset, max_timestamp, is_transactional)
        self._map_end_offset = max(self._map_end_offset, base_offset + last_offset_delta + 1)

    def commit_end_txn(self, producer_id: int, producer_epoch: int, offset: int,
                       timestamp: int, coordinator_epoch: int = -1) -> int | None:
        """Add an appended transaction marker; returns the first offset of the transaction it ends.

        Raises ProducerStateError for a marker whose epoch is older than the producer's.
        """
        entry = self._pending(producer_id)
        if producer_epoch < entry.producer_epoch:
            raise ProducerStateError(f"producer {producer_id}: marker epoch {producer_epoch} is "
                                     f"smaller than the last seen epoch {entry.producer_epoch}")
        first_offset = entry.current_txn_first_offset
        _apply_end_txn(entry, producer_epoch, timestamp, coordinator_epoch)
        self._map_end_offset = max(self._map_end_offset, offset + 1)
        return first_offset

    def apply(self) -> None:
        """Make the pending changes the manager's state."""
        if self._updated:                   # none for batches without a producer id
            self._manager._producers.update(self._updated)
            for entry in self._updated.values():
                self._manager._track(entry)
            self._updated = {}              # a later change here copies the manager's entry first (_pending)
        self._manager.map_end_offset = self._map_end_offset

    def _pending(self, producer_id: int) -> ProducerEntry:
        entry = self._updated.get(producer_id)
        if entry is None:
            committed = self._manager.entry(producer_id)
            entry = committed.copy() if committed is not None else ProducerEntry(producer_id)
            self._updated[producer_id] = entry
        return entry


def _apply_data_batch(entry: ProducerEntry, producer_epoch: int, base_sequence: int,
                      last_offset_delta: int, base_offset: int, max_timestamp: int,
                      is_transactional: bool) -> None:
    entry._add_batch(producer_epoch, BatchMetadata(
        base_sequence, increment_sequence(base_sequence, last_offset_delta),
        base_offset, base_offset + last_offset_delta, max_timestamp))
    if is_transactional and entry.current_txn_first_offset is None:
        entry.current_txn_first_offset = base_offset


def _apply_end_txn(entry: ProducerEntry, producer_epoch: int, timestamp: int, coordinator_epoch: int = -1) -> None:
    entry._update_epoch(producer_epoch)
    entry.current_txn_first_offset = None
    entry.last_timestamp = timestamp
    entry.coordinator_epoch = max(entry.coordinator_epoch, coordinator_epoch)


def _parse_snapshot(data: bytes) -> tuple[dict[int, ProducerEntry], int]:
    try:
        doc = json.loads(data)
        if doc["version"] != SNAPSHOT_VERSION:
            raise ProducerStateError(f"unsupported snapshot version {doc['version']!r}")
        offset = _int(doc["offset"])
        producers: dict[int, ProducerEntry] = {}
        for p in doc["producers"]:
            txn = p["txn_first_offset"]
            entry = ProducerEntry(_int(p["id"]), _int(p["epoch"]), [],
                                  _int(p["last_timestamp"]), None if txn is None else _int(txn),
                                  _int(p.get("coordinator_epoch", -1)))
            for b in p["batches"][-BATCHES_TO_RETAIN:]:
                entry.batches.append(BatchMetadata(*(_int(v) for v in b)))
            producers[entry.producer_id] = entry
    except ProducerStateError:
        raise
    except (ValueError, KeyError, TypeError) as exc:
        raise ProducerStateError(f"malformed producer state snapshot: {exc!r}") from exc
    return producers, offset


def _int(value: object) -> int:
    if type(value) is not int:
        raise TypeError(f"expected an integer, got {value!r}")
    return value
