"""Unit tests for the pure transaction coordinator (state/transactions.py): every transition, allowed and refused,
with Kafka's error codes; replay and restart; the records each transition writes.  Also the partition side of a
transaction's end: ProducerStateManager.check_marker and commit_end_txn.

The harness plays the coordinator runtime: an operation's records are "made durable" by appending them to a list
(the __transaction_state log) and only then replayed, as the server does.
"""
from __future__ import annotations

import dataclasses

import pytest

import trireme.wire.error_codes as E
from trireme.state.producer_state import Outcome, ProducerStateManager
from trireme.state.transactions import (MAX_PRODUCER_EPOCH, IllegalTransition, MarkerJob, TransactionCoordinator,
                                        TxnConfig)
from trireme.state.txn_records import (TxnLogValue, TxnState, decode_txn_key, decode_txn_value, encode_txn_key,
                                       txn_record)

EMPTY, ONGOING = TxnState.EMPTY, TxnState.ONGOING
PREPARE_COMMIT, PREPARE_ABORT = TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT
COMPLETE_COMMIT, COMPLETE_ABORT = TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT

NONE = E.NONE.code
TID = "txn-a"
TIMEOUT = 60_000
T0 = 1_000_000
P1, P2, P3 = ("orders", 0), ("orders", 1), ("audit", 0)


class Harness:
    """A loaded coordinator, its durable log and a producer id allocator that counts its calls."""

    def __init__(self, **config) -> None:
        self.config = TxnConfig(**config)
        self.coord = TransactionCoordinator(self.config)
        self.coord.loaded()
        self.log: list[tuple[bytes, bytes | None]] = []
        self.next_pid = 1000
        self.allocated: list[int] = []
        self.now = T0

    def alloc(self) -> int:
        pid = self.next_pid
        self.next_pid += 1
        self.allocated.append(pid)
        return pid

    def tick(self, ms: int = 1) -> int:
        self.now += ms
        return self.now

    def durable(self, outcome_or_records):
        """Make records durable (append to the log), then replay them; returns what it was given."""
        records = outcome_or_records if isinstance(outcome_or_records, list) else outcome_or_records.records
        for key, value in records:
            self.log.append((key, value))
            self.coord.replay(key, value)
        return outcome_or_records

    # operations that must succeed (records made durable)

    def init(self, tid=TID, timeout=TIMEOUT, **kw):
        outcome = self.coord.init_producer_id(tid, timeout, self.tick(), self.alloc, **kw)
        return self.durable(outcome)

    def add(self, tid, pid, epoch, partitions):
        return self.durable(self.coord.add_partitions(tid, pid, epoch, partitions, self.tick()))

    def end(self, tid, pid, epoch, commit):
        return self.durable(self.coord.end_txn(tid, pid, epoch, commit, self.tick()))

    def complete(self, tid, pid, epoch):
        return self.durable(self.coord.markers_written(tid, pid, epoch, self.tick()))

    def meta(self, tid=TID):
        return self.coord.describe(tid)

    def state(self, tid=TID):
        return self.coord.describe(tid).state

    def to_state(self, state: TxnState, tid=TID, partitions=(P1, P2)) -> tuple[int, int]:
        """Drive ``tid`` (new) into ``state`` the way clients and the marker writer do; → (producer id, epoch)."""
        out = self.init(tid)
        assert out.error == NONE
        pid, epoch = out.producer_id, out.producer_epoch
        if state is EMPTY:
            return pid, epoch
        assert self.add(tid, pid, epoch, partitions).error == NONE
        if state is ONGOING:
            return pid, epoch
        commit = state in (PREPARE_COMMIT, COMPLETE_COMMIT)
        assert self.end(tid, pid, epoch, commit).error == NONE
        if state in (PREPARE_COMMIT, PREPARE_ABORT):
            return pid, epoch
        assert self.complete(tid, pid, epoch).error == NONE
        assert self.state(tid) is state
        return pid, epoch


def only_record(outcome) -> tuple[str, TxnLogValue | None]:
    """The one record an outcome carries, decoded."""
    assert len(outcome.records) == 1, outcome.records
    key, value = outcome.records[0]
    return decode_txn_key(key), decode_txn_value(value)


def no_change(outcome) -> None:
    assert outcome.records == []
    assert outcome.markers is None


@pytest.fixture
def h() -> Harness:
    return Harness()


# --- loading ---------------------------------------------------------------------------------------------------

def test_operations_before_loaded_answer_load_in_progress():
    coord = TransactionCoordinator()
    calls = []
    assert coord.init_producer_id(TID, TIMEOUT, T0, lambda: calls.append(1) or 1).error == \
        E.COORDINATOR_LOAD_IN_PROGRESS.code
    assert calls == []
    out = coord.add_partitions(TID, 1, 0, [P1], T0)
    assert out.error == E.COORDINATOR_LOAD_IN_PROGRESS.code
    assert out.partition_errors == {P1: E.COORDINATOR_LOAD_IN_PROGRESS.code}
    assert coord.verify_partitions(TID, 1, 0, [P1]) == {P1: E.COORDINATOR_LOAD_IN_PROGRESS.code}
    assert coord.end_txn(TID, 1, 0, True, T0).error == E.COORDINATOR_LOAD_IN_PROGRESS.code
    assert coord.pending == {}
    assert coord.loaded() == []
    assert coord.init_producer_id(TID, TIMEOUT, T0, lambda: 7).error == NONE


# --- InitProducerId --------------------------------------------------------------------------------------------

def test_init_new_id_allocates_producer_id_epoch_zero(h):
    out = h.coord.init_producer_id(TID, TIMEOUT, 5000, h.alloc)
    assert (out.error, out.producer_id, out.producer_epoch) == (NONE, 1000, 0)
    assert h.allocated == [1000]
    assert out.transactional_id == TID
    assert out.markers is None
    assert only_record(out) == (TID, TxnLogValue(
        producer_id=1000, producer_epoch=0, transaction_timeout_ms=TIMEOUT, state=EMPTY,
        last_update_timestamp_ms=5000, start_timestamp_ms=-1))
    # Not durable yet: nothing is known, the id is pending.
    assert h.meta() is None
    assert TID in h.coord.pending
    again = h.coord.init_producer_id(TID, TIMEOUT, 5001, h.alloc)
    assert again.error == E.CONCURRENT_TRANSACTIONS.code
    no_change(again)
    assert h.allocated == [1000]
    h.durable(out)
    assert TID not in h.coord.pending
    meta = h.meta()
    assert (meta.state, meta.producer_id, meta.producer_epoch) == (EMPTY, 1000, 0)


def test_init_empty_transactional_id_is_invalid_request(h):
    out = h.coord.init_producer_id("", TIMEOUT, T0, h.alloc)
    assert out.error == E.INVALID_REQUEST.code
    no_change(out)
    assert h.allocated == []


@pytest.mark.parametrize("state", [EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT])
def test_init_known_id_bumps_epoch(h, state):
    pid, epoch = h.to_state(state)
    allocated = list(h.allocated)
    before = h.meta().value
    out = h.coord.init_producer_id(TID, 30_000, 9_999_999, h.alloc)
    assert (out.error, out.producer_id, out.producer_epoch) == (NONE, pid, epoch + 1)
    assert h.allocated == allocated
    assert out.markers is None
    assert only_record(out) == (TID, dataclasses.replace(
        before, producer_epoch=epoch + 1, transaction_timeout_ms=30_000, state=EMPTY, partitions=(),
        last_update_timestamp_ms=9_999_999, start_timestamp_ms=-1))
    h.durable(out)
    meta = h.meta()
    assert (meta.state, meta.producer_id, meta.producer_epoch, meta.value.partitions) == (EMPTY, pid, epoch + 1, ())
    # The previous epoch is fenced everywhere.
    assert h.coord.add_partitions(TID, pid, epoch, [P1], h.tick()).error == E.PRODUCER_FENCED.code
    assert h.coord.end_txn(TID, pid, epoch, True, h.tick()).error == E.PRODUCER_FENCED.code


def _force(h: Harness, tid: str, **fields) -> TxnLogValue:
    """Put a durable value for ``tid`` straight into the log (e.g. an epoch near exhaustion)."""
    value = TxnLogValue(**{**dict(producer_id=500, producer_epoch=0, transaction_timeout_ms=TIMEOUT, state=EMPTY,
                                  last_update_timestamp_ms=T0, start_timestamp_ms=-1), **fields})
    h.durable([txn_record(tid, value, version=1 if h.config.transaction_version >= 1 else 0)])
    return value


@pytest.mark.parametrize("tv", [0, 1])
@pytest.mark.parametrize("state", [EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT])
def test_init_epoch_exhaustion_rotates_producer_id(tv, state):
    h = Harness(transaction_version=tv)
    _force(h, TID, producer_id=500, producer_epoch=MAX_PRODUCER_EPOCH - 1, state=state)
    out = h.init()
    assert (out.error, out.producer_id, out.producer_epoch) == (NONE, 1000, 0)
    assert h.allocated == [1000]
    _, value = only_record(out)
    assert (value.producer_id, value.producer_epoch, value.state) == (1000, 0, EMPTY)
    if tv >= 1:                                      # only value version 1 can carry the tagged field
        assert value.previous_producer_id == 500
        assert h.meta().value.previous_producer_id == 500
    # The old producer id is gone: requests naming it are refused.
    assert h.coord.add_partitions(TID, 500, MAX_PRODUCER_EPOCH - 1, [P1], h.tick()).error == \
        E.INVALID_PRODUCER_ID_MAPPING.code


