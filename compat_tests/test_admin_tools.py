"""What admin tools ask for, asked by real clients: log dirs, partition reassignments, the metadata quorum and
delegation tokens through the Java Admin (3.9.0 and 4.3.0), client quotas through the Java Admin too (kafka-python has no call for them), elections,
ACLs (described, created, deleted), SCRAM users, config resources and the legacy AlterConfigs through
kafka-python's KafkaAdminClient, and the internal topics as
kafka-python, aiokafka, confluent-kafka and the Java Admin see them.
"""
from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Producer
from kafka import KafkaAdminClient, TopicPartition
from kafka.admin import (ACL, ACLFilter, ACLOperation, ACLPermissionType, ConfigResource, ConfigResourceType,
                         ResourcePattern, ResourcePatternFilter, ResourceType)
from kafka.admin._acls import ACLResourcePatternType
from kafka.errors import SecurityDisabledError, UnknownTopicOrPartitionError

from compat_tests import clients
from compat_tests.python_clients import OP_TIMEOUT_S, create_topics, unique_topic

pytestmark = pytest.mark.timeout(180)

TIMEOUT_MS = int(OP_TIMEOUT_S * 1000)
NODE = 1                        # node.id default
ELECTION_NOT_NEEDED = 84
INTERNAL = {"__consumer_offsets", "__transaction_state"}


@pytest.fixture(scope="module")
def admin(module_server):
    client = KafkaAdminClient(bootstrap_servers=module_server.bootstrap, request_timeout_ms=TIMEOUT_MS,
                              client_id="compat-admin-tools")
    yield client
    client.close()


def _segment_bytes(server, topic: str, partition: int) -> int:
    """The bytes of the partition's batches in its segment files (zeros written ahead of appends are not the log's)."""
    directory = Path(server.data_dir) / "logs" / f"{topic}-{partition}"
    segments = sorted((f for f in directory.iterdir() if f.name.endswith(".log")), key=lambda f: int(f.stem))
    return sum(h.size for f in segments
               for _, h in clients.segment_batches(f.read_bytes(), active=f == segments[-1])[0])


# --- Java Admin: log dirs, reassignments, quotas ---------------------------------------------

def test_describe_log_dirs_java(module_server, java_harness, java_version):
    java = java_harness(java_version)
    topic = unique_topic("logdirs")
    java.ok("create_topic", topic=topic, partitions=2)
    java.ok("produce", topic=topic, records=[clients.record(b"x" * 1000, partition=1) for _ in range(20)])
    [d] = java.ok("describe_log_dirs")["dirs"]
    assert (d["broker"], d["path"], d["error"]) == (NODE, os.path.abspath(os.path.join(module_server.data_dir,
                                                                                       "logs")), None)
    assert d["total_bytes"] >= d["usable_bytes"] > 0
    sizes = {(r["topic"], r["partition"]): r["size"] for r in d["replicas"]}
    assert sizes[(topic, 0)] == 0
    assert sizes[(topic, 1)] == _segment_bytes(module_server, topic, 1) > 20 * 1000
    assert {t for t, _ in sizes} >= INTERNAL | {topic}
    assert all(r["offset_lag"] == 0 and r["future"] is False for r in d["replicas"])


def test_partition_reassignments_java(module_server, java_harness, java_version):
    java = java_harness(java_version)
    topic = unique_topic("reassign")
    java.ok("create_topic", topic=topic, partitions=3)
    assert java.ok("list_reassignments")["reassignments"] == []
    results = java.ok("alter_reassignments", reassignments=[
        [topic, 0, [NODE]], [topic, 1, [NODE, NODE + 1]], [topic, 2, None], [topic, 7, [NODE]]])["results"]
    assert results == [[topic, 0, None], [topic, 1, "InvalidReplicaAssignmentException"],
                       [topic, 2, "NoReassignmentInProgressException"],
                       [topic, 7, "UnknownTopicOrPartitionException"]]
    # A reassignment to the replicas a partition has is complete at once: nothing is in progress.
    assert java.ok("list_reassignments", partitions=[[topic, 0], [topic, 1]])["reassignments"] == []
    partitions = java.ok("describe_topic", topic=topic)["partitions"]
    assert [(p["leader"], p["replicas"], p["isr"]) for p in partitions] == [(NODE, [NODE], [NODE])] * 3


def test_describe_client_quotas_java(module_server, java_harness):
    java = java_harness("4.3.0")
    assert java.ok("describe_client_quotas")["entries"] == []
    assert java.ok("describe_client_quotas", user="alice")["entries"] == []


