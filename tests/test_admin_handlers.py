"""Unit tests for the admin handlers: topics, partitions, configs, cluster, records deletion and leader epochs.

Each call goes through the codec at the version under test: the request is encoded and decoded
(so only the fields that version carries reach the handler), and the response is encoded and
decoded again (proving it is encodable at that version).
"""
from __future__ import annotations

import uuid

import pytest
import trio

from trireme.server import dispatch
from trireme.server.broker import Broker
from trireme.server.clock import now_ms
from trireme.server.config import PROPERTIES, SENSITIVE_PROPERTIES, Config
from trireme.server.deferred import Deferred
from trireme.server.dispatch import API_KEYS, HANDLERS, RequestContext
from trireme.server.handlers.metadata import CLUSTER_OPERATIONS, TOPIC_OPERATIONS
from trireme.state.topics import TOPIC_CONFIGS
from trireme.wire import error_codes as E
from trireme.wire import records

dispatch.load_handlers()

ZERO_UUID = uuid.UUID(int=0)
NONE = 0
SOURCE_TOPIC, SOURCE_STATIC, SOURCE_DEFAULT = 1, 4, 5


# --- helpers ---------------------------------------------------------------------------------

def handler(api):
    return HANDLERS[API_KEYS[api]]


def versions(api):
    h = handler(api)
    return range(h.min_version, h.max_version + 1)


def req(api):
    """The request class of ``api`` (nested struct classes are its attributes)."""
    return handler(api).request.cls


def call(broker, api, version, request):
    h = handler(api)
    frame = bytearray(h.request.encode_bytes(request, version))      # decoded from a writable frame, as served
    decoded, end = h.request.decode(frame, version)
    assert end == len(frame)
    ctx = RequestContext(broker=broker, api_key=h.api_key, api_version=version, correlation_id=7,
                         client_id="tests", principal="User:ANONYMOUS", connection=None, frame=frame)
    response = h.fn(ctx, decoded)
    if isinstance(response, Deferred):      # the answer waits for __cluster_metadata's records: run the broker
        response = wait_deferred(broker, response)
    data = h.response.encode_bytes(response, version)
    out, end = h.response.decode(data, version)
    assert end == len(data)
    return out


def wait_deferred(broker, deferred):
    """The response a Deferred gives, with the broker's tasks (its flush round) running meanwhile."""
    result = []

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            result.append(await deferred.wait())
            nursery.cancel_scope.cancel()
    trio.run(main)
    return result[0]


def make_broker(path, **props):
    config = Config(data_dir=str(path))
    config.set("trireme.fsync.enable", False)
    for name, value in props.items():
        config.set(name.replace("_", "."), value)
    return Broker(config)


@pytest.fixture
def broker(tmp_path):
    b = make_broker(tmp_path / "data")
    yield b
    b.close()


def append(broker, topic, index, count):
    """Append ``count`` records to a partition and make them durable (high watermark moves)."""
    p = broker.partition(topic, index)
    buf = bytearray(records.build_batch([(None, b"v%d" % i) for i in range(count)],
                                        partition_leader_epoch=p.leader_epoch))
    p.log.append(buf, records.validate_batches(buf), now_ms())
    p.log.flush_done(p.log.flush_begin())


# --- CreateTopics ----------------------------------------------------------------------------

CT = req("CreateTopics")


def creatable(name, partitions=1, rf=1, configs=None, assignments=None):
    return CT.CreatableTopic(
        name=name, num_partitions=partitions, replication_factor=rf,
        assignments=[CT.CreatableTopic.CreatableReplicaAssignment(partition_index=i, broker_ids=ids)
                     for i, ids in (assignments or [])],
        configs=[CT.CreatableTopic.CreatableTopicConfig(name=k, value=v) for k, v in (configs or {}).items()])


def create(broker, version, *topics, validate_only=False):
    return call(broker, "CreateTopics", version,
                CT(topics=list(topics), timeout_ms=1000, validate_only=validate_only)).topics


@pytest.mark.parametrize("version", versions("CreateTopics"))
def test_create_topics_every_version(broker, version):
    [result] = create(broker, version, creatable("orders", 3, configs={"retention.ms": "1000"}))
    assert (result.name, result.error_code, result.error_message) == ("orders", NONE, None)
    topic = broker.topics.get("orders")
    assert topic.partitions == 3 and all(broker.partition("orders", i) for i in range(3))
    assert result.topic_id == (topic.topic_id if version >= 7 else ZERO_UUID)
    if version >= 5:
        assert (result.num_partitions, result.replication_factor) == (3, 1)
        assert [c.name for c in result.configs] == sorted(TOPIC_CONFIGS)
        by_name = {c.name: c for c in result.configs}
        assert (by_name["retention.ms"].value, by_name["retention.ms"].config_source) == ("1000", SOURCE_TOPIC)
        assert (by_name["segment.bytes"].value, by_name["segment.bytes"].config_source) == ("1073741824",
                                                                                           SOURCE_DEFAULT)
        assert not any(c.read_only or c.is_sensitive for c in result.configs)
        assert result.topic_config_error_code == 0