def test_init_epoch_below_exhaustion_bumps_without_rotation(h):
    _force(h, TID, producer_id=500, producer_epoch=MAX_PRODUCER_EPOCH - 2)
    out = h.init()
    assert (out.error, out.producer_id, out.producer_epoch) == (NONE, 500, MAX_PRODUCER_EPOCH - 1)
    assert h.allocated == []
    assert only_record(out)[1].previous_producer_id == -1


def test_init_fences_ongoing_transaction(h):
    pid, epoch = h.to_state(ONGOING, partitions=[P1, P3])
    before = h.meta().value
    out = h.coord.init_producer_id(TID, TIMEOUT, 7_000_000, h.alloc)
    # The caller is told to retry; the open transaction is aborted with the bumped epoch.
    assert out.error == E.CONCURRENT_TRANSACTIONS.code
    assert (out.producer_id, out.producer_epoch) == (pid, epoch + 1)
    assert only_record(out) == (TID, dataclasses.replace(
        before, producer_epoch=epoch + 1, state=PREPARE_ABORT, last_update_timestamp_ms=7_000_000))
    assert out.markers == MarkerJob(TID, pid, epoch + 1, False, tuple(sorted([P1, P3])))
    h.durable(out)
    assert h.state() is PREPARE_ABORT
    # The old producer's EndTxn is fenced at once; its AddPartitionsToTxn waits for the abort's markers first
    # (Kafka 4.x checks a transition in flight before the epoch there).
    assert h.coord.end_txn(TID, pid, epoch, True, h.tick()).error == E.PRODUCER_FENCED.code
    assert h.coord.add_partitions(TID, pid, epoch, [P2], h.tick()).error == E.CONCURRENT_TRANSACTIONS.code
    # The retry finds the abort still being written, then (markers done) gets the epoch bumped again.
    retry = h.coord.init_producer_id(TID, TIMEOUT, h.tick(), h.alloc)
    assert retry.error == E.CONCURRENT_TRANSACTIONS.code
    no_change(retry)
    done = h.complete(TID, pid, epoch + 1)
    assert only_record(done)[1].state is COMPLETE_ABORT
    assert h.coord.add_partitions(TID, pid, epoch, [P2], h.tick()).error == E.PRODUCER_FENCED.code
    retry = h.init()
    assert (retry.error, retry.producer_id, retry.producer_epoch) == (NONE, pid, epoch + 2)
    assert h.allocated == [1000]


@pytest.mark.parametrize("state", [PREPARE_COMMIT, PREPARE_ABORT])
def test_init_while_prepared_is_concurrent_transactions(h, state):
    pid, epoch = h.to_state(state)
    out = h.coord.init_producer_id(TID, TIMEOUT, h.tick(), h.alloc)
    assert out.error == E.CONCURRENT_TRANSACTIONS.code
    no_change(out)
    assert TID not in h.coord.pending
    assert (h.state(), h.meta().producer_epoch) == (state, epoch)


def test_init_while_pending_is_concurrent_transactions(h):
    pid, epoch = h.to_state(ONGOING)
    pending = h.coord.end_txn(TID, pid, epoch, True, h.tick())       # not yet durable
    out = h.coord.init_producer_id(TID, TIMEOUT, h.tick(), h.alloc)
    assert out.error == E.CONCURRENT_TRANSACTIONS.code
    no_change(out)
    h.durable(pending)
    assert h.state() is PREPARE_COMMIT


@pytest.mark.parametrize("timeout", [0, -1, 900_001, 2**31 - 1])
def test_init_bad_timeout(h, timeout):
    out = h.coord.init_producer_id(TID, timeout, T0, h.alloc)
    assert out.error == E.INVALID_TRANSACTION_TIMEOUT.code
    no_change(out)
    assert h.allocated == []
    assert TID not in h.coord.pending


def test_init_timeout_bounds_follow_config():
    h = Harness(max_timeout_ms=5000)
    assert h.coord.init_producer_id(TID, 5001, T0, h.alloc).error == E.INVALID_TRANSACTION_TIMEOUT.code
    assert h.init(timeout=5000).error == NONE
    assert h.init(timeout=1).error == NONE
    assert h.meta().value.transaction_timeout_ms == 1


# KIP-360: InitProducerId naming the producer's current id and epoch.

def test_kip360_current_epoch_is_bumped(h):
    pid, epoch = h.to_state(COMPLETE_ABORT)
    out = h.init(expected_producer_id=pid, expected_producer_epoch=epoch)
    assert (out.error, out.producer_id, out.producer_epoch) == (NONE, pid, epoch + 1)
    assert only_record(out)[1].producer_epoch == epoch + 1


def test_kip360_retry_after_bump_returns_same_answer(h):
    pid, epoch = h.to_state(EMPTY)
    first = h.init(expected_producer_id=pid, expected_producer_epoch=epoch)
    assert (first.error, first.producer_epoch) == (NONE, epoch + 1)
    retry = h.coord.init_producer_id(TID, TIMEOUT, h.tick(), h.alloc, expected_producer_id=pid,
                                     expected_producer_epoch=epoch)
    assert (retry.error, retry.producer_id, retry.producer_epoch) == (NONE, pid, epoch + 1)
    no_change(retry)
    assert TID not in h.coord.pending
    # And the new epoch itself is "current": bumping from it works.
    again = h.init(expected_producer_id=pid, expected_producer_epoch=epoch + 1)
    assert (again.error, again.producer_epoch) == (NONE, epoch + 2)


def test_kip360_stale_epoch_is_fenced(h):
    pid, epoch = h.to_state(EMPTY)
    for _ in range(3):
        h.init(expected_producer_id=pid, expected_producer_epoch=h.meta().producer_epoch)
    current = h.meta().producer_epoch
    assert current == epoch + 3
    for stale in (epoch, epoch + 1):
        out = h.coord.init_producer_id(TID, TIMEOUT, h.tick(), h.alloc, expected_producer_id=pid,
                                       expected_producer_epoch=stale)
        assert out.error == E.PRODUCER_FENCED.code
        no_change(out)
    # Another producer id entirely.
    out = h.coord.init_producer_id(TID, TIMEOUT, h.tick(), h.alloc, expected_producer_id=pid + 77,
                                   expected_producer_epoch=current)
    assert out.error == E.PRODUCER_FENCED.code
    assert h.meta().producer_epoch == current


def test_kip360_epoch_taken_over_by_new_producer_is_fenced(h):
    """A producer replaced by a plain InitProducerId (no expected epoch) must not get the new producer's epoch.

    Kafka: an InitProducerId without an expected epoch sets lastProducerEpoch to -1, so the replaced producer's
    later KIP-360 InitProducerId(pid, old epoch) is neither current nor "the retry of the last bump": PRODUCER_FENCED.
    """
    old = h.init()
    pid, epoch = old.producer_id, old.producer_epoch
    new = h.init()                                   # another producer instance with the same transactional id
    assert (new.producer_id, new.producer_epoch) == (pid, epoch + 1)
    zombie = h.coord.init_producer_id(TID, TIMEOUT, h.tick(), h.alloc, expected_producer_id=pid,
                                      expected_producer_epoch=epoch)
    assert zombie.error == E.PRODUCER_FENCED.code, (
        f"the replaced producer got producer id {zombie.producer_id} epoch {zombie.producer_epoch}: "
        f"the epoch the new producer holds")


def test_kip360_epoch_fenced_by_abort_is_fenced(h):
    """After InitProducerId fenced an open transaction (epoch bump + abort), the fenced epoch is no "retry"."""
    pid, epoch = h.to_state(ONGOING)
    h.durable(h.coord.init_producer_id(TID, TIMEOUT, h.tick(), h.alloc))   # the replacement fences
    h.complete(TID, pid, epoch + 1)
    assert (h.state(), h.meta().producer_epoch) == (COMPLETE_ABORT, epoch + 1)
    zombie = h.coord.init_producer_id(TID, TIMEOUT, h.tick(), h.alloc, expected_producer_id=pid,
                                      expected_producer_epoch=epoch)
    assert zombie.error == E.PRODUCER_FENCED.code, (
        f"the fenced producer got producer id {zombie.producer_id} epoch {zombie.producer_epoch}")


@pytest.mark.parametrize("tv", [0, 1])
def test_kip360_retry_after_producer_id_rotation_returns_same_answer(tv):
    """Kafka: a retry naming the exhausted (previous) producer id and epoch gets the rotated id and epoch 0 again."""
    h = Harness(transaction_version=tv)
    _force(h, TID, producer_id=500, producer_epoch=MAX_PRODUCER_EPOCH - 1)
    first = h.init(expected_producer_id=500, expected_producer_epoch=MAX_PRODUCER_EPOCH - 1)
    assert (first.error, first.producer_id, first.producer_epoch) == (NONE, 1000, 0)
    retry = h.coord.init_producer_id(TID, TIMEOUT, h.tick(), h.alloc, expected_producer_id=500,
                                     expected_producer_epoch=MAX_PRODUCER_EPOCH - 1)
    assert (retry.error, retry.producer_id, retry.producer_epoch) == (NONE, 1000, 0)
    assert retry.records == []
    assert h.allocated == [1000]


