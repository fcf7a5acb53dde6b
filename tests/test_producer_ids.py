"""Tests for durable producer id allocation: uniqueness across restarts and crashes at any point."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from trireme.state.producer_ids import BLOCK_SIZE, ProducerIdError, ProducerIdManager


class FakeStorage:
    """A dict-backed stand-in for state.storage with exactly its four methods.

    Setting ``crash_next_write`` to "before" or "after" makes the next write_atomic raise as a crash
    would, with the new data not yet written or already durable.
    """

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.dirs: set[str] = set()
        self.writes = 0
        self.crash_next_write: str | None = None

    def read_all(self, path: str) -> bytes:
        try:
            return self.files[path]
        except KeyError:
            raise FileNotFoundError(path) from None

    def write_atomic(self, path: str, data: bytes) -> None:
        crash, self.crash_next_write = self.crash_next_write, None
        if crash != "before":
            self.writes += 1
            self.files[path] = bytes(data)
        if crash is not None:
            raise OSError("simulated crash")

    def exists(self, path: str) -> bool:
        return path in self.files or path in self.dirs

    def makedirs(self, path: str) -> None:
        self.dirs.add(path)


def test_ids_are_sequential_within_a_block_and_reserved_before_use():
    storage = FakeStorage()
    manager = ProducerIdManager(storage, "pid/block")
    assert manager.reserve_needed()
    assert [manager.next_id() for _ in range(5)] == [0, 1, 2, 3, 4]
    assert storage.writes == 1
    assert "pid" in storage.dirs
    assert not manager.reserve_needed()


def test_new_block_written_only_when_the_block_runs_out():
    storage = FakeStorage()
    manager = ProducerIdManager(storage, "pids", block_size=10)
    ids = [manager.next_id() for _ in range(25)]
    assert ids == list(range(25))
    assert storage.writes == 3


def test_restart_resumes_after_the_reserved_block():
    storage = FakeStorage()
    first = ProducerIdManager(storage, "pids")
    handed_out = [first.next_id() for _ in range(3)]
    second = ProducerIdManager(storage, "pids")  # restart: the rest of the block is skipped
    assert second.next_id() == BLOCK_SIZE
    assert not set(handed_out) & {BLOCK_SIZE}


def test_explicit_reserve_lets_the_caller_do_the_write_ahead():
    storage = FakeStorage()
    manager = ProducerIdManager(storage, "pids", block_size=2)
    manager.reserve()
    assert storage.writes == 1
    assert [manager.next_id(), manager.next_id()] == [0, 1]
    assert manager.reserve_needed()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.sampled_from([None, "before", "after"])),
                min_size=1, max_size=8),
       st.integers(1, 7))
def test_never_an_id_twice_across_crashes(lives, block_size):
    """Each life hands out some ids, then dies, possibly inside a reservation write."""
    storage = FakeStorage()
    seen: list[int] = []
    for count, crash in lives:
        manager = ProducerIdManager(storage, "pids", block_size=block_size)
        seen.extend(manager.next_id() for _ in range(count))
        if crash is not None:
            storage.crash_next_write = crash
            with pytest.raises(OSError):
                while True:
                    seen.append(manager.next_id())
        # The manager is discarded here: everything in memory is lost.
    assert len(seen) == len(set(seen))


def test_failed_reservation_hands_out_nothing_and_can_be_retried():
    storage = FakeStorage()
    manager = ProducerIdManager(storage, "pids", block_size=2)
    assert [manager.next_id(), manager.next_id()] == [0, 1]
    storage.crash_next_write = "before"
    with pytest.raises(OSError):
        manager.next_id()
    assert manager.next_id() == 2
    assert ProducerIdManager(storage, "pids", block_size=2).next_id() == 4


@pytest.mark.parametrize("data", [b"", b"garbage", b'{"version":1}', b'{"version":9,"block_end":5}',
                                  b'{"version":1,"block_end":-1}', b'{"version":1,"block_end":"5"}'])
def test_unreadable_file_is_an_error_not_a_restart_from_zero(data):
    storage = FakeStorage()
    storage.files["pids"] = data
    with pytest.raises(ProducerIdError):
        ProducerIdManager(storage, "pids")