def test_create_topics_defaults_and_static_broker_configs(tmp_path):
    b = make_broker(tmp_path, num_partitions=4, log_retention_ms=5000)
    try:
        [result] = create(b, 7, creatable("t", -1, -1))
        assert result.error_code == NONE and result.num_partitions == 4 and result.replication_factor == 1
        assert b.topics.get("t").partitions == 4
        retention = next(c for c in result.configs if c.name == "retention.ms")
        assert (retention.value, retention.config_source) == ("5000", SOURCE_STATIC)
    finally:
        b.close()


@pytest.mark.parametrize("topic, code, message", [
    (creatable("t", 1, 3), E.INVALID_REPLICATION_FACTOR,
     "Unable to replicate the partition 3 time(s): The target replication factor of 3 cannot be reached "
     "because only 1 broker(s) are registered."),
    (creatable("t", 1, 0), E.INVALID_REPLICATION_FACTOR,
     "Replication factor must be larger than 0, or -1 to use the default value."),
    (creatable("t", 1, -2), E.INVALID_REPLICATION_FACTOR,
     "Replication factor must be larger than 0, or -1 to use the default value."),
    (creatable("t", 0, 1), E.INVALID_PARTITIONS, "Number of partitions was set to an invalid non-positive value."),
    (creatable("t", -3, 1), E.INVALID_PARTITIONS, "Number of partitions was set to an invalid non-positive value."),
    (creatable("bad name"), E.INVALID_TOPIC_EXCEPTION, None),
    (creatable(""), E.INVALID_TOPIC_EXCEPTION, "Topic name is illegal, it can't be empty"),
    (creatable("t", configs={"retention.ms": "soon"}), E.INVALID_CONFIG, None),
    (creatable("t", configs={"no.such.config": "1"}), E.INVALID_CONFIG, "Unknown topic config name: no.such.config"),
    (creatable("t", configs={"retention.ms": None, "segment.ms": None}), E.INVALID_CONFIG,
     "Null value not supported for topic configs: retention.ms,segment.ms"),
    (creatable("t", 1, 1, assignments=[(0, [1])]), E.INVALID_REQUEST,
     "A manual partition assignment was specified, but replication factor was not set to -1."),
    (creatable("t", 1, -1, assignments=[(0, [1])]), E.INVALID_REQUEST,
     "A manual partition assignment was specified, but numPartitions was not set to -1."),
    (creatable("t", -1, -1, assignments=[(0, [2])]), E.INVALID_REPLICA_ASSIGNMENT,
     "The manual partition assignment includes broker 2, but no such broker is registered."),
    (creatable("t", -1, -1, assignments=[(0, [1, 1])]), E.INVALID_REPLICA_ASSIGNMENT,
     "The manual partition assignment includes the broker 1 more than once."),
    (creatable("t", -1, -1, assignments=[(0, [])]), E.INVALID_REPLICA_ASSIGNMENT,
     "The manual partition assignment includes an empty replica list."),
    (creatable("t", -1, -1, assignments=[(0, [1]), (0, [1])]), E.INVALID_REPLICA_ASSIGNMENT,
     "Found multiple manual partition assignments for partition 0"),
    (creatable("t", -1, -1, assignments=[(0, [1]), (2, [1])]), E.INVALID_REPLICA_ASSIGNMENT,
     "partitions should be a consecutive 0-based integer sequence"),
])
@pytest.mark.parametrize("version", [2, 5, 7])
def test_create_topics_refusals(broker, version, topic, code, message):
    [result] = create(broker, version, topic)
    assert result.error_code == code.code
    assert result.error_message
    if message is not None:
        assert result.error_message == message
    assert result.topic_id == ZERO_UUID and len(broker.topics) == 0
    if version >= 5:
        assert (result.num_partitions, result.replication_factor, result.configs) == (-1, -1, [])


def test_create_topics_existing_and_colliding(broker):
    create(broker, 7, creatable("a.b"))
    exists, collides, fine = create(broker, 7, creatable("a.b"), creatable("a_b"), creatable("c"))
    assert (exists.error_code, exists.error_message) == (E.TOPIC_ALREADY_EXISTS.code, "Topic 'a.b' already exists.")
    assert (collides.error_code, collides.error_message) == (
        E.INVALID_TOPIC_EXCEPTION.code, "Topic 'a_b' collides with existing topic: a.b")
    assert fine.error_code == NONE


