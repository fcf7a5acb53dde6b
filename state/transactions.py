"""The transaction coordinator as a pure state machine: each operation returns the ``__transaction_state`` records to append and its answer.

It follows Kafka's TransactionCoordinator (KIP-98, KIP-360, KIP-890).  A transactional id's durable
state (:class:`~trireme.state.txn_records.TxnLogValue`) changes only when a record is replayed
(:meth:`TransactionCoordinator.replay`), after the runtime has made it durable.  Between an
operation and the replay of its record the id has a *pending* transition (in memory only), and
every other request for it is answered CONCURRENT_TRANSACTIONS, as Kafka's ``pendingState`` does —
except after a COMPLETE record: markers are durable by then, so the next operation may build on the
pending COMPLETE value; its own record follows in the log, and its answer waits for that record, so
both are made durable (in log order) by one fsync.

States and transitions (Kafka's)::

    Empty ──AddPartitions──▶ Ongoing ──EndTxn(commit)──▶ PrepareCommit ──markers──▶ CompleteCommit
      ▲                         │    ──EndTxn(abort) ──▶ PrepareAbort  ──markers──▶ CompleteAbort
      └──InitProducerId─────────┘    ──fence/timeout──▶ (PrepareEpochFence) ─▶ PrepareAbort

The PREPARE record is the commit point: once it is durable the client is answered and the
markers (:class:`MarkerJob`) are written to every partition of the transaction; then a COMPLETE
record ends it.  PrepareEpochFence is the pending state of a fence (InitProducerId or a timeout
aborting an open transaction with a bumped epoch); it is never written.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable, Iterable

import trireme.wire.error_codes as E
from trireme.state.coordinator_status import CoordinatorStatus
from trireme.state.effects import Effects
from trireme.state.txn_records import (TxnLogValue, TxnRecordError, TxnState, decode_txn_key, decode_txn_value,
                                       txn_record, txn_tombstone, value_version_for)

NONE = 0
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
MAX_PRODUCER_EPOCH = 32767
# The coordinator epoch markers carry: this node has always led the one __transaction_state partition.
COORDINATOR_EPOCH = 0

EMPTY, ONGOING = TxnState.EMPTY, TxnState.ONGOING
PREPARE_COMMIT, PREPARE_ABORT = TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT
COMPLETE_COMMIT, COMPLETE_ABORT = TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT
DEAD, PREPARE_EPOCH_FENCE = TxnState.DEAD, TxnState.PREPARE_EPOCH_FENCE

# Kafka's TransactionState.validPreviousStates.
VALID_PREVIOUS: dict[TxnState, frozenset[TxnState]] = {
    EMPTY: frozenset({EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT}),
    ONGOING: frozenset({ONGOING, EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT}),
    PREPARE_COMMIT: frozenset({ONGOING}),
    # Transactions V2 may abort with no transaction open (EndTxn v5 abort in Empty or Complete*).
    PREPARE_ABORT: frozenset({ONGOING, PREPARE_EPOCH_FENCE, EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT}),
    COMPLETE_COMMIT: frozenset({PREPARE_COMMIT}),
    COMPLETE_ABORT: frozenset({PREPARE_ABORT}),
    DEAD: frozenset({EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT}),
    PREPARE_EPOCH_FENCE: frozenset({ONGOING}),
}


class IllegalTransition(Exception):
    """A transition Kafka's state machine does not allow (a bug in the caller, never a client's doing)."""


@dataclass(frozen=True)
class TxnConfig:
    max_timeout_ms: int = 900_000                       # transaction.max.timeout.ms
    id_expiration_ms: int = 604_800_000                 # transactional.id.expiration.ms
    transaction_version: int = 0                        # finalized transaction.version level at start-up
    two_phase_commit_enable: bool = False               # transaction.two.phase.commit.enable (KIP-939)


@dataclass
class TxnMetadata:
    """A transactional id's state: the last durable value plus what only lives in memory."""

    transactional_id: str
    value: TxnLogValue
    last_producer_epoch: int = NO_PRODUCER_EPOCH        # the epoch before a KIP-360 bump (-1 after any other)
    last_producer_id: int = NO_PRODUCER_ID              # the producer id before the last rotation

    @property
    def state(self) -> TxnState:
        return self.value.state

    @property
    def producer_id(self) -> int:
        return self.value.producer_id

    @property
    def producer_epoch(self) -> int:
        return self.value.producer_epoch

    @property
    def client_identity(self) -> tuple[int, int]:
        """The producer id and epoch the client uses: the transaction's own, unless a 2PC InitProducerId kept a
        prepared transaction (KIP-939), which gives the client the next pair and keeps the transaction's for its
        markers."""
        v = self.value
        if v.next_producer_epoch != NO_PRODUCER_EPOCH:
            return v.next_producer_id, v.next_producer_epoch
        return v.producer_id, v.producer_epoch