def test_metadata_quorum_log_dirs_and_tokens_java(module_server, java_harness, java_version):
    """describeMetadataQuorum (kafka-metadata-quorum.sh), alterReplicaLogDirs (kafka-reassign-partitions.sh
    --reassignment-json-file with log_dirs) and createDelegationToken (kafka-delegation-tokens.sh)."""
    java = java_harness(java_version)
    quorum = java.ok("describe_metadata_quorum")
    assert (quorum["leader"], [v["id"] for v in quorum["voters"]], quorum["observers"]) == (NODE, [NODE], [])
    assert quorum["voters"][0]["log_end_offset"] == quorum["high_watermark"] >= 0
    topic = unique_topic("java-logdirs")
    java.ok("create_topic", topic=topic, partitions=1)
    log_dir = os.path.abspath(os.path.join(module_server.data_dir, "logs"))
    results = java.ok("alter_replica_log_dirs", moves=[[topic, 0, NODE, log_dir], [topic, 0, NODE, "/nowhere"],
                                                       [topic, 5, NODE, log_dir]])["results"]
    # The Admin keeps one destination per replica: the last one given for partition 0.
    assert results == [[topic, 0, "LogDirNotFoundException"], [topic, 5, "UnknownTopicOrPartitionException"]]
    assert java.ok("alter_replica_log_dirs", moves=[[topic, 0, NODE, log_dir]])["results"] == [[topic, 0, None]]
    # DELEGATION_TOKEN_REQUEST_NOT_ALLOWED: what Kafka answers over a PLAINTEXT connection.
    assert java.ok("create_delegation_token")["error"] == "UnsupportedByAuthenticationException"


# --- kafka-python's admin client -------------------------------------------------------------

def test_elect_leaders_kafka_python(module_server, admin):
    topic = create_topics(module_server.bootstrap, [unique_topic("elect")], 2)[0]
    for election_type in (0, 1):                # preferred, unclean
        response = admin.elect_leaders(election_type, {topic: [0, 1]})
        assert response.error_code == 0
        [result] = response.replica_election_results
        assert [(p.partition_id, p.error_code) for p in result.partition_result] == \
            [(0, ELECTION_NOT_NEEDED), (1, ELECTION_NOT_NEEDED)]
    # No topics named: kafka-python names every partition of every topic, internal ones included.
    everything = admin.elect_leaders(0)
    results = {(t.topic, p.partition_id): p.error_code for t in everything.replica_election_results
               for p in t.partition_result}
    assert {(topic, 0), (topic, 1), ("__consumer_offsets", 0)} <= set(results)
    assert set(results.values()) == {ELECTION_NOT_NEEDED}
    with pytest.raises(UnknownTopicOrPartitionError):
        admin.elect_leaders(0, {topic: [5]})


def test_describe_acls_kafka_python(admin):
    acl_filter = ACLFilter(principal=None, host="*", operation=ACLOperation.ANY,
                           permission_type=ACLPermissionType.ANY,
                           resource_pattern=ResourcePatternFilter(ResourceType.TOPIC, None,
                                                                  ACLResourcePatternType.ANY))
    with pytest.raises(SecurityDisabledError):
        admin.describe_acls(acl_filter)


def test_describe_user_scram_credentials_kafka_python(admin):
    assert admin.describe_user_scram_credentials() == {}
    described = admin.describe_user_scram_credentials(["alice"])
    assert list(described) == ["alice"]
    assert described["alice"]["credential_infos"] == [] and "alice" in described["alice"]["error"]


def test_list_config_resources_kafka_python(module_server, admin):
    topic = create_topics(module_server.bootstrap, [unique_topic("configs")], 1)[0]
    everything = admin.list_config_resources()
    assert everything["broker"] == everything["broker_logger"] == [str(NODE)]
    assert {topic} | INTERNAL <= set(everything["topic"])
    assert admin.list_config_resources(["BROKER"]) == {"broker": [str(NODE)]}


def test_log_dirs_and_reassignments_kafka_python(module_server, admin):
    """The same calls as the Java tests above, from kafka-python: what its admin scripts send."""
    topic = create_topics(module_server.bootstrap, [unique_topic("kp-logdirs")], 1)[0]
    [broker] = admin.describe_log_dirs({topic: [0]})
    [log_dir] = broker["log_dirs"]
    assert log_dir["log_dir"] == os.path.abspath(os.path.join(module_server.data_dir, "logs"))
    assert [t["name"] for t in log_dir["topics"]] == [topic]
    tp = TopicPartition(topic, 0)
    assert admin.alter_partition_reassignments({tp: [NODE]}) == {tp: None}
    assert admin.list_partition_reassignments() == {}


# --- internal topics -------------------------------------------------------------------------

