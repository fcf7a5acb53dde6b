#!/usr/bin/env python3
"""Writes golden protocol vectors under tests/vectors/, encoded by kafka-python (independent of wire/).

For each API below and every version in its JSON validVersions, a realistic populated example
request and response (case "basic") is built as a kafka-python object and encoded by kafka-python:

    tests/vectors/<ApiName>/v<N>_basic_request.hex     hex of the request body (no size prefix, no header)
    tests/vectors/<ApiName>/v<N>_basic_response.hex    hex of the response body
    tests/vectors/<ApiName>/v<N>_basic.json            the field values used, to rebuild both objects

The sidecar holds every field present at that version, keyed by Kafka's JSON field names, except
tagged structs left at their default (absent from the wire).  Values: numbers, strings, booleans,
null, lists, objects; ``bytes``/``records`` fields as lowercase hex; ``uuid`` fields as canonical
strings; int32 "authorized operations" bit fields as plain int32.

Nothing here imports our own codec: only kafka-python and Kafka's JSON definitions it ships.
Other cases (e.g. vectors captured from real clients) may live in the same directories; this tool
only rewrites its own ``*_basic*`` files.

Usage: python tools/make_vectors.py [--out tests/vectors] [--check]
"""
from __future__ import annotations

import argparse
import importlib
import importlib.resources
import json
import pkgutil
import sys
import uuid
import warnings
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "tests" / "vectors"
CASE = "basic"

APIS = [
    "ApiVersions", "Metadata", "Produce", "Fetch", "ListOffsets", "OffsetForLeaderEpoch", "CreateTopics",
    "DeleteTopics", "CreatePartitions", "DescribeConfigs", "IncrementalAlterConfigs", "DescribeCluster",
    "DescribeTopicPartitions", "DeleteRecords", "InitProducerId", "FindCoordinator", "JoinGroup", "SyncGroup",
    "Heartbeat", "LeaveGroup", "OffsetCommit", "OffsetFetch", "DescribeGroups", "ListGroups", "DeleteGroups",
    "OffsetDelete", "AddPartitionsToTxn", "AddOffsetsToTxn", "EndTxn", "WriteTxnMarkers", "TxnOffsetCommit",
    "DescribeProducers", "DescribeTransactions", "ListTransactions", "UpdateFeatures",
    "DescribeProducers", "DescribeTransactions", "ListTransactions",
    "DescribeLogDirs", "ElectLeaders", "AlterPartitionReassignments", "ListPartitionReassignments", "DescribeAcls",
    "DescribeClientQuotas", "DescribeUserScramCredentials", "ListConfigResources",
    "AlterConfigs", "AlterReplicaLogDirs", "DescribeQuorum", "SaslHandshake", "SaslAuthenticate", "CreateAcls",
    "DeleteAcls", "AlterClientQuotas", "AlterUserScramCredentials",
]

# Versions below the JSON definition's range that brokers still advertise: Kafka 4 advertises Produce
# from v0 (KAFKA-18659) although ProduceRequest.json starts at v3.  kafka-python still encodes v0-2
# from the same definition (those versions only use fields marked "0+"/"1+"/"2+").
EXTRA_VERSIONS = {"Produce": range(0, 3)}


# --- kafka-python --------------------------------------------------------------------------

def kp_classes() -> dict[str, type]:
    from kafka.protocol.api_message import ApiMessage
    import kafka.protocol as kp
    found = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        for info in pkgutil.walk_packages(kp.__path__, "kafka.protocol."):
            try:
                mod = importlib.import_module(info.name)
            except Exception:
                continue
            for v in vars(mod).values():
                if (isinstance(v, type) and issubclass(v, ApiMessage) and v is not ApiMessage
                        and getattr(v, "_json", None)):
                    found[v.name] = v
    return found


@lru_cache(maxsize=None)
def original_json(name: str) -> dict:
    """Kafka's definition as shipped (kafka-python patches some field names/types in its own copy)."""
    text = importlib.resources.files("kafka.protocol.schemas.resources").joinpath(name + ".json").read_text("utf-8")
    spec = json.loads("\n".join(l for l in text.splitlines() if not l.lstrip().startswith("//")))
    common = {c["name"]: c["fields"] for c in spec.get("commonStructs", [])}

    def inline(fields):          # a field typed by a common struct gets that struct's fields
        for f in fields:
            if "fields" in f:
                inline(f["fields"])
            elif _elem_type(f) in common:
                f["fields"] = common[_elem_type(f)]
                inline(f["fields"])
    inline(spec["fields"])
    return spec


def parse_versions(text):
    if text is None or text == "none":
        return None
    if text.endswith("+"):
        return int(text[:-1]), 1 << 30
    if "-" in text:
        lo, hi = text.split("-")
        return int(lo), int(hi)
    return int(text), int(text)


def _in(versions, v):
    return versions is not None and versions[0] <= v <= versions[1]


def _is_bitfield(kf) -> bool:
    from kafka.protocol.schemas.fields.codecs import BitField
    return getattr(kf, "_type", None) is BitField


def _sub_fields(kf):
    return kf.array_of._fields if kf.is_struct_array() else kf._fields


def _sub_class(kf):
    return kf.array_of.data_class if kf.is_struct_array() else kf.data_class


def _elem_type(jf) -> str:
    t = jf["type"]
    return t[2:] if t.startswith("[]") else t


def _int32_to_bits(v):
    u = v & 0xFFFFFFFF
    bits = {i for i in range(32) if u >> i & 1}
    return None if bits == {31} else bits


def _bits_to_int32(bits):
    if bits is None:
        return -(1 << 31)
    u = sum(1 << b for b in bits)
    return u - (1 << 32) if u >= 1 << 31 else u


def build(example: dict, jfields: list[dict], kfields, version: int, kcls, where: str):
    """A kafka-python object from an example keyed by JSON names (fields absent at ``version`` are ignored)."""
    assert len(jfields) == len(kfields), where
    known = {jf["name"] for jf in jfields}
    unknown = set(example) - known
    assert not unknown, f"{where}: example has fields the definition lacks: {sorted(unknown)}"
    kwargs = {}
    for jf, kf in zip(jfields, kfields):
        if not kf.for_version_q(version) or jf["name"] not in example:
            continue
        value = example[jf["name"]]
        if value is None and not kf.nullable_for_version_q(version):
            continue                               # not nullable at this version: keep the default
        kwargs[kf.name] = _to_kp(value, jf, kf, version, f"{where}.{jf['name']}")
    return kcls(version=version, **kwargs)


