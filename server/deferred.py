"""A response that is not ready yet: handlers return one when the answer waits (for an fsync, a coordinator, data)."""
from __future__ import annotations

import dataclasses
from typing import Any, Awaitable, Callable


@dataclasses.dataclass(slots=True)
class Deferred:
    """``await wait()`` returns the response (or None for no response)."""

    wait: Callable[[], Awaitable[Any]]