def test_kip360_unknown_id_gets_new_producer_id(h):
    """An id the coordinator does not know (expired, say): a fresh producer id whatever the request names."""
    out = h.init(expected_producer_id=77, expected_producer_epoch=3)
    assert (out.error, out.producer_id, out.producer_epoch) == (NONE, 1000, 0)
    assert h.allocated == [1000]


@pytest.mark.parametrize("state", [PREPARE_COMMIT, PREPARE_ABORT])
def test_kip360_while_prepared_is_concurrent_transactions(h, state):
    pid, epoch = h.to_state(state)
    out = h.coord.init_producer_id(TID, TIMEOUT, h.tick(), h.alloc, expected_producer_id=pid,
                                   expected_producer_epoch=epoch)
    assert out.error == E.CONCURRENT_TRANSACTIONS.code
    no_change(out)


def test_kip360_ongoing_current_epoch_fences(h):
    pid, epoch = h.to_state(ONGOING)
    out = h.coord.init_producer_id(TID, TIMEOUT, h.tick(), h.alloc, expected_producer_id=pid,
                                   expected_producer_epoch=epoch)
    assert out.error == E.CONCURRENT_TRANSACTIONS.code
    assert only_record(out)[1].state is PREPARE_ABORT
    assert out.markers.producer_epoch == epoch + 1


def test_2pc_refused_when_disabled(h):
    out = h.coord.init_producer_id(TID, TIMEOUT, T0, h.alloc, enable_2pc=True)
    assert out.error == E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED.code
    no_change(out)
    assert h.allocated == []
    h.to_state(EMPTY)
    out = h.coord.init_producer_id(TID, TIMEOUT, h.tick(), h.alloc, enable_2pc=True)
    assert out.error == E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED.code
    no_change(out)


@pytest.mark.parametrize("known", [False, True], ids=["new-id", "known-id"])
def test_2pc_transaction_never_times_out(known):
    """With 2PC enabled the client's timeout is ignored (Kafka: Int.MaxValue) and the transaction never times out."""
    h = Harness(two_phase_commit_enable=True)
    if known:
        h.to_state(EMPTY)
    out = h.init(timeout=TIMEOUT, enable_2pc=True)
    assert out.error == NONE
    pid, epoch = out.producer_id, out.producer_epoch
    h.add(TID, pid, epoch, [P1])
    assert h.coord.abort_timed_out(h.now + 10 * TIMEOUT) == [], (
        f"stored transaction timeout {h.meta().value.transaction_timeout_ms}")


def test_2pc_accepts_any_timeout_when_enabled():
    h = Harness(two_phase_commit_enable=True)
    out = h.init(timeout=0, enable_2pc=True)
    assert out.error == NONE


def test_2pc_keep_prepared_transaction_survives_a_producer_restart():
    """KIP-939: InitProducerId(Enable2Pc, KeepPreparedTxn) keeps the Ongoing transaction and fences the old instance;
    EndTxn with the new pair completes it with markers in the transaction's own epoch; a restart keeps it all."""
    h = Harness(two_phase_commit_enable=True)
    first = h.init(enable_2pc=True)
    pid, epoch = first.producer_id, first.producer_epoch
    h.add(TID, pid, epoch, [P1, P2])
    kept = h.init(enable_2pc=True, keep_prepared_txn=True)
    assert (kept.error, kept.producer_id, kept.producer_epoch) == (NONE, pid, epoch + 1)
    assert (kept.ongoing_producer_id, kept.ongoing_producer_epoch) == (pid, epoch)
    assert h.state() is ONGOING and set(h.meta().value.partitions) == {P1, P2}
    assert h.meta().value.next_producer_epoch == epoch + 1
    # The instance before it is fenced; nothing times the transaction out.
    assert h.coord.end_txn(TID, pid, epoch, True, h.tick()).error == E.PRODUCER_FENCED.code
    assert h.coord.abort_timed_out(h.now + 10**9) == []
    # A restart of the coordinator keeps the kept transaction and its next pair (a v1 record).
    fresh = TransactionCoordinator(h.config)
    for key, value in h.log:
        fresh.replay(key, value)
    fresh.loaded()
    assert fresh.describe(TID).value == h.meta().value
    out = h.end(TID, pid, epoch + 1, True)
    assert out.error == NONE and out.markers.commit
    assert (out.markers.producer_id, out.markers.producer_epoch) == (pid, epoch)   # the data's epoch
    h.complete(TID, pid, epoch)
    assert h.state() is COMPLETE_COMMIT
    assert (h.meta().producer_id, h.meta().producer_epoch) == (pid, epoch + 1)
    assert h.meta().value.next_producer_epoch == -1


def test_2pc_keep_prepared_needs_enable_2pc_and_without_it_aborts():
    h = Harness(two_phase_commit_enable=True)
    first = h.init(enable_2pc=True)
    h.add(TID, first.producer_id, first.producer_epoch, [P1])
    assert h.coord.init_producer_id(TID, TIMEOUT, h.tick(), h.alloc, keep_prepared_txn=True).error == \
        E.INVALID_REQUEST.code
    fenced = h.coord.init_producer_id(TID, TIMEOUT, h.tick(), h.alloc, enable_2pc=True)
    assert fenced.error == E.CONCURRENT_TRANSACTIONS.code and fenced.markers is not None and not fenced.markers.commit


# --- AddPartitionsToTxn ----------------------------------------------------------------------------------------

def test_add_partitions_unknown_id(h):
    out = h.coord.add_partitions(TID, 1000, 0, [P1, P2], h.tick())
    assert out.error == E.INVALID_PRODUCER_ID_MAPPING.code
    assert out.partition_errors == {P1: E.INVALID_PRODUCER_ID_MAPPING.code, P2: E.INVALID_PRODUCER_ID_MAPPING.code}
    no_change(out)


def test_add_partitions_other_producer_id(h):
    pid, epoch = h.to_state(EMPTY)
    out = h.coord.add_partitions(TID, pid + 1, epoch, [P1], h.tick())
    assert out.error == E.INVALID_PRODUCER_ID_MAPPING.code
    assert out.partition_errors == {P1: E.INVALID_PRODUCER_ID_MAPPING.code}
    no_change(out)


@pytest.mark.parametrize("delta", [-1, 1])
def test_add_partitions_wrong_epoch_is_fenced(h, delta):
    pid, epoch = h.to_state(EMPTY)
    h.init()                                         # epoch 1: both 0 and 2 are wrong
    out = h.coord.add_partitions(TID, pid, epoch + 1 + delta, [P1], h.tick())
    assert out.error == E.PRODUCER_FENCED.code
    assert out.partition_errors == {P1: E.PRODUCER_FENCED.code}
    no_change(out)
    assert h.state() is EMPTY


@pytest.mark.parametrize("state", [PREPARE_COMMIT, PREPARE_ABORT])
def test_add_partitions_while_prepared_is_concurrent(h, state):
    pid, epoch = h.to_state(state)
    out = h.coord.add_partitions(TID, pid, epoch, [P3], h.tick())
    assert out.error == E.CONCURRENT_TRANSACTIONS.code
    assert out.partition_errors == {P3: E.CONCURRENT_TRANSACTIONS.code}
    no_change(out)
    assert TID not in h.coord.pending


def test_add_partitions_while_pending_is_concurrent(h):
    pid, epoch = h.to_state(EMPTY)
    first = h.coord.add_partitions(TID, pid, epoch, [P1], h.tick())
    assert first.error == NONE and len(first.records) == 1
    second = h.coord.add_partitions(TID, pid, epoch, [P2], h.tick())
    assert second.error == E.CONCURRENT_TRANSACTIONS.code
    assert second.partition_errors == {P2: E.CONCURRENT_TRANSACTIONS.code}
    no_change(second)
    h.durable(first)
    assert h.meta().value.partitions == (P1,)


def test_add_partitions_empty_to_ongoing_sets_start_time(h):
    pid, epoch = h.to_state(EMPTY)
    before = h.meta().value
    out = h.coord.add_partitions(TID, pid, epoch, [P2, P1], 2_000_000)
    assert (out.error, out.producer_id, out.producer_epoch) == (NONE, pid, epoch)
    assert out.partition_errors == {P1: NONE, P2: NONE}
    assert out.markers is None
    assert only_record(out) == (TID, dataclasses.replace(
        before, state=ONGOING, partitions=(P1, P2), last_update_timestamp_ms=2_000_000,
        start_timestamp_ms=2_000_000))
    h.durable(out)
    meta = h.meta()
    assert (meta.state, meta.value.partitions, meta.value.start_timestamp_ms) == (ONGOING, (P1, P2), 2_000_000)


def test_add_partitions_ongoing_extends_keeping_start_time(h):
    pid, epoch = h.to_state(EMPTY)
    h.durable(h.coord.add_partitions(TID, pid, epoch, [P1], 2_000_000))
    out = h.coord.add_partitions(TID, pid, epoch, [P1, P3], 2_000_500)
    assert out.error == NONE
    assert out.partition_errors == {P1: NONE, P3: NONE}
    _, value = only_record(out)
    assert (value.state, value.partitions) == (ONGOING, tuple(sorted([P1, P3])))
    assert (value.start_timestamp_ms, value.last_update_timestamp_ms) == (2_000_000, 2_000_500)


