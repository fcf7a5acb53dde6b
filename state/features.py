"""Finalized feature levels (KIP-584): which levels this node supports, which are finalized, and their epoch, kept as records of ``__cluster_metadata``.

Kafka finalizes features in its metadata log, as FeatureLevelRecords; so does this node (the features
section of ``__cluster_metadata``: one record per feature, carrying its level and the epoch after the
change).  The one feature with behaviour here is ``transaction.version`` (KIP-890): 0 is the
classic protocol with v0 transaction-log values, 1 writes flexible (v1) values, 2 is transactions V2
(an epoch bump per transaction, partitions added implicitly by Produce v12 and TxnOffsetCommit v5).  A client learns the levels from ApiVersions v3+; the
finalized-features epoch rises with every change so that a client can tell newer information
from older.  UpdateFeatures changes a level under Kafka's rules (:meth:`FeatureLevels.validate`).
"""
from __future__ import annotations

from dataclasses import dataclass

from trireme.state.storage import Storage
from trireme.wire import error_codes as E
from trireme.wire.codec import message

from .cluster_metadata import FEATURE_LEVEL, decode_key, decode_value, encode_key, encode_value, read_legacy_file

TRANSACTION_VERSION = "transaction.version"
# feature → (min, max) level this node supports
SUPPORTED: dict[str, tuple[int, int]] = {TRANSACTION_VERSION: (0, 2)}
LEGACY_FEATURES_FILE = "features.json"       # where earlier versions kept the levels (read to upgrade)

# UpdateFeatures' UpgradeType (v1+); v0 has AllowDowngrade instead.
UPGRADE, SAFE_DOWNGRADE, UNSAFE_DOWNGRADE = 1, 2, 3


@dataclass(frozen=True)
class FeatureUpdate:
    feature: str
    level: int                     # < 1 asks to remove the feature (level 0)
    upgrade_type: int = UPGRADE


def feature_record(feature: str, level: int, epoch: int) -> tuple[bytes, bytes]:
    key = encode_key(FEATURE_LEVEL, "FeatureLevelKey", message("FeatureLevelKey").cls(name=feature))
    return key, encode_value("FeatureLevelValue", message("FeatureLevelValue").cls(feature_level=level, epoch=epoch))


class FeatureLevels:
    """The finalized level of each supported feature and the epoch of that information: the features section of
    ``__cluster_metadata``.  The epoch is 0 until a level was ever finalized (a new data directory)."""

    record_types = (FEATURE_LEVEL,)

    def __init__(self) -> None:
        self.levels: dict[str, int] = {name: 0 for name in SUPPORTED}
        self.epoch = 0
        self._unsupported: dict[str, tuple[int, int]] = {}     # records of features this node does not know

    # --- the durable section
    def replay(self, key: bytes, value: bytes | None) -> None:
        name = decode_key(key, "FeatureLevelKey").name
        level, epoch = (0, self.epoch) if value is None else _level_epoch(value)
        if name in SUPPORTED:
            self.levels[name] = level
        elif value is None:
            self._unsupported.pop(name, None)
        else:
            self._unsupported[name] = (level, epoch)
        self.epoch = max(self.epoch, epoch)

    def live_records(self) -> list[tuple[bytes, bytes]]:
        if self.epoch == 0:
            return []
        return ([feature_record(name, level, self.epoch) for name, level in self.levels.items()]
                + [feature_record(name, level, epoch) for name, (level, epoch) in self._unsupported.items()])

    def initial_records(self, initial: dict[str, int]) -> list[tuple[bytes, bytes]]:
        """On a new data directory (no level ever finalized): the records finalizing ``initial`` (the configured
        levels); ValueError if they are not valid levels."""
        for problem in self.validate([FeatureUpdate(n, level) for n, level in initial.items()]).values():
            if problem:
                raise ValueError(f"initial feature levels {initial}: {problem[1]}")
        return [feature_record(name, level, 1) for name, level in {**self.levels, **initial}.items()]

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

    def apply(self, updates: list[FeatureUpdate]) -> tuple[list, bool]:
        """Validated updates → (the records finalizing them, whether any level changes); nothing changes until the
        records are replayed."""
        levels = dict(self.levels)
        for u in updates:
            levels[u.feature] = max(u.level, 0)
        changed = {name: level for name, level in levels.items() if level != self.levels.get(name)}
        if not changed:
            return [], False
        return [feature_record(name, level, self.epoch + 1) for name, level in changed.items()], True


def _level_epoch(value) -> tuple[int, int]:
    v = decode_value(value, "FeatureLevelValue")
    return v.feature_level, v.epoch


def read_legacy_levels(storage: Storage, path: str = LEGACY_FEATURES_FILE) -> tuple[dict[str, int], int] | None:
    """The levels and epoch earlier versions kept in the JSON file ``path`` (None if there is none), for the
    upgrade that turns them into records."""
    def read(doc):
        levels = {str(k): int(v) for k, v in doc["levels"].items()}
        return {name: levels.get(name, 0) for name in SUPPORTED}, int(doc["epoch"])
    return read_legacy_file(storage, path, "feature file", read)
