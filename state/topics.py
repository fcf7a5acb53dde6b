"""The topic registry (names, topic ids, partition counts, configs, leader epochs) and the broker's identity.

Topic configs use Kafka's names, types, defaults and validity rules.  Configs are kept as the strings
clients send; :func:`parse_config_value` turns one into its typed value.  The registry is a section of
``__cluster_metadata``: every change is a record, visible once durable and replayed.
"""
from __future__ import annotations

import base64
import math
import posixpath
import re
import uuid
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Mapping, Protocol

from trireme.wire.codec import message

from .cluster_metadata import (REMOVE_TOPIC_RECORD, TOPIC_RECORD, MetadataRecordError, decode_key, decode_value,
                               encode_key, encode_value, read_legacy_file, record_type)

# Kafka error codes used here.
UNKNOWN_TOPIC_OR_PARTITION = 3
INVALID_TOPIC_EXCEPTION = 17
TOPIC_ALREADY_EXISTS = 36
INVALID_PARTITIONS = 37
INVALID_REPLICATION_FACTOR = 38
INVALID_CONFIG = 40
INVALID_REQUEST = 42
UNKNOWN_TOPIC_ID = 100

# Kafka's ConfigSource values, for DescribeConfigs.
SOURCE_DYNAMIC_TOPIC_CONFIG = 1
SOURCE_STATIC_BROKER_CONFIG = 4
SOURCE_DEFAULT_CONFIG = 5

# IncrementalAlterConfigs operations.
OP_SET = 0
OP_DELETE = 1
OP_APPEND = 2
OP_SUBTRACT = 3

INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state", "__cluster_metadata"})
MAX_TOPIC_NAME_LENGTH = 249
_LEGAL_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]+")
_INTEGER = re.compile(r"[+-]?[0-9]+")
_INT_RANGE = (-2**31, 2**31 - 1)
_LONG_RANGE = (-2**63, 2**63 - 1)
LEGACY_REGISTRY_FILE = "topics.json"       # where earlier versions kept the registry (read to upgrade)


class Storage(Protocol):
    def read_all(self, path: str) -> bytes: ...
    def write_atomic(self, path: str, data: bytes) -> None: ...
    def exists(self, path: str) -> bool: ...
    def makedirs(self, path: str) -> None: ...