def test_create_topics_manual_assignment(broker):
    [result] = create(broker, 7, creatable("m", -1, -1, assignments=[(1, [1]), (0, [1])]))
    assert result.error_code == NONE and result.num_partitions == 2
    assert broker.topics.get("m").partitions == 2


def test_create_topics_validate_only(broker):
    [result] = create(broker, 7, creatable("v", 2), validate_only=True)
    assert result.error_code == NONE and result.num_partitions == 2 and result.topic_id != ZERO_UUID
    assert "v" not in broker.topics and broker.partition("v", 0) is None


def test_create_topics_duplicate_names(broker):
    results = create(broker, 7, creatable("d"), creatable("x"), creatable("d", 2))
    assert [(r.name, r.error_code) for r in results] == [("x", NONE), ("d", E.INVALID_REQUEST.code)]
    assert results[1].error_message == "Duplicate topic name."
    assert "d" not in broker.topics


# --- DeleteTopics ----------------------------------------------------------------------------

DT = req("DeleteTopics")


def delete_by_name(broker, version, *names):
    if version >= 6:
        request = DT(topics=[DT.DeleteTopicState(name=n, topic_id=ZERO_UUID) for n in names], timeout_ms=100)
    else:
        request = DT(topic_names=list(names), timeout_ms=100)
    return call(broker, "DeleteTopics", version, request).responses


@pytest.mark.parametrize("version", versions("DeleteTopics"))
def test_delete_topics_by_name(broker, version):
    create(broker, 7, creatable("gone", 2))
    topic_id = broker.topics.get("gone").topic_id
    append(broker, "gone", 0, 3)
    gone, missing = delete_by_name(broker, version, "gone", "missing")
    assert (gone.name, gone.error_code) == ("gone", NONE)
    assert gone.topic_id == (topic_id if version >= 6 else ZERO_UUID)
    assert "gone" not in broker.topics and broker.partition("gone", 0) is None
    assert (missing.name, missing.error_code) == ("missing", E.UNKNOWN_TOPIC_OR_PARTITION.code)
    if version >= 5:
        assert gone.error_message is None and missing.error_message


def test_delete_topics_by_id(broker):
    create(broker, 7, creatable("x"), creatable("y"))
    x = broker.topics.get("x").topic_id
    unknown = uuid.uuid4()
    request = DT(topics=[DT.DeleteTopicState(name=None, topic_id=x),
                         DT.DeleteTopicState(name=None, topic_id=unknown),
                         DT.DeleteTopicState(name="y", topic_id=broker.topics.get("y").topic_id),
                         DT.DeleteTopicState(name=None, topic_id=ZERO_UUID)], timeout_ms=1)
    by_id, missing, both, neither = call(broker, "DeleteTopics", 6, request).responses
    assert (by_id.name, by_id.topic_id, by_id.error_code) == ("x", x, NONE)
    assert (missing.name, missing.topic_id, missing.error_code) == (None, unknown, E.UNKNOWN_TOPIC_ID.code)
    assert (both.error_code, both.error_message) == (E.INVALID_REQUEST.code,
                                                     "You may not specify both topic name and topic id.")
    assert (neither.error_code, neither.name) == (E.INVALID_REQUEST.code, None)
    assert "x" not in broker.topics and "y" in broker.topics


def test_delete_topics_duplicates(broker):
    create(broker, 7, creatable("x"), creatable("y"))
    y = broker.topics.get("y").topic_id
    request = DT(topics=[DT.DeleteTopicState(name="x", topic_id=ZERO_UUID),
                         DT.DeleteTopicState(name="x", topic_id=ZERO_UUID),
                         DT.DeleteTopicState(name=None, topic_id=y),
                         DT.DeleteTopicState(name="y", topic_id=ZERO_UUID)], timeout_ms=1)
    results = call(broker, "DeleteTopics", 6, request).responses
    assert [(r.name, r.error_code, r.error_message) for r in results] == [
        ("x", E.INVALID_REQUEST.code, "Duplicate topic name."),
        ("y", E.INVALID_REQUEST.code, "The provided topic name maps to an ID that was already supplied.")]
    assert "x" in broker.topics and "y" in broker.topics


@pytest.mark.parametrize("version", versions("DeleteTopics"))
def test_delete_topics_disabled(tmp_path, version):
    b = make_broker(tmp_path, delete_topic_enable=False)
    try:
        create(b, 7, creatable("kept"))
        [result] = delete_by_name(b, version, "kept")
        assert result.error_code == (E.TOPIC_DELETION_DISABLED if version >= 3 else E.INVALID_REQUEST).code
        assert "kept" in b.topics
    finally:
        b.close()


