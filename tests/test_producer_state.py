"""Tests for per-partition idempotent-producer state: sequences, epochs, duplicates, recovery, expiry."""
from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings, strategies as st

from trireme.state.producer_state import (
    MAX_SEQUENCE,
    Outcome,
    ProducerStateError,
    ProducerStateManager,
    increment_sequence,
)

PID = 1000


@dataclass
class Header:
    producer_id: int
    producer_epoch: int
    base_sequence: int
    last_offset_delta: int
    base_offset: int
    max_timestamp: int
    is_control: bool = False
    is_transactional: bool = False


class Log:
    """A toy partition: checks, appends and remembers headers the way the real append path will."""

    def __init__(self) -> None:
        self.state = ProducerStateManager()
        self.headers: list[Header] = []
        self.end = 0

    def produce(self, pid, epoch, seq, count=1, ts=1000, txn=False):
        """Returns (outcome, base offset answered)."""
        result = self.state.check(pid, epoch, seq, count - 1, txn)
        if result.is_duplicate:
            return result.outcome, result.duplicate.first_offset
        if not result.accepted:
            return result.outcome, -1
        base = self.end
        self.state.commit(pid, epoch, seq, count - 1, base, ts, txn)
        self.headers.append(Header(pid, epoch, seq, count - 1, base, ts, False, txn))
        self.end += count
        return result.outcome, base

    def marker(self, pid, epoch, ts=1000):
        first = self.state.commit_end_txn(pid, epoch, self.end, ts)
        self.headers.append(Header(pid, epoch, -1, 0, self.end, ts, True, True))
        self.end += 1
        return first


def test_non_idempotent_batches_always_accepted():
    log = Log()
    assert log.produce(-1, -1, -1) == (Outcome.ACCEPT, 0)
    assert log.produce(-1, -1, -1) == (Outcome.ACCEPT, 1)
    assert len(log.state) == 0
    assert log.state.map_end_offset == 2


def test_in_order_batches_accepted():
    log = Log()
    assert log.produce(PID, 0, 0, count=3) == (Outcome.ACCEPT, 0)
    assert log.produce(PID, 0, 3, count=2) == (Outcome.ACCEPT, 3)
    assert log.produce(PID, 0, 5) == (Outcome.ACCEPT, 5)
    entry = log.state.entry(PID)
    assert entry.producer_epoch == 0
    assert entry.last_seq == 5
    assert entry.last_offset == 5


def test_unknown_producer_accepts_any_sequence():
    log = Log()
    assert log.produce(PID, 3, 42) == (Outcome.ACCEPT, 0)
    assert log.produce(PID, 3, 43) == (Outcome.ACCEPT, 1)


def test_each_of_last_five_batches_is_a_duplicate_with_its_original_offset():
    log = Log()
    offsets = [log.produce(PID, 0, seq * 2, count=2)[1] for seq in range(7)]
    # Batches 2..6 (sequences 4..13) are cached; each retry answers the original offset.
    for i in range(2, 7):
        result = log.state.check(PID, 0, i * 2, 1, False)
        assert result.outcome is Outcome.DUPLICATE_SEQUENCE_NUMBER
        assert result.error_code == 0
        assert result.duplicate.first_offset == offsets[i]
        assert result.duplicate.last_offset == offsets[i] + 1
        assert log.produce(PID, 0, i * 2, count=2) == (Outcome.DUPLICATE_SEQUENCE_NUMBER, offsets[i])
    assert log.end == 14  # nothing appended by the retries


def test_batch_older_than_the_cache_is_out_of_order():
    log = Log()
    for seq in range(6):
        log.produce(PID, 0, seq)
    result = log.state.check(PID, 0, 0, 0, False)  # sixth-oldest: evicted from the cache
    assert result.outcome is Outcome.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert result.error_code == 45
    assert log.state.check(PID, 0, 1, 0, False).is_duplicate


def test_partial_overlap_with_cached_batch_is_out_of_order():
    log = Log()
    log.produce(PID, 0, 0, count=3)
    assert log.state.check(PID, 0, 0, 1, False).outcome is Outcome.OUT_OF_ORDER_SEQUENCE_NUMBER


