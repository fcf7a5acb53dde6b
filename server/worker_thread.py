"""A long-lived thread that runs one task's blocking calls (the flusher's fsyncs and snapshot writes), woken through pipes.

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
import threading

import trio


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
        ok, value = result
        if ok:
            return value
        try:
            raise value
        finally:
            del value, result                       # no frame ↔ traceback cycle

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
                try:
                    self._result = (True, fn(*args))
                except BaseException as e:          # handed to the caller, raised there
                    self._result = (False, e)
                del fn, args                        # hold no batch or snapshot until the next call
                try:
                    os.write(self._done_w, b"\0")
                except OSError:                     # closed meanwhile: nobody waits
                    return
        finally:
            os.close(self._calls_r)
            os.close(self._done_w)