# --- CreatePartitions ------------------------------------------------------------------------

CP = req("CreatePartitions")


def grow(broker, version, name, count, assignments=None, validate_only=False):
    topic = CP.CreatePartitionsTopic(
        name=name, count=count,
        assignments=None if assignments is None else [CP.CreatePartitionsTopic.CreatePartitionsAssignment(
            broker_ids=ids) for ids in assignments])
    request = CP(topics=[topic], timeout_ms=100, validate_only=validate_only)
    [result] = call(broker, "CreatePartitions", version, request).results
    return result


@pytest.mark.parametrize("version", versions("CreatePartitions"))
def test_create_partitions_every_version(broker, version):
    create(broker, 7, creatable("g", 1))
    result = grow(broker, version, "g", 3)
    assert (result.name, result.error_code, result.error_message) == ("g", NONE, None)
    assert broker.topics.get("g").partitions == 3 and broker.partition("g", 2) is not None
    result = grow(broker, version, "g", 5, assignments=[[1], [1]])
    assert result.error_code == NONE and broker.partition("g", 4) is not None


@pytest.mark.parametrize("count, assignments, code, message", [
    (2, None, E.INVALID_PARTITIONS, "Topic already has 2 partition(s)."),
    (1, None, E.INVALID_PARTITIONS, "The topic g currently has 2 partition(s); 1 would not be an increase."),
    (4, [[1]], E.INVALID_REPLICA_ASSIGNMENT,
     "Attempted to add 2 additional partition(s), but only 1 assignment(s) were specified."),
    (3, [[3]], E.INVALID_REPLICA_ASSIGNMENT,
     "The manual partition assignment includes broker 3, but no such broker is registered."),
    (3, [[1, 1]], E.INVALID_REPLICA_ASSIGNMENT,
     "The manual partition assignment includes the broker 1 more than once."),
    (3, [[]], E.INVALID_REPLICA_ASSIGNMENT, "The manual partition assignment includes an empty replica list."),
])
def test_create_partitions_refusals(broker, count, assignments, code, message):
    create(broker, 7, creatable("g", 2))
    result = grow(broker, 3, "g", count, assignments)
    assert (result.error_code, result.error_message) == (code.code, message)
    assert broker.topics.get("g").partitions == 2


def test_create_partitions_unknown_validate_only_and_duplicates(broker):
    result = grow(broker, 0, "nope", 3)
    assert (result.error_code, result.error_message) == (E.UNKNOWN_TOPIC_OR_PARTITION.code, None)
    create(broker, 7, creatable("g", 1), creatable("h", 1))
    result = grow(broker, 1, "g", 4, validate_only=True)
    assert result.error_code == NONE and broker.topics.get("g").partitions == 1 and broker.partition("g", 1) is None
    request = CP(topics=[CP.CreatePartitionsTopic(name=n, count=2, assignments=None) for n in ("h", "g", "h")],
                 timeout_ms=1, validate_only=False)
    results = call(broker, "CreatePartitions", 3, request).results
    assert [(r.name, r.error_code) for r in results] == [("h", E.INVALID_REQUEST.code), ("g", NONE)]
    assert broker.topics.get("h").partitions == 1 and broker.topics.get("g").partitions == 2


# --- DescribeConfigs -------------------------------------------------------------------------

DC = req("DescribeConfigs")


def describe(broker, version, *resources, synonyms=False, docs=False):
    request = DC(resources=[DC.DescribeConfigsResource(resource_type=t, resource_name=n, configuration_keys=k)
                            for t, n, k in resources],
                 include_synonyms=synonyms, include_documentation=docs)
    return call(broker, "DescribeConfigs", version, request).results