def _to_kp(value, jf, kf, version, where):
    if value is None:
        return None
    if "fields" in jf:
        def one(e):
            return build(e, jf["fields"], _sub_fields(kf), version, _sub_class(kf), where)
        return [one(e) for e in value] if jf["type"].startswith("[]") else one(value)
    t = _elem_type(jf)
    if _is_bitfield(kf):
        return _int32_to_bits(value)
    if t in ("bytes", "records"):
        return bytes.fromhex(value)
    if t == "uuid":
        u = uuid.UUID(value)
        return None if u.int == 0 else u
    return list(value) if jf["type"].startswith("[]") else value


def dump(kobj, jfields, kfields, version) -> dict:
    """Every field of a kafka-python object present at ``version``, as JSON values keyed by JSON names."""
    out = {}
    for jf, kf in zip(jfields, kfields):
        if not kf.for_version_q(version):
            continue
        v = getattr(kobj, kf.name)
        tagged = jf.get("tag") is not None and _in(parse_versions(jf.get("taggedVersions")), version)
        if "fields" in jf:
            if v is None:
                if tagged and not _in(parse_versions(jf.get("nullableVersions")), version):
                    continue                       # absent tagged struct: its default
                out[jf["name"]] = None
            elif jf["type"].startswith("[]"):
                out[jf["name"]] = [dump(e, jf["fields"], _sub_fields(kf), version) for e in v]
            else:
                out[jf["name"]] = dump(v, jf["fields"], _sub_fields(kf), version)
            continue
        t = _elem_type(jf)
        if _is_bitfield(kf):
            v = _bits_to_int32(v)
        elif v is None:
            v = str(uuid.UUID(int=0)) if t == "uuid" else None
        elif t in ("bytes", "records"):
            v = bytes(v).hex()
        elif t == "uuid":
            v = str(v)
        elif isinstance(v, (list, tuple)):
            v = list(v)
        out[jf["name"]] = v
    return out


# --- example data --------------------------------------------------------------------------

ORDERS_ID = "6f2d9a3c-1b4e-4c8a-9d7e-2a5b3c4d5e6f"
AUDIT_ID = "0b7e5d41-93a2-4f6c-8e1d-7c9b2a4f6e80"
ZERO_ID = "00000000-0000-0000-0000-000000000000"
CLUSTER_ID = "MkU3OEVBNTcwNTJENDM2Qk"
GROUP = "orders-consumers"
MEMBER = "consumer-orders-1-3f2a8c1e-5d7b-4e09-a1c2-9b8d7e6f5a4b"
HOST1, HOST2 = "broker-1.kafka.internal", "broker-2.kafka.internal"
UNKNOWN_OPS = -(1 << 31)                     # "authorized operations not requested"
TOPIC_OPS = (1 << 3) | (1 << 4) | (1 << 8)   # READ, WRITE, DESCRIBE
CLUSTER_OPS = (1 << 7) | (1 << 8) | (1 << 9) | (1 << 10)  # CREATE, DESCRIBE, ALTER, DESCRIBE_CONFIGS
GROUP_OPS = (1 << 3) | (1 << 6) | (1 << 8)   # READ, DELETE, DESCRIBE

# ConsumerProtocolSubscription v0: version 0, topics ["orders"], user data null.
SUBSCRIPTION = "0000" "00000001" "00066f7264657273" "ffffffff"
# ConsumerProtocolAssignment v0: version 0, [{"orders", [0, 1, 2]}], user data null.
ASSIGNMENT = "0000" "00000001" "00066f7264657273" "00000003" "00000000" "00000001" "00000002" "ffffffff"


def record_batch(magic: int) -> str:
    """Two records as a v2 record batch (magic 2) or a legacy message set (magic 0/1), uncompressed."""
    if magic == 2:
        from kafka.record.default_records import DefaultRecordBatchBuilder
        b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0, producer_id=-1,
                                      producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
        b.append(0, timestamp=1700000000000, key=b"order-1041", value=b'{"sku": "A-17", "qty": 3}',
                 headers=[("source", b"web")])
        b.append(1, timestamp=1700000000005, key=b"order-1042", value=b'{"sku": "B-02", "qty": 1}', headers=[])
        return bytes(b.build()).hex()
    from kafka.record.legacy_records import LegacyRecordBatchBuilder
    b = LegacyRecordBatchBuilder(magic=magic, compression_type=0, batch_size=1 << 20)
    ts = 1700000000000 if magic else None
    b.append(0, timestamp=ts, key=b"order-1041", value=b'{"sku": "A-17", "qty": 3}')
    b.append(1, timestamp=ts, key=b"order-1042", value=b'{"sku": "B-02", "qty": 1}')
    return bytes(b.build()).hex()


def produce_magic(version: int) -> int:
    return 0 if version == 0 else 1 if version <= 2 else 2