def test_add_partitions_already_included_writes_nothing(h):
    pid, epoch = h.to_state(ONGOING, partitions=[P1, P2])
    out = h.coord.add_partitions(TID, pid, epoch, [P2], h.tick())
    assert (out.error, out.partition_errors) == (NONE, {P2: NONE})
    no_change(out)
    assert TID not in h.coord.pending
    assert (out.producer_id, out.producer_epoch) == (pid, epoch)


@pytest.mark.parametrize("state", [COMPLETE_COMMIT, COMPLETE_ABORT])
def test_add_partitions_after_completed_starts_new_transaction(h, state):
    pid, epoch = h.to_state(state, partitions=[P1, P2])
    out = h.coord.add_partitions(TID, pid, epoch, [P3], 3_000_000)
    assert out.error == NONE
    _, value = only_record(out)
    assert (value.state, value.partitions, value.start_timestamp_ms) == (ONGOING, (P3,), 3_000_000)
    assert value.producer_epoch == epoch


# --- verify_partitions (KIP-890 part 1) ------------------------------------------------------------------------

def test_verify_partitions_in_ongoing_transaction(h):
    pid, epoch = h.to_state(ONGOING, partitions=[P1, P2])
    result = h.coord.verify_partitions(TID, pid, epoch, [P1, P2, P3])
    assert result[P1] == NONE and result[P2] == NONE
    assert result[P3] in (E.INVALID_TXN_STATE.code, E.TRANSACTION_ABORTABLE.code)
    assert h.coord.pending == {}


def test_verify_partitions_changes_nothing(h):
    pid, epoch = h.to_state(ONGOING, partitions=[P1])
    before = (dict(h.coord.transactions), dict(h.coord.pending), len(h.log))
    h.coord.verify_partitions(TID, pid, epoch, [P1, P2])
    h.coord.verify_partitions(TID, pid, epoch + 1, [P1])
    h.coord.verify_partitions("other", pid, epoch, [P1])
    assert (dict(h.coord.transactions), dict(h.coord.pending), len(h.log)) == before
    assert h.meta().value.partitions == (P1,)


@pytest.mark.parametrize("state", [EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT])
def test_verify_partitions_without_open_transaction(h, state):
    pid, epoch = h.to_state(state, partitions=[P1])
    result = h.coord.verify_partitions(TID, pid, epoch, [P1])
    assert result[P1] in (E.INVALID_TXN_STATE.code, E.TRANSACTION_ABORTABLE.code)


def test_verify_partitions_wrong_producer(h):
    pid, epoch = h.to_state(ONGOING, partitions=[P1])
    assert h.coord.verify_partitions("nobody", pid, epoch, [P1]) == {P1: E.INVALID_PRODUCER_ID_MAPPING.code}
    assert h.coord.verify_partitions(TID, pid + 1, epoch, [P1]) == {P1: E.INVALID_PRODUCER_ID_MAPPING.code}
    assert h.coord.verify_partitions(TID, pid, epoch + 1, [P1]) == {P1: E.PRODUCER_FENCED.code}
    assert h.coord.verify_partitions(TID, pid, epoch - 1, [P1]) == {P1: E.PRODUCER_FENCED.code}


@pytest.mark.parametrize("state", [PREPARE_COMMIT, PREPARE_ABORT])
def test_verify_partitions_while_prepared_is_concurrent(h, state):
    """Kafka's handleVerifyPartitionsInTransaction: PrepareCommit/PrepareAbort → CONCURRENT_TRANSACTIONS (retriable),
    which the produce path turns into NOT_ENOUGH_REPLICAS."""
    pid, epoch = h.to_state(state, partitions=[P1])
    assert h.coord.verify_partitions(TID, pid, epoch, [P1, P2]) == {
        P1: E.CONCURRENT_TRANSACTIONS.code, P2: E.CONCURRENT_TRANSACTIONS.code}


# --- EndTxn ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("commit", [True, False], ids=["commit", "abort"])
def test_end_txn_ongoing_prepares(h, commit):
    pid, epoch = h.to_state(ONGOING, partitions=[P3, P1])
    before = h.meta().value
    out = h.coord.end_txn(TID, pid, epoch, commit, 4_000_000)
    assert (out.error, out.producer_id, out.producer_epoch) == (NONE, pid, epoch)
    target = PREPARE_COMMIT if commit else PREPARE_ABORT
    assert only_record(out) == (TID, dataclasses.replace(before, state=target, last_update_timestamp_ms=4_000_000))
    assert out.markers == MarkerJob(TID, pid, epoch, commit, tuple(sorted([P1, P3])))
    assert TID in h.coord.pending
    assert h.state() is ONGOING                      # only replay changes durable state
    h.durable(out)
    assert h.state() is target
    assert TID not in h.coord.pending


# (state the transaction is in, commit?) → expected error.  A prepared transaction's markers are still being
# written: Kafka holds a pending Complete* transition until they are, and checks it before the state.
END_TXN_TABLE = [
    (COMPLETE_COMMIT, True, NONE),
    (COMPLETE_COMMIT, False, E.INVALID_TXN_STATE.code),
    (COMPLETE_ABORT, False, NONE),
    (COMPLETE_ABORT, True, E.INVALID_TXN_STATE.code),
    (PREPARE_COMMIT, True, E.CONCURRENT_TRANSACTIONS.code),
    (PREPARE_COMMIT, False, E.CONCURRENT_TRANSACTIONS.code),
    (PREPARE_ABORT, False, E.CONCURRENT_TRANSACTIONS.code),
    (PREPARE_ABORT, True, E.CONCURRENT_TRANSACTIONS.code),
    (EMPTY, True, E.INVALID_TXN_STATE.code),
    (EMPTY, False, E.INVALID_TXN_STATE.code),
]


@pytest.mark.parametrize("state,commit,error", END_TXN_TABLE,
                         ids=[f"{s.kafka_name}-{'commit' if c else 'abort'}" for s, c, _ in END_TXN_TABLE])
def test_end_txn_outside_ongoing(h, state, commit, error):
    pid, epoch = h.to_state(state)
    before = h.meta()
    out = h.coord.end_txn(TID, pid, epoch, commit, h.tick())
    assert out.error == error
    no_change(out)
    assert TID not in h.coord.pending
    assert h.meta() == before
    if error == NONE:                                # a retry of a completed EndTxn: the same answer
        assert (out.producer_id, out.producer_epoch) == (pid, epoch)


def test_end_txn_unknown_or_other_producer(h):
    assert h.coord.end_txn(TID, 1000, 0, True, h.tick()).error == E.INVALID_PRODUCER_ID_MAPPING.code
    pid, epoch = h.to_state(ONGOING)
    assert h.coord.end_txn(TID, pid + 1, epoch, True, h.tick()).error == E.INVALID_PRODUCER_ID_MAPPING.code
    assert h.coord.end_txn(TID, pid, epoch + 1, True, h.tick()).error == E.PRODUCER_FENCED.code
    assert h.coord.end_txn(TID, pid, epoch - 1, False, h.tick()).error == E.PRODUCER_FENCED.code
    assert h.state() is ONGOING and h.coord.pending == {}


def test_end_txn_while_pending_is_concurrent(h):
    pid, epoch = h.to_state(ONGOING)
    pending = h.coord.add_partitions(TID, pid, epoch, [P3], h.tick())
    out = h.coord.end_txn(TID, pid, epoch, True, h.tick())
    assert out.error == E.CONCURRENT_TRANSACTIONS.code
    no_change(out)
    h.durable(pending)
    out = h.end(TID, pid, epoch, True)
    assert out.markers.partitions == tuple(sorted([P1, P2, P3]))


# --- markers_written -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("commit", [True, False], ids=["commit", "abort"])
def test_markers_written_completes_prepared(h, commit):
    pid, epoch = h.to_state(PREPARE_COMMIT if commit else PREPARE_ABORT, partitions=[P1, P2])
    before = h.meta().value
    out = h.coord.markers_written(TID, pid, epoch, 5_000_000)
    assert out.error == NONE
    assert out.markers is None
    assert only_record(out) == (TID, dataclasses.replace(
        before, state=COMPLETE_COMMIT if commit else COMPLETE_ABORT, partitions=(), last_update_timestamp_ms=5_000_000))
    h.durable(out)
    assert h.state() is (COMPLETE_COMMIT if commit else COMPLETE_ABORT)
    # A second (resumed) job finds nothing to complete.
    again = h.coord.markers_written(TID, pid, epoch, h.tick())
    assert again.error == E.INVALID_TXN_STATE.code
    no_change(again)


@pytest.mark.parametrize("state", [EMPTY, ONGOING, COMPLETE_COMMIT, COMPLETE_ABORT])
def test_markers_written_only_from_prepared(h, state):
    pid, epoch = h.to_state(state)
    before = h.meta()
    out = h.coord.markers_written(TID, pid, epoch, h.tick())
    assert out.error == E.INVALID_TXN_STATE.code
    no_change(out)
    assert h.meta() == before and h.coord.pending == {}


