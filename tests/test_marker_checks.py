"""Unit tests for checking a client's transaction marker against the coordinator: TransactionCoordinator.producer_transactions and ProducerTransaction.check_marker.

The property: every marker the coordinator itself writes (classic, V2 with its bumped epoch, V2 at the last epoch,
a fence, a KIP-939 kept transaction) passes; any other marker for a partition of an open transaction is refused;
elsewhere only an ABORT at an epoch the coordinator gave the producer passes (a hanging transaction's abort).
"""
from __future__ import annotations

import pytest

import trireme.wire.error_codes as E
from tests.test_transactions import P1, P2, P3, TID, Harness, _force, end_v2, v2_ongoing
from trireme.state.transactions import MAX_PRODUCER_EPOCH
from trireme.state.txn_records import TxnState

NONE = E.NONE.code
OTHER = ("orders", 9)


def check(h: Harness, pid: int, epoch: int, commit: bool, partition, coordinator_epoch: int = 0) -> int:
    txn = h.coord.producer_transactions([pid]).get(pid)
    assert txn is not None, f"the coordinator has no transaction for producer {pid}"
    return txn.check_marker(epoch, commit, coordinator_epoch, partition)[0]


def passes_own_markers(h: Harness, job) -> None:
    for tp in job.partitions:
        assert check(h, job.producer_id, job.producer_epoch, job.commit, tp, job.coordinator_epoch) == NONE


def test_unknown_producer_ids_are_not_reported():
    h = Harness()
    out = h.init()
    assert h.coord.producer_transactions([out.producer_id + 1, -1]) == {}
    assert set(h.coord.producer_transactions([out.producer_id])) == {out.producer_id}


@pytest.mark.parametrize("commit", [True, False])
def test_classic_transaction(commit):
    h = Harness()
    out = h.init()
    pid, epoch = out.producer_id, out.producer_epoch
    h.add(TID, pid, epoch, [P1, P2])
    # Ongoing: no marker at all on its partitions, whatever it says.
    for c in (True, False):
        for e in (epoch, epoch + 1, MAX_PRODUCER_EPOCH):
            assert check(h, pid, e, c, P1) == E.INVALID_TXN_STATE.code
    # An EndTxn whose PREPARE is not durable yet: still not prepared.
    prepare = h.coord.end_txn(TID, pid, epoch, commit, h.tick())
    assert check(h, pid, epoch, commit, P1) == E.INVALID_TXN_STATE.code
    h.durable(prepare)
    passes_own_markers(h, prepare.markers)
    assert check(h, pid, epoch, not commit, P1) == E.INVALID_TXN_STATE.code
    assert check(h, pid, epoch + 1, commit, P1) == E.INVALID_PRODUCER_EPOCH.code
    assert check(h, pid, epoch - 1, commit, P1) == E.INVALID_PRODUCER_EPOCH.code
    assert check(h, pid, epoch, commit, P1, coordinator_epoch=-1) == E.TRANSACTION_COORDINATOR_FENCED.code
    assert check(h, pid, epoch, commit, P1, coordinator_epoch=1) == E.TRANSACTION_COORDINATOR_FENCED.code
    # Another partition: no transaction of this producer there that the coordinator knows.
    assert check(h, pid, epoch, True, P3) == E.INVALID_TXN_STATE.code
    assert check(h, pid, epoch, False, P3) == NONE
    assert check(h, pid, epoch + 1, False, P3) == E.INVALID_PRODUCER_EPOCH.code
    assert check(h, pid, epoch, False, P3, coordinator_epoch=-1) == NONE
    assert check(h, pid, epoch, False, P3, coordinator_epoch=1) == E.TRANSACTION_COORDINATOR_FENCED.code
    h.complete(TID, pid, epoch)
    # Complete: a hanging transaction's abort may pass, at an epoch the producer was given; no commit.
    assert check(h, pid, epoch, True, P1) == E.INVALID_TXN_STATE.code
    assert check(h, pid, epoch, False, P1) == NONE
    assert check(h, pid, MAX_PRODUCER_EPOCH, False, P1) == E.INVALID_PRODUCER_EPOCH.code


def test_an_add_being_written_counts_as_open():
    """AddPartitionsToTxn is answered once staged and produce verification accepts a staged add: a marker must
    not end the producer's batches on that partition behind the coordinator's back."""
    h = Harness()
    out = h.init()
    pid, epoch = out.producer_id, out.producer_epoch
    h.add(TID, pid, epoch, [P1])
    staged = h.coord.add_partitions(TID, pid, epoch, [P2], h.tick())
    assert staged.records and check(h, pid, epoch, False, P2) == E.INVALID_TXN_STATE.code
    h.durable(staged)
    assert check(h, pid, epoch, False, P2) == E.INVALID_TXN_STATE.code


@pytest.mark.parametrize("commit", [True, False])
def test_v2_markers_carry_the_bumped_epoch(commit):
    h = Harness(transaction_version=2)
    pid, epoch = v2_ongoing(h)
    out = h.durable(end_v2(h, pid, epoch, commit))
    passes_own_markers(h, out.markers)
    assert out.markers.producer_epoch == epoch + 1
    assert check(h, pid, epoch, commit, P1) == E.INVALID_PRODUCER_EPOCH.code
    h.complete(TID, pid, epoch + 1)
    assert check(h, pid, epoch + 1, False, P1) == NONE
    assert check(h, pid, epoch + 2, False, P1) == E.INVALID_PRODUCER_EPOCH.code