@pytest.mark.parametrize("version", versions("DescribeConfigs"))
def test_describe_topic_configs(tmp_path, version):
    b = make_broker(tmp_path, log_segment_bytes=1048576)
    try:
        create(b, 7, creatable("t", configs={"cleanup.policy": "compact"}))
        [result] = describe(b, version, (2, "t", None), synonyms=True, docs=True)
        assert (result.error_code, result.error_message, result.resource_type, result.resource_name) == (
            NONE, None, 2, "t")
        assert [c.name for c in result.configs] == sorted(TOPIC_CONFIGS)
        c = {c.name: c for c in result.configs}
        assert (c["cleanup.policy"].value, c["cleanup.policy"].config_source) == ("compact", SOURCE_TOPIC)
        assert [(s.name, s.value, s.source) for s in c["cleanup.policy"].synonyms] == [
            ("cleanup.policy", "compact", SOURCE_TOPIC), ("log.cleanup.policy", "delete", SOURCE_DEFAULT)]
        assert (c["segment.bytes"].value, c["segment.bytes"].config_source) == ("1048576", SOURCE_STATIC)
        assert [(s.name, s.value, s.source) for s in c["segment.bytes"].synonyms] == [
            ("log.segment.bytes", "1048576", SOURCE_STATIC), ("log.segment.bytes", "1073741824", SOURCE_DEFAULT)]
        assert (c["preallocate"].value, c["preallocate"].config_source) == ("false", SOURCE_DEFAULT)
        assert not any(x.read_only or x.is_sensitive for x in result.configs)
        if version >= 3:
            assert c["retention.ms"].config_type == 5 and c["cleanup.policy"].config_type == 7
            assert c["preallocate"].config_type == 1 and c["retention.ms"].documentation is None
    finally:
        b.close()


def test_describe_topic_configs_filters_and_errors(broker):
    create(broker, 7, creatable("t"))
    some, every, missing, illegal = describe(broker, 4, (2, "t", ["retention.ms", "no.such", "segment.ms"]),
                                             (2, "t", []), (2, "missing", None), (2, "a/b", None))
    assert [c.name for c in some.configs] == ["retention.ms", "segment.ms"]
    assert all(c.synonyms == [] for c in some.configs)
    assert len(every.configs) == len(TOPIC_CONFIGS)
    assert (missing.error_code, missing.error_message, missing.configs) == (E.UNKNOWN_TOPIC_OR_PARTITION.code,
                                                                             None, [])
    assert missing.resource_name == "missing" and missing.resource_type == 2
    assert illegal.error_code == E.INVALID_TOPIC_EXCEPTION.code and illegal.error_message


@pytest.mark.parametrize("version", versions("DescribeConfigs"))
def test_describe_broker_configs(tmp_path, version):
    b = make_broker(tmp_path, num_partitions=6, auto_create_topics_enable=False)
    try:
        ours, default, other, word, logger = describe(b, version, (4, str(b.node_id), None), (4, "", None),
                                                      (4, "2", None), (4, "one", None), (8, "1", None),
                                                      synonyms=True, docs=True)
        assert ours.error_code == NONE and [c.name for c in ours.configs] == sorted(PROPERTIES)
        c = {c.name: c for c in ours.configs}
        assert (c["num.partitions"].value, c["num.partitions"].config_source) == ("6", SOURCE_STATIC)
        assert c["auto.create.topics.enable"].value == "false"
        assert (c["log.segment.bytes"].value, c["log.segment.bytes"].config_source) == ("1073741824", SOURCE_DEFAULT)
        assert [(s.value, s.source) for s in c["num.partitions"].synonyms] == [("6", SOURCE_STATIC),
                                                                               ("1", SOURCE_DEFAULT)]
        assert all(x.read_only and x.is_sensitive == (x.name in SENSITIVE_PROPERTIES) for x in ours.configs)
        if version >= 3:
            assert c["num.partitions"].documentation == PROPERTIES["num.partitions"][1]
            assert c["auto.create.topics.enable"].config_type == 1 and c["log.retention.ms"].config_type == 5
        assert (default.error_code, default.configs) == (NONE, [])
        assert other.error_code == E.INVALID_REQUEST.code
        assert other.error_message == f"Unexpected broker id, expected {b.node_id} or empty string, but received 2"
        assert (word.error_code, word.error_message) == (E.INVALID_REQUEST.code,
                                                         "Broker id must be an integer, but it is: one")
        assert logger.error_code == E.INVALID_REQUEST.code
    finally:
        b.close()


def test_describe_configs_without_documentation(broker):
    [result] = describe(broker, 4, (4, "1", ["num.partitions"]), docs=False)
    assert [(c.name, c.documentation) for c in result.configs] == [("num.partitions", None)]


# --- IncrementalAlterConfigs -----------------------------------------------------------------

IAC = req("IncrementalAlterConfigs")
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3


def alter(broker, version, *resources, validate_only=False):
    request = IAC(resources=[IAC.AlterConfigsResource(
        resource_type=t, resource_name=n,
        configs=[IAC.AlterConfigsResource.AlterableConfig(name=k, config_operation=op, value=v) for k, op, v in ops])
        for t, n, ops in resources], validate_only=validate_only)
    return call(broker, "IncrementalAlterConfigs", version, request).responses