def test_markers_written_wrong_producer_or_pending(h):
    assert h.coord.markers_written(TID, 1000, 0, h.tick()).error == E.INVALID_TXN_STATE.code
    pid, epoch = h.to_state(ONGOING)
    pending = h.coord.end_txn(TID, pid, epoch, False, h.tick())
    assert h.coord.markers_written(TID, pid, epoch, h.tick()).error == E.INVALID_TXN_STATE.code   # not durable yet
    h.durable(pending)
    assert h.coord.markers_written(TID, pid, epoch + 1, h.tick()).error == E.INVALID_TXN_STATE.code
    assert h.coord.markers_written(TID, pid + 1, epoch, h.tick()).error == E.INVALID_TXN_STATE.code
    first = h.coord.markers_written(TID, pid, epoch, h.tick())
    assert first.error == NONE
    assert h.coord.markers_written(TID, pid, epoch, h.tick()).error == E.INVALID_TXN_STATE.code  # pending
    h.durable(first)
    assert h.state() is COMPLETE_ABORT


# --- timeouts --------------------------------------------------------------------------------------------------

def test_abort_timed_out_only_ongoing_past_own_timeout(h):
    short = h.init("short", timeout=1000)
    long = h.init("long", timeout=5000)
    h.durable(h.coord.add_partitions("short", short.producer_id, 0, [P1], 10_000_000))
    h.durable(h.coord.add_partitions("long", long.producer_id, 0, [P2], 10_000_000))
    # Ids in every other state, long past any timeout.
    h.to_state(EMPTY, tid="idle")
    h.to_state(PREPARE_COMMIT, tid="prepared")
    h.to_state(COMPLETE_ABORT, tid="done")
    assert h.coord.abort_timed_out(10_001_000) == []               # exactly the timeout: not yet
    # Adding partitions later does not extend the transaction (timeout runs from its start).
    assert h.durable(h.coord.add_partitions("short", short.producer_id, 0, [P3], 10_000_900)).error == NONE
    outcomes = h.coord.abort_timed_out(10_001_001)
    assert [o.transactional_id for o in outcomes] == ["short"]
    out = outcomes[0]
    assert (out.error, out.producer_id, out.producer_epoch) == (NONE, short.producer_id, 1)
    _, value = only_record(out)
    assert (value.state, value.producer_epoch, value.partitions) == (PREPARE_ABORT, 1, tuple(sorted([P1, P3])))
    assert value.last_update_timestamp_ms == 10_001_001
    assert out.markers == MarkerJob("short", short.producer_id, 1, False, tuple(sorted([P1, P3])))
    # Pending: a second sweep does not abort it again.
    assert h.coord.abort_timed_out(10_001_002) == []
    h.durable(out)
    # The timed-out producer is fenced (its AddPartitionsToTxn once the abort's markers are written).
    assert h.coord.end_txn("short", short.producer_id, 0, True, h.tick()).error == E.PRODUCER_FENCED.code
    assert h.coord.add_partitions("short", short.producer_id, 0, [P1], h.tick()).error == \
        E.CONCURRENT_TRANSACTIONS.code
    h.complete("short", short.producer_id, 1)
    assert h.coord.add_partitions("short", short.producer_id, 0, [P1], h.tick()).error == E.PRODUCER_FENCED.code
    outcomes = h.coord.abort_timed_out(10_005_001)
    assert [o.transactional_id for o in outcomes] == ["long"]
    for other in ("idle", "prepared", "done"):
        assert other not in h.coord.pending


def test_abort_timed_out_skips_pending(h):
    pid, epoch = h.to_state(ONGOING)
    start = h.meta().value.start_timestamp_ms
    pending = h.coord.end_txn(TID, pid, epoch, True, h.tick())
    assert h.coord.abort_timed_out(start + 10 * TIMEOUT) == []
    h.durable(pending)
    assert h.state() is PREPARE_COMMIT


def test_abort_timed_out_then_retry_of_fenced_producer(h):
    pid, epoch = h.to_state(ONGOING)
    start = h.meta().value.start_timestamp_ms
    [out] = h.coord.abort_timed_out(start + TIMEOUT + 1)
    h.durable(out)
    h.complete(TID, pid, epoch + 1)
    # The producer notices (PRODUCER_FENCED); a new instance initialises: the epoch is bumped past the fence.
    new = h.init()
    assert (new.error, new.producer_id, new.producer_epoch) == (NONE, pid, epoch + 2)


# --- transactional id expiration -------------------------------------------------------------------------------

def test_expire_transactional_ids_only_idle_non_open():
    h = Harness(id_expiration_ms=10_000)
    h.to_state(EMPTY, tid="empty")
    h.to_state(COMPLETE_COMMIT, tid="committed")
    h.to_state(COMPLETE_ABORT, tid="aborted")
    h.to_state(ONGOING, tid="ongoing")
    h.to_state(PREPARE_COMMIT, tid="prep-c")
    h.to_state(PREPARE_ABORT, tid="prep-a")
    last = max(m.value.last_update_timestamp_ms for m in h.coord.transactions.values())
    assert h.coord.expire_transactional_ids(last + 9_999 - 100) == []
    records = h.coord.expire_transactional_ids(last + 10_000_000)
    expired = sorted(decode_txn_key(k) for k, v in records)
    assert expired == ["aborted", "committed", "empty"]
    assert all(v is None for _, v in records)
    # Pending tombstones: operations on those ids wait; a second sweep does not repeat them.
    assert h.coord.init_producer_id("empty", TIMEOUT, h.tick(), h.alloc).error == E.CONCURRENT_TRANSACTIONS.code
    assert h.coord.expire_transactional_ids(last + 10_000_001) == []
    h.durable(records)
    assert h.meta("empty") is None and h.meta("committed") is None and h.meta("aborted") is None
    assert {m.transactional_id for m in h.coord.transactions.values()} == {"ongoing", "prep-c", "prep-a"}
    # A new producer with an expired id gets a new producer id.
    allocated = len(h.allocated)
    out = h.init("committed")
    assert (out.error, out.producer_epoch) == (NONE, 0)
    assert len(h.allocated) == allocated + 1 and out.producer_id == h.allocated[-1]


def test_expire_boundary_uses_last_update_time():
    h = Harness(id_expiration_ms=10_000)
    h.to_state(EMPTY)
    last = h.meta().value.last_update_timestamp_ms
    assert h.coord.expire_transactional_ids(last + 9_999) == []
    assert [decode_txn_key(k) for k, _ in h.coord.expire_transactional_ids(last + 10_000)] == [TID]


def test_expire_write_failure_is_abandoned():
    h = Harness(id_expiration_ms=10_000)
    pid, epoch = h.to_state(EMPTY)
    records = h.coord.expire_transactional_ids(h.now + 20_000)
    assert len(records) == 1
    h.coord.abandon(TID)
    assert TID not in h.coord.pending
    out = h.init()
    assert (out.error, out.producer_id, out.producer_epoch) == (NONE, pid, epoch + 1)


# --- abandon: a transition whose record could not be made durable ------------------------------------------------

def test_abandon_drops_pending_transition(h):
    pid, epoch = h.to_state(ONGOING)
    before = h.meta()
    failed = h.coord.init_producer_id(TID, TIMEOUT, h.tick(), h.alloc)          # a fence whose write fails
    assert failed.records
    h.coord.abandon(TID)
    assert h.coord.pending == {} and h.meta() == before
    # The old producer still owns its transaction and can commit it.
    out = h.end(TID, pid, epoch, True)
    assert out.error == NONE and out.markers.producer_epoch == epoch


def test_abandoned_new_id_is_unknown(h):
    out = h.coord.init_producer_id(TID, TIMEOUT, h.tick(), h.alloc)
    h.coord.abandon(TID)
    assert h.meta() is None and h.coord.pending == {}
    retry = h.init()
    assert retry.error == NONE and retry.producer_epoch == 0 and retry.producer_id != out.producer_id


# --- replay, restart, records ----------------------------------------------------------------------------------

def _scenario(h: Harness) -> None:
    """One id in each state, epoch bumps, a fence and an expiry: the log holds them all."""
    h.to_state(EMPTY, tid="gone")
    h.tick(h.config.id_expiration_ms)
    h.to_state(EMPTY, tid="e")
    h.init("e")
    h.to_state(ONGOING, tid="o", partitions=[P1, P3])
    h.to_state(PREPARE_COMMIT, tid="pc")
    h.to_state(PREPARE_ABORT, tid="pa", partitions=[P2])
    h.to_state(COMPLETE_COMMIT, tid="cc")
    h.to_state(COMPLETE_ABORT, tid="ca")
    pid, epoch = h.to_state(ONGOING, tid="fenced", partitions=[P2, P3])
    h.durable(h.coord.init_producer_id("fenced", TIMEOUT, h.tick(), h.alloc))
    kip = h.init("kip")
    h.init("kip", expected_producer_id=kip.producer_id, expected_producer_epoch=kip.producer_epoch)
    expired = h.coord.expire_transactional_ids(h.now)
    assert [decode_txn_key(k) for k, _ in expired] == ["gone"]
    h.durable(expired)


def _values(transactions: dict) -> dict:
    return {k: m.value for k, m in transactions.items()}


def _restarted(h: Harness, config: TxnConfig | None = None) -> tuple[TransactionCoordinator, list[MarkerJob]]:
    fresh = TransactionCoordinator(config or h.config)
    for key, value in h.log:
        fresh.replay(key, value)
    return fresh, fresh.loaded()


