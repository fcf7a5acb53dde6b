"""server/worker_thread.py: calls run in the thread, values and exceptions come back, cancellation waits for the
call, and close ends the thread."""
from __future__ import annotations

import threading
import time

import pytest
import trio

from trireme.server.worker_thread import WorkerThread


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
