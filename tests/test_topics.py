"""Tests for the topic registry, topic config validation and the broker's meta.properties."""
from __future__ import annotations

import json
import uuid
from dataclasses import replace

import pytest

from trireme.state.coordinator_records import RecordError
from trireme.state.topics import (
    INVALID_CONFIG,
    INVALID_PARTITIONS,
    INVALID_REPLICATION_FACTOR,
    INVALID_REQUEST,
    INVALID_TOPIC_EXCEPTION,
    OP_APPEND,
    OP_DELETE,
    OP_SET,
    OP_SUBTRACT,
    SOURCE_DEFAULT_CONFIG,
    SOURCE_DYNAMIC_TOPIC_CONFIG,
    SOURCE_STATIC_BROKER_CONFIG,
    TOPIC_ALREADY_EXISTS,
    TOPIC_CONFIG_DEFAULTS,
    UNKNOWN_TOPIC_ID,
    UNKNOWN_TOPIC_OR_PARTITION,
    BrokerMeta,
    BrokerMetaError,
    Topic,
    TopicError,
    TopicRegistry,
    kafka_uuid_string,
    parse_config_value,
    parse_properties,
    read_legacy_registry,
    validate_config,
    validate_topic_name,
)


class FakeStorage:
    """A dict-backed stand-in for state.storage with exactly its four methods."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.dirs: set[str] = set()

    def read_all(self, path: str) -> bytes:
        try:
            return self.files[path]
        except KeyError:
            raise FileNotFoundError(path) from None

    def write_atomic(self, path: str, data: bytes) -> None:
        self.files[path] = bytes(data)

    def exists(self, path: str) -> bool:
        return path in self.files or path in self.dirs

    def makedirs(self, path: str) -> None:
        self.dirs.add(path)


@pytest.fixture
def storage():
    return FakeStorage()


DECISIONS = {"create", "delete", "delete_by_id", "add_partitions", "alter_configs", "replace_configs",
             "bump_leader_epoch"}


class Logged:
    """A registry whose decisions are made durable at once (appended to ``log``) and replayed, as the broker's
    ``__cluster_metadata`` update does; ``validate_only`` decides and writes nothing."""

    def __init__(self, log: list) -> None:
        self.log = log
        self.registry = TopicRegistry()
        for key, value in log:
            self.registry.replay(key, value)

    def __getattr__(self, name):
        attr = getattr(self.registry, name)
        if name not in DECISIONS:
            return attr

        def decided(*args, validate_only=False, **kwargs):
            records, topic = attr(*args, **kwargs)
            if not validate_only:
                self.log.extend(records)
                for key, value in records:
                    self.registry.replay(key, value)
            return topic
        return decided


@pytest.fixture
def log():
    return []


def reopen(log: list) -> Logged:
    """The registry a restart replays from the log."""
    return Logged(log)


def code_of(fn, *args, **kwargs) -> int:
    with pytest.raises(TopicError) as info:
        fn(*args, **kwargs)
    return info.value.code


# --- configs ---------------------------------------------------------------------------------

def test_kafka_defaults():
    assert TOPIC_CONFIG_DEFAULTS["retention.ms"] == "604800000"
    assert TOPIC_CONFIG_DEFAULTS["retention.bytes"] == "-1"
    assert TOPIC_CONFIG_DEFAULTS["segment.bytes"] == "1073741824"
    assert TOPIC_CONFIG_DEFAULTS["cleanup.policy"] == "delete"
    assert TOPIC_CONFIG_DEFAULTS["max.message.bytes"] == "1048588"
    assert TOPIC_CONFIG_DEFAULTS["message.timestamp.type"] == "CreateTime"
    assert TOPIC_CONFIG_DEFAULTS["min.insync.replicas"] == "1"
    assert TOPIC_CONFIG_DEFAULTS["compression.type"] == "producer"


@pytest.mark.parametrize("name,value", [
    ("retention.ms", "-1"), ("retention.ms", "9223372036854775807"), ("retention.ms", " 1000 "),
    ("retention.bytes", "-5"), ("segment.bytes", "14"), ("segment.bytes", "2147483647"),
    ("cleanup.policy", "compact"), ("cleanup.policy", "compact, delete"),
    ("compression.type", "zstd"), ("message.timestamp.type", "LogAppendTime"),
    ("min.insync.replicas", "2"), ("max.message.bytes", "0"), ("preallocate", "TRUE"),
    ("min.cleanable.dirty.ratio", "0.01"),
])
def test_valid_configs(name, value):
    assert validate_config(name, value) is None


@pytest.mark.parametrize("name,value", [
    ("retention.ms", "-2"), ("retention.ms", "9223372036854775808"), ("retention.ms", "1.5"),
    ("retention.ms", "abc"), ("retention.ms", ""), ("retention.ms", None), ("retention.ms", "1_000"),
    ("segment.bytes", "13"), ("segment.bytes", "2147483648"), ("cleanup.policy", "remove"),
    ("cleanup.policy", ""), ("cleanup.policy", "compact,nope"), ("compression.type", "brotli"),
    ("message.timestamp.type", "createtime"), ("min.insync.replicas", "0"),
    ("max.message.bytes", "-1"), ("preallocate", "yes"), ("min.cleanable.dirty.ratio", "1.5"),
    ("min.cleanable.dirty.ratio", "nan"), ("no.such.config", "1"),
])
def test_invalid_configs(name, value):
    assert isinstance(validate_config(name, value), str)


def test_typed_values():
    assert parse_config_value("retention.ms", " 42") == 42
    assert parse_config_value("cleanup.policy", "compact, delete") == ["compact", "delete"]
    assert parse_config_value("preallocate", "True") is True
    assert parse_config_value("min.cleanable.dirty.ratio", "0.25") == 0.25
    assert parse_config_value("compression.type", "lz4") == "lz4"
    with pytest.raises(ValueError):
        parse_config_value("segment.bytes", "1")


# --- topic names -----------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["a", "A-b_c.9", "x" * 249, "__consumer_offsets", "..."])
def test_legal_topic_names(name):
    assert validate_topic_name(name) is None


@pytest.mark.parametrize("name", ["", ".", "..", "x" * 250, "a b", "a/b", "tópico", "a*"])
def test_illegal_topic_names(name):
    assert validate_topic_name(name) is not None
    assert code_of(TopicRegistry().create, name, 1) == INVALID_TOPIC_EXCEPTION


# --- create / delete / persist ---------------------------------------------------------------

def test_create_get_and_reload(log):
    registry = reopen(log)
    orders = registry.create("orders", 3, {"retention.ms": "1000"})
    events = registry.create("events", -1, default_partitions=2)
    assert isinstance(orders.topic_id, uuid.UUID)
    assert orders.topic_id != events.topic_id
    assert events.partitions == 2
    assert orders.configs == {"retention.ms": "1000"}
    assert registry.get("orders") == orders
    assert registry.get("nope") is None
    assert registry.by_id(events.topic_id) == events
    assert [t.name for t in registry.all()] == ["orders", "events"]
    assert len(log) == 2                        # one record per topic

    reloaded = reopen(log)
    assert reloaded.all() == registry.all()
    assert reloaded.get("orders").topic_id == orders.topic_id
    later = reloaded.create("later", 1)
    assert [t.name for t in reloaded.all()] == ["orders", "events", "later"]
    assert later.created_order > events.created_order


def test_load_without_records_is_empty(log):
    assert reopen(log).all() == []


def test_create_errors(log):
    registry = reopen(log)
    registry.create("a.b", 1)
    assert code_of(registry.create, "a.b", 1) == TOPIC_ALREADY_EXISTS
    assert code_of(registry.create, "a_b", 1) == INVALID_TOPIC_EXCEPTION  # collides with a.b
    assert code_of(registry.create, "t", 0) == INVALID_PARTITIONS
    assert code_of(registry.create, "t", -2) == INVALID_PARTITIONS
    assert code_of(registry.create, "t", 1, replication_factor=3) == INVALID_REPLICATION_FACTOR
    assert code_of(registry.create, "t", 1, replication_factor=0) == INVALID_REPLICATION_FACTOR
    assert code_of(registry.create, "t", 1, {"retention.ms": "x"}) == INVALID_CONFIG
    assert code_of(registry.create, "t", 1, {"bogus": "1"}) == INVALID_CONFIG
    assert registry.create("t", 1, replication_factor=1).partitions == 1
    existing = registry.get("t").topic_id
    assert code_of(registry.create, "u", 1, topic_id=existing) == INVALID_REQUEST
    assert [t.name for t in reopen(log).all()] == ["a.b", "t"]


def test_validate_only_changes_nothing(log):
    registry = reopen(log)
    topic = registry.create("t", 4, {"cleanup.policy": "compact"}, validate_only=True)
    assert topic.partitions == 4
    assert registry.get("t") is None
    assert log == []


def test_delete_and_recreate_gets_new_id(log):
    registry = reopen(log)
    first = registry.create("t", 1)
    assert registry.delete("t") == first
    assert registry.get("t") is None
    assert registry.by_id(first.topic_id) is None
    assert code_of(registry.delete, "t") == UNKNOWN_TOPIC_OR_PARTITION
    second = registry.create("t", 1)
    assert second.topic_id != first.topic_id
    assert reopen(log).get("t").topic_id == second.topic_id


def test_delete_by_id(log):
    registry = reopen(log)
    topic = registry.create("t", 1)
    assert code_of(registry.delete_by_id, uuid.uuid4()) == UNKNOWN_TOPIC_ID
    assert registry.delete_by_id(topic.topic_id) == topic
    assert reopen(log).all() == []


def test_explicit_topic_id_is_kept(log):
    wanted = uuid.UUID("12345678-1234-5678-1234-567812345678")
    registry = reopen(log)
    assert registry.create("t", 1, topic_id=wanted).topic_id == wanted
    assert reopen(log).by_id(wanted).name == "t"


def test_topic_ids_stable_across_many_reloads_and_changes(log):
    registry = reopen(log)
    ids = {name: registry.create(name, 1).topic_id for name in ["a", "b", "c"]}
    for _ in range(3):
        registry = reopen(log)
        registry.add_partitions("a", registry.get("a").partitions + 1)
        registry.alter_configs("b", [("retention.ms", OP_SET, "5")])
        assert {t.name: t.topic_id for t in registry.all()} == ids


def test_decisions_change_nothing_until_replayed(log):
    registry = reopen(log)
    registry.create("t", 1)
    raw = registry.registry                     # deciding without writing: as a record that never became durable
    raw.create("u", 1)
    raw.add_partitions("t", 5)
    raw.alter_configs("t", [("retention.ms", OP_SET, "5")])
    raw.delete("t")
    assert [(t.name, t.partitions, t.configs) for t in raw.all()] == [("t", 1, {})]
    assert [(t.name, t.partitions) for t in reopen(log).all()] == [("t", 1)]


def test_internal_topics_flagged(log):
    registry = reopen(log)
    assert registry.create("__consumer_offsets", 50).is_internal
    assert not registry.create("plain", 1).is_internal


# --- partitions ------------------------------------------------------------------------------

def test_add_partitions(log):
    registry = reopen(log)
    registry.create("t", 2)
    assert registry.add_partitions("t", 5).partitions == 5
    assert code_of(registry.add_partitions, "t", 5) == INVALID_PARTITIONS
    assert code_of(registry.add_partitions, "t", 3) == INVALID_PARTITIONS
    assert code_of(registry.add_partitions, "nope", 9) == UNKNOWN_TOPIC_OR_PARTITION
    assert registry.add_partitions("t", 9, validate_only=True).partitions == 9
    assert reopen(log).get("t").partitions == 5


# --- configs on topics -----------------------------------------------------------------------

def test_effective_config_layers(log):
    topic = reopen(log).create("t", 1, {"retention.ms": "1000"})
    effective = topic.effective_config({"retention.ms": "5", "segment.bytes": "1048576"})
    assert effective["retention.ms"] == "1000"
    assert effective["segment.bytes"] == "1048576"
    assert effective["cleanup.policy"] == "delete"
    sources = topic.config_with_sources({"segment.bytes": "1048576"})
    assert sources["retention.ms"] == ("1000", SOURCE_DYNAMIC_TOPIC_CONFIG)
    assert sources["segment.bytes"] == ("1048576", SOURCE_STATIC_BROKER_CONFIG)
    assert sources["compression.type"] == ("producer", SOURCE_DEFAULT_CONFIG)
    assert topic.effective_config() == {**TOPIC_CONFIG_DEFAULTS, "retention.ms": "1000"}


def test_incremental_alter_configs(log):
    registry = reopen(log)
    registry.create("t", 1, {"retention.ms": "1000"})
    topic = registry.alter_configs("t", [("segment.bytes", OP_SET, "1048576"),
                                         ("retention.ms", OP_DELETE, None)])
    assert topic.configs == {"segment.bytes": "1048576"}
    topic = registry.alter_configs("t", [("cleanup.policy", OP_APPEND, "compact")])
    assert topic.configs["cleanup.policy"] == "delete,compact"  # appended to the default
    topic = registry.alter_configs("t", [("cleanup.policy", OP_APPEND, "compact")])
    assert topic.configs["cleanup.policy"] == "delete,compact"  # no duplicates
    topic = registry.alter_configs("t", [("cleanup.policy", OP_SUBTRACT, "delete")])
    assert topic.configs["cleanup.policy"] == "compact"
    assert reopen(log).get("t").configs == {"segment.bytes": "1048576", "cleanup.policy": "compact"}


def test_alter_configs_is_all_or_nothing(log):
    registry = reopen(log)
    registry.create("t", 1)
    ops = [("retention.ms", OP_SET, "5"), ("segment.bytes", OP_SET, "1")]
    assert code_of(registry.alter_configs, "t", ops) == INVALID_CONFIG
    assert code_of(registry.alter_configs, "t", [("nope", OP_SET, "1")]) == INVALID_CONFIG
    assert code_of(registry.alter_configs, "t", [("retention.ms", OP_APPEND, "1")]) == INVALID_CONFIG
    assert code_of(registry.alter_configs, "t", [("cleanup.policy", OP_SUBTRACT, "delete")]) == INVALID_CONFIG
    assert code_of(registry.alter_configs, "t", [("retention.ms", 7, "1")]) == INVALID_REQUEST
    assert code_of(registry.alter_configs, "x", []) == UNKNOWN_TOPIC_OR_PARTITION
    assert registry.alter_configs("t", [("retention.ms", OP_SET, "9")], validate_only=True).configs == {
        "retention.ms": "9"}
    assert registry.get("t").configs == {}


def test_replace_configs(log):
    registry = reopen(log)
    registry.create("t", 1, {"retention.ms": "1000"})
    assert registry.replace_configs("t", {"segment.ms": "60000"}).configs == {"segment.ms": "60000"}
    assert code_of(registry.replace_configs, "t", {"segment.ms": "0"}) == INVALID_CONFIG
    assert reopen(log).get("t").configs == {"segment.ms": "60000"}


# --- leader epochs ---------------------------------------------------------------------------

def test_leader_epoch_never_decreases(log):
    registry = reopen(log)
    assert registry.create("t", 1).leader_epoch == 0
    assert registry.bump_leader_epoch("t").leader_epoch == 1
    assert registry.bump_leader_epoch("t").leader_epoch == 2
    registry = reopen(log)
    assert registry.get("t").leader_epoch == 2
    assert registry.add_partitions("t", 3).leader_epoch == 2
    # A deleted and re-created topic continues above the old epochs, even across a restart.
    registry.delete("t")
    registry = reopen(log)
    assert registry.create("t", 1).leader_epoch == 3
    assert reopen(log).get("t").leader_epoch == 3
    assert code_of(registry.bump_leader_epoch, "nope") == UNKNOWN_TOPIC_OR_PARTITION


# --- records and compaction -------------------------------------------------------------------

def test_compaction_keeps_the_latest_record_per_topic_and_drops_removed_topics(log):
    registry = reopen(log)
    kept = registry.create("kept", 1)
    for i in range(5):
        registry.alter_configs("kept", [("retention.ms", OP_SET, str(1000 + i))])
    registry.add_partitions("kept", 3)
    gone = registry.create("gone", 2)
    registry.bump_leader_epoch("gone")
    registry.delete("gone")
    live = registry.live_records()
    keys = [key for key, _ in live]
    assert len(keys) == len(set(keys)) == 2     # the kept topic, the gone name's next leader epoch
    assert all(value is not None for _, value in live)
    compacted = reopen(live)
    assert compacted.all() == registry.all() == [replace(kept, partitions=3, configs={"retention.ms": "1004"})]
    assert compacted.by_id(gone.topic_id) is None
    assert compacted.create("gone", 1).leader_epoch == 2    # the deleted name's epochs continue
    assert len(compacted.live_records()) == 2               # the name is a topic again: no removed-name record


def test_a_record_for_a_name_held_by_another_id_is_unreadable(log):
    registry = reopen(log)
    registry.create("t", 1)
    other = TopicRegistry()
    records, _ = other.create("t", 1)
    with pytest.raises(RecordError):
        registry.registry.replay(*records[0])
    assert len(registry.all()) == 1


def test_legacy_registry_file_is_read_for_the_upgrade(storage):
    storage.files["topics.json"] = json.dumps({
        "version": 1, "next_order": 2, "retired_epochs": {"old": 4},
        "topics": [{"name": "t", "topic_id": str(uuid.UUID(int=77)), "partitions": 3, "configs": {"retention.ms": "5"},
                    "created_order": 1, "leader_epoch": 2}]}).encode()
    topics, retired = read_legacy_registry(storage)
    assert topics == [Topic("t", uuid.UUID(int=77), 3, {"retention.ms": "5"}, 1, 2)] and retired == {"old": 4}
    assert read_legacy_registry(FakeStorage()) is None
    storage.files["topics.json"] = b'{"version": 9}'
    with pytest.raises(ValueError, match="malformed topic registry"):
        read_legacy_registry(storage)


# --- broker metadata -------------------------------------------------------------------------

def test_broker_meta_created_then_reloaded(storage):
    meta = BrokerMeta.load_or_create(storage, "data/meta.properties")
    assert meta.node_id == 1
    assert len(meta.cluster_id) == 22
    assert set(meta.cluster_id) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
    assert not meta.cluster_id.startswith("-")
    props = parse_properties(storage.files["data/meta.properties"])
    assert props == {"version": "1", "node.id": "1", "cluster.id": meta.cluster_id, "directory.id": meta.directory_id}
    assert len(meta.directory_id) == 22 and meta.directory_id != meta.cluster_id
    assert BrokerMeta.load_or_create(storage, "data/meta.properties") == meta


def test_broker_meta_without_a_directory_id_gets_one_once(storage):
    """A meta.properties written before directory ids were: the next start gives it one, and keeps it."""
    storage.files["meta.properties"] = b"version=1\nnode.id=1\ncluster.id=MkU3OEVBNTcwNTJENDM2Qk\n"
    meta = BrokerMeta.load_or_create(storage)
    assert meta.cluster_id == "MkU3OEVBNTcwNTJENDM2Qk" and len(meta.directory_id) == 22
    assert BrokerMeta.load_or_create(storage) == meta


def test_broker_meta_reads_kafka_written_file(storage):
    storage.files["meta.properties"] = (b"#\n#Thu Jan 01 00:00:00 UTC 2025\nnode.id=3\n"
                                        b"directory.id=abc\nversion=1\ncluster.id=MkU3OEVBNTcwNTJENDM2Qk\n")
    meta = BrokerMeta.load_or_create(storage, node_id=3)
    assert meta == BrokerMeta(3, "MkU3OEVBNTcwNTJENDM2Qk", "abc")


@pytest.mark.parametrize("content", [b"version=1\nnode.id=2\ncluster.id=abc\n",  # another node
                                     b"version=0\nnode.id=1\ncluster.id=abc\n",
                                     b"version=1\nnode.id=1\n", b"node.id=x\n"])
def test_broker_meta_rejects_foreign_or_broken_files(storage, content):
    storage.files["meta.properties"] = content
    with pytest.raises(BrokerMetaError):
        BrokerMeta.load_or_create(storage)


def test_kafka_uuid_string():
    assert kafka_uuid_string(uuid.UUID(int=0)) == "AAAAAAAAAAAAAAAAAAAAAA"
    assert len(kafka_uuid_string(uuid.uuid4())) == 22
