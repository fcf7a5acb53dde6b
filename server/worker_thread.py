"""Long-lived threads for the flusher's blocking calls: one that runs a task's calls, woken through pipes, and helpers
that let it run several at once (the fsyncs of a round's partitions).

Why not ``trio.to_thread.run_sync``: on this machine one of its hops costs ~100 µs of CPU (its capacity limiter,
context copy, ``run_sync_soon`` and wake-up socket, and the GIL's hand-offs), and the flusher makes one per group
commit: hundreds to thousands a second.  This thread blocks in ``os.read`` on a pipe until given a call and
reports its end by writing a byte to a second pipe, which the event loop waits for with ``wait_readable``: ~45 µs
of CPU and ~50 µs of wall time per hop in a tight loop.  In the broker the CPU per request stayed the same, but
rounds got shorter, so acks=all answers at light load come sooner (``docs/performance.md``, issue 11's sixth
round).

One call at a time, from one task.  As with ``trio.to_thread.run_sync``, a call once started is never abandoned:
neither a cancellation nor Ctrl-C ends the wait before the call ends (Ctrl-C is raised after it), so the broker's
final flush and close never overlap a call.
"""
from __future__ import annotations

import os
import queue
import threading

import trio


def _outcome(fn, *args) -> tuple:
    """``fn(*args)`` as (True, value) or (False, exception): handed from a thread to the caller, who unpacks it."""
    try:
        return True, fn(*args)
    except BaseException as e:
        return False, e


def _unpack(outcome: tuple):
    """An `_outcome`'s value, or its exception raised."""
    ok, value = outcome
    if ok:
        return value
    try:
        raise value
    finally:
        del value, outcome                          # no frame ↔ traceback cycle


class WorkerThread:
    def __init__(self, name: str):
        fds: list[int] = []
        try:
            fds += os.pipe()
            fds += os.pipe()
            self._calls_r, self._calls_w, self._done_r, self._done_w = fds
            os.set_blocking(self._done_r, False)
            self._call = None               # (fn, args) handed to the thread
            self._result = None             # (True, value) or (False, exception), handed back
            self._closed = False
            threading.Thread(target=self._serve, name=name, daemon=True).start()
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise

    @trio.lowlevel.enable_ki_protection
    async def run(self, fn, *args):
        """``fn(*args)`` in the thread → its value, or its exception raised here."""
        await trio.lowlevel.checkpoint_if_cancelled()       # cancelled already: the call does not start
        if self._closed:
            raise RuntimeError("worker thread is closed")
        if self._call is not None:
            raise RuntimeError("worker thread is busy: one call at a time")
        self._call = (fn, args)
        try:
            os.write(self._calls_w, b"\0")
        except BaseException:
            self._call = None
            raise
        interrupted = None
        with trio.CancelScope(shield=True):
            while True:
                try:
                    await trio.lowlevel.wait_readable(self._done_r)
                    ended = os.read(self._done_r, 1)
                except BlockingIOError:
                    continue
                except KeyboardInterrupt as e:      # delivered to a waiting main task: raised once the call ends
                    interrupted = e
                    continue
                break
        result, self._result, self._call = self._result, None, None
        if interrupted is not None:
            raise interrupted
        if not ended:
            raise RuntimeError("worker thread ended")
        return _unpack(result)

    def close(self) -> None:
        """End the thread once it is idle (it closes its own ends of the pipes)."""
        if self._closed:
            return
        self._closed = True
        os.close(self._calls_w)          # the thread reads EOF
        trio.lowlevel.notify_closing(self._done_r)
        os.close(self._done_r)

    def _serve(self) -> None:
        try:
            while os.read(self._calls_r, 1):
                fn, args = self._call
                self._result = _outcome(fn, *args)  # handed to the caller, unpacked there
                del fn, args                        # hold no batch or snapshot until the next call
                try:
                    os.write(self._done_w, b"\0")
                except OSError:                     # closed meanwhile: nobody waits
                    return
        finally:
            os.close(self._calls_r)
            os.close(self._done_w)


class ThreadFanOut:
    """``map(fn, items)`` from one (non-trio) thread, with ``fn`` run for up to ``helpers + 1`` items at once: the
    calling thread and long-lived helper threads take the items from one queue.  Used by the flush thread for the
    fsyncs of a round's partitions, which then take as long as the slowest, not their sum: with 4 partitions a
    round took ~1.6 ms, and an answer two rounds (issue 11's seventh round).  One caller at a time, and ``close``
    only while no ``map`` runs (the flusher closes it after its flush thread's last call ended)."""

    def __init__(self, name: str, helpers: int):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()       # (fn, index, item), or None: end
        self._results: queue.SimpleQueue = queue.SimpleQueue()    # (index, _outcome)
        self._threads: list[threading.Thread] = []
        try:
            for i in range(helpers):
                thread = threading.Thread(target=self._serve, name=f"{name}-{i}", daemon=True)
                thread.start()
                self._threads.append(thread)
        except BaseException:
            self.close()                            # the helpers already started end
            raise

    def map(self, fn, items: list) -> list:
        """``[fn(item) for item in items]``, in that order.  If calls raise, the first item's exception is raised once
        every call ended (the others' are dropped: the flusher's calls return their errors instead)."""
        if len(items) < 2 or not self._threads:
            return [fn(item) for item in items]
        for index, item in enumerate(items):
            self._jobs.put((fn, index, item))
        outcomes: list = [None] * len(items)
        waiting = len(items)
        while True:                                 # the caller takes jobs too, until none is left
            try:
                _, index, item = self._jobs.get_nowait()
            except queue.Empty:
                break
            outcomes[index] = _outcome(fn, item)
            waiting -= 1
        for _ in range(waiting):
            index, outcome = self._results.get()
            outcomes[index] = outcome
        try:
            return [_unpack(outcome) for outcome in outcomes]
        finally:
            del outcomes                            # no frame ↔ traceback cycle through a raised exception

    def close(self) -> None:
        """End the helpers (each once its current call ends); later ``map`` calls run in the caller alone."""
        for _ in self._threads:
            self._jobs.put(None)
        self._threads = []

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            fn, index, item = job
            self._results.put((index, _outcome(fn, item)))
            del job, fn, item                       # hold no partition until the next round