@pytest.mark.parametrize("version", versions("IncrementalAlterConfigs"))
def test_incremental_alter_topic_configs(broker, version):
    create(broker, 7, creatable("t", 2, configs={"segment.ms": "1000"}))
    [result] = alter(broker, version, (2, "t", [("retention.ms", SET, "5000"), ("segment.ms", DELETE, None),
                                                ("cleanup.policy", APPEND, "compact")]))
    assert (result.error_code, result.error_message, result.resource_type, result.resource_name) == (
        NONE, None, 2, "t")
    assert dict(broker.topics.get("t").configs) == {"retention.ms": "5000", "cleanup.policy": "delete,compact"}
    assert broker.partition("t", 1).log.retention_ms == 5000
    [result] = alter(broker, version, (2, "t", [("cleanup.policy", SUBTRACT, "delete")]))
    assert result.error_code == NONE and broker.topics.get("t").configs["cleanup.policy"] == "compact"
    [described] = describe(broker, 4, (2, "t", ["retention.ms"]))
    assert [(c.value, c.config_source) for c in described.configs] == [("5000", SOURCE_TOPIC)]


def test_incremental_alter_configs_refusals(broker):
    create(broker, 7, creatable("t"))
    results = alter(broker, 1,
                    (2, "t", [("retention.ms", SET, "soon")]),
                    (2, "missing", [("retention.ms", SET, "1")]),
                    (2, "bad name", [("retention.ms", SET, "1")]),
                    (4, "1", [("num.partitions", SET, "3")]),
                    (32, "group", [("x", SET, "1")]))
    assert [r.error_code for r in results] == [E.INVALID_CONFIG.code, E.UNKNOWN_TOPIC_OR_PARTITION.code,
                                               E.INVALID_TOPIC_EXCEPTION.code, E.INVALID_REQUEST.code,
                                               E.INVALID_REQUEST.code]
    assert all(r.error_message for r in results)
    assert "static" in results[3].error_message
    results = alter(broker, 0,
                    (2, "t", [("retention.ms", SET, None)]),
                    (2, "t", [("no.such", SET, "1")]))
    assert [(r.error_code, r.error_message) for r in results] == [
        (E.INVALID_REQUEST.code, "Each resource must appear at most once.")] * 2
    [null, dup, unknown, not_list, bad_op] = [
        alter(broker, 1, (2, "t", ops))[0] for ops in (
            [("retention.ms", SET, None), ("segment.ms", APPEND, None), ("preallocate", DELETE, None)],
            [("retention.ms", SET, "1"), ("retention.ms", DELETE, None)],
            [("no.such", SET, "1")],
            [("retention.ms", APPEND, "1")],
            [("retention.ms", 9, "1")])]
    assert (null.error_code, null.error_message) == (E.INVALID_REQUEST.code,
                                                     "Null value not supported for : retention.ms, segment.ms")
    assert (dup.error_code, dup.error_message) == (E.INVALID_REQUEST.code, "Error due to duplicate config keys")
    assert (unknown.error_code, unknown.error_message) == (E.INVALID_CONFIG.code, "Unknown topic config name: no.such")
    assert not_list.error_code == E.INVALID_CONFIG.code and not_list.error_message
    assert bad_op.error_code == E.INVALID_REQUEST.code
    assert dict(broker.topics.get("t").configs) == {}


def test_incremental_alter_configs_validate_only(broker):
    create(broker, 7, creatable("t"))
    [result] = alter(broker, 1, (2, "t", [("retention.ms", SET, "5")]), validate_only=True)
    assert result.error_code == NONE and dict(broker.topics.get("t").configs) == {}


# --- DescribeCluster -------------------------------------------------------------------------

DCL = req("DescribeCluster")


@pytest.mark.parametrize("version", versions("DescribeCluster"))
def test_describe_cluster(broker, version):
    r = call(broker, "DescribeCluster", version, DCL(include_cluster_authorized_operations=False))
    assert (r.error_code, r.error_message, r.cluster_id, r.controller_id) == (NONE, None, broker.cluster_id,
                                                                              broker.node_id)
    assert r.endpoint_type == 1
    [node] = r.brokers
    assert (node.broker_id, node.host, node.port, node.rack, node.is_fenced) == (
        broker.node_id, broker.advertised_host, broker.advertised_port, None, False)
    assert r.cluster_authorized_operations == -2**31
    r = call(broker, "DescribeCluster", version, DCL(include_cluster_authorized_operations=True))
    assert r.cluster_authorized_operations == CLUSTER_OPERATIONS


@pytest.mark.parametrize("version", [1, 2])
def test_describe_cluster_endpoint_types(broker, version):
    r = call(broker, "DescribeCluster", version, DCL(endpoint_type=2))
    assert r.error_code == E.MISMATCHED_ENDPOINT_TYPE.code and r.error_message and r.brokers == []
    r = call(broker, "DescribeCluster", version, DCL(endpoint_type=7))
    assert (r.error_code, r.error_message) == (E.UNSUPPORTED_ENDPOINT_TYPE.code, "Unsupported endpoint type 7")
    assert r.brokers == []