def examples(api: str, version: int) -> tuple[dict, dict]:
    """(request, response) example values for one API; fields a version lacks are ignored."""
    if api == "ApiVersions":
        return (
            {"ClientSoftwareName": "apache-kafka-java", "ClientSoftwareVersion": "3.9.0"},
            {"ErrorCode": 0, "ThrottleTimeMs": 0,
             "ApiKeys": [{"ApiKey": 0, "MinVersion": 3, "MaxVersion": 11},
                         {"ApiKey": 1, "MinVersion": 4, "MaxVersion": 17},
                         {"ApiKey": 3, "MinVersion": 0, "MaxVersion": 12},
                         {"ApiKey": 18, "MinVersion": 0, "MaxVersion": 4}],
             "SupportedFeatures": [{"Name": "metadata.version", "MinVersion": 1, "MaxVersion": 21}],
             "FinalizedFeaturesEpoch": 1187,
             "FinalizedFeatures": [{"Name": "metadata.version", "MaxVersionLevel": 21, "MinVersionLevel": 21}],
             "ZkMigrationReady": False},
        )
    if api == "Metadata":
        partitions = [
            {"ErrorCode": 0, "PartitionIndex": 0, "LeaderId": 1, "LeaderEpoch": 5,
             "ReplicaNodes": [1, 2], "IsrNodes": [1, 2], "OfflineReplicas": []},
            {"ErrorCode": 0, "PartitionIndex": 1, "LeaderId": 2, "LeaderEpoch": 3,
             "ReplicaNodes": [2, 1], "IsrNodes": [2], "OfflineReplicas": []},
        ]
        return (
            {"Topics": [{"TopicId": ZERO_ID, "Name": "orders"}, {"TopicId": ZERO_ID, "Name": "audit"}],
             "AllowAutoTopicCreation": False, "IncludeClusterAuthorizedOperations": False,
             "IncludeTopicAuthorizedOperations": True},
            {"ThrottleTimeMs": 0,
             "Brokers": [{"NodeId": 1, "Host": HOST1, "Port": 9092, "Rack": "use1-az1"},
                         {"NodeId": 2, "Host": HOST2, "Port": 9092, "Rack": None}],
             "ClusterId": CLUSTER_ID, "ControllerId": 1,
             "Topics": [{"ErrorCode": 0, "Name": "orders", "TopicId": ORDERS_ID, "IsInternal": False,
                         "Partitions": partitions, "TopicAuthorizedOperations": TOPIC_OPS},
                        {"ErrorCode": 3, "Name": "audit", "TopicId": ZERO_ID, "IsInternal": False,
                         "Partitions": [], "TopicAuthorizedOperations": UNKNOWN_OPS}],
             "ClusterAuthorizedOperations": UNKNOWN_OPS, "ErrorCode": 0},
        )
    if api == "Produce":
        return (
            {"TransactionalId": None, "Acks": -1, "TimeoutMs": 30000,
             "TopicData": [{"Name": "orders", "TopicId": ORDERS_ID,
                            "PartitionData": [{"Index": 0, "Records": record_batch(produce_magic(version))}]}]},
            {"Responses": [{"Name": "orders", "TopicId": ORDERS_ID, "PartitionResponses": [
                {"Index": 0, "ErrorCode": 0, "BaseOffset": 1041, "LogAppendTimeMs": -1, "LogStartOffset": 0,
                 "RecordErrors": [], "ErrorMessage": None},
                {"Index": 1, "ErrorCode": 6, "BaseOffset": -1, "LogAppendTimeMs": -1, "LogStartOffset": -1,
                 "RecordErrors": [], "ErrorMessage": "This server is not the leader for that topic-partition.",
                 "CurrentLeader": {"LeaderId": 2, "LeaderEpoch": 4}}]}],
             "ThrottleTimeMs": 0,
             "NodeEndpoints": [{"NodeId": 2, "Host": HOST2, "Port": 9092, "Rack": "use1-az2"}]},
        )
    if api == "Fetch":
        return (
            {"ReplicaId": -1, "MaxWaitMs": 500, "MinBytes": 1, "MaxBytes": 52428800, "IsolationLevel": 1,
             "SessionId": 0, "SessionEpoch": -1,
             "Topics": [{"Topic": "orders", "TopicId": ORDERS_ID, "Partitions": [
                 {"Partition": 0, "CurrentLeaderEpoch": 5, "FetchOffset": 1041, "LastFetchedEpoch": -1,
                  "LogStartOffset": -1, "PartitionMaxBytes": 1048576}]}],
             "ForgottenTopicsData": [], "RackId": "use1-az1"},
            {"ThrottleTimeMs": 0, "ErrorCode": 0, "SessionId": 918273645,
             "Responses": [{"Topic": "orders", "TopicId": ORDERS_ID, "Partitions": [
                 {"PartitionIndex": 0, "ErrorCode": 0, "HighWatermark": 1043, "LastStableOffset": 1043,
                  "LogStartOffset": 0, "AbortedTransactions": [{"ProducerId": 4000, "FirstOffset": 1000}],
                  "PreferredReadReplica": -1, "Records": record_batch(2)}]}],
             "NodeEndpoints": []},
        )
    if api == "ListOffsets":
        return (
            {"ReplicaId": -1, "IsolationLevel": 0, "TimeoutMs": 30000,
             "Topics": [{"Name": "orders", "Partitions": [
                 {"PartitionIndex": 0, "CurrentLeaderEpoch": 5, "Timestamp": -1, "MaxNumOffsets": 1},
                 {"PartitionIndex": 1, "CurrentLeaderEpoch": 3, "Timestamp": -2, "MaxNumOffsets": 1}]}]},
            {"ThrottleTimeMs": 0,
             "Topics": [{"Name": "orders", "Partitions": [
                 {"PartitionIndex": 0, "ErrorCode": 0, "OldStyleOffsets": [1043], "Timestamp": -1,
                  "Offset": 1043, "LeaderEpoch": 5},
                 {"PartitionIndex": 1, "ErrorCode": 0, "OldStyleOffsets": [0], "Timestamp": -1,
                  "Offset": 0, "LeaderEpoch": 3}]}]},
        )
    if api == "OffsetForLeaderEpoch":
        return (
            {"ReplicaId": -1, "Topics": [{"Topic": "orders", "Partitions": [
                {"Partition": 0, "CurrentLeaderEpoch": 5, "LeaderEpoch": 4}]}]},
            {"ThrottleTimeMs": 0, "Topics": [{"Topic": "orders", "Partitions": [
                {"ErrorCode": 0, "Partition": 0, "LeaderEpoch": 4, "EndOffset": 980}]}]},
        )
    if api == "CreateTopics":
        return (
            {"Topics": [{"Name": "orders", "NumPartitions": 3, "ReplicationFactor": 2, "Assignments": [],
                         "Configs": [{"Name": "cleanup.policy", "Value": "delete"},
                                     {"Name": "retention.ms", "Value": "604800000"}]},
                        {"Name": "audit", "NumPartitions": -1, "ReplicationFactor": -1,
                         "Assignments": [{"PartitionIndex": 0, "BrokerIds": [1, 2]}], "Configs": []}],
             "timeoutMs": 30000, "validateOnly": False},
            {"ThrottleTimeMs": 0,
             "Topics": [{"Name": "orders", "TopicId": ORDERS_ID, "ErrorCode": 0, "ErrorMessage": None,
                         "TopicConfigErrorCode": 0, "NumPartitions": 3, "ReplicationFactor": 2,
                         "Configs": [{"Name": "cleanup.policy", "Value": "delete", "ReadOnly": False,
                                      "ConfigSource": 1, "IsSensitive": False},
                                     {"Name": "retention.ms", "Value": "604800000", "ReadOnly": False,
                                      "ConfigSource": 1, "IsSensitive": False}]},
                        {"Name": "audit", "TopicId": ZERO_ID, "ErrorCode": 36,
                         "ErrorMessage": "Topic 'audit' already exists.", "TopicConfigErrorCode": 0,
                         "NumPartitions": -1, "ReplicationFactor": -1, "Configs": None}]},
        )
    if api == "DeleteTopics":
        return (
            {"Topics": [{"Name": "orders", "TopicId": ZERO_ID}, {"Name": None, "TopicId": AUDIT_ID}],
             "TopicNames": ["orders", "audit"], "TimeoutMs": 30000},
            {"ThrottleTimeMs": 0,
             "Responses": [{"Name": "orders", "TopicId": ORDERS_ID, "ErrorCode": 0, "ErrorMessage": None},
                           {"Name": "audit", "TopicId": AUDIT_ID, "ErrorCode": 3,
                            "ErrorMessage": "This server does not host this topic-partition."}]},
        )
    if api == "CreatePartitions":
        return (
            {"Topics": [{"Name": "orders", "Count": 6, "Assignments": None},
                        {"Name": "audit", "Count": 2, "Assignments": [{"BrokerIds": [2, 1]}]}],
             "TimeoutMs": 30000, "ValidateOnly": False},
            {"ThrottleTimeMs": 0,
             "Results": [{"Name": "orders", "ErrorCode": 0, "ErrorMessage": None},
                         {"Name": "audit", "ErrorCode": 37,
                          "ErrorMessage": "Topic already has 2 partitions."}]},
        )
    if api == "DescribeConfigs":
        return (
            {"Resources": [{"ResourceType": 2, "ResourceName": "orders",
                            "ConfigurationKeys": ["retention.ms", "cleanup.policy"]},
                           {"ResourceType": 4, "ResourceName": "1", "ConfigurationKeys": None}],
             "IncludeSynonyms": True, "IncludeDocumentation": False},
            {"ThrottleTimeMs": 0,
             "Results": [{"ErrorCode": 0, "ErrorMessage": None, "ResourceType": 2, "ResourceName": "orders",
                          "Configs": [
                              {"Name": "retention.ms", "Value": "604800000", "ReadOnly": False, "ConfigSource": 1,
                               "IsDefault": False, "IsSensitive": False,
                               "Synonyms": [{"Name": "retention.ms", "Value": "604800000", "Source": 1},
                                            {"Name": "log.retention.hours", "Value": "168", "Source": 5}],
                               "ConfigType": 5, "Documentation": None},
                              {"Name": "cleanup.policy", "Value": "delete", "ReadOnly": False, "ConfigSource": 5,
                               "IsDefault": True, "IsSensitive": False, "Synonyms": [],
                               "ConfigType": 7, "Documentation": None}]}]},
        )
    if api == "IncrementalAlterConfigs":
        return (
            {"Resources": [{"ResourceType": 2, "ResourceName": "orders", "Configs": [
                {"Name": "retention.ms", "ConfigOperation": 0, "Value": "86400000"},
                {"Name": "cleanup.policy", "ConfigOperation": 1, "Value": None}]}],
             "ValidateOnly": False},
            {"ThrottleTimeMs": 0, "Responses": [{"ErrorCode": 0, "ErrorMessage": None, "ResourceType": 2,
                                                 "ResourceName": "orders"}]},
        )
    if api == "DescribeCluster":
        return (
            {"IncludeClusterAuthorizedOperations": True, "EndpointType": 1, "IncludeFencedBrokers": False},
            {"ThrottleTimeMs": 0, "ErrorCode": 0, "ErrorMessage": None, "EndpointType": 1,
             "ClusterId": CLUSTER_ID, "ControllerId": 1,
             "Brokers": [{"BrokerId": 1, "Host": HOST1, "Port": 9092, "Rack": "use1-az1", "IsFenced": False},
                         {"BrokerId": 2, "Host": HOST2, "Port": 9092, "Rack": None, "IsFenced": False}],
             "ClusterAuthorizedOperations": CLUSTER_OPS},
        )
    if api == "DescribeTopicPartitions":
        return (
            {"Topics": [{"Name": "orders"}, {"Name": "audit"}], "ResponsePartitionLimit": 2000, "Cursor": None},
            {"ThrottleTimeMs": 0,
             "Topics": [{"ErrorCode": 0, "Name": "orders", "TopicId": ORDERS_ID, "IsInternal": False,
                         "Partitions": [
                             {"ErrorCode": 0, "PartitionIndex": 0, "LeaderId": 1, "LeaderEpoch": 5,
                              "ReplicaNodes": [1, 2], "IsrNodes": [1, 2], "EligibleLeaderReplicas": None,
                              "LastKnownElr": None, "OfflineReplicas": []},
                             {"ErrorCode": 0, "PartitionIndex": 1, "LeaderId": 2, "LeaderEpoch": 3,
                              "ReplicaNodes": [2, 1], "IsrNodes": [2], "EligibleLeaderReplicas": [1],
                              "LastKnownElr": [], "OfflineReplicas": []}],
                         "TopicAuthorizedOperations": TOPIC_OPS}],
             "NextCursor": {"TopicName": "audit", "PartitionIndex": 0}},
        )
    if api == "DeleteRecords":
        return (
            {"Topics": [{"Name": "orders", "Partitions": [{"PartitionIndex": 0, "Offset": 1000},
                                                          {"PartitionIndex": 1, "Offset": -1}]}],
             "TimeoutMs": 30000},
            {"ThrottleTimeMs": 0,
             "Topics": [{"Name": "orders", "Partitions": [
                 {"PartitionIndex": 0, "LowWatermark": 1000, "ErrorCode": 0},
                 {"PartitionIndex": 1, "LowWatermark": 512, "ErrorCode": 0}]}]},
        )
    if api == "InitProducerId":
        return (
            {"TransactionalId": "orders-txn-1", "TransactionTimeoutMs": 60000, "ProducerId": -1,
             "ProducerEpoch": -1, "Enable2Pc": False, "KeepPreparedTxn": False},
            {"ThrottleTimeMs": 0, "ErrorCode": 0, "ProducerId": 4000, "ProducerEpoch": 0,
             "OngoingTxnProducerId": -1, "OngoingTxnProducerEpoch": -1},
        )
    if api == "FindCoordinator":
        return (
            {"Key": GROUP, "KeyType": 0, "CoordinatorKeys": [GROUP]},
            {"ThrottleTimeMs": 0, "ErrorCode": 0, "ErrorMessage": None, "NodeId": 1, "Host": HOST1, "Port": 9092,
             "Coordinators": [{"Key": GROUP, "NodeId": 1, "Host": HOST1, "Port": 9092, "ErrorCode": 0,
                               "ErrorMessage": None}]},
        )
    if api == "JoinGroup":
        return (
            {"GroupId": GROUP, "SessionTimeoutMs": 45000, "RebalanceTimeoutMs": 300000, "MemberId": "",
             "GroupInstanceId": None, "ProtocolType": "consumer",
             "Protocols": [{"Name": "range", "Metadata": SUBSCRIPTION},
                           {"Name": "cooperative-sticky", "Metadata": SUBSCRIPTION}],
             "Reason": None},
            {"ThrottleTimeMs": 0, "ErrorCode": 0, "GenerationId": 7, "ProtocolType": "consumer",
             "ProtocolName": "range", "Leader": MEMBER, "SkipAssignment": False, "MemberId": MEMBER,
             "Members": [{"MemberId": MEMBER, "GroupInstanceId": None, "Metadata": SUBSCRIPTION}]},
        )
    if api == "SyncGroup":
        return (
            {"GroupId": GROUP, "GenerationId": 7, "MemberId": MEMBER, "GroupInstanceId": None,
             "ProtocolType": "consumer", "ProtocolName": "range",
             "Assignments": [{"MemberId": MEMBER, "Assignment": ASSIGNMENT}]},
            {"ThrottleTimeMs": 0, "ErrorCode": 0, "ProtocolType": "consumer", "ProtocolName": "range",
             "Assignment": ASSIGNMENT},
        )
    if api == "Heartbeat":
        return (
            {"GroupId": GROUP, "GenerationId": 7, "MemberId": MEMBER, "GroupInstanceId": None},
            {"ThrottleTimeMs": 0, "ErrorCode": 0},
        )
    if api == "LeaveGroup":
        return (
            {"GroupId": GROUP, "MemberId": MEMBER,
             "Members": [{"MemberId": MEMBER, "GroupInstanceId": None, "Reason": "the consumer is being closed"}]},
            {"ThrottleTimeMs": 0, "ErrorCode": 0,
             "Members": [{"MemberId": MEMBER, "GroupInstanceId": None, "ErrorCode": 0}]},
        )
    if api == "OffsetCommit":
        return (
            {"GroupId": GROUP, "GenerationIdOrMemberEpoch": 7, "MemberId": MEMBER, "GroupInstanceId": None,
             "RetentionTimeMs": -1,
             "Topics": [{"Name": "orders", "TopicId": ORDERS_ID, "Partitions": [
                 {"PartitionIndex": 0, "CommittedOffset": 1043, "CommittedLeaderEpoch": 5, "CommitTimestamp": -1,
                  "CommittedMetadata": ""},
                 {"PartitionIndex": 1, "CommittedOffset": 877, "CommittedLeaderEpoch": 3, "CommitTimestamp": -1,
                  "CommittedMetadata": None}]}]},
            {"ThrottleTimeMs": 0,
             "Topics": [{"Name": "orders", "TopicId": ORDERS_ID, "Partitions": [
                 {"PartitionIndex": 0, "ErrorCode": 0}, {"PartitionIndex": 1, "ErrorCode": 0}]}]},
        )
    if api == "OffsetFetch":
        partitions = [
            {"PartitionIndex": 0, "CommittedOffset": 1043, "CommittedLeaderEpoch": 5, "Metadata": "", "ErrorCode": 0},
            {"PartitionIndex": 1, "CommittedOffset": 877, "CommittedLeaderEpoch": 3, "Metadata": "", "ErrorCode": 0},
            {"PartitionIndex": 2, "CommittedOffset": -1, "CommittedLeaderEpoch": -1, "Metadata": "", "ErrorCode": 0},
        ]
        return (
            {"GroupId": GROUP, "Topics": [{"Name": "orders", "PartitionIndexes": [0, 1, 2]}],
             "Groups": [{"GroupId": GROUP, "MemberId": None, "MemberEpoch": -1,
                         "Topics": [{"Name": "orders", "TopicId": ORDERS_ID, "PartitionIndexes": [0, 1, 2]}]}],
             "RequireStable": True},
            {"ThrottleTimeMs": 0, "Topics": [{"Name": "orders", "Partitions": partitions}], "ErrorCode": 0,
             "Groups": [{"GroupId": GROUP, "ErrorCode": 0,
                         "Topics": [{"Name": "orders", "TopicId": ORDERS_ID, "Partitions": partitions}]}]},
        )
    if api == "DescribeGroups":
        return (
            {"Groups": [GROUP], "IncludeAuthorizedOperations": True},
            {"ThrottleTimeMs": 0,
             "Groups": [{"ErrorCode": 0, "ErrorMessage": None, "GroupId": GROUP, "GroupState": "Stable",
                         "ProtocolType": "consumer", "ProtocolData": "range",
                         "Members": [{"MemberId": MEMBER, "GroupInstanceId": None, "ClientId": "consumer-orders-1",
                                      "ClientHost": "/10.0.3.17", "MemberMetadata": SUBSCRIPTION,
                                      "MemberAssignment": ASSIGNMENT}],
                         "AuthorizedOperations": GROUP_OPS}]},
        )
    if api == "ListGroups":
        return (
            {"StatesFilter": ["Stable", "Empty"], "TypesFilter": ["classic"]},
            {"ThrottleTimeMs": 0, "ErrorCode": 0,
             "Groups": [{"GroupId": GROUP, "ProtocolType": "consumer", "GroupState": "Stable", "GroupType": "classic"},
                        {"GroupId": "audit-readers", "ProtocolType": "consumer", "GroupState": "Empty",
                         "GroupType": "classic"}]},
        )
    if api == "DeleteGroups":
        return (
            {"GroupsNames": ["audit-readers", GROUP]},
            {"ThrottleTimeMs": 0, "Results": [{"GroupId": "audit-readers", "ErrorCode": 0},
                                              {"GroupId": GROUP, "ErrorCode": 68}]},
        )
    if api == "OffsetDelete":
        return (
            {"GroupId": GROUP, "Topics": [{"Name": "orders", "Partitions": [{"PartitionIndex": 0},
                                                                              {"PartitionIndex": 1}]}]},
            {"ErrorCode": 0, "ThrottleTimeMs": 0,
             "Topics": [{"Name": "orders", "Partitions": [{"PartitionIndex": 0, "ErrorCode": 0},
                                                          {"PartitionIndex": 1, "ErrorCode": 86}]}]},
        )
    if api == "AddPartitionsToTxn":
        topics = [{"Name": "orders", "Partitions": [0, 1]}, {"Name": "audit", "Partitions": [2]}]
        results = [{"Name": "orders", "ResultsByPartition": [{"PartitionIndex": 0, "PartitionErrorCode": 0},
                                                             {"PartitionIndex": 1, "PartitionErrorCode": 0}]},
                   {"Name": "audit", "ResultsByPartition": [{"PartitionIndex": 2, "PartitionErrorCode": 48}]}]
        return (
            {"V3AndBelowTransactionalId": "orders-txn-1", "V3AndBelowProducerId": 4000,
             "V3AndBelowProducerEpoch": 2, "V3AndBelowTopics": topics,
             "Transactions": [{"TransactionalId": "orders-txn-1", "ProducerId": 4000, "ProducerEpoch": 2,
                               "VerifyOnly": True, "Topics": topics}]},
            {"ThrottleTimeMs": 0, "ErrorCode": 0, "ResultsByTopicV3AndBelow": results,
             "ResultsByTransaction": [{"TransactionalId": "orders-txn-1", "TopicResults": results}]},
        )
    if api == "AddOffsetsToTxn":
        return (
            {"TransactionalId": "orders-txn-1", "ProducerId": 4000, "ProducerEpoch": 2, "GroupId": GROUP},
            {"ThrottleTimeMs": 0, "ErrorCode": 0},
        )
    if api == "EndTxn":
        return (
            {"TransactionalId": "orders-txn-1", "ProducerId": 4000, "ProducerEpoch": 2, "Committed": True},
            {"ThrottleTimeMs": 0, "ErrorCode": 0, "ProducerId": 4000, "ProducerEpoch": 3},
        )
    if api == "WriteTxnMarkers":
        return (
            {"Markers": [{"ProducerId": 4000, "ProducerEpoch": 2, "TransactionResult": False,
                          "Topics": [{"Name": "orders", "PartitionIndexes": [0, 1]}],
                          "CoordinatorEpoch": 0, "TransactionVersion": 1}]},
            {"Markers": [{"ProducerId": 4000, "Topics": [{"Name": "orders", "Partitions": [
                {"PartitionIndex": 0, "ErrorCode": 0}, {"PartitionIndex": 1, "ErrorCode": 47}]}]}]},
        )
    if api == "TxnOffsetCommit":
        return (
            {"TransactionalId": "orders-txn-1", "GroupId": GROUP, "ProducerId": 4000, "ProducerEpoch": 2,
             "GenerationId": 7, "MemberId": MEMBER, "GroupInstanceId": None,
             "Topics": [{"Name": "orders", "Partitions": [
                 {"PartitionIndex": 0, "CommittedOffset": 1043, "CommittedLeaderEpoch": 5,
                  "CommittedMetadata": ""}]}]},
            {"ThrottleTimeMs": 0, "Topics": [{"Name": "orders", "Partitions": [
                {"PartitionIndex": 0, "ErrorCode": 0}]}]},
        )
    if api == "DescribeProducers":
        return (
            {"Topics": [{"Name": "orders", "PartitionIndexes": [0, 1]}]},
            {"ThrottleTimeMs": 0, "Topics": [{"Name": "orders", "Partitions": [
                {"PartitionIndex": 0, "ErrorCode": 0, "ErrorMessage": None, "ActiveProducers": [
                    {"ProducerId": 4000, "ProducerEpoch": 2, "LastSequence": 41, "LastTimestamp": 1700000000000,
                     "CoordinatorEpoch": 0, "CurrentTxnStartOffset": 1043}]},
                {"PartitionIndex": 1, "ErrorCode": 3, "ErrorMessage": "orders-1 does not exist",
                 "ActiveProducers": []}]}]},
        )
    if api == "DescribeTransactions":
        return (
            {"TransactionalIds": ["orders-txn-1", "gone"]},
            {"ThrottleTimeMs": 0, "TransactionStates": [
                {"ErrorCode": 0, "TransactionalId": "orders-txn-1", "TransactionState": "Ongoing",
                 "TransactionTimeoutMs": 60000, "TransactionStartTimeMs": 1700000000000, "ProducerId": 4000,
                 "ProducerEpoch": 2, "Topics": [{"Topic": "orders", "Partitions": [0, 1]}]},
                {"ErrorCode": 105, "TransactionalId": "gone", "TransactionState": "", "TransactionTimeoutMs": 0,
                 "TransactionStartTimeMs": -1, "ProducerId": -1, "ProducerEpoch": -1, "Topics": []}]},
        )
    if api == "ListTransactions":
        return (
            {"StateFilters": ["Ongoing", "Bogus"], "ProducerIdFilters": [4000], "DurationFilter": 60000,
             "TransactionalIdPattern": "orders-.*"},
            {"ThrottleTimeMs": 0, "ErrorCode": 0, "UnknownStateFilters": ["Bogus"],
             "TransactionStates": [{"TransactionalId": "orders-txn-1", "ProducerId": 4000,
                                    "TransactionState": "Ongoing"}]},
        )
    if api == "UpdateFeatures":
        return (
            {"timeoutMs": 60000, "FeatureUpdates": [{"Feature": "transaction.version", "MaxVersionLevel": 2,
                                                     "AllowDowngrade": False, "UpgradeType": 1}],
             "ValidateOnly": False},
            {"ThrottleTimeMs": 0, "ErrorCode": 0, "ErrorMessage": None,
             "Results": [{"Feature": "transaction.version", "ErrorCode": 0, "ErrorMessage": None}]},
        )
    if api == "DescribeLogDirs":
        return (
            {"Topics": [{"Topic": "orders", "Partitions": [0, 1]}, {"Topic": "audit", "Partitions": [0]}]},
            {"ThrottleTimeMs": 0, "ErrorCode": 0, "Results": [
                {"ErrorCode": 0, "LogDir": "/var/lib/kafka/data", "TotalBytes": 107374182400,
                 "UsableBytes": 53687091200, "IsCordoned": False,
                 "Topics": [{"Name": "orders", "Partitions": [
                     {"PartitionIndex": 0, "PartitionSize": 1048576, "OffsetLag": 0, "IsFutureKey": False},
                     {"PartitionIndex": 1, "PartitionSize": 0, "OffsetLag": 0, "IsFutureKey": False}]}]},
                {"ErrorCode": 56, "LogDir": "/mnt/disk2/kafka", "TotalBytes": -1, "UsableBytes": -1,
                 "IsCordoned": False, "Topics": []}]},
        )
    if api == "ElectLeaders":
        return (
            {"ElectionType": 0, "TopicPartitions": [{"Topic": "orders", "Partitions": [0, 1]}], "TimeoutMs": 60000},
            {"ThrottleTimeMs": 0, "ErrorCode": 0, "ReplicaElectionResults": [{"Topic": "orders", "PartitionResult": [
                {"PartitionId": 0, "ErrorCode": 84, "ErrorMessage": None},
                {"PartitionId": 1, "ErrorCode": 3, "ErrorMessage": "No such partition as orders-1"}]}]},
        )
    if api == "AlterPartitionReassignments":
        return (
            {"TimeoutMs": 60000, "AllowReplicationFactorChange": False, "Topics": [{"Name": "orders", "Partitions": [
                {"PartitionIndex": 0, "Replicas": [1, 2]}, {"PartitionIndex": 1, "Replicas": None}]}]},
            {"ThrottleTimeMs": 0, "AllowReplicationFactorChange": False, "ErrorCode": 0, "ErrorMessage": None,
             "Responses": [{"Name": "orders", "Partitions": [
                 {"PartitionIndex": 0, "ErrorCode": 0, "ErrorMessage": None},
                 {"PartitionIndex": 1, "ErrorCode": 85, "ErrorMessage": "No reassignment is in progress"}]}]},
        )
    if api == "ListPartitionReassignments":
        return (
            {"TimeoutMs": 60000, "Topics": [{"Name": "orders", "PartitionIndexes": [0, 1]}]},
            {"ThrottleTimeMs": 0, "ErrorCode": 0, "ErrorMessage": None, "Topics": [{"Name": "orders", "Partitions": [
                {"PartitionIndex": 0, "Replicas": [1, 2, 3], "AddingReplicas": [3], "RemovingReplicas": [1]}]}]},
        )
    if api == "DescribeAcls":
        return (
            {"ResourceTypeFilter": 2, "ResourceNameFilter": "orders", "PatternTypeFilter": 3,
             "PrincipalFilter": None, "HostFilter": None, "Operation": 1, "PermissionType": 1},
            {"ThrottleTimeMs": 0, "ErrorCode": 0, "ErrorMessage": None, "Resources": [
                {"ResourceType": 2, "ResourceName": "orders", "PatternType": 3, "Acls": [
                    {"Principal": "User:alice", "Host": "*", "Operation": 3, "PermissionType": 3}]}]},
        )
    if api == "DescribeClientQuotas":
        return (
            {"Components": [{"EntityType": "user", "MatchType": 0, "Match": "alice"},
                            {"EntityType": "client-id", "MatchType": 2, "Match": None}], "Strict": False},
            {"ThrottleTimeMs": 0, "ErrorCode": 0, "ErrorMessage": None, "Entries": [
                {"Entity": [{"EntityType": "user", "EntityName": "alice"},
                            {"EntityType": "client-id", "EntityName": None}],
                 "Values": [{"Key": "producer_byte_rate", "Value": 1048576.0}]}]},
        )
    if api == "DescribeUserScramCredentials":
        return (
            {"Users": [{"Name": "alice"}, {"Name": "bob"}]},
            {"ThrottleTimeMs": 0, "ErrorCode": 0, "ErrorMessage": None, "Results": [
                {"User": "alice", "ErrorCode": 0, "ErrorMessage": None,
                 "CredentialInfos": [{"Mechanism": 1, "Iterations": 8192}]},
                {"User": "bob", "ErrorCode": 91, "ErrorMessage": "no credentials for bob", "CredentialInfos": []}]},
        )
    if api == "ListConfigResources":
        return (
            {"ResourceTypes": [2, 4]},
            {"ThrottleTimeMs": 0, "ErrorCode": 0, "ConfigResources": [
                {"ResourceName": "1", "ResourceType": 4}, {"ResourceName": "orders", "ResourceType": 2}]},
        )
    if api == "AlterConfigs":
        return (
            {"Resources": [{"ResourceType": 2, "ResourceName": "orders", "Configs": [
                {"Name": "retention.ms", "Value": "86400000"}, {"Name": "cleanup.policy", "Value": "compact"}]},
                           {"ResourceType": 4, "ResourceName": "1", "Configs": []}],
             "ValidateOnly": True},
            {"ThrottleTimeMs": 0, "Responses": [
                {"ErrorCode": 0, "ErrorMessage": None, "ResourceType": 2, "ResourceName": "orders"},
                {"ErrorCode": 42, "ErrorMessage": "Broker configs are static", "ResourceType": 4,
                 "ResourceName": "1"}]},
        )
    if api == "AlterReplicaLogDirs":
        return (
            {"Dirs": [{"Path": "/var/lib/kafka/data", "Topics": [{"Name": "orders", "Partitions": [0, 1]}]},
                      {"Path": "/mnt/disk2/kafka", "Topics": [{"Name": "audit", "Partitions": [2]}]}]},
            {"ThrottleTimeMs": 0, "Results": [
                {"TopicName": "orders", "Partitions": [{"PartitionIndex": 0, "ErrorCode": 0},
                                                       {"PartitionIndex": 1, "ErrorCode": 0}]},
                {"TopicName": "audit", "Partitions": [{"PartitionIndex": 2, "ErrorCode": 57}]}]},
        )
    if api == "DescribeQuorum":
        voter = {"ReplicaId": 1, "ReplicaDirectoryId": AUDIT_ID, "LogEndOffset": 5210,
                 "LastFetchTimestamp": 1700000000000, "LastCaughtUpTimestamp": 1700000000000}
        observer = {"ReplicaId": 4, "ReplicaDirectoryId": ZERO_ID, "LogEndOffset": 5208,
                    "LastFetchTimestamp": 1699999999500, "LastCaughtUpTimestamp": 1699999999000}
        return (
            {"Topics": [{"TopicName": "__cluster_metadata", "Partitions": [{"PartitionIndex": 0}]}]},
            {"ErrorCode": 0, "ErrorMessage": None, "Topics": [{"TopicName": "__cluster_metadata", "Partitions": [
                {"PartitionIndex": 0, "ErrorCode": 0, "ErrorMessage": None, "LeaderId": 1, "LeaderEpoch": 7,
                 "HighWatermark": 5210, "CurrentVoters": [voter], "Observers": [observer]}]}],
             "Nodes": [{"NodeId": 1, "Listeners": [{"Name": "CONTROLLER", "Host": HOST1, "Port": 9093}]}]},
        )
    if api == "SaslHandshake":
        return ({"Mechanism": "SCRAM-SHA-512"}, {"ErrorCode": 33, "Mechanisms": ["PLAIN", "SCRAM-SHA-256"]})
    if api == "SaslAuthenticate":
        return (
            {"AuthBytes": b"\x00alice\x00secret".hex()},
            {"ErrorCode": 0, "ErrorMessage": None, "AuthBytes": b"v=ok".hex(), "SessionLifetimeMs": 3600000},
        )
    if api == "CreateAcls":
        return (
            {"Creations": [{"ResourceType": 2, "ResourceName": "orders", "ResourcePatternType": 3,
                            "Principal": "User:alice", "Host": "*", "Operation": 3, "PermissionType": 3}]},
            {"ThrottleTimeMs": 0, "Results": [{"ErrorCode": 54, "ErrorMessage": "No Authorizer is configured."}]},
        )
    if api == "DeleteAcls":
        return (
            {"Filters": [{"ResourceTypeFilter": 2, "ResourceNameFilter": "orders", "PatternTypeFilter": 3,
                          "PrincipalFilter": None, "HostFilter": None, "Operation": 1, "PermissionType": 1}]},
            {"ThrottleTimeMs": 0, "FilterResults": [{"ErrorCode": 0, "ErrorMessage": None, "MatchingAcls": [
                {"ErrorCode": 0, "ErrorMessage": None, "ResourceType": 2, "ResourceName": "orders",
                 "PatternType": 3, "Principal": "User:alice", "Host": "*", "Operation": 3,
                 "PermissionType": 3}]}]},
        )
    if api == "AlterClientQuotas":
        entity = [{"EntityType": "user", "EntityName": "alice"}, {"EntityType": "client-id", "EntityName": None}]
        return (
            {"Entries": [{"Entity": entity, "Ops": [{"Key": "producer_byte_rate", "Value": 1048576.0,
                                                     "Remove": False},
                                                    {"Key": "consumer_byte_rate", "Value": 0.0, "Remove": True}]}],
             "ValidateOnly": False},
            {"ThrottleTimeMs": 0, "Entries": [{"ErrorCode": 0, "ErrorMessage": None, "Entity": entity}]},
        )
    if api == "AlterUserScramCredentials":
        return (
            {"Deletions": [{"Name": "bob", "Mechanism": 2}],
             "Upsertions": [{"Name": "alice", "Mechanism": 1, "Iterations": 8192, "Salt": b"salt".hex(),
                             "SaltedPassword": b"\x01\x02\x03".hex()}]},
            {"ThrottleTimeMs": 0, "Results": [{"User": "bob", "ErrorCode": 0, "ErrorMessage": None},
                                              {"User": "alice", "ErrorCode": 33, "ErrorMessage": "no SCRAM"}]},
        )
    raise KeyError(api)


