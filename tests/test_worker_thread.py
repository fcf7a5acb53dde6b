"""server/worker_thread.py: calls run in the thread, values and exceptions come back, cancellation waits for the
call, and close ends the thread; the fan-out runs calls at once and gives back their values in order."""
from __future__ import annotations

import os
import threading
import time

import pytest
import trio

from trireme.server.worker_thread import ThreadFanOut, WorkerThread


def test_calls_run_in_the_thread_and_return_their_values():
    async def main():
        worker = WorkerThread("test-worker")
        try:
            names = [await worker.run(lambda: threading.current_thread().name) for _ in range(100)]
            assert names == ["test-worker"] * 100
            assert await worker.run(divmod, 17, 5) == (3, 2)
        finally:
            worker.close()
    trio.run(main)


def test_an_exception_is_raised_in_the_caller_and_the_thread_goes_on():
    async def main():
        worker = WorkerThread("test-worker")
        try:
            with pytest.raises(ZeroDivisionError):
                await worker.run(lambda: 1 / 0)
            assert await worker.run(lambda: "still serving") == "still serving"
        finally:
            worker.close()
    trio.run(main)


def test_a_cancelled_caller_still_waits_for_the_call_to_end():
    finished = []

    def slow():
        time.sleep(0.2)
        finished.append(True)
        return "done"

    async def main():
        worker = WorkerThread("test-worker")
        try:
            with trio.move_on_after(0.01) as scope:
                await worker.run(slow)
                await trio.sleep(1)         # the cancellation lands at the next checkpoint, after the call
            assert scope.cancelled_caught
            assert finished == [True]           # nothing returned before the call ended
        finally:
            worker.close()
    trio.run(main)


def test_close_ends_the_thread_and_refuses_later_calls():
    async def main():
        worker = WorkerThread("test-worker-close")
        assert await worker.run(lambda: 1) == 1
        worker.close()
        worker.close()                          # twice is harmless
        for _ in range(100):
            if not any(t.name == "test-worker-close" for t in threading.enumerate()):
                break
            await trio.sleep(0.01)
        assert not any(t.name == "test-worker-close" for t in threading.enumerate())
        with pytest.raises(RuntimeError, match="closed"):
            await worker.run(lambda: 1)
    trio.run(main)


def test_a_cancelled_caller_does_not_start_a_call():
    ran = []

    async def main():
        worker = WorkerThread("test-worker")
        try:
            with trio.CancelScope() as scope:
                scope.cancel()
                await worker.run(ran.append, 1)
            assert scope.cancelled_caught
            assert await worker.run(lambda: "next") == "next"      # still usable
        finally:
            worker.close()
    trio.run(main)
    assert ran == []


def test_ctrl_c_while_waiting_is_raised_once_the_call_has_ended(monkeypatch):
    # trio delivers Ctrl-C to a waiting main task by ending its wait with KeyboardInterrupt: simulated here
    # on the first wait, so the test does not depend on where a real signal lands.
    real_wait = trio.lowlevel.wait_readable
    interrupts = []

    async def wait_interrupted_once(fd):
        if not interrupts:
            interrupts.append(fd)
            raise KeyboardInterrupt
        await real_wait(fd)

    monkeypatch.setattr(trio.lowlevel, "wait_readable", wait_interrupted_once)
    finished = []

    def slow():
        time.sleep(0.2)
        finished.append(True)

    async def main():
        worker = WorkerThread("test-worker")
        try:
            with pytest.raises(KeyboardInterrupt):
                await worker.run(slow)
            assert finished == [True]           # not raised before the call ended
            assert interrupts
        finally:
            worker.close()
    trio.run(main)


def test_close_releases_the_pipes():
    # Each of the worker's four descriptors is identified by its pipe's inode, not by a count of the process's
    # descriptors: other tests' threads open and close descriptors meanwhile (a count once failed in CI so).
    def pipe_inode(fd: int):
        try:
            st = os.fstat(fd)
        except OSError:
            return None                                  # closed
        return (st.st_dev, st.st_ino)

    async def main():
        worker = WorkerThread("test-worker-fds")
        fds = [worker._calls_r, worker._calls_w, worker._done_r, worker._done_w]
        inodes = [pipe_inode(fd) for fd in fds]
        assert None not in inodes and len(set(inodes)) == 2          # two pipes, both ends open
        assert await worker.run(lambda: 1) == 1
        worker.close()
        for _ in range(200):
            still_open = [fd for fd, ino in zip(fds, inodes) if pipe_inode(fd) == ino]
            if not still_open:
                break
            await trio.sleep(0.01)
        assert still_open == []
    trio.run(main)


def test_the_fan_out_runs_its_calls_at_once_and_answers_in_order():
    fan_out = ThreadFanOut("test-fan", helpers=3)
    try:
        together = threading.Barrier(4, timeout=10)      # passes only if all four calls run at the same time

        def call(n):
            together.wait()
            return n * n, threading.current_thread().name
        results = fan_out.map(call, [1, 2, 3, 4])
        assert [value for value, _ in results] == [1, 4, 9, 16]
        assert sorted(name for _, name in results) == sorted(                # the caller takes items too
            ["test-fan-0", "test-fan-1", "test-fan-2", threading.current_thread().name])
        # more items than threads: the helpers take the rest in turn
        assert fan_out.map(lambda n: n + 1, list(range(20))) == list(range(1, 21))
        assert fan_out.map(lambda n: threading.current_thread().name, ["only"]) == [threading.current_thread().name]
        assert fan_out.map(lambda n: n, []) == []
    finally:
        fan_out.close()


def test_the_fan_out_raises_a_calls_exception_once_every_call_ended():
    fan_out = ThreadFanOut("test-fan-errors", helpers=2)
    failed = threading.Event()
    ended = []
    try:
        def call(n):
            if n == 1:
                failed.set()
                raise OSError(5, "disk")
            assert failed.wait(10)                      # the others end only after the failure
            time.sleep(0.05)
            ended.append(n)
            return n
        with pytest.raises(OSError, match="disk"):
            fan_out.map(call, [0, 1, 2])
        assert sorted(ended) == [0, 2]                  # not raised before the others ended
        assert fan_out.map(lambda n: -n, [1, 2, 3]) == [-1, -2, -3]        # and usable afterwards
    finally:
        fan_out.close()


def test_a_fan_out_that_cannot_start_its_helpers_ends_those_it_started(monkeypatch):
    real_start, started = threading.Thread.start, []

    def start(thread):
        if len(started) == 2:
            raise RuntimeError("can't start new thread")
        real_start(thread)
        started.append(thread)
    monkeypatch.setattr(threading.Thread, "start", start)
    with pytest.raises(RuntimeError, match="can't start"):
        ThreadFanOut("test-fan-fail", helpers=4)
    monkeypatch.undo()
    for t in started:
        t.join(timeout=10)
    assert len(started) == 2 and not any(t.is_alive() for t in started)


def test_closing_the_fan_out_ends_its_helpers():
    fan_out = ThreadFanOut("test-fan-close", helpers=2)
    fan_out.map(lambda n: n, [1, 2, 3])
    helpers = [t for t in threading.enumerate() if t.name.startswith("test-fan-close-")]
    assert len(helpers) == 2
    fan_out.close()
    for t in helpers:
        t.join(timeout=10)
    assert not any(t.is_alive() for t in helpers)
    assert fan_out.map(lambda n: n * 2, [1, 2]) == [2, 4]                  # closed: calls run in the caller
