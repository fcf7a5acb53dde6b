"""What a pure coordinator asks of the server after an operation: records to append, answers to release, timers."""
from __future__ import annotations

from typing import Hashable

TimerKey = tuple


class Effects:
    """What the server must do after an operation: append ``records``, then send ``responses``; apply timers.

    ``timers`` ((key, deadline_ms) to (re)schedule) and ``cancel`` (keys to drop) never share a key, so
    they may be applied in either order.
    """

    __slots__ = ("responses", "records", "_timers", "_cancel")

    def __init__(self) -> None:
        self.responses: list[tuple[Hashable, object]] = []
        self.records: list[tuple[bytes, bytes | None]] = []
        self._timers: dict[TimerKey, int] = {}
        self._cancel: dict[TimerKey, None] = {}

    @property
    def timers(self) -> list[tuple[TimerKey, int]]:
        return list(self._timers.items())

    @property
    def cancel(self) -> list[TimerKey]:
        return list(self._cancel)

    def respond(self, request_id: Hashable, result: object) -> None:
        self.responses.append((request_id, result))

    def schedule(self, key: TimerKey, deadline_ms: int) -> None:
        self._cancel.pop(key, None)
        self._timers.pop(key, None)
        self._timers[key] = deadline_ms

    def cancel_timer(self, key: TimerKey) -> None:
        self._timers.pop(key, None)
        self._cancel[key] = None

    def append(self, record: tuple[bytes, bytes | None]) -> None:
        self.records.append(record)

    def __repr__(self) -> str:
        return (f"Effects(responses={self.responses!r}, timers={self.timers!r}, cancel={self.cancel!r}, "
                f"records={len(self.records)})")