def test_sequence_gap_is_out_of_order_and_changes_nothing():
    log = Log()
    log.produce(PID, 0, 0)
    before = log.state.snapshot()
    assert log.produce(PID, 0, 2) == (Outcome.OUT_OF_ORDER_SEQUENCE_NUMBER, -1)
    assert log.state.snapshot() == before
    assert log.produce(PID, 0, 1) == (Outcome.ACCEPT, 1)


def test_sequence_wraps_after_int32_max():
    assert increment_sequence(MAX_SEQUENCE, 1) == 0
    assert increment_sequence(MAX_SEQUENCE - 1, 3) == 1
    log = Log()
    log.produce(PID, 0, MAX_SEQUENCE - 1, count=2)  # last sequence MAX
    assert log.produce(PID, 0, 0, count=2) == (Outcome.ACCEPT, 2)
    # A batch straddling the wrap: base MAX-1, 4 records → last sequence 1.
    log2 = Log()
    log2.produce(PID, 0, MAX_SEQUENCE - 2)
    assert log2.produce(PID, 0, MAX_SEQUENCE - 1, count=4) == (Outcome.ACCEPT, 1)
    assert log2.state.entry(PID).last_seq == 1
    assert log2.produce(PID, 0, MAX_SEQUENCE - 1, count=4) == (Outcome.DUPLICATE_SEQUENCE_NUMBER, 1)
    assert log2.produce(PID, 0, 2) == (Outcome.ACCEPT, 5)


def test_lower_epoch_is_fenced():
    log = Log()
    log.produce(PID, 5, 0)
    result = log.state.check(PID, 4, 1, 0, False)
    assert result.outcome is Outcome.INVALID_PRODUCER_EPOCH
    assert result.error_code == 47


def test_epoch_bump_resets_sequence_to_zero():
    log = Log()
    log.produce(PID, 0, 0, count=10)
    assert log.produce(PID, 1, 10) == (Outcome.OUT_OF_ORDER_SEQUENCE_NUMBER, -1)
    assert log.produce(PID, 1, 0, count=2) == (Outcome.ACCEPT, 10)
    # The old epoch's batches are no longer cached, and the old epoch is fenced.
    assert log.state.check(PID, 0, 0, 9, False).outcome is Outcome.INVALID_PRODUCER_EPOCH
    assert log.produce(PID, 1, 2) == (Outcome.ACCEPT, 12)


def test_duplicate_needs_same_epoch():
    log = Log()
    log.produce(PID, 0, 0)
    assert log.state.check(PID, 1, 0, 0, False).outcome is Outcome.ACCEPT  # new epoch, seq 0


def test_commit_refuses_what_check_refuses():
    state = ProducerStateManager()
    state.commit(PID, 0, 0, 0, 0, 1)
    with pytest.raises(ProducerStateError):
        state.commit(PID, 0, 5, 0, 1, 1)
    with pytest.raises(ProducerStateError):
        state.commit(PID, 0, 0, 0, 1, 1)  # duplicate


def test_multi_batch_request_checks_against_pending_batches():
    state = ProducerStateManager()
    state.commit(PID, 0, 0, 4, 0, 1)  # seq 0..4
    append = state.begin()
    assert append.check(PID, 0, 5, 4, False).accepted
    append.commit(PID, 0, 5, 4, 5, 1)
    assert append.check(PID, 0, 5, 4, False).outcome is Outcome.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert append.check(PID, 0, 11, 0, False).outcome is Outcome.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert append.check(PID, 0, 10, 0, False).accepted
    # Duplicates are recognised against committed state only, as Kafka does.
    assert append.check(PID, 0, 0, 4, False).is_duplicate
    append.commit(PID, 0, 10, 0, 10, 1)
    # Nothing reaches the manager before apply().
    assert state.entry(PID).last_seq == 4
    assert state.map_end_offset == 5
    append.apply()
    assert state.entry(PID).last_seq == 10
    assert state.map_end_offset == 11


