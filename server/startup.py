"""The edges of a broker's start-up: failures the operator gets as one line, and stop signals noted from the first moment.

A :class:`StartupError` is a reason the broker cannot start that lies outside its code (the address is taken, the
data directory cannot be used or is another broker's): ``trireme serve`` prints its message as one line and exits
non-zero, where any other exception keeps its traceback.  :class:`StopSignals` takes SIGINT/SIGTERM before the
configuration is read, so a signal at any point of start-up (while the logs load, around ``listening on``) ends
in the same clean shutdown as one while serving: loading polls :meth:`StopSignals.requested`, the running broker
awaits :meth:`StopSignals.wait`.
"""
from __future__ import annotations

import signal

import trio

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StartupError(Exception):
    """The broker cannot start, for a reason the message names in one line (the address or path and the OS's reason)."""


class StartupInterrupted(Exception):
    """A stop signal came while the logs were loading: what was opened has been closed again."""


def os_reason(error: OSError) -> str:
    """An OSError's reason without its errno prefix ("Address already in use")."""
    return error.strerror or str(error)


def startup_failure(error: BaseException, kinds: tuple[type[BaseException], ...] = (StartupError,)) \
        -> BaseException | None:
    """The one failure of ``kinds`` that ``error`` is, or that every leaf of an exception group of nurseries is (None
    when anything else is in it: that keeps its traceback)."""
    if isinstance(error, BaseExceptionGroup):
        leaves = [startup_failure(e, kinds) for e in error.exceptions]
        return leaves[0] if leaves and all(leaf is not None for leaf in leaves) else None
    return error if isinstance(error, kinds) else None


async def open_listeners(host: str, port: int, what: str = "") -> list[trio.SocketListener]:
    """trio's TCP listeners on HOST:PORT, or a StartupError naming the address (and ``what`` it is for)."""
    try:
        return await trio.open_tcp_listeners(port, host=host)
    except OSError as e:        # socket.gaierror included: a host that does not resolve
        raise StartupError(f"cannot listen on {host}:{port}{f' ({what})' if what else ''}: {os_reason(e)}") from None


class StopSignals:
    """SIGINT and SIGTERM for the life of ``trireme serve``: the first one is noted at once (even while start-up code
    runs without yielding) and wakes :meth:`wait`; later ones change nothing (the shutdown is under way)."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._event: trio.Event | None = None
        self._previous: dict = {}

    def install(self) -> "StopSignals":
        """Take the signals (in the main thread, before anything else of the broker's start-up)."""
        self._previous = {signum: signal.signal(signum, self._handle) for signum in SIGNALS}
        return self

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def requested(self) -> bool:
        return self.received is not None

    def _handle(self, signum: int, frame) -> None:
        if self.received is None:
            self.received = signum
        token, event = self._token, self._event
        if token is not None and event is not None:
            try:
                token.run_sync_soon(event.set, idempotent=True)     # trio's way in from a signal handler
            except trio.RunFinishedError:
                pass

    async def wait(self) -> int:
        """The signal that asks the broker to stop, once one came (at once if one came before)."""
        self._event = trio.Event()
        self._token = trio.lowlevel.current_trio_token()
        try:
            if self.received is None:
                await self._event.wait()
            return self.received
        finally:
            self._token = self._event = None
