"""Tests for durable producer id allocation: ids only from reservations that are durable records, unique across restarts and crashes at any point."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from trireme.state.producer_ids import BLOCK_SIZE, ProducerIdError, ProducerIdManager, read_legacy_block_end
from trireme.state.storage import MemoryStorage


def restart(log: list, block_size: int = BLOCK_SIZE) -> ProducerIdManager:
    """A manager that replayed the durable ``log`` at start-up."""
    manager = ProducerIdManager(block_size)
    for key, value in log:
        manager.replay(key, value)
    manager.loaded()
    return manager


def reserve(manager: ProducerIdManager, log: list) -> None:
    """A reservation made durable (appended to the log) and replayed."""
    records = manager.reserve()
    log.extend(records)
    for key, value in records:
        manager.replay(key, value)


def test_no_id_before_a_durable_reservation():
    log: list = []
    manager = restart(log)
    with pytest.raises(ProducerIdError):
        manager.next_id()
    records = manager.reserve()
    with pytest.raises(ProducerIdError):            # decided, not yet replayed: still nothing
        manager.next_id()
    for key, value in records:
        manager.replay(key, value)
    assert [manager.next_id() for _ in range(5)] == [0, 1, 2, 3, 4]
    assert manager.available() == BLOCK_SIZE - 5


def test_a_reservation_ahead_extends_the_current_block():
    log: list = []
    manager = restart(log, block_size=10)
    reserve(manager, log)
    assert [manager.next_id() for _ in range(6)] == list(range(6))
    reserve(manager, log)                           # ahead, while 4 ids of the first block remain
    assert [manager.next_id() for _ in range(14)] == list(range(6, 20))
    assert manager.available() == 0 and len(log) == 2


def test_restart_resumes_after_the_reserved_block():
    log: list = []
    first = restart(log)
    reserve(first, log)
    handed_out = [first.next_id() for _ in range(3)]
    second = restart(log)                           # the rest of the block is skipped
    reserve(second, log)
    assert second.next_id() == BLOCK_SIZE
    assert not set(handed_out) & {BLOCK_SIZE}
    assert restart(second.live_records()).block_end == 2 * BLOCK_SIZE        # compaction keeps the latest


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.booleans()), min_size=1, max_size=8), st.integers(1, 7))
def test_never_an_id_twice_across_crashes(lives, block_size):
    """Each life hands out some ids (reserving as needed), then dies, possibly with a reservation decided but not
    yet durable (lost)."""
    log: list = []
    seen: list[int] = []
    for count, crash_in_reservation in lives:
        manager = restart(log, block_size)
        for _ in range(count):
            if manager.available() == 0:
                reserve(manager, log)
            seen.append(manager.next_id())
        if crash_in_reservation:
            manager.reserve()                       # appended, never durable: not in the log
            with pytest.raises(ProducerIdError):
                while True:
                    seen.append(manager.next_id())
        # The manager is discarded here: everything in memory is lost.
    assert len(seen) == len(set(seen))


def test_handed_out():
    log: list = []
    ids = restart(log, block_size=10)
    reserve(ids, log)
    assert not ids.handed_out(0)
    first, second = ids.next_id(), ids.next_id()
    assert ids.handed_out(first) and ids.handed_out(second)
    assert not ids.handed_out(second + 1) and not ids.handed_out(-1)
    again = restart(log, block_size=10)             # a restart: above the reserved block
    assert again.handed_out(second) and again.handed_out(9) and not again.handed_out(10)


@pytest.mark.parametrize("data", [b"", b"garbage", b'{"version":1}', b'{"version":9,"block_end":5}',
                                  b'{"version":1,"block_end":-1}', b'{"version":1,"block_end":"5"}'])
def test_unreadable_legacy_file_is_an_error_not_a_restart_from_zero(data):
    storage = MemoryStorage()
    storage.write_atomic("producer_ids", data)
    with pytest.raises(ValueError):
        read_legacy_block_end(storage)


# --- several brokers on one metadata log (a cluster: Kafka's AllocateProducerIds) -----------------------------


def test_brokers_sharing_the_log_hand_out_only_their_own_blocks():
    """Every broker replays every reservation, but hands out ids only from the blocks reserved for it: interleaved
    reservations for brokers 1, 2 and 1 again give disjoint ids, and each one's ids are its blocks'."""
    brokers = {n: ProducerIdManager(10, broker_id=n) for n in (1, 2)}
    for m in brokers.values():
        m.loaded()
    log: list = []
    for asker in (1, 2, 1):
        records, start = brokers[1].reserve_for(asker)     # the controller (broker 1) decides every block
        assert start == brokers[1].block_end
        log.extend(records)
        for m in brokers.values():
            for key, value in records:
                m.replay(key, value)
    ids = {n: [m.next_id() for _ in range(m.available())] for n, m in brokers.items()}
    assert ids[1] == list(range(0, 10)) + list(range(20, 30))
    assert ids[2] == list(range(10, 20))
    for m in brokers.values():
        with pytest.raises(ProducerIdError):
            m.next_id()


def test_a_block_granted_by_the_answer_and_by_the_replay_counts_once():
    m = ProducerIdManager(10, broker_id=2)
    m.loaded()
    records, start = ProducerIdManager(10, broker_id=1).reserve_for(2)
    m.granted(start, start + 10)                            # the controller's answer
    for key, value in records:                              # ... then its record, replayed from the log
        m.replay(key, value)
    assert m.available() == 10


def test_handed_out_knows_every_reserved_id_but_this_brokers_unused_ones():
    m = ProducerIdManager(10, broker_id=2)
    m.loaded()
    controller = ProducerIdManager(10, broker_id=1)
    for asker in (1, 2):
        records, _ = controller.reserve_for(asker)
        for key, value in records:
            controller.replay(key, value)
            m.replay(key, value)
    assert m.next_id() == 10
    assert [m.handed_out(p) for p in (0, 9, 10, 11, 19, 20)] == [True, True, True, False, False, False]