# --- DescribeTopicPartitions -----------------------------------------------------------------

DTP = req("DescribeTopicPartitions")


def dtp(broker, names=(), limit=2000, cursor=None):
    request = DTP(topics=[DTP.TopicRequest(name=n) for n in names], response_partition_limit=limit,
                  cursor=None if cursor is None else DTP.Cursor(topic_name=cursor[0], partition_index=cursor[1]))
    r = call(broker, "DescribeTopicPartitions", 0, request)
    page = [(t.name, t.error_code, [p.partition_index for p in t.partitions]) for t in r.topics]
    nxt = None if r.next_cursor is None else (r.next_cursor.topic_name, r.next_cursor.partition_index)
    return r, page, nxt


@pytest.fixture
def abc(broker):
    create(broker, 7, creatable("c", 1), creatable("a", 3), creatable("b", 2))
    return broker


def test_describe_topic_partitions_all(abc):
    r, page, nxt = dtp(abc)
    # The coordinators' internal topics are listed too (and sort first), as on Kafka.
    assert page == [("__consumer_offsets", 0, [0]), ("__transaction_state", 0, [0]),
                    ("a", 0, [0, 1, 2]), ("b", 0, [0, 1]), ("c", 0, [0])] and nxt is None
    assert [t.is_internal for t in r.topics] == [True, True, False, False, False]
    a = r.topics[2]
    assert a.topic_id == abc.topics.get("a").topic_id and a.is_internal is False
    assert a.topic_authorized_operations == TOPIC_OPERATIONS
    p = a.partitions[1]
    assert (p.error_code, p.leader_id, p.leader_epoch, p.replica_nodes, p.isr_nodes) == (0, 1, 0, [1], [1])
    assert (p.eligible_leader_replicas, p.last_known_elr, p.offline_replicas) == ([], [], [])


def test_describe_topic_partitions_paging(abc):
    internal = [("__consumer_offsets", 0, [0]), ("__transaction_state", 0, [0])]
    _, page, nxt = dtp(abc, limit=4)
    assert page == [*internal, ("a", 0, [0, 1])] and nxt == ("a", 2)
    _, page, nxt = dtp(abc, limit=4, cursor=nxt)
    assert page == [("a", 0, [2]), ("b", 0, [0, 1]), ("c", 0, [0])] and nxt is None
    _, page, nxt = dtp(abc, limit=5)              # the limit is used up exactly by "a"
    assert page == [*internal, ("a", 0, [0, 1, 2])] and nxt == ("b", 0)
    _, page, nxt = dtp(abc, limit=0, cursor=("a", 0))   # at least one partition per page
    assert page == [("a", 0, [0])] and nxt == ("a", 1)
    _, page, nxt = dtp(abc, limit=2, cursor=("a", 2))
    assert page == [("a", 0, [2]), ("b", 0, [0])] and nxt == ("b", 1)
    _, page, nxt = dtp(abc, cursor=("a", 9))      # past the end of the topic: no partitions of it
    assert page == [("a", 0, []), ("b", 0, [0, 1]), ("c", 0, [0])] and nxt is None
    _, page, nxt = dtp(abc, cursor=("bb", 0))     # a cursor topic that doesn't exist
    assert page == [("c", 0, [0])] and nxt is None


def test_describe_topic_partitions_named(abc):
    _, page, nxt = dtp(abc, names=["c", "zz", "a", "c", "bad name"])
    assert page == [("a", 0, [0, 1, 2]), ("bad name", E.INVALID_TOPIC_EXCEPTION.code, []), ("c", 0, [0]),
                    ("zz", E.UNKNOWN_TOPIC_OR_PARTITION.code, [])]
    assert nxt is None
    _, page, nxt = dtp(abc, names=["a", "c", "b"], limit=3, cursor=("b", 1))
    assert page == [("b", 0, [1]), ("c", 0, [0])] and nxt is None
    _, page, nxt = dtp(abc, names=["a", "zz", "c"], limit=3)
    assert page == [("a", 0, [0, 1, 2])] and nxt == ("c", 0)


def test_describe_topic_partitions_bad_cursor(abc):
    r, page, nxt = dtp(abc, names=["a", "b"], cursor=("c", 0))
    assert page == [("a", E.INVALID_REQUEST.code, []), ("b", E.INVALID_REQUEST.code, [])] and nxt is None
    _, page, _ = dtp(abc, names=["a"], cursor=("a", -1))
    assert page == [("a", E.INVALID_REQUEST.code, [])]


