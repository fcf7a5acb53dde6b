"""Finalized feature levels (KIP-584): which levels this node supports, which are finalized, and their epoch, persisted as JSON.

Kafka finalizes features in its metadata log; a single node keeps them in ``features.json``
(written with ``write_atomic``).  The one feature with behaviour here is ``transaction.version``
(KIP-890): 0 is the classic protocol with v0 transaction-log values, 1 writes flexible (v1)
values, 2 is transactions V2 (an epoch bump per transaction, partitions added implicitly by
Produce v12 and TxnOffsetCommit v5).  A client learns the levels from ApiVersions v3+; the
finalized-features epoch rises with every change so that a client can tell newer information
from older.  UpdateFeatures changes a level under Kafka's rules (:meth:`FeatureLevels.validate`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from trireme.state.storage import Storage
from trireme.wire import error_codes as E

TRANSACTION_VERSION = "transaction.version"
# feature → (min, max) level this node supports
SUPPORTED: dict[str, tuple[int, int]] = {TRANSACTION_VERSION: (0, 2)}
FILE_VERSION = 1

# UpdateFeatures' UpgradeType (v1+); v0 has AllowDowngrade instead.
UPGRADE, SAFE_DOWNGRADE, UNSAFE_DOWNGRADE = 1, 2, 3


@dataclass(frozen=True)
class FeatureUpdate:
    feature: str
    level: int                     # < 1 asks to remove the feature (level 0)
    upgrade_type: int = UPGRADE


class FeatureLevels:
    """The finalized level of each supported feature and the epoch of that information, kept at ``path``."""

    def __init__(self, storage: Storage, path: str = "features.json") -> None:
        self._storage = storage
        self._path = path
        self.levels: dict[str, int] = {name: 0 for name in SUPPORTED}
        self.epoch = 0

    def load_or_create(self, initial: dict[str, int]) -> None:
        """Read the file; on a new data directory finalize ``initial`` (the configured levels) first."""
        try:
            data = self._storage.read_all(self._path)
        except FileNotFoundError:
            for update in self.validate([FeatureUpdate(n, level) for n, level in initial.items()]).values():
                if update:
                    raise ValueError(f"initial feature levels {initial}: {update[1]}")
            self._write({**self.levels, **initial}, 1)
            return
        try:
            doc = json.loads(data)
            if doc["version"] != FILE_VERSION:
                raise ValueError(f"unsupported version {doc['version']!r}")
            levels = {str(k): int(v) for k, v in doc["levels"].items()}
            epoch = int(doc["epoch"])
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"malformed feature file {self._path!r}: {exc!r}") from exc
        self.levels = {name: levels.get(name, 0) for name in SUPPORTED}
        self.epoch = epoch

    def level(self, feature: str) -> int:
        return self.levels.get(feature, 0)

    def finalized(self) -> dict[str, int]:
        """Features at a level above 0 (what ApiVersions lists as finalized)."""
        return {name: level for name, level in self.levels.items() if level > 0}

    def validate(self, updates: list[FeatureUpdate]) -> dict[str, tuple[int, str] | None]:
        """Kafka's checks for each update → feature: None if allowed, else (error code, message)."""
        results: dict[str, tuple[int, str] | None] = {}
        for u in updates:
            target = max(u.level, 0)
            current = self.level(u.feature)
            if u.feature not in SUPPORTED:
                results[u.feature] = (E.INVALID_UPDATE_VERSION.code,
                                      f"Invalid update version {target} for feature {u.feature}. "
                                      f"This node does not support the given feature.")
            elif not SUPPORTED[u.feature][0] <= target <= SUPPORTED[u.feature][1]:
                low, high = SUPPORTED[u.feature]
                results[u.feature] = (E.INVALID_UPDATE_VERSION.code,
                                      f"Invalid update version {target} for feature {u.feature}. "
                                      f"This node only supports versions {low}-{high}")
            elif target < current and u.upgrade_type == UPGRADE:
                results[u.feature] = (E.INVALID_UPDATE_VERSION.code,
                                      f"Invalid update version {target} for feature {u.feature}. "
                                      f"Can't downgrade the version of this feature without setting the "
                                      f"upgrade type to either safe or unsafe downgrade.")
            elif u.upgrade_type not in (UPGRADE, SAFE_DOWNGRADE, UNSAFE_DOWNGRADE):
                results[u.feature] = (E.INVALID_UPDATE_VERSION.code, f"Unknown upgrade type {u.upgrade_type}.")
            else:
                results[u.feature] = None
        return results

    def apply(self, updates: list[FeatureUpdate]) -> bool:
        """Finalize validated updates (durably, before they are visible) → whether any level changed."""
        levels = dict(self.levels)
        for u in updates:
            levels[u.feature] = max(u.level, 0)
        if levels == self.levels:
            return False
        self._write(levels, self.epoch + 1)
        return True

    def _write(self, levels: dict[str, int], epoch: int) -> None:
        doc = {"version": FILE_VERSION, "epoch": epoch, "levels": levels}
        self._storage.write_atomic(self._path, json.dumps(doc, indent=1, sort_keys=True).encode())
        self.levels, self.epoch = levels, epoch