def test_internal_topics_listed_and_marked(module_server, admin, java_harness):
    """kafka-python and the Java Admin see __consumer_offsets and __transaction_state as Kafka lists them:
    present, internal, hidden by the Java Admin's listTopics unless listInternal; writes are refused."""
    described = {t["name"]: t for t in admin.describe_topics(sorted(INTERNAL))}
    assert {n: (t["error_code"], t["is_internal"]) for n, t in described.items()} == {
        n: (0, True) for n in INTERNAL}
    java = java_harness("3.9.0")
    assert INTERNAL <= set(java.ok("list_topics", internal=True)["topics"])
    assert not INTERNAL & set(java.ok("list_topics")["topics"])
    assert java.ok("describe_topic", topic="__consumer_offsets")["internal"] is True
    # kafka-python's producer refuses internal topics before sending; librdkafka sends and reports the broker's error.
    producer = Producer({"bootstrap.servers": module_server.bootstrap, "message.timeout.ms": TIMEOUT_MS})
    reports = []
    producer.produce("__consumer_offsets", b"x", partition=0, on_delivery=lambda err, msg: reports.append(err))
    assert producer.flush(OP_TIMEOUT_S) == 0
    assert [e.code() for e in reports] == [KafkaError.TOPIC_EXCEPTION]       # 17, INVALID_TOPIC_EXCEPTION


def test_aiokafka_exclude_internal_topics(module_server):
    """aiokafka's pattern subscription leaves internal topics out only because Metadata marks them internal."""
    from aiokafka import AIOKafkaConsumer
    topic = create_topics(module_server.bootstrap, [unique_topic("xinternal")], 1)[0]
    pattern = f"^(__consumer_offsets|{topic})$"

    async def assigned(exclude: bool) -> set[str]:
        consumer = AIOKafkaConsumer(bootstrap_servers=module_server.bootstrap, group_id=unique_topic("g"),
                                    exclude_internal_topics=exclude, metadata_max_age_ms=500,
                                    auto_offset_reset="earliest")
        await consumer.start()
        try:
            consumer.subscribe(pattern=pattern)
            for _ in range(100):
                await consumer.getmany(timeout_ms=100)
                topics = {tp.topic for tp in consumer.assignment()}
                if topic in topics:
                    return topics
            return set()
        finally:
            await consumer.stop()

    assert asyncio.run(assigned(True)) == {topic}
    assert asyncio.run(assigned(False)) == {topic, "__consumer_offsets"}


# --- kafka-python: legacy AlterConfigs and ACL changes ------------------------------------------

def _overrides(admin, topic: str) -> dict[str, str]:
    described = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])["topic"][topic]
    return {name: c["value"] for name, c in described.items() if c["config_source"] == "DYNAMIC_TOPIC_CONFIG"}


def test_alter_configs_legacy_kafka_python(module_server, admin):
    """kafka-python's alter_configs(incremental=False) sends the legacy AlterConfigs, first filling in the
    topic's other dynamic configs (AlterConfigs reverts the ones left out)."""
    topic = create_topics(module_server.bootstrap, [unique_topic("kp-legacy-cfg")], 1)[0]

    def alter(configs, **kw):
        resource = ConfigResource(ConfigResourceType.TOPIC, topic, configs=configs)
        return admin.alter_configs([resource], incremental=False, **kw)["topic"][topic]

    assert alter({"cleanup.policy": "compact"}) == "OK"
    assert alter({"retention.ms": "7200000"}) == "OK"
    assert _overrides(admin, topic) == {"cleanup.policy": "compact", "retention.ms": "7200000"}
    assert alter({"retention.ms": "60000"}, validate_only=True) == "OK"
    assert alter({"retention.ms": "soon"}).startswith("[Error 40] InvalidConfigurationError")
    assert _overrides(admin, topic) == {"cleanup.policy": "compact", "retention.ms": "7200000"}


def test_create_and_delete_acls_kafka_python(admin):
    acl = ACL(principal="User:alice", host="*", operation=ACLOperation.READ, permission_type=ACLPermissionType.ALLOW,
              resource_pattern=ResourcePattern(ResourceType.TOPIC, "orders"))
    outcome = admin.create_acls([acl])
    assert outcome == {"succeeded": [], "failed": [SecurityDisabledError]}
    acl_filter = ACLFilter(principal=None, host="*", operation=ACLOperation.ANY,
                           permission_type=ACLPermissionType.ANY,
                           resource_pattern=ResourcePatternFilter(ResourceType.TOPIC, None,
                                                                  ACLResourcePatternType.ANY))
    [(flt, matched, error)] = admin.delete_acls([acl_filter])
    assert (flt, matched, error) == (acl_filter, [], SecurityDisabledError)