def test_multi_batch_new_producer_and_epoch_bump_in_one_request():
    state = ProducerStateManager()
    append = state.begin()
    append.commit(PID, 0, 7, 0, 0, 1)  # unknown producer: any sequence
    assert append.check(PID, 0, 9, 0, False).outcome is Outcome.OUT_OF_ORDER_SEQUENCE_NUMBER
    append.commit(PID, 0, 8, 0, 1, 1)
    append.commit(PID, 1, 0, 0, 2, 1)
    assert append.check(PID, 0, 9, 0, False).outcome is Outcome.INVALID_PRODUCER_EPOCH
    append.apply()
    assert state.entry(PID).producer_epoch == 1
    assert state.entry(PID).last_seq == 0


def test_an_overlay_used_after_apply_changes_the_manager_only_when_applied_again():
    state = ProducerStateManager()
    append = state.begin()
    append.commit(PID, 0, 0, 0, 0, 1)
    append.apply()
    applied = state.snapshot()
    append.commit(PID, 0, 1, 0, 1, 1)
    assert state.snapshot() == applied and state.entry(PID).last_seq == 0
    assert append.check(PID, 0, 2, 0, False).accepted      # checked against its own pending batch
    append.apply()
    assert state.entry(PID).last_seq == 1 and state.map_end_offset == 2


def test_abandoned_overlay_leaves_manager_untouched():
    state = ProducerStateManager()
    state.commit(PID, 0, 0, 0, 0, 1)
    before = state.snapshot()
    append = state.begin()
    append.commit(PID, 0, 1, 0, 1, 1)
    append.commit(PID + 1, 0, 0, 0, 2, 1)
    assert state.snapshot() == before


def test_transactions_track_first_offset_and_reject_non_transactional_batches():
    log = Log()
    log.produce(PID, 0, 0, txn=True)
    log.produce(PID + 1, 0, 0)
    log.produce(PID, 0, 1, txn=True)
    assert log.state.entry(PID).current_txn_first_offset == 0
    assert log.state.first_unstable_offset() == 0
    result = log.state.check(PID, 0, 2, 0, False)
    assert result.outcome is Outcome.INVALID_TXN_STATE
    assert log.marker(PID, 0) == 0
    assert log.state.first_unstable_offset() is None
    assert log.produce(PID, 0, 2) == (Outcome.ACCEPT, 4)  # sequences continue after the marker


def test_marker_with_new_epoch_resets_sequences_and_older_marker_is_refused():
    log = Log()
    log.produce(PID, 0, 0, count=3, txn=True)
    log.marker(PID, 1)
    assert log.state.entry(PID).producer_epoch == 1
    assert log.state.check(PID, 1, 3, 0, True).outcome is Outcome.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert log.state.check(PID, 1, 0, 0, True).accepted
    with pytest.raises(ProducerStateError):
        log.state.commit_end_txn(PID, 0, log.end, 1)


def test_rebuild_from_headers_equals_live_state():
    log = Log()
    log.produce(PID, 0, 0, count=3)
    log.produce(-1, -1, -1)
    log.produce(PID + 1, 2, 100, txn=True)
    for seq in range(3, 10):
        log.produce(PID, 0, seq)
    log.marker(PID + 1, 2)
    log.produce(PID, 1, 0)
    log.produce(PID + 2, 0, 0, txn=True)
    rebuilt = ProducerStateManager()
    rebuilt.rebuild(log.headers)
    assert rebuilt.snapshot() == log.state.snapshot()
    assert rebuilt.map_end_offset == log.end
    assert rebuilt.first_unstable_offset() == log.state.first_unstable_offset()


def test_snapshot_round_trip_and_tail_replay():
    log = Log()
    for seq in range(8):
        log.produce(PID, 0, seq, txn=seq >= 6)
    log.produce(PID + 1, 3, 0, ts=5)
    data = log.state.snapshot()
    covered = len(log.headers)
    log.produce(PID, 0, 8, txn=True)
    log.marker(PID, 0)
    log.produce(PID + 1, 3, 1)

    restored = ProducerStateManager()
    offset = restored.load_snapshot(data)
    assert offset == log.headers[covered].base_offset
    for header in log.headers:  # already-covered batches are skipped
        restored.load_batch(header)
    assert restored.snapshot() == log.state.snapshot()
    assert restored.check(PID, 0, 9, 0, False).accepted
    assert restored.check(PID, 0, 8, 0, True).duplicate.first_offset == 9