@pytest.mark.parametrize("tv", [0, 1])
def test_restart_replay_rebuilds_identical_state(tv):
    h = Harness(transaction_version=tv)
    _scenario(h)
    fresh, jobs = _restarted(h)
    # The durable values; last_producer_epoch/id live in memory only (as Kafka's lastProducerEpoch).
    assert _values(fresh.transactions) == _values(h.coord.transactions)
    assert fresh.pending == {}
    assert "gone" not in fresh.transactions
    by_id = {job.transactional_id: job for job in jobs}
    assert set(by_id) == {"pc", "pa", "fenced"}
    pc, pa, fenced = h.meta("pc"), h.meta("pa"), h.meta("fenced")
    assert by_id["pc"] == MarkerJob("pc", pc.producer_id, pc.producer_epoch, True, (P1, P2), 0, tv)
    assert by_id["pa"] == MarkerJob("pa", pa.producer_id, pa.producer_epoch, False, (P2,), 0, tv)
    assert by_id["fenced"].producer_epoch == fenced.producer_epoch == 1
    assert by_id["fenced"].commit is False and by_id["fenced"].partitions == tuple(sorted([P2, P3]))
    # The restarted coordinator carries on: the resumed markers complete the prepared transactions.
    for job in jobs:
        out = fresh.markers_written(job.transactional_id, job.producer_id, job.producer_epoch, h.tick())
        assert out.error == NONE
        for key, value in out.records:
            fresh.replay(key, value)
    assert fresh.loaded() == []


@pytest.mark.parametrize("state", [EMPTY, ONGOING, PREPARE_COMMIT, PREPARE_ABORT, COMPLETE_COMMIT, COMPLETE_ABORT])
def test_replay_of_a_states_record_rebuilds_it(h, state):
    """The last record written for an id holds its whole state: replayed alone, it rebuilds the same value."""
    h.to_state(state, partitions=[P3, P1])
    key, value = h.log[-1]
    assert decode_txn_value(value) == h.meta().value
    fresh = TransactionCoordinator(h.config)
    fresh.replay(key, value)
    assert fresh.describe(TID).value == h.meta().value
    jobs = fresh.loaded()
    meta = h.meta()
    if state in (PREPARE_COMMIT, PREPARE_ABORT):
        assert jobs == [MarkerJob(TID, meta.producer_id, meta.producer_epoch, state is PREPARE_COMMIT,
                                  tuple(sorted([P1, P3])))]
    else:
        assert jobs == []


def test_restart_replay_of_each_prefix_matches_live_state():
    """Replaying the log up to any record gives the state the live coordinator had right after that record."""
    h = Harness()
    snapshots = []
    original = h.durable

    def durable(outcome_or_records):
        records = outcome_or_records if isinstance(outcome_or_records, list) else outcome_or_records.records
        for key, value in records:
            original([(key, value)])
            snapshots.append(dict(h.coord.transactions))
        return outcome_or_records
    h.durable = durable
    _scenario(h)
    assert len(snapshots) == len(h.log)
    for n in range(len(h.log) + 1):
        fresh = TransactionCoordinator()
        for key, value in h.log[:n]:
            fresh.replay(key, value)
        assert _values(fresh.transactions) == _values(snapshots[n - 1] if n else {})


def test_compacted_log_rebuilds_same_values():
    h = Harness(transaction_version=1)
    _scenario(h)
    fresh = TransactionCoordinator(h.config)
    for key, value in h.coord.compact_records():
        fresh.replay(key, value)
    assert {k: m.value for k, m in fresh.transactions.items()} == {k: m.value for k, m in h.coord.transactions.items()}


def test_replay_skips_records_that_do_not_decode(h):
    h.to_state(EMPTY)
    before = dict(h.coord.transactions)
    h.coord.replay(b"\x00\x07garbage", b"\x00\x00")
    h.coord.replay(encode_txn_key(TID), b"\x7f")
    assert h.coord.transactions == before


def test_every_transition_record_decodes_to_its_state(h):
    """Across a full life cycle, each record decodes to the value the coordinator then holds."""
    seen = []
    for outcome in [h.coord.init_producer_id(TID, TIMEOUT, h.tick(), h.alloc)]:
        h.durable(outcome)
        seen.append(outcome)
    pid = h.meta().producer_id
    steps = [
        lambda: h.coord.add_partitions(TID, pid, 0, [P1], h.tick()),
        lambda: h.coord.add_partitions(TID, pid, 0, [P2], h.tick()),
        lambda: h.coord.end_txn(TID, pid, 0, True, h.tick()),
        lambda: h.coord.markers_written(TID, pid, 0, h.tick()),
        lambda: h.coord.init_producer_id(TID, TIMEOUT, h.tick(), h.alloc),
        lambda: h.coord.add_partitions(TID, pid, 1, [P3], h.tick()),
        lambda: h.coord.init_producer_id(TID, TIMEOUT, h.tick(), h.alloc),        # fence
        lambda: h.coord.markers_written(TID, pid, 2, h.tick()),
        lambda: h.coord.init_producer_id(TID, TIMEOUT, h.tick(), h.alloc),
    ]
    expected_states = [ONGOING, ONGOING, PREPARE_COMMIT, COMPLETE_COMMIT, EMPTY, ONGOING, PREPARE_ABORT,
                       COMPLETE_ABORT, EMPTY]
    for step, state in zip(steps, expected_states):
        outcome = step()
        tid, value = only_record(outcome)
        h.durable(outcome)
        assert tid == TID
        assert value == h.meta().value
        assert value.state is state
    assert h.meta().producer_epoch == 3


@pytest.mark.parametrize("tv,version", [(0, 0), (1, 1), (2, 1)])
def test_record_value_version_follows_transaction_version(tv, version):
    h = Harness(transaction_version=tv)
    out = h.init()
    assert out.records[0][1][:2] == version.to_bytes(2, "big")
    assert only_record(out)[1].client_transaction_version == (tv if version else 0)


def test_illegal_transition_is_refused():
    with pytest.raises(IllegalTransition):
        TransactionCoordinator._check_transition(EMPTY, PREPARE_COMMIT)
    with pytest.raises(IllegalTransition):
        TransactionCoordinator._check_transition(COMPLETE_COMMIT, COMPLETE_ABORT)


# --- the partition side: ProducerStateManager.check_marker and commit_end_txn -------------------------------------

PID = 4242


def _txn_batch(state: ProducerStateManager, epoch: int, seq: int, offset: int, count: int = 1) -> None:
    state.commit(PID, epoch, seq, count - 1, offset, 1000 + offset, is_transactional=True)


def test_check_marker_unknown_producer_accepted():
    state = ProducerStateManager()
    assert state.check_marker(PID, 0, 0) == (0, "")
    assert state.check_marker(PID, 0, 0, strict_epoch=True) == (0, "")
    assert state.check_marker(PID, -1, -1) == (0, "")


def test_check_marker_older_epoch_is_invalid_producer_epoch():
    state = ProducerStateManager()
    _txn_batch(state, 3, 0, 0)
    code, message = state.check_marker(PID, 2, 0)
    assert code == Outcome.INVALID_PRODUCER_EPOCH == E.INVALID_PRODUCER_EPOCH.code == 47
    assert message
    assert state.check_marker(PID, 3, 0) == (0, "")
    assert state.check_marker(PID, 4, 0) == (0, "")


def test_check_marker_strict_epoch_for_transaction_version_2():
    state = ProducerStateManager()
    _txn_batch(state, 3, 0, 0)
    assert state.check_marker(PID, 3, 0, strict_epoch=True)[0] == 47
    assert state.check_marker(PID, 2, 0, strict_epoch=True)[0] == 47
    assert state.check_marker(PID, 4, 0, strict_epoch=True) == (0, "")


def test_check_marker_older_coordinator_epoch_is_fenced():
    state = ProducerStateManager()
    _txn_batch(state, 1, 0, 0)
    state.commit_end_txn(PID, 1, 1, 2000, coordinator_epoch=5)
    code, message = state.check_marker(PID, 1, 4)
    assert code == E.TRANSACTION_COORDINATOR_FENCED.code == 52
    assert message
    assert state.check_marker(PID, 1, 5) == (0, "")
    assert state.check_marker(PID, 1, 6) == (0, "")
    # The producer epoch is checked first.
    assert state.check_marker(PID, 0, 4)[0] == 47


def test_check_marker_changes_nothing():
    state = ProducerStateManager()
    _txn_batch(state, 1, 0, 0)
    snap = state.snapshot()
    state.check_marker(PID, 0, 0)
    state.check_marker(PID, 9, 9, strict_epoch=True)
    assert state.snapshot() == snap
    assert state.first_unstable_offset() == 0


def test_commit_end_txn_returns_transaction_first_offset():
    state = ProducerStateManager()
    state.commit(7, 0, 0, 1, 0, 1000)                       # someone else's non-transactional batch
    _txn_batch(state, 1, 0, 2, count=2)                     # offsets 2-3
    _txn_batch(state, 1, 2, 5)                              # offset 5
    assert state.first_unstable_offset() == 2
    assert state.commit_end_txn(PID, 1, 6, 2000, coordinator_epoch=0) == 2
    assert state.first_unstable_offset() is None
    entry = state.entry(PID)
    assert entry.current_txn_first_offset is None and entry.coordinator_epoch == 0
    assert state.map_end_offset == 7
    # A second (resumed) marker ends nothing.
    assert state.commit_end_txn(PID, 1, 7, 2001) is None
    # A marker for a producer the partition never saw: nothing to end, the producer is now known.
    assert state.commit_end_txn(99, 0, 8, 2002) is None
    assert state.entry(99).producer_epoch == 0