@dataclass(frozen=True)
class MarkerJob:
    """Markers to write once a PREPARE record is durable: one per partition of the transaction."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool
    partitions: tuple[tuple[str, int], ...]
    coordinator_epoch: int = COORDINATOR_EPOCH
    transaction_version: int = 0


@dataclass(frozen=True)
class ProducerTransaction:
    """What the coordinator holds for one producer id, read to check a marker for it that it did not send itself.

    ``prepared``: (commit, producer epoch) of its durable PrepareCommit/PrepareAbort, or None;
    ``open_partitions``: the partitions of its open transaction (Ongoing or Prepare*), adds still being written
    included (a partition's produce may already rely on one); ``max_epoch``: the highest epoch the coordinator has
    given this producer id.
    """

    transactional_id: str
    prepared: tuple[bool, int] | None
    open_partitions: frozenset[tuple[str, int]]
    max_epoch: int

    def check_marker(self, producer_epoch: int, commit: bool, coordinator_epoch: int,
                     partition: tuple[str, int]) -> tuple[int, str]:
        """Whether a COMMIT/ABORT marker for this producer id may be written to ``partition`` → (error code,
        message); (0, "") to write it.

        On a partition of the open transaction only the coordinator's own marker: its prepared result, epoch and
        coordinator epoch (a marker while the transaction is Ongoing would end it behind the coordinator's back).
        Elsewhere, the partition's open transaction of this producer id (if any) is not the coordinator's (a
        hanging transaction, KIP-664): an ABORT at an epoch the coordinator gave the producer, with a coordinator
        epoch not above the coordinator's, may end it (higher ones would fence the producer, or the coordinator's
        own markers, on that partition); a COMMIT would publish records the coordinator never committed.
        """
        tid = self.transactional_id
        if partition in self.open_partitions:
            if self.prepared is None:
                return E.INVALID_TXN_STATE.code, f"the transaction of {tid!r} on this partition is not prepared"
            prepared_commit, prepared_epoch = self.prepared
            if commit != prepared_commit:
                return (E.INVALID_TXN_STATE.code, f"the transaction of {tid!r} is prepared to "
                        f"{'commit' if prepared_commit else 'abort'}")
            if producer_epoch != prepared_epoch:
                return (E.INVALID_PRODUCER_EPOCH.code,
                        f"the transaction of {tid!r} was prepared at epoch {prepared_epoch}, not {producer_epoch}")
            if coordinator_epoch != COORDINATOR_EPOCH:
                return (E.TRANSACTION_COORDINATOR_FENCED.code,
                        f"coordinator epoch {coordinator_epoch} is not the coordinator's {COORDINATOR_EPOCH}")
            return NONE, ""
        if commit:
            return E.INVALID_TXN_STATE.code, f"{tid!r} has no transaction on this partition to commit"
        if producer_epoch > self.max_epoch:
            return (E.INVALID_PRODUCER_EPOCH.code,
                    f"epoch {producer_epoch} is above the epoch {self.max_epoch} the coordinator gave {tid!r}")
        if coordinator_epoch > COORDINATOR_EPOCH:        # it would fence the coordinator's later markers there
            return (E.TRANSACTION_COORDINATOR_FENCED.code,
                    f"coordinator epoch {coordinator_epoch} is above the coordinator's {COORDINATOR_EPOCH}")
        return NONE, ""


@dataclass
class TxnOutcome:
    """An operation's answer: an error, or records to make durable (then the answer holds) and markers to write."""

    error: int = NONE
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    effects: Effects = field(default_factory=Effects)
    markers: MarkerJob | None = None
    transactional_id: str | None = None                 # whose pending transition the records carry
    ongoing_producer_id: int = NO_PRODUCER_ID           # KIP-939: the kept transaction's id and epoch
    ongoing_producer_epoch: int = NO_PRODUCER_EPOCH
    partition_errors: dict[tuple[str, int], int] = field(default_factory=dict)

    @property
    def records(self) -> list:
        return self.effects.records


def _error(code: int) -> TxnOutcome:
    return TxnOutcome(error=code)


class TransactionCoordinator(CoordinatorStatus):
    def __init__(self, config: TxnConfig | None = None) -> None:
        self.config = config or TxnConfig()
        self.transaction_version = self.config.transaction_version   # the finalized level; UpdateFeatures sets it
        self.transactions: dict[str, TxnMetadata] = {}
        # id → (the record's value bytes, the value meant) being written; (None, None) for a tombstone
        self.pending: dict[str, tuple[bytes | None, TxnLogValue | None]] = {}
        CoordinatorStatus.__init__(self)    # loading; unavailable: this broker does not lead its partition
        self._next_last: dict[str, tuple[int, int]] = {}   # id → (last epoch, last id) its pending bump leaves
        self.timed_out = 0                              # transactions aborted at their timeout (metrics)
        self.fenced = 0                                 # open transactions fenced by InitProducerId

    # --- replay ----------------------------------------------------------------------------------

    def replay(self, key: bytes, value: bytes | None, *, producer_id: int = -1, transactional: bool = False) -> None:
        """Apply one durable ``__transaction_state`` record (at start-up, or once an operation's record is durable)."""
        try:
            transactional_id = decode_txn_key(key)
            decoded = decode_txn_value(value)
        except TxnRecordError:
            return                                      # not ours to read: skipped, as Kafka skips unknown keys
        if transactional_id in self.pending and self.pending[transactional_id][0] == (
                None if value is None else bytes(value)):
            del self.pending[transactional_id]      # the last transition written for it is now durable
        if decoded is None:
            self.transactions.pop(transactional_id, None)
            return
        existing = self.transactions.get(transactional_id)
        if existing is not None and (existing.producer_id, existing.producer_epoch) == \
                (decoded.producer_id, decoded.producer_epoch):
            last = (existing.last_producer_epoch, existing.last_producer_id)
        else:
            # A new producer id or epoch: what came before it, as the operation that wrote it said (in memory
            # only, like Kafka's lastProducerEpoch); after a restart, the stored previous producer id.
            last = self._next_last.pop(transactional_id, (NO_PRODUCER_EPOCH, decoded.previous_producer_id))
        self.transactions[transactional_id] = TxnMetadata(transactional_id, decoded, *last)

    def replay_end_txn(self, producer_id: int, commit: bool) -> None:
        """Markers never land in ``__transaction_state``."""

    def abandon(self, transactional_id: str) -> None:
        """An operation's records could not be made durable: its pending transition is dropped."""
        self.pending.pop(transactional_id, None)
        self._next_last.pop(transactional_id, None)

    def loaded(self) -> list[MarkerJob]:
        """End loading; → the markers of transactions a crash left prepared, to be written again."""
        self.loading = False
        return self.prepared()

    def prepared(self) -> list[MarkerJob]:
        """The markers of every durable PrepareCommit/PrepareAbort transaction."""
        return [self._marker_job(m, m.state is PREPARE_COMMIT) for m in self.transactions.values()
                if m.state in (PREPARE_COMMIT, PREPARE_ABORT)]

    def compact_records(self) -> list:
        """The latest value of every transactional id (what a compacted log keeps)."""
        return [txn_record(m.transactional_id, m.value, version=self._value_version) for m in self.transactions.values()]

    # --- InitProducerId --------------------------------------------------------------------------

    def init_producer_id(self, transactional_id: str, timeout_ms: int, now_ms: int,
                         allocate_producer_id: Callable[[], int], *,
                         expected_producer_id: int = NO_PRODUCER_ID,
                         expected_producer_epoch: int = NO_PRODUCER_EPOCH,
                         enable_2pc: bool = False, keep_prepared_txn: bool = False) -> TxnOutcome:
        """InitProducerId with a transactional id: a producer id and a bumped epoch; fences an open transaction."""
        if not transactional_id:
            return _error(E.INVALID_REQUEST.code)
        if enable_2pc and not self.config.two_phase_commit_enable:
            return _error(E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED.code)
        if keep_prepared_txn and not enable_2pc:
            return _error(E.INVALID_REQUEST.code)
        if not enable_2pc and not 0 < timeout_ms <= self.config.max_timeout_ms:
            return _error(E.INVALID_TRANSACTION_TIMEOUT.code)
        if self.serving_error:
            return _error(self.serving_error)
        meta, busy = self._current(transactional_id)
        if busy:
            return _error(E.CONCURRENT_TRANSACTIONS.code)
        if meta is None:
            producer_id = allocate_producer_id()
            value = TxnLogValue(producer_id=producer_id, producer_epoch=0,
                                transaction_timeout_ms=0 if enable_2pc else timeout_ms,
                                state=EMPTY, last_update_timestamp_ms=now_ms, start_timestamp_ms=-1,
                                client_transaction_version=self.transaction_version)
            return self._transition(transactional_id, None, value, producer_id, 0)
        expected = expected_producer_id != NO_PRODUCER_ID
        if expected and not self._is_valid_retry_or_current(meta, expected_producer_id, expected_producer_epoch):
            return _error(E.PRODUCER_FENCED.code)
        if meta.state is ONGOING:               # (a prepared one is in flight: answered CONCURRENT_TRANSACTIONS above)
            if keep_prepared_txn:
                return self._keep_prepared(meta, now_ms, allocate_producer_id)
            # Fence the open transaction: bump the epoch and abort it with the new one; the caller retries.
            outcome = self._fence_and_abort(meta, now_ms)
            self.fenced += 1
            outcome.error = E.CONCURRENT_TRANSACTIONS.code if outcome.error == NONE else outcome.error
            return outcome
        if meta.state not in (EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT):
            return _error(E.CONCURRENT_TRANSACTIONS.code)
        if expected and expected_producer_epoch != NO_PRODUCER_EPOCH \
                and expected_producer_epoch == meta.last_producer_epoch \
                and expected_producer_id in (meta.producer_id, meta.last_producer_id):
            # A retry of an InitProducerId whose bump already happened: the same answer again.
            return TxnOutcome(producer_id=meta.producer_id, producer_epoch=meta.producer_epoch)
        producer_id, epoch, previous = meta.producer_id, meta.producer_epoch + 1, NO_PRODUCER_ID
        # KIP-360: only a bump the current producer asked for leaves an epoch it may retry with.
        last_epoch = meta.producer_epoch if expected else NO_PRODUCER_EPOCH
        last_id = meta.last_producer_id
        if epoch >= MAX_PRODUCER_EPOCH:
            producer_id, epoch, previous = allocate_producer_id(), 0, meta.producer_id
            last_id = meta.producer_id
        self._next_last[transactional_id] = (last_epoch, last_id)
        value = dataclasses.replace(
            meta.value, producer_id=producer_id, producer_epoch=epoch, previous_producer_id=previous,
            next_producer_id=NO_PRODUCER_ID, next_producer_epoch=NO_PRODUCER_EPOCH,
            transaction_timeout_ms=0 if enable_2pc else timeout_ms, state=EMPTY, partitions=(),
            last_update_timestamp_ms=now_ms, start_timestamp_ms=-1,
            client_transaction_version=self.transaction_version)
        return self._transition(transactional_id, meta.state, value, producer_id, epoch)

    def _keep_prepared(self, meta: TxnMetadata, now_ms: int, allocate_producer_id) -> TxnOutcome:
        """KIP-939: a restarted 2PC producer keeps its prepared (Ongoing) transaction for the external coordinator
        to complete.  The transaction keeps its producer id and epoch (its markers need them); the client gets the
        next pair, which fences the producer instance before it."""
        client_id, client_epoch = meta.client_identity
        if client_epoch + 1 >= MAX_PRODUCER_EPOCH:
            client_id, client_epoch = allocate_producer_id(), -1
        value = dataclasses.replace(meta.value, next_producer_id=client_id, next_producer_epoch=client_epoch + 1,
                                    last_update_timestamp_ms=now_ms)
        self._next_last[meta.transactional_id] = (meta.last_producer_epoch, meta.last_producer_id)
        outcome = self._transition(meta.transactional_id, ONGOING, value, client_id, client_epoch + 1)
        outcome.ongoing_producer_id, outcome.ongoing_producer_epoch = meta.producer_id, meta.producer_epoch
        return outcome

    @staticmethod
    def _is_valid_retry_or_current(meta: TxnMetadata, producer_id: int, epoch: int) -> bool:
        """KIP-360: the request names this id's current producer (its epoch, or the one before its own bump), or
        is the retry of a bump that rotated the producer id because the epoch was exhausted."""
        if producer_id == meta.producer_id:
            return epoch in (meta.producer_epoch, meta.last_producer_epoch)
        return producer_id == meta.last_producer_id and epoch >= MAX_PRODUCER_EPOCH - 1 \
            and epoch == meta.last_producer_epoch

    # --- AddPartitionsToTxn / AddOffsetsToTxn ----------------------------------------------------

    def add_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                       partitions: Iterable[tuple[str, int]], now_ms: int, *, implicit: bool = False) -> TxnOutcome:
        """Add partitions to the producer's transaction, starting it if none is open.  ``implicit``: added by a
        Produce v12+ or TxnOffsetCommit v5+ of a transactions V2 client, which the transaction then records."""
        partitions = tuple(partitions)
        if not transactional_id:
            return self._all_failed(partitions, E.INVALID_REQUEST.code)
        meta, error = self._check_producer(transactional_id, producer_id, producer_epoch, busy_first=True)
        if error:
            return self._all_failed(partitions, error)
        if meta.state not in (EMPTY, ONGOING, COMPLETE_COMMIT, COMPLETE_ABORT):
            return self._all_failed(partitions, E.INVALID_TXN_STATE.code)
        current = set(meta.value.partitions) if meta.state is ONGOING else set()
        outcome_ok = TxnOutcome(producer_id=meta.producer_id, producer_epoch=meta.producer_epoch,
                                partition_errors={tp: NONE for tp in partitions})
        if meta.state is ONGOING and current.issuperset(partitions):
            return outcome_ok
        value = dataclasses.replace(
            meta.value, state=ONGOING, partitions=tuple(current | set(partitions)), last_update_timestamp_ms=now_ms,
            start_timestamp_ms=meta.value.start_timestamp_ms if meta.state is ONGOING else now_ms,
            client_transaction_version=2 if implicit else self._classic_version)
        outcome = self._transition(transactional_id, meta.state, value, meta.producer_id, meta.producer_epoch)
        outcome.partition_errors = outcome_ok.partition_errors
        return outcome

    def verify_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                          partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """KIP-890 part 1: whether each partition is in the producer's ongoing transaction (nothing changes)."""
        partitions = tuple(partitions)
        # A partition whose add is staged counts: AddPartitionsToTxn is answered once its record is staged.
        meta, error = self._check_producer(transactional_id, producer_id, producer_epoch, staged=True)
        if error:
            return {tp: error for tp in partitions}
        if meta.state is not ONGOING:           # (a prepared one is in flight: CONCURRENT_TRANSACTIONS above)
            return {tp: E.INVALID_TXN_STATE.code for tp in partitions}
        current = set(meta.value.partitions)
        return {tp: NONE if tp in current else E.INVALID_TXN_STATE.code for tp in partitions}

    def _check_producer(self, transactional_id: str, producer_id: int, producer_epoch: int, *,
                        staged: bool = False, busy_first: bool = False) -> tuple[TxnMetadata | None, int]:
        """The producer checks of AddPartitionsToTxn (``busy_first``: a transition in flight answers before the
        producer id and epoch, as Kafka 4.x's handleAddPartitionsToTransaction does) and of the verification
        (Kafka's handleVerifyPartitionsInTransaction: producer id, epoch, then whether it is busy)."""
        if self.serving_error:
            return None, self.serving_error
        meta, busy = self._current(transactional_id, staged=staged)
        if busy and busy_first:
            return None, E.CONCURRENT_TRANSACTIONS.code
        if meta is None or meta.client_identity[0] != producer_id:
            return None, E.INVALID_PRODUCER_ID_MAPPING.code
        if producer_epoch != meta.client_identity[1]:
            return None, E.PRODUCER_FENCED.code
        if busy:
            return None, E.CONCURRENT_TRANSACTIONS.code
        return meta, NONE

    @staticmethod
    def _all_failed(partitions, error: int) -> TxnOutcome:
        return TxnOutcome(error=error, partition_errors={tp: error for tp in partitions})

    # --- EndTxn ----------------------------------------------------------------------------------
    #
    # Kafka 4.x's order of checks (TransactionCoordinator.handleEndTransaction / handleAddPartitionsToTransaction);
    # the first that matches answers.  "In flight" is Kafka's pendingTransitionInProgress (see _current): a record
    # being written, or the markers of a prepared transaction.  The server waits out CONCURRENT_TRANSACTIONS (up to
    # 5 s, TransactionService._when_settled) and tries again, so the client gets what Kafka answers its retry.
    #
    #  AddPartitionsToTxn (v0-3, the coordinator form v4+, and the implicit add of Produce v12 / TxnOffsetCommit v5)
    #   1 empty transactional id → INVALID_REQUEST; 2 loading → COORDINATOR_LOAD_IN_PROGRESS; 3 in flight →
    #   CONCURRENT_TRANSACTIONS (KAFKA-18660: before the producer id, which an exhausted epoch may be changing);
    #   4 unknown id / another producer id → INVALID_PRODUCER_ID_MAPPING; 5 another epoch → PRODUCER_FENCED;
    #   6 PrepareX → CONCURRENT_TRANSACTIONS (only while in flight: answered at 3); 7 Ongoing with every partition
    #   in it → NONE, nothing written; 8 else → Ongoing with them added.
    #  EndTxn v0-4 (classic)
    #   1 empty id → INVALID_REQUEST; 2 loading; 3 unknown id / another producer id → INVALID_PRODUCER_ID_MAPPING;
    #   4 another epoch → PRODUCER_FENCED; 5 in flight → CONCURRENT_TRANSACTIONS; 6 by state:
    #     Ongoing → Prepare<result>; CompleteCommit: commit NONE, abort INVALID_TXN_STATE; CompleteAbort: abort
    #     NONE, commit INVALID_TXN_STATE; PrepareX (only while in flight: answered at 5); Empty → INVALID_TXN_STATE
    #  EndTxn v5 (transactions V2)
    #   1 empty id; 2 loading; 3 in flight → CONCURRENT_TRANSACTIONS (KAFKA-18464: before the epoch, so an EndTxn
    #     right after the previous one returned — its markers still going out, the epoch already bumped — waits
    #     instead of being fenced; KAFKA-18660: before the producer id); 4 unknown id, or another producer id that
    #     is not retryOnOverflow → INVALID_PRODUCER_ID_MAPPING; 5 an epoch not valid for the state → PRODUCER_FENCED
    #     (Ongoing/Empty: the current epoch; Complete*: the current one, retryOnEpochBump (the epoch before the
    #     bump) or retryOnOverflow (the old producer id at the last epoch, the new id at epoch 0)); 6 by state:
    #                       abort: retry  current   commit: retry  current
    #       Empty                  (5)    bump             (5)     INVALID_TXN_STATE
    #       CompleteAbort          NONE   bump             ITS     ITS
    #       CompleteCommit         ITS    bump             NONE    ITS
    #     Ongoing → Prepare<result> with the epoch bumped (a new producer id at the last epoch).

    def end_txn(self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool,
                now_ms: int, *, epoch_bump: bool = False,
                allocate_producer_id: Callable[[], int] | None = None) -> TxnOutcome:
        """EndTxn: PREPARE_COMMIT/PREPARE_ABORT (the commit point) and the markers to write after it.

        ``epoch_bump``: EndTxn v5+ (transactions V2), where ending a transaction bumps the producer epoch
        (a new producer id from ``allocate_producer_id`` when it is exhausted) and the answer names it."""
        if not transactional_id:
            return _error(E.INVALID_REQUEST.code)
        if self.serving_error:
            return _error(self.serving_error)
        meta, busy = self._current(transactional_id)
        # A prepared 2PC transaction kept for its external coordinator (KIP-939) ends as a classic one.
        kept_2pc = meta is not None and meta.state is ONGOING and meta.value.next_producer_epoch != NO_PRODUCER_EPOCH
        if epoch_bump and not kept_2pc:
            if busy:
                return _error(E.CONCURRENT_TRANSACTIONS.code)
            if meta is None:
                return _error(E.INVALID_PRODUCER_ID_MAPPING.code)
            return self._end_txn_v2(meta, producer_id, producer_epoch, commit, now_ms, allocate_producer_id)
        if meta is None or meta.client_identity[0] != producer_id:
            return _error(E.INVALID_PRODUCER_ID_MAPPING.code)
        if producer_epoch != meta.client_identity[1]:
            return _error(E.PRODUCER_FENCED.code)
        if busy:
            return _error(E.CONCURRENT_TRANSACTIONS.code)
        state = meta.state
        if state is ONGOING:
            value = dataclasses.replace(meta.value, state=PREPARE_COMMIT if commit else PREPARE_ABORT,
                                        last_update_timestamp_ms=now_ms,
                                        client_transaction_version=self._classic_version)
            outcome = self._transition(transactional_id, state, value, meta.producer_id, meta.producer_epoch)
            outcome.markers = self._marker_job(TxnMetadata(transactional_id, value), commit)
            return outcome
        if state is COMPLETE_COMMIT:
            return TxnOutcome(producer_id=producer_id, producer_epoch=producer_epoch) if commit \
                else _error(E.INVALID_TXN_STATE.code)
        if state is COMPLETE_ABORT:
            return _error(E.INVALID_TXN_STATE.code) if commit \
                else TxnOutcome(producer_id=producer_id, producer_epoch=producer_epoch)
        return _error(E.INVALID_TXN_STATE.code)         # Empty (nothing to end), Dead

    def _end_txn_v2(self, meta: TxnMetadata, producer_id: int, producer_epoch: int, commit: bool,
                    now_ms: int, allocate_producer_id) -> TxnOutcome:
        """Kafka's EndTxn for transactions V2, from its step 4 (nothing in flight): the PREPARE record carries the
        bumped epoch, so a retry names the epoch before it (``retry_on_bump``), or after an exhausted epoch the
        previous producer id at the last epoch (``retry_on_overflow``); the same epoch as the state's means the
        next transaction's EndTxn."""
        v = meta.value
        retry_on_overflow = v.previous_producer_id == producer_id and producer_epoch == MAX_PRODUCER_EPOCH - 1 \
            and v.producer_epoch == 0
        retry_on_bump = v.producer_epoch == producer_epoch + 1
        if v.producer_id != producer_id and not retry_on_overflow:
            return _error(E.INVALID_PRODUCER_ID_MAPPING.code)
        state = meta.state
        if state in (COMPLETE_COMMIT, COMPLETE_ABORT):
            valid = retry_on_bump or retry_on_overflow or producer_epoch == v.producer_epoch
        else:
            valid = producer_epoch == v.producer_epoch
        if not valid:
            return _error(E.PRODUCER_FENCED.code)
        is_retry = retry_on_bump or retry_on_overflow
        done = TxnOutcome(producer_id=v.producer_id, producer_epoch=v.producer_epoch)
        if state is ONGOING:
            return self._prepare_v2(meta, commit, now_ms, allocate_producer_id)
        if state is COMPLETE_COMMIT:
            if commit:
                return done if is_retry else _error(E.INVALID_TXN_STATE.code)
            return _error(E.INVALID_TXN_STATE.code) if is_retry else self._prepare_v2(meta, False, now_ms,
                                                                                    allocate_producer_id)
        if state is COMPLETE_ABORT:
            if commit:
                return _error(E.INVALID_TXN_STATE.code)
            return done if is_retry else self._prepare_v2(meta, False, now_ms, allocate_producer_id)
        if state is EMPTY and not commit:
            return self._prepare_v2(meta, False, now_ms, allocate_producer_id)
        return _error(E.INVALID_TXN_STATE.code)         # commit in Empty; PrepareX only while in flight

    def _prepare_v2(self, meta: TxnMetadata, commit: bool, now_ms: int, allocate_producer_id) -> TxnOutcome:
        """PREPARE with the epoch bumped; an abort with no transaction open (Empty, Complete*) has no partitions.
        At the last epoch the markers take it and the client gets a new producer id at epoch 0 (kept as the next
        producer id/epoch until the COMPLETE record makes it the transactional id's)."""
        v = meta.value
        open_txn = meta.state is ONGOING
        next_id, next_epoch = NO_PRODUCER_ID, NO_PRODUCER_EPOCH
        if v.producer_epoch >= MAX_PRODUCER_EPOCH - 1:
            if allocate_producer_id is None:
                raise ValueError("an exhausted epoch needs a producer id allocator")
            next_id, next_epoch = allocate_producer_id(), 0
        value = dataclasses.replace(
            v, producer_epoch=v.producer_epoch + 1, next_producer_id=next_id, next_producer_epoch=next_epoch,
            state=PREPARE_COMMIT if commit else PREPARE_ABORT, partitions=v.partitions if open_txn else (),
            last_update_timestamp_ms=now_ms, start_timestamp_ms=v.start_timestamp_ms if open_txn else now_ms,
            client_transaction_version=2)
        self._next_last[meta.transactional_id] = (v.producer_epoch, meta.last_producer_id)
        prepared = TxnMetadata(meta.transactional_id, value)
        outcome = self._transition(meta.transactional_id, meta.state, value, *prepared.client_identity)
        outcome.markers = self._marker_job(prepared, commit)
        return outcome

    def markers_written(self, transactional_id: str, producer_id: int, producer_epoch: int,
                        now_ms: int) -> TxnOutcome:
        """Every marker of a prepared transaction is written: the COMPLETE record ends it."""
        meta = self.transactions.get(transactional_id)
        if meta is None or meta.producer_id != producer_id or meta.producer_epoch != producer_epoch \
                or meta.state not in (PREPARE_COMMIT, PREPARE_ABORT) or transactional_id in self.pending:
            return _error(E.INVALID_TXN_STATE.code)   # already completed (a resumed job raced a live one)
        # A kept 2PC transaction, or a V2 one whose epoch ran out, hands over to its client's id and epoch.
        client_id, client_epoch = meta.client_identity
        rotated = client_id != meta.producer_id
        if rotated:
            self._next_last[transactional_id] = (meta.last_producer_epoch, meta.producer_id)
        value = dataclasses.replace(meta.value, state=COMPLETE_COMMIT if meta.state is PREPARE_COMMIT else COMPLETE_ABORT,
                                    partitions=(), last_update_timestamp_ms=now_ms, producer_id=client_id,
                                    producer_epoch=client_epoch, next_producer_id=NO_PRODUCER_ID,
                                    next_producer_epoch=NO_PRODUCER_EPOCH,
                                    previous_producer_id=meta.producer_id if rotated else meta.value.previous_producer_id)
        return self._transition(transactional_id, meta.state, value, client_id, client_epoch)

    # --- timeouts and expiry ---------------------------------------------------------------------

    def abort_timed_out(self, now_ms: int) -> list[TxnOutcome]:
        """Abort every open transaction older than its own timeout, fencing its producer (epoch bump)."""
        outcomes = []
        for meta in list(self.transactions.values()):
            if meta.state is ONGOING and meta.transactional_id not in self.pending \
                    and meta.value.transaction_timeout_ms > 0 \
                    and now_ms - meta.value.start_timestamp_ms > meta.value.transaction_timeout_ms:
                outcome = self._fence_and_abort(meta, now_ms)
                if outcome.error == NONE:
                    self.timed_out += 1
                    outcomes.append(outcome)
        return outcomes

    def abort_ongoing(self, transactional_id: str, now_ms: int) -> TxnOutcome:
        """An operator's abort of an Ongoing transaction, done as its timeout would do it (fence, abort)."""
        meta, busy = self._current(transactional_id)
        if busy:
            return _error(E.CONCURRENT_TRANSACTIONS.code)
        if meta is None or meta.state is not ONGOING:
            return _error(E.INVALID_TXN_STATE.code)
        return self._fence_and_abort(meta, now_ms)

    def expire_transactional_ids(self, now_ms: int) -> list:
        """Tombstones for ids idle (no open transaction) for longer than transactional.id.expiration.ms."""
        records = []
        for meta in list(self.transactions.values()):
            if meta.state in (EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT) and meta.transactional_id not in self.pending \
                    and now_ms - meta.value.last_update_timestamp_ms >= self.config.id_expiration_ms:
                self.pending[meta.transactional_id] = (None, None)
                records.append(txn_tombstone(meta.transactional_id))
        return records

    def _fence_and_abort(self, meta: TxnMetadata, now_ms: int) -> TxnOutcome:
        """PrepareEpochFence then PrepareAbort: the bumped epoch aborts the open transaction."""
        # Under transactions V2 the PREPARE bumps the fenced epoch once more, as Kafka's does, so that the fenced
        # producer's EndTxn (epoch + 1 would look like its retry) is refused.
        bump = 2 if meta.value.client_transaction_version >= 2 else 1
        epoch = min(meta.producer_epoch + bump, MAX_PRODUCER_EPOCH)
        self._check_transition(meta.state, PREPARE_EPOCH_FENCE)
        value = dataclasses.replace(meta.value, producer_epoch=epoch, state=PREPARE_ABORT,
                                    last_update_timestamp_ms=now_ms)
        self._next_last[meta.transactional_id] = (NO_PRODUCER_EPOCH, meta.last_producer_id)   # fenced: no retry
        outcome = self._transition(meta.transactional_id, PREPARE_EPOCH_FENCE, value, meta.producer_id, epoch)
        outcome.markers = self._marker_job(TxnMetadata(meta.transactional_id, value), False)
        return outcome

    # --- recovery --------------------------------------------------------------------------------

    def orphaned(self, open_transactions: Iterable[tuple[tuple[str, int], int, int]]) -> list[MarkerJob]:
        """At start-up, for the transactions open in data partitions ((topic, partition), producer id, epoch): the
        ABORT markers of those whose AddPartitionsToTxn record a crash lost.

        AddPartitionsToTxn is answered once its record is staged, so a crash can keep a transaction's data (its
        produce was answered after its own fsync) but lose the record that added the partition: the coordinator
        then has the producer's id and epoch in a state without that partition (Empty, Complete*, or Ongoing
        with other partitions).  Its EndTxn can never reach the partition, so it is aborted here, as its
        producer's next request would have it (INVALID_TXN_STATE, abortable).  A producer the coordinator does
        not know at all is left alone: that is a hanging transaction in KIP-664's sense, for an operator.
        """
        by_producer = {m.producer_id: m for m in self.transactions.values()}
        jobs = []
        for tp, producer_id, producer_epoch in open_transactions:
            meta = by_producer.get(producer_id)
            if meta is None or meta.producer_epoch != producer_epoch or meta.state in (PREPARE_COMMIT, PREPARE_ABORT):
                continue
            if meta.state is ONGOING and tp in meta.value.partitions:
                continue
            jobs.append(MarkerJob(meta.transactional_id, producer_id, producer_epoch, False, (tp,)))
        return jobs

    # --- reading ---------------------------------------------------------------------------------

    def describe(self, transactional_id: str) -> TxnMetadata | None:
        return self.transactions.get(transactional_id)

    def producer_transactions(self, producer_ids: Iterable[int]) -> dict[int, ProducerTransaction]:
        """For each of ``producer_ids`` that a transactional id has (as its producer id, or the next one a KIP-939
        or exhausted-epoch transaction hands over to), durable or being written: what a marker for it is checked
        against.  One pass over the transactional ids."""
        wanted = set(producer_ids)
        found: dict[int, dict] = {}
        values = [(tid, m.value, True) for tid, m in self.transactions.items()]
        values += [(tid, value, False) for tid, (_, value) in self.pending.items() if value is not None]
        for tid, value, durable in values:
            for pid, epoch in ((value.producer_id, value.producer_epoch),
                               (value.next_producer_id, value.next_producer_epoch)):
                if pid not in wanted or pid == NO_PRODUCER_ID:
                    continue
                entry = found.setdefault(pid, {"tid": tid, "prepared": None, "open": set(), "max_epoch": epoch})
                entry["max_epoch"] = max(entry["max_epoch"], epoch)
                if pid != value.producer_id:
                    continue
                if value.state in (ONGOING, PREPARE_COMMIT, PREPARE_ABORT):
                    entry["open"].update(value.partitions)
                if durable and value.state in (PREPARE_COMMIT, PREPARE_ABORT):
                    entry["prepared"] = (value.state is PREPARE_COMMIT, value.producer_epoch)
        return {pid: ProducerTransaction(e["tid"], e["prepared"], frozenset(e["open"]), e["max_epoch"])
                for pid, e in found.items()}

    def list(self, states: Iterable[str] = (), producer_ids: Iterable[int] = (),
             duration_filter_ms: int = -1, now_ms: int = 0) -> list[TxnMetadata]:
        """ListTransactions with its filters (state names, producer ids, v1+ minimum age); the v2+ id pattern is
        matched by the handler, off the event loop."""
        states, producer_ids = set(states), set(producer_ids)
        out = []
        for meta in self.transactions.values():
            if meta.state is DEAD:                      # as Kafka: an id being expired is not listed
                continue
            if states and meta.state.kafka_name not in states:
                continue
            if producer_ids and meta.producer_id not in producer_ids:
                continue
            if duration_filter_ms >= 0 and now_ms - meta.value.start_timestamp_ms <= duration_filter_ms:
                continue                                # as Kafka: running for longer than that (-1: not started)
            out.append(meta)
        return out

    # --- helpers ---------------------------------------------------------------------------------

    def _current(self, transactional_id: str, *, staged: bool = False) -> tuple[TxnMetadata | None, bool]:
        """(the state an operation builds on, whether a transition still in flight forbids it: Kafka's
        ``pendingTransitionInProgress``).  In flight: a record being written, or the markers of a durable
        PrepareCommit/PrepareAbort being written (Kafka holds a pending CompleteCommit/CompleteAbort from the
        moment it answers EndTxn until the COMPLETE record is written).  ``staged``: a read-only check (produce
        verification) may also rely on a staged Ongoing value."""
        durable = self.transactions.get(transactional_id)
        if transactional_id not in self.pending:
            return durable, durable is not None and durable.state in (PREPARE_COMMIT, PREPARE_ABORT)
        value = self.pending[transactional_id][1]
        if value is not None and (value.state in (COMPLETE_COMMIT, COMPLETE_ABORT)
                                  or staged and value.state is ONGOING):
            last_epoch = durable.last_producer_epoch if durable is not None else NO_PRODUCER_EPOCH
            return TxnMetadata(transactional_id, value, last_epoch), False
        return durable, True

    @property
    def _classic_version(self) -> int:
        """The transaction version a classic (V1) request leaves on a transaction: markers of a V1 transaction
        keep the producer's epoch, so they must not be checked by V2's strictly-newer rule."""
        return min(self.transaction_version, 1)

    @property
    def _value_version(self) -> int:
        return value_version_for(self.transaction_version)

    @staticmethod
    def _check_transition(current: TxnState | None, target: TxnState) -> None:
        if current is not None and current not in VALID_PREVIOUS[target]:
            raise IllegalTransition(f"{current.kafka_name} → {target.kafka_name}")

    def _transition(self, transactional_id: str, current: TxnState | None, value: TxnLogValue,
                    producer_id: int, producer_epoch: int) -> TxnOutcome:
        """The record moving ``transactional_id`` to ``value``; the transition is pending until it is replayed."""
        self._check_transition(current, value.state)
        # The next producer id/epoch of a kept 2PC transaction are tagged fields: such a record is written at v1.
        version = max(self._value_version, 1 if value.next_producer_epoch != NO_PRODUCER_EPOCH
                      or value.client_transaction_version >= 2 else 0)
        record = txn_record(transactional_id, value, version=version)
        self.pending[transactional_id] = (record[1], value)
        outcome = TxnOutcome(producer_id=producer_id, producer_epoch=producer_epoch, transactional_id=transactional_id)
        outcome.effects.append(record)
        return outcome

    def _marker_job(self, meta: TxnMetadata, commit: bool) -> MarkerJob:
        return MarkerJob(meta.transactional_id, meta.producer_id, meta.producer_epoch, commit,
                         meta.value.partitions, COORDINATOR_EPOCH, meta.value.client_transaction_version)