@pytest.mark.parametrize("data", [b"", b"{}", b"[1]", b'{"version":2,"offset":0,"producers":[]}',
                                  b'{"version":1,"offset":"0","producers":[]}',
                                  b'{"version":1,"offset":0,"producers":[{"id":1}]}'])
def test_malformed_snapshot_is_refused_without_changing_state(data):
    state = ProducerStateManager()
    state.commit(PID, 0, 0, 0, 0, 1)
    before = state.snapshot()
    with pytest.raises(ProducerStateError):
        state.load_snapshot(data)
    assert state.snapshot() == before


def test_expiry_removes_idle_producers_but_not_open_transactions():
    state = ProducerStateManager(producer_id_expiration_ms=1000)
    state.commit(PID, 0, 0, 0, 0, 100)
    state.commit(PID + 1, 0, 0, 0, 1, 500)
    state.commit(PID + 2, 0, 0, 0, 2, 100, is_transactional=True)
    assert state.expire(now_ms=1099) == []
    assert state.expire(now_ms=1100) == [PID]
    assert state.entry(PID) is None
    assert state.entry(PID + 2) is not None
    # An expired producer is unknown again, so any sequence is accepted.
    assert state.check(PID, 0, 17, 0, False).accepted


def test_default_expiration_is_one_day():
    assert ProducerStateManager().producer_id_expiration_ms == 86_400_000


# --- property: rebuilt and snapshot-restored state equal live state ------------------------

_ops = st.lists(
    st.tuples(
        st.sampled_from([-1, 1, 2, 3]),          # producer id
        st.integers(0, 2),                        # epoch
        st.sampled_from(["next", "dup", "gap", "zero", "wrap"]),
        st.integers(1, 4),                        # record count
        st.booleans(),                            # transactional
        st.booleans(),                            # write a marker afterwards
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(_ops, st.integers(0, 40))
def test_rebuild_and_snapshot_match_live_state(ops, cut):
    log = Log()
    snapshot_at = None
    for i, (pid, epoch, kind, count, txn, marker) in enumerate(ops):
        if i == cut:
            snapshot_at = (log.state.snapshot(), len(log.headers))
        entry = log.state.entry(pid) if pid != -1 else None
        seq = {"next": increment_sequence(entry.last_seq, 1) if entry and entry.batches else 0,
               "dup": entry.batches[0].first_seq if entry and entry.batches else 0,
               "gap": 5, "zero": 0, "wrap": MAX_SEQUENCE - 1}[kind]
        if pid == -1:
            epoch, seq, txn = -1, -1, False
        outcome, _ = log.produce(pid, epoch, seq, count, ts=i, txn=txn)
        assert outcome in set(Outcome)
        assert log.state.first_unstable_offset() == _scanned_first_unstable(log.state)
        if marker and pid != -1 and log.state.entry(pid) is not None \
                and log.state.entry(pid).producer_epoch <= epoch:
            log.marker(pid, epoch, ts=i)
    rebuilt = ProducerStateManager()
    rebuilt.rebuild(log.headers)
    assert rebuilt.snapshot() == log.state.snapshot()
    if snapshot_at is not None:
        restored = ProducerStateManager()
        restored.load_snapshot(snapshot_at[0])
        for header in log.headers:
            restored.load_batch(header)
        assert restored.snapshot() == log.state.snapshot()
        assert restored.first_unstable_offset() == log.state.first_unstable_offset()
    assert rebuilt.first_unstable_offset() == _scanned_first_unstable(log.state)


def _scanned_first_unstable(state):
    """The LSO bound the slow way, against the manager's incremental index."""
    starts = [e.current_txn_first_offset for e in state.entries() if e.current_txn_first_offset is not None]
    return min(starts) if starts else None