def test_commit_end_txn_with_bumped_epoch_fences_older_batches():
    state = ProducerStateManager()
    _txn_batch(state, 1, 0, 0)
    assert state.commit_end_txn(PID, 2, 1, 2000) == 0       # a fencing abort carries the bumped epoch
    assert state.check(PID, 1, 1, 0, True).outcome is Outcome.INVALID_PRODUCER_EPOCH
    assert state.check(PID, 3, 0, 0, True).accepted
    assert state.check(PID, 3, 5, 0, True).outcome is Outcome.OUT_OF_ORDER_SEQUENCE_NUMBER


def test_open_transactions_hold_first_unstable_offset():
    state = ProducerStateManager()
    state.commit(1, 0, 0, 0, 0, 1000, is_transactional=True)
    state.commit(2, 0, 0, 0, 1, 1000, is_transactional=True)
    state.commit(1, 0, 1, 0, 2, 1000, is_transactional=True)
    assert state.first_unstable_offset() == 0
    assert state.commit_end_txn(1, 0, 3, 1000) == 0
    assert state.first_unstable_offset() == 1
    assert state.commit_end_txn(2, 0, 4, 1000) == 1
    assert state.first_unstable_offset() is None


# --- transactions V2 (KIP-890 part 2): EndTxn v5 bumps the epoch -------------------------------------------------

def end_v2(h: Harness, pid: int, epoch: int, commit: bool, tid=TID):
    return h.coord.end_txn(tid, pid, epoch, commit, h.tick(), epoch_bump=True, allocate_producer_id=h.alloc)


def v2_ongoing(h: Harness, partitions=(P1, P2)) -> tuple[int, int]:
    """A V2 transaction: InitProducerId, then partitions added implicitly (Produce v12)."""
    out = h.init()
    pid, epoch = out.producer_id, out.producer_epoch
    assert h.durable(h.coord.add_partitions(TID, pid, epoch, partitions, h.tick(), implicit=True)).error == NONE
    assert h.meta().value.client_transaction_version == 2
    return pid, epoch


@pytest.mark.parametrize("commit", [True, False])
def test_v2_end_txn_bumps_the_epoch_and_its_markers_carry_it(commit):
    h = Harness(transaction_version=2)
    pid, epoch = v2_ongoing(h)
    out = end_v2(h, pid, epoch, commit)
    assert (out.error, out.producer_id, out.producer_epoch) == (NONE, pid, epoch + 1)
    _, value = only_record(out)
    assert value.state is (PREPARE_COMMIT if commit else PREPARE_ABORT)
    assert (value.producer_epoch, value.client_transaction_version) == (epoch + 1, 2)
    assert out.markers == MarkerJob(TID, pid, epoch + 1, commit, value.partitions, 0, 2)
    h.durable(out)
    assert h.meta().last_producer_epoch == epoch
    h.complete(TID, pid, epoch + 1)
    meta = h.meta()
    assert (meta.state, meta.producer_id, meta.producer_epoch) == \
        (COMPLETE_COMMIT if commit else COMPLETE_ABORT, pid, epoch + 1)
    # The next transaction runs at the new epoch; the old one is fenced.
    assert h.coord.add_partitions(TID, pid, epoch, [P1], h.tick(), implicit=True).error == E.PRODUCER_FENCED.code
    assert h.durable(h.coord.add_partitions(TID, pid, epoch + 1, [P3], h.tick(), implicit=True)).error == NONE
    assert end_v2(h, pid, epoch, commit).error == E.PRODUCER_FENCED.code
    assert h.durable(end_v2(h, pid, epoch + 1, commit)).producer_epoch == epoch + 2


def test_v2_retry_gets_the_same_new_epoch_back():
    h = Harness(transaction_version=2)
    pid, epoch = v2_ongoing(h)
    first = h.durable(end_v2(h, pid, epoch, True))
    # While the markers are written the retry (the epoch before the bump) waits: CONCURRENT_TRANSACTIONS.
    again = end_v2(h, pid, epoch, True)
    assert again.error == E.CONCURRENT_TRANSACTIONS.code
    no_change(again)
    assert end_v2(h, pid, epoch, False).error == E.CONCURRENT_TRANSACTIONS.code
    h.complete(TID, pid, epoch + 1)
    retry = end_v2(h, pid, epoch, True)
    assert (retry.error, retry.producer_id, retry.producer_epoch) == (NONE, first.producer_id, first.producer_epoch)
    no_change(retry)
    assert end_v2(h, pid, epoch, False).error == E.INVALID_TXN_STATE.code     # the other result of a retry
    # The epoch the state has names the next transaction: committing nothing is refused, aborting it bumps.
    assert end_v2(h, pid, epoch + 1, True).error == E.INVALID_TXN_STATE.code
    empty_abort = end_v2(h, pid, epoch + 1, False)
    assert (empty_abort.error, empty_abort.producer_epoch) == (NONE, epoch + 2)
    assert only_record(empty_abort)[1].partitions == () and empty_abort.markers.partitions == ()


def test_v2_an_older_or_newer_epoch_is_fenced_and_another_producer_id_unknown():
    h = Harness(transaction_version=2)
    pid, epoch = v2_ongoing(h)
    assert end_v2(h, pid, epoch + 1, True).error == E.PRODUCER_FENCED.code
    assert end_v2(h, pid + 1, epoch, True).error == E.INVALID_PRODUCER_ID_MAPPING.code
    assert end_v2(h, pid, epoch, True, tid="nobody").error == E.INVALID_PRODUCER_ID_MAPPING.code


def test_v2_abort_with_nothing_open_bumps_the_epoch():
    h = Harness(transaction_version=2)
    out = h.init()
    pid, epoch = out.producer_id, out.producer_epoch
    assert end_v2(h, pid, epoch, True).error == E.INVALID_TXN_STATE.code
    aborted = h.durable(end_v2(h, pid, epoch, False))
    assert (aborted.error, aborted.producer_epoch, h.state()) == (NONE, epoch + 1, PREPARE_ABORT)
    h.complete(TID, pid, epoch + 1)
    assert h.state() is COMPLETE_ABORT


def test_v2_exhausted_epoch_moves_the_client_to_a_new_producer_id():
    h = Harness(transaction_version=2)
    _force(h, TID, producer_id=500, producer_epoch=MAX_PRODUCER_EPOCH - 1, state=ONGOING, partitions=(P1,),
           start_timestamp_ms=T0, client_transaction_version=2)
    out = end_v2(h, 500, MAX_PRODUCER_EPOCH - 1, True)
    assert (out.error, out.producer_id, out.producer_epoch) == (NONE, 1000, 0)
    assert h.allocated == [1000]
    # The markers take the last epoch of the old producer id.
    assert (out.markers.producer_id, out.markers.producer_epoch) == (500, MAX_PRODUCER_EPOCH)
    h.durable(out)
    retry = end_v2(h, 500, MAX_PRODUCER_EPOCH - 1, True)
    assert retry.error == E.CONCURRENT_TRANSACTIONS.code
    h.complete(TID, 500, MAX_PRODUCER_EPOCH)
    meta = h.meta()
    assert (meta.state, meta.producer_id, meta.producer_epoch, meta.value.previous_producer_id) == \
        (COMPLETE_COMMIT, 1000, 0, 500)
    retry = end_v2(h, 500, MAX_PRODUCER_EPOCH - 1, True)                  # retryOnOverflow
    assert (retry.error, retry.producer_id, retry.producer_epoch) == (NONE, 1000, 0)
    assert h.durable(h.coord.add_partitions(TID, 1000, 0, [P1], h.tick(), implicit=True)).error == NONE


def test_v2_fence_bumps_twice_so_the_fenced_end_txn_is_no_retry():
    h = Harness(transaction_version=2)
    pid, epoch = v2_ongoing(h)
    fence = h.coord.init_producer_id(TID, TIMEOUT, h.tick(), h.alloc)
    assert fence.error == E.CONCURRENT_TRANSACTIONS.code
    assert fence.markers.producer_epoch == epoch + 2 and fence.markers.transaction_version == 2
    h.durable(fence)
    h.complete(TID, pid, epoch + 2)
    assert h.state() is COMPLETE_ABORT
    assert end_v2(h, pid, epoch, True).error == E.PRODUCER_FENCED.code
    assert end_v2(h, pid, epoch, False).error == E.PRODUCER_FENCED.code


def test_classic_end_txn_at_level_2_writes_v1_markers():
    """A librdkafka producer (EndTxn v1) on a broker at transaction.version 2: its markers keep its epoch, so they
    must not be checked by V2's strictly-newer rule."""
    h = Harness(transaction_version=2)
    pid, epoch = h.to_state(ONGOING)
    out = h.end(TID, pid, epoch, True)
    assert (out.producer_epoch, out.markers.producer_epoch, out.markers.transaction_version) == (epoch, epoch, 1)


def test_transaction_version_level_follows_update_features():
    h = Harness(transaction_version=0)
    assert h.init().records[0][1][:2] == (0).to_bytes(2, "big")
    h.coord.transaction_version = 2
    assert h.init(tid="other").records[0][1][:2] == (1).to_bytes(2, "big")


