"""Whether a coordinator's state machine serves yet: what the group and transaction coordinators share."""
from __future__ import annotations

import trireme.wire.error_codes as E


class CoordinatorStatus:
    """``loading`` until the coordinator's partition was replayed; ``unavailable`` (NOT_COORDINATOR, or
    COORDINATOR_LOAD_IN_PROGRESS while the partition is being opened) while this broker does not lead it."""

    def __init__(self) -> None:
        self.loading = True
        self.unavailable = 0

    @property
    def serving_error(self) -> int:
        """0 while the coordinator serves; else the error every request is answered."""
        if self.unavailable:
            return self.unavailable
        return E.COORDINATOR_LOAD_IN_PROGRESS.code if self.loading else 0
