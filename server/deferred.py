"""A response that is not ready yet: handlers return one when the answer waits (for an fsync, a coordinator, data)."""
from __future__ import annotations

import dataclasses
from typing import Any, Awaitable, Callable


@dataclasses.dataclass(slots=True)
class Deferred:
    """``await wait()`` returns the response (or None for no response).  A ``poll`` (a long-polling fetch) only
    waits for something to happen: it is cancelled, unanswered, as soon as the client's connection ends."""

    wait: Callable[[], Awaitable[Any]]
    poll: bool = False