# --- generation ----------------------------------------------------------------------------

def versions_for(api: str) -> list[int]:
    lo, hi = parse_versions(original_json(api + "Request")["validVersions"])
    return sorted(set(range(lo, hi + 1)) | set(EXTRA_VERSIONS.get(api, ())))


def generate(api: str, classes: dict[str, type]) -> dict[str, str]:
    """{file name: content} for one API."""
    files = {}
    for version in versions_for(api):
        sidecar = {"api": api, "api_key": classes[api + "Request"].API_KEY, "version": version, "case": CASE}
        for kind, example in zip(("request", "response"), examples(api, version)):
            name = api + kind.capitalize()
            kcls = classes[name]
            jfields = original_json(name)["fields"]
            kfields = kcls._struct._fields
            obj = build(example, jfields, kfields, version, kcls, f"{name} v{version}")
            values = dump(obj, jfields, kfields, version)
            body = obj.encode(version=version)
            # Sanity: kafka-python reads its own bytes back to the same values.
            again = kcls.decode(body, version=version)
            assert dump(again, jfields, kfields, version) == values, f"{name} v{version}: kafka-python round trip"
            files[f"v{version}_{CASE}_{kind}.hex"] = bytes(body).hex() + "\n"
            sidecar[kind] = values
        files[f"v{version}_{CASE}.json"] = json.dumps(sidecar, indent=2) + "\n"
    return files


def generate_all() -> dict[str, dict[str, str]]:
    classes = kp_classes()
    return {api: generate(api, classes) for api in APIS}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--check", action="store_true", help="only compare with the files on disk")
    args = parser.parse_args(argv)
    stale = 0
    written = 0
    for api, files in generate_all().items():
        directory = args.out / api
        if args.check:
            for fname, content in files.items():
                path = directory / fname
                if not path.exists() or path.read_text() != content:
                    print(f"stale: {path}")
                    stale += 1
            continue
        directory.mkdir(parents=True, exist_ok=True)
        for old in directory.glob(f"v*_{CASE}[._]*"):
            if old.name not in files:
                old.unlink()
        for fname, content in files.items():
            (directory / fname).write_text(content)
            written += 1
    if args.check:
        print("vectors up to date" if not stale else f"{stale} stale vector files")
        return 1 if stale else 0
    print(f"wrote {written} files under {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