def test_v2_at_the_last_epoch_markers_take_it_and_the_next_producer_id_has_no_transaction():
    h = Harness(transaction_version=2)
    pid = 500
    _force(h, TID, producer_id=pid, producer_epoch=MAX_PRODUCER_EPOCH - 1, state=TxnState.ONGOING,
           partitions=(P1, P2), client_transaction_version=2)
    out = h.durable(end_v2(h, pid, MAX_PRODUCER_EPOCH - 1, True))
    assert out.markers.producer_epoch == MAX_PRODUCER_EPOCH
    passes_own_markers(h, out.markers)
    new_pid = h.meta().value.next_producer_id
    assert new_pid not in (pid, -1)
    assert check(h, new_pid, 0, True, P1) == E.INVALID_TXN_STATE.code
    assert check(h, new_pid, 0, False, P1) == NONE
    assert check(h, new_pid, 1, False, P1) == E.INVALID_PRODUCER_EPOCH.code
    h.complete(TID, pid, MAX_PRODUCER_EPOCH)
    assert h.meta().producer_id == new_pid
    assert h.coord.producer_transactions([pid]) == {}      # the old producer id is free of the coordinator


@pytest.mark.parametrize("tv", [0, 2])
def test_a_fence_aborts_with_its_own_epoch(tv):
    h = Harness(transaction_version=tv)
    if tv:
        pid, epoch = v2_ongoing(h)
    else:
        out = h.init()
        pid, epoch = out.producer_id, out.producer_epoch
        h.add(TID, pid, epoch, [P1, P2])
    fenced = h.durable(h.coord.abort_timed_out(h.now + 10**9)[0])
    passes_own_markers(h, fenced.markers)
    assert check(h, pid, epoch, False, P1) == E.INVALID_PRODUCER_EPOCH.code


def test_kip939_kept_transaction_keeps_its_own_pair():
    h = Harness(two_phase_commit_enable=True)
    first = h.init(enable_2pc=True)
    pid, epoch = first.producer_id, first.producer_epoch
    h.add(TID, pid, epoch, [P1, P2])
    h.init(enable_2pc=True, keep_prepared_txn=True)       # the client now has (pid, epoch + 1)
    assert h.state() is TxnState.ONGOING
    for e in (epoch, epoch + 1):
        assert check(h, pid, e, True, P1) == E.INVALID_TXN_STATE.code      # still only prepared by the 2PC client
    assert check(h, pid, epoch + 1, False, P3) == NONE                      # the client's epoch: given
    assert check(h, pid, epoch + 2, False, P3) == E.INVALID_PRODUCER_EPOCH.code
    out = h.end(TID, pid, epoch + 1, True)
    passes_own_markers(h, out.markers)
    assert check(h, pid, epoch + 1, True, P1) == E.INVALID_PRODUCER_EPOCH.code


def test_orphaned_transaction_abort_passes():
    """What abort_orphans writes (a transaction open on a partition the coordinator never recorded) would pass the
    check too, though the coordinator's own markers skip it."""
    h = Harness()
    out = h.init()
    pid, epoch = out.producer_id, out.producer_epoch
    (job,) = h.coord.orphaned([(OTHER, pid, epoch)])
    passes_own_markers(h, job)


# --- the partition side: an unknown producer is checked as one at epoch -1 and coordinator epoch -1, as on Kafka

def test_partition_check_refuses_impossible_markers_for_an_unknown_producer():
    from trireme.state.producer_state import ProducerStateManager
    state = ProducerStateManager()
    assert state.check_marker(7, -2, 0)[0] == E.INVALID_PRODUCER_EPOCH.code
    assert state.check_marker(7, -32768, 0)[0] == E.INVALID_PRODUCER_EPOCH.code
    assert state.check_marker(7, 0, -2)[0] == E.TRANSACTION_COORDINATOR_FENCED.code
    assert state.check_marker(7, -1, 0, strict_epoch=True)[0] == E.INVALID_PRODUCER_EPOCH.code
    assert state.check_marker(-1, 0, 0)[0] == E.INVALID_REQUEST.code
    assert state.check_marker(7, -1, -1) == (NONE, "")
    assert state.check_marker(7, 0, 0, strict_epoch=True) == (NONE, "")
    assert len(state) == 0
    # What the check accepts, commit_end_txn records without complaint.
    state.commit_end_txn(7, -1, 0, 1, -1)
    assert state.entry(7).producer_epoch == -1


def test_marker_applied_only_at_the_epoch_with_nothing_open():
    from trireme.state.producer_state import ProducerStateManager
    state = ProducerStateManager()
    assert not state.marker_applied(7, 1)                        # unknown producer
    state.commit(7, 0, 0, 0, 0, 10, is_transactional=True)       # a transaction open at epoch 0
    assert not state.marker_applied(7, 0) and not state.marker_applied(7, 1)
    state.commit_end_txn(7, 1, 1, 11)                            # its V2 marker at the bumped epoch 1
    assert state.marker_applied(7, 1)
    assert state.check_marker(7, 1, 0, strict_epoch=True)[0] == E.INVALID_PRODUCER_EPOCH.code
    assert not state.marker_applied(7, 0) and not state.marker_applied(7, 2)
    state.commit(7, 1, 0, 0, 2, 12, is_transactional=True)       # the next transaction, at epoch 1
    assert not state.marker_applied(7, 1)