# --- DeleteRecords ---------------------------------------------------------------------------

DR = req("DeleteRecords")


def delete_records(broker, version, topic, *partitions):
    request = DR(topics=[DR.DeleteRecordsTopic(name=topic, partitions=[
        DR.DeleteRecordsTopic.DeleteRecordsPartition(partition_index=i, offset=o) for i, o in partitions])],
        timeout_ms=100)
    [t] = call(broker, "DeleteRecords", version, request).topics
    assert t.name == topic
    return [(p.partition_index, p.error_code, p.low_watermark) for p in t.partitions]


@pytest.mark.parametrize("version", versions("DeleteRecords"))
def test_delete_records(broker, version):
    create(broker, 7, creatable("r", 2))
    append(broker, "r", 0, 10)
    append(broker, "r", 1, 5)
    assert delete_records(broker, version, "r", (0, 4), (1, -1), (5, 1)) == [
        (0, NONE, 4), (1, NONE, 5), (5, E.UNKNOWN_TOPIC_OR_PARTITION.code, -1)]
    assert broker.partition("r", 0).log.log_start_offset == 4
    assert delete_records(broker, version, "r", (0, 2), (0, 11), (0, -2)) == [
        (0, NONE, 4), (0, E.OFFSET_OUT_OF_RANGE.code, -1), (0, E.OFFSET_OUT_OF_RANGE.code, -1)]
    assert delete_records(broker, version, "nope", (0, 1)) == [(0, E.UNKNOWN_TOPIC_OR_PARTITION.code, -1)]


def test_delete_records_refused_for_compacted_topics(broker):
    create(broker, 7, creatable("k", 1, configs={"cleanup.policy": "compact"}),
           creatable("kd", 1, configs={"cleanup.policy": "compact,delete"}))
    append(broker, "k", 0, 3)
    append(broker, "kd", 0, 3)
    assert delete_records(broker, 2, "k", (0, 1)) == [(0, E.POLICY_VIOLATION.code, -1)]
    assert delete_records(broker, 2, "kd", (0, 1)) == [(0, NONE, 1)]


# --- OffsetForLeaderEpoch --------------------------------------------------------------------

OFLE = req("OffsetForLeaderEpoch")


def epochs(broker, version, topic, *partitions, replica_id=-1):
    request = OFLE(replica_id=replica_id, topics=[OFLE.OffsetForLeaderTopic(topic=topic, partitions=[
        OFLE.OffsetForLeaderTopic.OffsetForLeaderPartition(partition=i, current_leader_epoch=c, leader_epoch=e)
        for i, c, e in partitions])])
    [t] = call(broker, "OffsetForLeaderEpoch", version, request).topics
    assert t.topic == topic
    return [(p.partition, p.error_code, p.leader_epoch, p.end_offset) for p in t.partitions]


@pytest.mark.parametrize("version", versions("OffsetForLeaderEpoch"))
def test_offset_for_leader_epoch(broker, version):
    create(broker, 7, creatable("e", 1))
    append(broker, "e", 0, 6)
    assert epochs(broker, version, "e", (0, -1, 0), (0, 0, 0), (0, -1, 1), (0, -1, -1), (3, -1, 0)) == [
        (0, NONE, 0, 6), (0, NONE, 0, 6), (0, NONE, -1, -1), (0, NONE, -1, -1),
        (3, E.UNKNOWN_TOPIC_OR_PARTITION.code, -1, -1)]
    assert epochs(broker, version, "nope", (0, -1, 0)) == [(0, E.UNKNOWN_TOPIC_OR_PARTITION.code, -1, -1)]


def test_offset_for_leader_epoch_older_epochs_and_fencing(broker):
    create(broker, 7, creatable("e", 1))
    delete_by_name(broker, 6, "e")
    create(broker, 7, creatable("e", 1))           # a re-created topic continues from the next epoch
    assert broker.partition("e", 0).leader_epoch == 1
    append(broker, "e", 0, 8)
    assert epochs(broker, 4, "e", (0, 1, 0), (0, 1, 1), (0, 1, 2)) == [
        (0, NONE, 0, 0), (0, NONE, 1, 8), (0, NONE, -1, -1)]
    delete_records(broker, 2, "e", (0, 3))
    assert epochs(broker, 3, "e", (0, -1, 0), (0, 0, 1), (0, 2, 1), replica_id=-2) == [
        (0, NONE, 0, 3), (0, E.FENCED_LEADER_EPOCH.code, -1, -1), (0, E.UNKNOWN_LEADER_EPOCH.code, -1, -1)]
