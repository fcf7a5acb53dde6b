"""A response that is not ready yet: handlers return one when the answer waits (for an fsync, a coordinator, data)."""
from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Awaitable, Callable


@dataclasses.dataclass(slots=True)
class Deferred:
    """``await wait()`` returns the response (or None for no response).  A connection runs the waits of its
    requests one after another, in request order, as it writes their answers.

    A ``poll`` (a long-polling fetch) only waits for something to happen: it is cancelled, unanswered, as soon
    as the client's connection ends.  ``ready``, if given, says whether ``wait()`` would finish now without
    waiting (an acks=all produce whose data is durable already): answers before it are then sent together with
    it instead of ahead of it, and a flush that makes it ready runs its ``wait()`` itself, outside any task, and
    sends the answer (so a ready ``wait()`` must not suspend: the connection closes if it does)."""

    wait: Callable[[], Awaitable[Any]]
    poll: bool = False
    ready: Callable[[], bool] | None = None


async def settle(result):
    """A handler's result → its response: awaited if it is a coroutine, then a Deferred's wait (a handler called
    outside a connection: the local peer, an Envelope, a request forwarded to this broker once it is the
    controller)."""
    if inspect.isawaitable(result):
        result = await result
    if isinstance(result, Deferred):
        result = await result.wait()
    return result
