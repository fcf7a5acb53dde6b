"""FeatureLevels: the finalized transaction.version level, its epoch, Kafka's update rules, and its records in __cluster_metadata."""
import pytest

import trireme.wire.error_codes as E
from trireme.state.features import (SAFE_DOWNGRADE, TRANSACTION_VERSION, UNSAFE_DOWNGRADE, FeatureLevels,
                                    FeatureUpdate, read_legacy_levels)
from trireme.state.storage import MemoryStorage


def replayed(records, features=None) -> FeatureLevels:
    features = features or FeatureLevels()
    for key, value in records:
        features.replay(key, value)
    return features


def initial(levels) -> tuple[FeatureLevels, list]:
    log = FeatureLevels().initial_records(levels)
    return replayed(log), log


def test_a_new_data_directory_finalizes_the_configured_level():
    features, log = initial({TRANSACTION_VERSION: 2})
    assert (features.finalized(), features.epoch) == ({TRANSACTION_VERSION: 2}, 1)
    again = replayed(log)                                   # a restart: the records, not the configured level
    assert (again.finalized(), again.epoch) == ({TRANSACTION_VERSION: 2}, 1)


def test_level_0_is_not_listed_as_finalized():
    features, _ = initial({TRANSACTION_VERSION: 0})
    assert features.finalized() == {} and features.level(TRANSACTION_VERSION) == 0


def test_an_unsupported_initial_level_is_refused():
    with pytest.raises(ValueError, match="only supports versions 0-2"):
        FeatureLevels().initial_records({TRANSACTION_VERSION: 3})


@pytest.mark.parametrize("update,error", [
    (FeatureUpdate(TRANSACTION_VERSION, 3), "only supports versions 0-2"),
    (FeatureUpdate("metadata.version", 1), "does not support the given feature"),
    (FeatureUpdate(TRANSACTION_VERSION, 1), "Can't downgrade"),
    (FeatureUpdate(TRANSACTION_VERSION, 0), "Can't downgrade"),
    (FeatureUpdate(TRANSACTION_VERSION, 1, upgrade_type=7), "Unknown upgrade type"),
])
def test_refused_updates(update, error):
    features, _ = initial({TRANSACTION_VERSION: 2})
    ((feature, problem),) = features.validate([update]).items()
    assert feature == update.feature and problem[0] == E.INVALID_UPDATE_VERSION.code and error in problem[1]


def test_apply_raises_the_epoch_only_for_a_change_once_replayed():
    features, log = initial({TRANSACTION_VERSION: 1})
    assert features.validate([FeatureUpdate(TRANSACTION_VERSION, 2)]) == {TRANSACTION_VERSION: None}
    records, changed = features.apply([FeatureUpdate(TRANSACTION_VERSION, 2)])
    assert changed and features.level(TRANSACTION_VERSION) == 1           # nothing changes before the replay
    log += records
    replayed(records, features)
    assert (features.level(TRANSACTION_VERSION), features.epoch) == (2, 2)
    assert features.apply([FeatureUpdate(TRANSACTION_VERSION, 2)]) == ([], False)
    for upgrade_type in (SAFE_DOWNGRADE, UNSAFE_DOWNGRADE):
        assert features.validate([FeatureUpdate(TRANSACTION_VERSION, 0, upgrade_type)]) == {TRANSACTION_VERSION: None}
    records, changed = features.apply([FeatureUpdate(TRANSACTION_VERSION, -1, SAFE_DOWNGRADE)])   # < 1 removes it
    log += records
    replayed(records, features)
    reloaded = replayed(log)
    assert (reloaded.finalized(), reloaded.epoch) == ({}, 3)
    compacted = replayed(reloaded.live_records())
    assert (compacted.levels, compacted.epoch) == (reloaded.levels, 3)


def test_a_malformed_legacy_file_is_refused():
    storage = MemoryStorage()
    storage.write_atomic("features.json", b'{"version": 9}')
    with pytest.raises(ValueError, match="malformed feature file"):
        read_legacy_levels(storage)
