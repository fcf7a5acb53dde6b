"""Topics, producer id blocks and feature levels as records of ``__cluster_metadata``: a restart recovers them from the log alone, a data directory with the earlier JSON files is upgraded into records, and the start-up compaction keeps one record per live topic."""
from __future__ import annotations

import json
import shutil
import uuid

from broker_runner import run_with_broker
from trireme.server.broker import Broker
from trireme.server.clock import now_ms
from trireme.server.config import Config
from trireme.state.features import TRANSACTION_VERSION, FeatureUpdate, SAFE_DOWNGRADE
from trireme.state.log import PartitionLog
from trireme.state.producer_ids import BLOCK_SIZE
from trireme.state.storage import FileStorage
from trireme.state.topics import OP_SET
from trireme.wire import records

LEGACY_FILES = ("topics.json", "producer_ids", "features.json")


def make_broker(path, **props) -> Broker:
    config = Config(data_dir=str(path))
    config.update(props)
    return Broker(config)


def topics_of(broker: Broker) -> list:
    return [(t.name, t.topic_id, t.partitions, dict(t.configs), t.leader_epoch) for t in broker.topics.all()]


def append(broker: Broker, topic: str, index: int, value: bytes) -> None:
    p = broker.partition(topic, index)
    buf = bytearray(records.build_batch([(None, value)], partition_leader_epoch=p.leader_epoch))
    p.log.append(buf, records.validate_batches(buf), now_ms())
    p.log.sync(now_ms())


async def set_transaction_version(b: Broker, level: int) -> None:
    await b.cluster_metadata.update(
        lambda: b.features.apply([FeatureUpdate(TRANSACTION_VERSION, level, SAFE_DOWNGRADE)]))


def test_restart_recovers_topics_producer_ids_and_features_from_the_log_alone(tmp_path):
    broker = make_broker(tmp_path)
    ids = []

    async def body(b):
        await b.create_topic("orders", 2, {"retention.ms": "1000"})
        await b.create_topic("gone", 1)
        await b.add_partitions("orders", 4)
        await b.alter_topic_configs("orders", [("cleanup.policy", OP_SET, "compact")])
        await b.delete_topic("gone")
        ids.append(await b.transactions.idempotent_producer_id())
        await set_transaction_version(b, 1)         # the new data directory finalized the default, 2
    run_with_broker(broker, body)
    before = topics_of(broker)
    assert [t[:4] for t in before] == [("orders", before[0][1], 4, {"retention.ms": "1000",
                                                                      "cleanup.policy": "compact"})]
    assert not (tmp_path / "logs" / "gone-0").exists()
    broker.close()
    assert not [name for name in LEGACY_FILES if (tmp_path / name).exists()]

    again = make_broker(tmp_path)
    assert topics_of(again) == before
    assert sorted(k for k in again.partitions if k[0] == "orders") == [("orders", i) for i in range(4)]
    assert "gone" not in again.topics and ("gone", 0) not in again.partitions
    assert again.partition("orders", 3).config.compacted
    assert (again.features.level(TRANSACTION_VERSION), again.features.epoch) == (1, 2)

    async def later(b):
        ids.append(await b.transactions.idempotent_producer_id())
    run_with_broker(again, later)
    assert ids == [0, BLOCK_SIZE]               # after a restart: above the block reserved before
    again.close()
    assert not [name for name in LEGACY_FILES if (tmp_path / name).exists()]


def test_producer_ids_are_reserved_ahead_and_never_handed_out_twice(tmp_path):
    broker = make_broker(tmp_path)
    ids = []

    async def body(b):
        for _ in range(BLOCK_SIZE + 10):
            ids.append(await b.transactions.idempotent_producer_id())
    run_with_broker(broker, body)
    assert ids == list(range(BLOCK_SIZE + 10))
    assert broker.producer_ids.block_end == 2 * BLOCK_SIZE       # the second block reserved ahead, one only
    broker.close()
    again = make_broker(tmp_path)
    assert not again.producer_ids.handed_out(2 * BLOCK_SIZE) and again.producer_ids.handed_out(ids[-1])
    again.close()


def write_legacy_files(path, topic_id: uuid.UUID, *, block_end: int = 5000) -> None:
    """topics.json, producer_ids and features.json as the previous version wrote them (state/topics.py's
    TopicRegistry._commit, state/producer_ids.py's reserve, state/features.py's _write)."""
    doc = {"version": 1, "next_order": 2, "retired_epochs": {"old": 3}, "topics": [
        {"name": "legacy", "topic_id": str(topic_id), "partitions": 2, "configs": {"retention.ms": "5000"},
         "created_order": 1, "leader_epoch": 4}]}
    (path / "topics.json").write_bytes(json.dumps(doc, indent=1, sort_keys=True).encode())
    (path / "producer_ids").write_bytes(json.dumps({"version": 1, "block_end": block_end}).encode())
    levels = {"version": 1, "epoch": 3, "levels": {TRANSACTION_VERSION: 1}}
    (path / "features.json").write_bytes(json.dumps(levels, indent=1, sort_keys=True).encode())