# --- Kafka 4.x's order of checks (see the table above TransactionCoordinator.end_txn) -----------------------------

def v2_prepared(h: Harness, commit: bool = True) -> tuple[int, int]:
    """A V2 transaction whose EndTxn was answered (PREPARE durable) while its markers are still being written;
    → (producer id, the bumped epoch the client now has)."""
    pid, epoch = v2_ongoing(h)
    out = h.durable(end_v2(h, pid, epoch, commit))
    assert (out.error, out.producer_epoch) == (NONE, epoch + 1)
    return pid, epoch + 1


def test_order_v2_abort_right_after_a_commit_waits_instead_of_being_fenced():
    """KAFKA-18464: the client's abort (nothing open, the bumped epoch) arrives while the commit's markers are still
    going out: CONCURRENT_TRANSACTIONS, not PRODUCER_FENCED; once they are written it bumps the epoch again."""
    h = Harness(transaction_version=2)
    pid, epoch = v2_prepared(h)
    out = end_v2(h, pid, epoch, False)
    assert out.error == E.CONCURRENT_TRANSACTIONS.code
    no_change(out)
    h.complete(TID, pid, epoch)
    out = h.durable(end_v2(h, pid, epoch, False))
    assert (out.error, out.producer_id, out.producer_epoch, h.state()) == (NONE, pid, epoch + 1, PREPARE_ABORT)


def test_order_v2_commit_before_its_produce_is_seen_waits():
    """The next transaction's commit (the bumped epoch) before the previous one's markers are written:
    CONCURRENT_TRANSACTIONS (before: PRODUCER_FENCED); with its partition added meanwhile it commits."""
    h = Harness(transaction_version=2)
    pid, epoch = v2_prepared(h, commit=False)
    assert end_v2(h, pid, epoch, True).error == E.CONCURRENT_TRANSACTIONS.code
    h.complete(TID, pid, epoch)
    assert h.durable(h.coord.add_partitions(TID, pid, epoch, [P3], h.tick(), implicit=True)).error == NONE
    out = h.durable(end_v2(h, pid, epoch, True))
    assert (out.error, out.producer_epoch, h.state()) == (NONE, epoch + 1, PREPARE_COMMIT)


@pytest.mark.parametrize("who", ["older-epoch", "newer-epoch", "other-producer-id"])
def test_order_v2_in_flight_answers_before_the_producer_checks(who):
    """In flight comes first in V2's EndTxn: a stale, unknown-epoch or other-producer EndTxn waits too, and gets its
    error from the state after the transition."""
    h = Harness(transaction_version=2)
    pid, epoch = v2_prepared(h)
    ask_pid, ask_epoch, after = {
        "older-epoch": (pid, epoch - 2, E.PRODUCER_FENCED.code),
        "newer-epoch": (pid, epoch + 1, E.PRODUCER_FENCED.code),
        "other-producer-id": (pid + 7, epoch, E.INVALID_PRODUCER_ID_MAPPING.code),
    }[who]
    assert end_v2(h, ask_pid, ask_epoch, True).error == E.CONCURRENT_TRANSACTIONS.code
    h.complete(TID, pid, epoch)
    assert end_v2(h, ask_pid, ask_epoch, True).error == after


def test_order_v2_exhausted_epoch_new_producer_id_waits_for_the_markers():
    """KAFKA-18660: after an EndTxn that ran out of epochs the client has the new producer id at epoch 0, which the
    transaction takes only with its COMPLETE record: until then CONCURRENT_TRANSACTIONS (not
    INVALID_PRODUCER_ID_MAPPING), for EndTxn and AddPartitionsToTxn alike."""
    h = Harness(transaction_version=2)
    _force(h, TID, producer_id=500, producer_epoch=MAX_PRODUCER_EPOCH - 1, state=ONGOING, partitions=(P1,),
           start_timestamp_ms=T0, client_transaction_version=2)
    out = h.durable(end_v2(h, 500, MAX_PRODUCER_EPOCH - 1, True))
    assert (out.producer_id, out.producer_epoch) == (1000, 0)
    assert end_v2(h, 1000, 0, False).error == E.CONCURRENT_TRANSACTIONS.code
    assert h.coord.add_partitions(TID, 1000, 0, [P2], h.tick(), implicit=True).error == E.CONCURRENT_TRANSACTIONS.code
    h.complete(TID, 500, MAX_PRODUCER_EPOCH)
    out = h.durable(end_v2(h, 1000, 0, False))
    assert (out.error, out.producer_id, out.producer_epoch) == (NONE, 1000, 1)


def test_order_v2_new_id_whose_init_is_in_flight():
    """A V2 EndTxn for an id whose first InitProducerId record is still being written: in flight first."""
    h = Harness(transaction_version=2)
    h.coord.init_producer_id(TID, TIMEOUT, h.tick(), h.alloc)         # staged, not yet durable
    assert end_v2(h, 1000, 0, False).error == E.CONCURRENT_TRANSACTIONS.code
    assert h.coord.end_txn(TID, 1000, 0, False, h.tick()).error == E.INVALID_PRODUCER_ID_MAPPING.code   # classic


@pytest.mark.parametrize("state", [PREPARE_COMMIT, PREPARE_ABORT], ids=lambda s: s.kafka_name)
def test_order_classic_producer_checks_come_before_in_flight(h, state):
    """Classic EndTxn keeps Kafka's older order: producer id, epoch, then in flight, then the state."""
    pid, epoch = h.to_state(state)
    assert h.coord.end_txn(TID, pid + 1, epoch, True, h.tick()).error == E.INVALID_PRODUCER_ID_MAPPING.code
    assert h.coord.end_txn(TID, pid, epoch - 1, True, h.tick()).error == E.PRODUCER_FENCED.code
    for commit in (True, False):
        assert h.coord.end_txn(TID, pid, epoch, commit, h.tick()).error == E.CONCURRENT_TRANSACTIONS.code


@pytest.mark.parametrize("implicit", [False, True], ids=["classic", "implicit"])
def test_order_add_partitions_in_flight_comes_first(h, implicit):
    """KAFKA-18660: AddPartitionsToTxn answers a transition in flight before the producer id and epoch checks."""
    pid, epoch = h.to_state(PREPARE_ABORT)
    for ask_pid, ask_epoch in ((pid, epoch), (pid + 1, epoch), (pid, epoch - 1), (pid, epoch + 1)):
        out = h.coord.add_partitions(TID, ask_pid, ask_epoch, [P3], h.tick(), implicit=implicit)
        assert out.partition_errors == {P3: E.CONCURRENT_TRANSACTIONS.code}
    h.complete(TID, pid, epoch)
    assert h.coord.add_partitions(TID, pid + 1, epoch, [P3], h.tick()).error == E.INVALID_PRODUCER_ID_MAPPING.code
    assert h.coord.add_partitions(TID, pid, epoch + 1, [P3], h.tick()).error == E.PRODUCER_FENCED.code


def test_order_verification_keeps_producer_checks_first(h):
    """Kafka's handleVerifyPartitionsInTransaction checks the producer id and epoch before anything else."""
    pid, epoch = h.to_state(PREPARE_COMMIT, partitions=[P1])
    assert h.coord.verify_partitions(TID, pid + 1, epoch, [P1]) == {P1: E.INVALID_PRODUCER_ID_MAPPING.code}
    assert h.coord.verify_partitions(TID, pid, epoch + 1, [P1]) == {P1: E.PRODUCER_FENCED.code}
    assert h.coord.verify_partitions(TID, pid, epoch, [P1]) == {P1: E.CONCURRENT_TRANSACTIONS.code}


def test_order_empty_transactional_id_is_invalid_request(h):
    assert h.coord.end_txn("", 1, 0, True, h.tick()).error == E.INVALID_REQUEST.code
    assert end_v2(h, 1, 0, False, tid="").error == E.INVALID_REQUEST.code
    assert h.coord.add_partitions("", 1, 0, [P1], h.tick()).partition_errors == {P1: E.INVALID_REQUEST.code}


def test_order_a_staged_complete_record_is_built_on():
    """Once the markers are written the COMPLETE record is only staged: the next EndTxn builds on it (its own record
    follows it in the log) — the answer Kafka gives the client's retry once COMPLETE is written."""
    h = Harness(transaction_version=2)
    pid, epoch = v2_prepared(h)
    staged = h.coord.markers_written(TID, pid, epoch, h.tick())
    assert staged.error == NONE and TID in h.coord.pending
    out = end_v2(h, pid, epoch, False)
    assert (out.error, out.producer_epoch) == (NONE, epoch + 1)

def test_list_duration_filter_means_running_longer_than_it():
    """ListTransactions v1 DurationFilter, as Kafka's TransactionStateManager: excluded when now - start <= filter."""
    h = Harness()
    pid, epoch = h.init().producer_id, 0
    h.add(TID, pid, epoch, [P1])
    start = h.meta().value.start_timestamp_ms
    assert [m.transactional_id for m in h.coord.list(duration_filter_ms=10, now_ms=start + 10)] == []
    assert [m.transactional_id for m in h.coord.list(duration_filter_ms=10, now_ms=start + 11)] == [TID]
    assert [m.transactional_id for m in h.coord.list(duration_filter_ms=-1, now_ms=start)] == [TID]