class TopicError(Exception):
    """A refused topic operation, carrying the Kafka error code to answer with."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# --- topic configs -------------------------------------------------------------------------

@dataclass(frozen=True)
class ConfigSpec:
    """One topic config: its type (Kafka's ConfigType name), default, and extra value rule."""

    name: str
    type: str  # "boolean", "string", "int", "long", "double" or "list"
    default: str
    check: Callable[[object], str | None] = lambda value: None

    @property
    def config_type(self) -> int:
        """Kafka's DescribeConfigs ConfigType number."""
        return {"boolean": 1, "string": 2, "int": 3, "long": 5, "double": 6, "list": 7}[self.type]


def _at_least(minimum: int | float) -> Callable[[object], str | None]:
    return lambda v: None if v >= minimum else f"Value must be at least {minimum}"


def _between(low: float, high: float) -> Callable[[object], str | None]:
    return lambda v: None if low <= v <= high else f"Value must be between {low} and {high}"


def _one_of(*allowed: str) -> Callable[[object], str | None]:
    return lambda v: None if v in allowed else f"String must be one of: {', '.join(allowed)}"


def _list_of(*allowed: str) -> Callable[[object], str | None]:
    def check(values: object) -> str | None:
        if not values:
            return f"List must contain at least one of: {', '.join(allowed)}"
        bad = [v for v in values if v not in allowed]
        return f"Invalid value {bad[0]}; must be one of: {', '.join(allowed)}" if bad else None
    return check


TOPIC_CONFIGS: dict[str, ConfigSpec] = {spec.name: spec for spec in [
    ConfigSpec("cleanup.policy", "list", "delete", _list_of("compact", "delete")),
    ConfigSpec("compression.type", "string", "producer",
               _one_of("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")),
    ConfigSpec("delete.retention.ms", "long", "86400000", _at_least(0)),
    ConfigSpec("file.delete.delay.ms", "long", "60000", _at_least(0)),
    ConfigSpec("index.interval.bytes", "int", "4096", _at_least(0)),
    ConfigSpec("max.compaction.lag.ms", "long", "9223372036854775807", _at_least(1)),
    ConfigSpec("max.message.bytes", "int", "1048588", _at_least(0)),
    ConfigSpec("message.timestamp.type", "string", "CreateTime", _one_of("CreateTime", "LogAppendTime")),
    ConfigSpec("min.cleanable.dirty.ratio", "double", "0.5", _between(0, 1)),
    ConfigSpec("min.compaction.lag.ms", "long", "0", _at_least(0)),
    ConfigSpec("min.insync.replicas", "int", "1", _at_least(1)),
    ConfigSpec("preallocate", "boolean", "false"),
    ConfigSpec("retention.bytes", "long", "-1"),
    ConfigSpec("retention.ms", "long", "604800000", _at_least(-1)),
    ConfigSpec("segment.bytes", "int", "1073741824", _at_least(14)),
    ConfigSpec("segment.index.bytes", "int", "10485760", _at_least(4)),
    ConfigSpec("segment.jitter.ms", "long", "0", _at_least(0)),
    ConfigSpec("segment.ms", "long", "604800000", _at_least(1)),
    ConfigSpec("unclean.leader.election.enable", "boolean", "false"),
]}

TOPIC_CONFIG_DEFAULTS: dict[str, str] = {name: spec.default for name, spec in TOPIC_CONFIGS.items()}


def parse_config_value(name: str, value: str) -> object:
    """The typed value of a topic config (int, float, bool, str or list of str); ValueError if invalid."""
    spec = TOPIC_CONFIGS.get(name)
    if spec is None:
        raise ValueError(f"Unknown topic config name: {name}")
    if not isinstance(value, str):
        raise ValueError(f"Invalid value {value!r} for configuration {name}: not a string")
    text = value.strip()
    parsed: object
    if spec.type in ("int", "long"):
        low, high = _INT_RANGE if spec.type == "int" else _LONG_RANGE
        if not _INTEGER.fullmatch(text) or not low <= int(text) <= high:
            raise ValueError(f"Invalid value {value} for configuration {name}: Not a number of type "
                             f"{spec.type.upper()}")
        parsed = int(text)
    elif spec.type == "double":
        try:
            parsed = float(text)
        except ValueError:
            parsed = math.nan
        if math.isnan(parsed) or "_" in text:
            raise ValueError(f"Invalid value {value} for configuration {name}: Not a number of type DOUBLE")
    elif spec.type == "boolean":
        if text.lower() not in ("true", "false"):
            raise ValueError(f"Invalid value {value} for configuration {name}: Expected value to be "
                             "either true or false")
        parsed = text.lower() == "true"
    elif spec.type == "list":
        parsed = [item.strip() for item in text.split(",")] if text else []
    else:
        parsed = text
    problem = spec.check(parsed)
    if problem is not None:
        raise ValueError(f"Invalid value {value} for configuration {name}: {problem}")
    return parsed


def validate_config(name: str, value: str | None) -> str | None:
    """Why ``name=value`` is not a valid topic config, or None when it is."""
    if name not in TOPIC_CONFIGS:
        return f"Unknown topic config name: {name}"
    if value is None:
        return f"Null value not supported for topic config {name}"
    try:
        parse_config_value(name, value)
    except ValueError as exc:
        return str(exc)
    return None


# --- topics --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Topic:
    """One topic; registry changes replace it with a new object, so a reference is a snapshot."""

    name: str
    topic_id: uuid.UUID
    partitions: int
    configs: Mapping[str, str] = field(default_factory=dict)  # only the explicitly set ones
    created_order: int = 0
    leader_epoch: int = 0
    replication_factor: int = 1     # as created; the data's replication is the storage engine's

    @property
    def is_internal(self) -> bool:
        return self.name in INTERNAL_TOPICS

    def effective_config(self, broker_defaults: Mapping[str, str] | None = None) -> dict[str, str]:
        """Every topic config: Kafka defaults, overridden by broker defaults, overridden by the topic's."""
        return {name: value for name, (value, _) in self.config_with_sources(broker_defaults).items()}

    def config_with_sources(self, broker_defaults: Mapping[str, str] | None = None
                            ) -> dict[str, tuple[str, int]]:
        """Every topic config as ``(value, Kafka ConfigSource)``, for DescribeConfigs."""
        result: dict[str, tuple[str, int]] = {}
        for name, spec in TOPIC_CONFIGS.items():
            if name in self.configs:
                result[name] = (self.configs[name], SOURCE_DYNAMIC_TOPIC_CONFIG)
            elif broker_defaults and name in broker_defaults:
                result[name] = (broker_defaults[name], SOURCE_STATIC_BROKER_CONFIG)
            else:
                result[name] = (spec.default, SOURCE_DEFAULT_CONFIG)
        return result


def validate_topic_name(name: str) -> str | None:
    """Why ``name`` is not a legal Kafka topic name, or None when it is."""
    if not name:
        return "Topic name is illegal, it can't be empty"
    if name in (".", ".."):
        return "Topic name cannot be \".\" or \"..\""
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        return (f"Topic name is illegal, it can't be longer than {MAX_TOPIC_NAME_LENGTH} characters, "
                f"topic name: {name}")
    if not _LEGAL_TOPIC_NAME.fullmatch(name):
        return (f"Topic name \"{name}\" is illegal, it contains a character other than ASCII "
                "alphanumerics, '.', '_' and '-'")
    return None


def _collision_key(name: str) -> str:
    # Kafka's metric names turn '.' into '_', so names differing only there collide.
    return name.replace(".", "_")


class TopicRegistry:
    """All topics: the topics section of ``__cluster_metadata`` (state/cluster_metadata.py).

    A change is decided by the methods below on the current state (they change nothing and return the records
    that make the change, with the topic as it would be); it happens when those records are replayed, once
    durable.  One record per topic, keyed by topic id (:func:`topic_record`), and one per deleted name whose
    leader epochs a re-created topic continues (:func:`removed_topic_record`).  ``listeners`` are called with
    (topic before, topic after) after each replayed change (None: no topic)."""

    record_types = (TOPIC_RECORD, REMOVE_TOPIC_RECORD)

    def __init__(self) -> None:
        self._topics: dict[str, Topic] = {}
        self._names_by_id: dict[uuid.UUID, str] = {}
        self._next_order = 0
        # Leader epoch a re-created topic starts from, so a name's epochs never go backwards.
        self._retired: dict[str, tuple[uuid.UUID, int]] = {}
        self.listeners: list[Callable[[Topic | None, Topic | None], None]] = []

    # --- the durable section -------------------------------------------------------------------

    def replay(self, key: bytes, value: bytes | None) -> None:
        if record_type(key) == REMOVE_TOPIC_RECORD:
            name = decode_key(key, "RemoveTopicKey").name
            if value is None:
                self._retired.pop(name, None)
            else:
                v = decode_value(value, "RemoveTopicValue")
                self._retired[name] = (v.topic_id, v.next_leader_epoch)
            return
        topic_id = decode_key(key, "TopicRecordKey").topic_id
        old = self.by_id(topic_id)
        new = None if value is None else _decode_topic(topic_id, value)
        if old is not None:
            del self._topics[old.name]
            del self._names_by_id[topic_id]
        if new is not None:
            if new.name in self._topics:
                raise MetadataRecordError(f"topic record {topic_id} names {new.name}, a topic with another id")
            self._topics[new.name] = new
            self._names_by_id[topic_id] = new.name
            self._next_order = max(self._next_order, new.created_order + 1)
        if old is not None or new is not None:
            for listener in self.listeners:
                listener(old, new)

    def live_records(self) -> list[tuple[bytes, bytes]]:
        return ([removed_topic_record(name, topic_id, epoch) for name, (topic_id, epoch) in self._retired.items()]
                + [topic_record(t) for t in self.all()])

    # --- reading -----------------------------------------------------------------------------

    def get(self, name: str) -> Topic | None:
        return self._topics.get(name)

    def by_id(self, topic_id: uuid.UUID) -> Topic | None:
        name = self._names_by_id.get(topic_id)
        return None if name is None else self._topics[name]

    def all(self) -> list[Topic]:
        """Every topic, in creation order."""
        return sorted(self._topics.values(), key=lambda t: t.created_order)

    def retired_epochs(self) -> dict[str, int]:
        """Deleted names → the leader epoch a topic created again under the name starts from."""
        return {name: epoch for name, (_, epoch) in self._retired.items()}

    def __contains__(self, name: object) -> bool:
        return name in self._topics

    def __len__(self) -> int:
        return len(self._topics)

    # --- deciding changes: → (records, the topic as it would be) ------------------------------

    def create(self, name: str, partitions: int, configs: Mapping[str, str | None] | None = None,
               topic_id: uuid.UUID | None = None, *, replication_factor: int = -1,
               default_partitions: int = 1, live_brokers: int = 1) -> tuple[list, Topic]:
        """Create a topic (``partitions``/``replication_factor`` -1 mean the defaults: the replication factor's is
        1); TopicError if refused, a replication factor above ``live_brokers`` among the reasons."""
        problem = validate_topic_name(name)
        if problem is not None:
            raise TopicError(INVALID_TOPIC_EXCEPTION, problem)
        if name in self._topics:
            raise TopicError(TOPIC_ALREADY_EXISTS, f"Topic '{name}' already exists.")
        colliding = [t for t in self._topics if _collision_key(t) == _collision_key(name)]
        if colliding:
            raise TopicError(INVALID_TOPIC_EXCEPTION,
                             f"Topic '{name}' collides with existing topic: {colliding[0]}")
        if partitions == -1:
            partitions = default_partitions
        if partitions < 1:
            raise TopicError(INVALID_PARTITIONS,
                             "Number of partitions was set to an invalid non-positive value.")
        if replication_factor == 0 or replication_factor < -1:
            raise TopicError(INVALID_REPLICATION_FACTOR,
                             "Replication factor must be larger than 0, or -1 to use the default value.")
        if replication_factor > live_brokers:
            raise TopicError(INVALID_REPLICATION_FACTOR,
                             f"Unable to replicate the partition {replication_factor} time(s): The target "
                             f"replication factor of {replication_factor} cannot be reached because only "
                             f"{live_brokers} broker(s) are registered.")
        checked = _checked_configs((configs or {}).items())
        if topic_id is None:
            topic_id = _new_topic_id(self)
        elif topic_id.int == 0 or self.by_id(topic_id) is not None:
            raise TopicError(INVALID_REQUEST, f"Topic id {topic_id} is zero or already in use.")
        retired = self._retired.get(name)
        topic = Topic(name, topic_id, partitions, checked, self._next_order, 0 if retired is None else retired[1],
                      max(1, replication_factor))
        records = [topic_record(topic)]
        if retired is not None:
            records.append(removed_topic_tombstone(name))
        return records, topic

    def delete(self, name: str) -> tuple[list, Topic]:
        """Delete a topic; TopicError(UNKNOWN_TOPIC_OR_PARTITION) if there is none."""
        topic = self._require(name)
        return [removed_topic_record(name, topic.topic_id, topic.leader_epoch + 1), topic_tombstone(topic)], topic

    def delete_by_id(self, topic_id: uuid.UUID) -> tuple[list, Topic]:
        """Delete a topic by id; TopicError(UNKNOWN_TOPIC_ID) if there is none."""
        topic = self.by_id(topic_id)
        if topic is None:
            raise TopicError(UNKNOWN_TOPIC_ID, f"Topic id {topic_id} not found.")
        return self.delete(topic.name)

    def add_partitions(self, name: str, new_total: int) -> tuple[list, Topic]:
        """Grow a topic to ``new_total`` partitions (CreatePartitions)."""
        topic = self._require(name)
        if new_total == topic.partitions:
            raise TopicError(INVALID_PARTITIONS, f"Topic already has {topic.partitions} partitions.")
        if new_total < topic.partitions:
            raise TopicError(INVALID_PARTITIONS,
                             f"The topic {name} currently has {topic.partitions} partition(s); "
                             f"{new_total} would not be an increase.")
        return _changed(replace(topic, partitions=new_total))

    def alter_configs(self, name: str, ops: Iterable[tuple[str, int, str | None]]) -> tuple[list, Topic]:
        """Apply IncrementalAlterConfigs ``(key, op, value)`` operations, all or none."""
        topic = self._require(name)
        configs = dict(topic.configs)
        for key, op, value in ops:
            spec = TOPIC_CONFIGS.get(key)
            if spec is None:
                raise TopicError(INVALID_CONFIG, f"Unknown topic config name: {key}")
            if op == OP_SET:
                _require_valid(key, value)
                configs[key] = value
            elif op == OP_DELETE:
                configs.pop(key, None)
            elif op in (OP_APPEND, OP_SUBTRACT):
                if spec.type != "list":
                    verb = "append" if op == OP_APPEND else "subtract"
                    raise TopicError(INVALID_CONFIG,
                                     f"Config value {verb} is not allowed for config key: {key}")
                if value is None:
                    raise TopicError(INVALID_CONFIG, f"Null value not supported for topic config {key}")
                current = configs.get(key, spec.default)
                old = [v.strip() for v in current.split(",") if v.strip()]
                given = [v.strip() for v in value.split(",") if v.strip()]
                if op == OP_APPEND:
                    new = list(dict.fromkeys(old + given))
                else:
                    new = [v for v in old if v not in given]
                new_value = ",".join(new)
                _require_valid(key, new_value)
                configs[key] = new_value
            else:
                raise TopicError(INVALID_REQUEST, f"Unknown config operation {op}")
        return _changed(replace(topic, configs=configs))

    def replace_configs(self, name: str, configs: Mapping[str, str | None]) -> tuple[list, Topic]:
        """Make ``configs`` the topic's whole set of overrides (the legacy AlterConfigs)."""
        topic = self._require(name)
        return _changed(replace(topic, configs=_checked_configs(configs.items())))

    def bump_leader_epoch(self, name: str) -> tuple[list, Topic]:
        """Increase the topic's leader epoch by one."""
        topic = self._require(name)
        return _changed(replace(topic, leader_epoch=topic.leader_epoch + 1))

    # --- internals ---------------------------------------------------------------------------

    def _require(self, name: str) -> Topic:
        topic = self._topics.get(name)
        if topic is None:
            raise TopicError(UNKNOWN_TOPIC_OR_PARTITION, "This server does not host this topic-partition.")
        return topic


def _changed(topic: Topic) -> tuple[list, Topic]:
    return [topic_record(topic)], topic


def topic_key(topic_id: uuid.UUID) -> bytes:
    return encode_key(TOPIC_RECORD, "TopicRecordKey", message("TopicRecordKey").cls(topic_id=topic_id))


def topic_record(topic: Topic) -> tuple[bytes, bytes]:
    """The record that makes ``topic`` what it is (creates it, or replaces the topic of its id)."""
    cls = message("TopicRecordValue").cls
    value = cls(name=topic.name, partitions=topic.partitions,
                configs=[cls.TopicConfig(name=k, value=v) for k, v in sorted(topic.configs.items())],
                created_order=topic.created_order, leader_epoch=topic.leader_epoch,
                replication_factor=topic.replication_factor)
    return topic_key(topic.topic_id), encode_value("TopicRecordValue", value)


def topic_tombstone(topic: Topic) -> tuple[bytes, None]:
    return topic_key(topic.topic_id), None


def _decode_topic(topic_id: uuid.UUID, value) -> Topic:
    v = decode_value(value, "TopicRecordValue")
    if validate_topic_name(v.name) is not None or v.partitions < 1:
        raise MetadataRecordError(f"topic record {topic_id} is invalid: {v.name!r} with {v.partitions} partitions")
    return Topic(v.name, topic_id, v.partitions, {c.name: c.value for c in v.configs}, v.created_order,
                 v.leader_epoch, max(1, v.replication_factor))


def _removed_key(name: str) -> bytes:
    return encode_key(REMOVE_TOPIC_RECORD, "RemoveTopicKey", message("RemoveTopicKey").cls(name=name))


def removed_topic_record(name: str, topic_id: uuid.UUID, next_leader_epoch: int) -> tuple[bytes, bytes]:
    """A deleted name: a topic created again under it starts from ``next_leader_epoch``."""
    value = message("RemoveTopicValue").cls(topic_id=topic_id, next_leader_epoch=next_leader_epoch)
    return _removed_key(name), encode_value("RemoveTopicValue", value)


def removed_topic_tombstone(name: str) -> tuple[bytes, None]:
    return _removed_key(name), None


def read_legacy_registry(storage: Storage, path: str = LEGACY_REGISTRY_FILE
                         ) -> tuple[list[Topic], dict[str, int]] | None:
    """The topics and retired leader epochs of the JSON registry earlier versions kept at ``path`` (None if
    there is none), for the upgrade that turns it into records."""
    def read(doc):
        topics = [Topic(str(t["name"]), uuid.UUID(t["topic_id"]), int(t["partitions"]),
                        {str(k): str(v) for k, v in t["configs"].items()}, int(t["created_order"]),
                        int(t["leader_epoch"])) for t in doc["topics"]]
        return topics, {str(k): int(v) for k, v in doc["retired_epochs"].items()}
    return read_legacy_file(storage, path, "topic registry", read)


def _require_valid(name: str, value: str | None) -> None:
    problem = validate_config(name, value)
    if problem is not None:
        raise TopicError(INVALID_CONFIG, problem)


def _checked_configs(items: Iterable[tuple[str, str | None]]) -> dict[str, str]:
    checked: dict[str, str] = {}
    for name, value in items:
        _require_valid(name, value)
        checked[name] = value  # type: ignore[assignment]  # validated as a string
    return checked


def _new_topic_id(registry: TopicRegistry) -> uuid.UUID:
    while True:
        topic_id = random_kafka_uuid()
        if registry.by_id(topic_id) is None:
            return topic_id


def _ensure_parent(storage: Storage, path: str) -> None:
    parent = posixpath.dirname(path)
    if parent and not storage.exists(parent):
        storage.makedirs(parent)


# --- broker identity -----------------------------------------------------------------------

def random_kafka_uuid() -> uuid.UUID:
    """A random UUID as Kafka makes them: never zero, never 1 (the metadata topic's), never shown with a leading '-'."""
    while True:
        value = uuid.uuid4()
        if value.int > 1 and not kafka_uuid_string(value).startswith("-"):
            return value


def kafka_uuid_string(value: uuid.UUID) -> str:
    """Kafka's text form of a UUID: 22 characters of unpadded URL-safe base64."""
    return base64.urlsafe_b64encode(value.bytes).rstrip(b"=").decode()


class BrokerMetaError(ValueError):
    """``meta.properties`` is unreadable or belongs to another node."""


@dataclass(frozen=True)
class BrokerMeta:
    """This broker's node id and its cluster's id, as recorded in ``meta.properties``."""

    node_id: int
    cluster_id: str
    directory_id: str = ""      # this data directory's own id (Kafka's directory.id)

    @classmethod
    def load_or_create(cls, storage: Storage, path: str = "meta.properties",
                       node_id: int = 1) -> BrokerMeta:
        """Read ``meta.properties``, or write a new one with a fresh cluster id on first start (and a directory id
        into one written before directory ids were)."""
        if not storage.exists(path):
            meta = cls(node_id, kafka_uuid_string(random_kafka_uuid()), kafka_uuid_string(random_kafka_uuid()))
            _ensure_parent(storage, path)
            storage.write_atomic(path, meta.to_properties())
            return meta
        try:
            props = parse_properties(storage.read_all(path))
        except UnicodeDecodeError as exc:
            raise BrokerMetaError(f"malformed {path}: not text ({exc.reason} at byte {exc.start})") from exc
        try:
            version = int(props["version"])
            stored_node_id = int(props["node.id"])
            cluster_id = props["cluster.id"]
        except (KeyError, ValueError) as exc:
            raise BrokerMetaError(f"malformed {path}: {exc!r}") from exc
        if version != 1:
            raise BrokerMetaError(f"unsupported {path} version {version}")
        if not cluster_id:
            raise BrokerMetaError(f"{path} has an empty cluster.id")
        if stored_node_id != node_id:
            raise BrokerMetaError(f"stored node id {stored_node_id} in {path} doesn't match the "
                                  f"configured node id {node_id}")
        if props.get("directory.id"):
            return cls(stored_node_id, cluster_id, props["directory.id"])
        meta = cls(stored_node_id, cluster_id, kafka_uuid_string(random_kafka_uuid()))
        storage.write_atomic(path, meta.to_properties())
        return meta

    def to_properties(self) -> bytes:
        return (f"#Written by Trireme; do not edit.\n"
                f"version=1\nnode.id={self.node_id}\ncluster.id={self.cluster_id}\n"
                f"directory.id={self.directory_id}\n").encode()


def parse_properties(data: bytes) -> dict[str, str]:
    """``key=value`` (or ``key:value``) lines of a Java properties file; comments and blanks skipped."""
    props: dict[str, str] = {}
    for raw in data.decode("utf-8").splitlines():
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        match = re.match(r"([^=:\s]+)\s*[=:\s]\s*(.*)", line)
        if match is None:
            props[line] = ""
        else:
            props[match.group(1)] = match.group(2).strip()
    return props