def legacy_data_dir(path) -> uuid.UUID:
    """A data directory of the previous version: partition logs with data, meta.properties, the three JSON files,
    and a __cluster_metadata log without their records."""
    broker = make_broker(path)
    broker.ensure_topic("legacy", 2)
    topic_id = broker.topics.get("legacy").topic_id
    append(broker, "legacy", 1, b"kept")
    broker.close()
    shutil.rmtree(path / "logs" / "__cluster_metadata-0")
    write_legacy_files(path, topic_id)
    return topic_id


def test_a_data_directory_of_the_previous_version_is_upgraded_into_records(tmp_path):
    topic_id = legacy_data_dir(tmp_path)
    broker = make_broker(tmp_path)
    assert topics_of(broker) == [("legacy", topic_id, 2, {"retention.ms": "5000"}, 4)]
    assert broker.partition("legacy", 1).log.log_end_offset == 1 and broker.partition("legacy", 1).leader_epoch == 4
    assert (broker.features.level(TRANSACTION_VERSION), broker.features.epoch) == (1, 3)
    assert broker.producer_ids.block_end == 5000 and not broker.producer_ids.handed_out(5000)
    assert broker.producer_ids.handed_out(4999)
    assert not [name for name in LEGACY_FILES if (tmp_path / name).exists()]        # records first, then removed
    created = []

    async def body(b):
        created.append(await b.create_topic("old", 1))              # a deleted name continues its leader epochs
        created.append(await b.transactions.idempotent_producer_id())
    run_with_broker(broker, body)
    assert created[0].leader_epoch == 3 and created[1] == 5000
    broker.close()

    again = make_broker(tmp_path)                                   # from the records alone
    assert topics_of(again) == topics_of(broker)
    assert (again.features.level(TRANSACTION_VERSION), again.features.epoch) == (1, 3)
    again.close()


def test_an_upgrade_cut_short_before_the_files_are_removed_writes_nothing_twice_and_regresses_nothing(tmp_path):
    legacy_data_dir(tmp_path)
    saved = {name: (tmp_path / name).read_bytes() for name in LEGACY_FILES}
    broker = make_broker(tmp_path)

    async def body(b):                                              # changes after the upgrade
        await b.alter_topic_configs("legacy", [("retention.ms", OP_SET, "9000")])
        await set_transaction_version(b, 2)
    run_with_broker(broker, body)
    after = topics_of(broker)
    broker.close()
    for name, data in saved.items():                                # as if the start had crashed before removing them
        (tmp_path / name).write_bytes(data)
    end = _metadata_end(tmp_path)

    again = make_broker(tmp_path)
    assert topics_of(again) == after and after[0][3] == {"retention.ms": "9000"}
    assert (again.features.level(TRANSACTION_VERSION), again.features.epoch) == (2, 4)
    assert again.producer_ids.block_end == 5000
    assert again.cluster_metadata.partition.log.log_end_offset == end                # no record written again
    assert not [name for name in LEGACY_FILES if (tmp_path / name).exists()]
    again.close()


def _metadata_end(path) -> int:
    """The log end offset of the data directory's __cluster_metadata log."""
    plog = PartitionLog.open(FileStorage(str(path)), "logs/__cluster_metadata-0", now_ms=now_ms())
    try:
        return plog.log_end_offset
    finally:
        plog.close()


def test_start_up_compaction_keeps_one_record_per_live_topic_and_drops_deleted_ones(tmp_path):
    broker = make_broker(tmp_path)

    async def body(b):
        await b.create_topic("kept", 1)
        for i in range(600):
            await b.alter_topic_configs("kept", [("retention.ms", OP_SET, str(1000 + i))])
        for i in range(300):
            await b.create_topic(f"temp{i}", 1)
            await b.delete_topic(f"temp{i}")
    run_with_broker(broker, body)
    kept = topics_of(broker)
    broker.close()

    again = make_broker(tmp_path)
    plog = again.cluster_metadata.partition.log
    live = plog.log_end_offset - plog.log_start_offset
    # the feature level, the kept topic, one removed-name record per deleted name (their next leader epoch)
    assert live == 1 + 1 + 300
    assert topics_of(again) == kept and kept[0][3] == {"retention.ms": "1599"}
    assert not [t for t in again.topics.all() if t.name.startswith("temp")]
    again.close()
