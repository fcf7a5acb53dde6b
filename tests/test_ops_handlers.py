"""Unit tests for what admin tools ask for: log dirs, elections, reassignments, ACLs, quotas, SCRAM users, config
resources, and internal topics in Metadata and Produce.

Each call goes through the codec at the version under test (see test_admin_handlers.call); the real clients'
view of the same APIs is in compat_tests/test_admin_tools.py.
"""
from __future__ import annotations

import os

import pytest
from test_admin_handlers import append, call, creatable, create, make_broker, req, versions

from trireme.state.topics import INTERNAL_TOPICS
from trireme.wire import error_codes as E
from trireme.wire import records


@pytest.fixture
def broker(tmp_path):
    b = make_broker(tmp_path / "data")
    create(b, 7, creatable("orders", 3), creatable("audit", 1))
    yield b
    b.close()


# --- internal topics -------------------------------------------------------------------------

MD = req("Metadata")


@pytest.mark.parametrize("version", [1, 9, 12])
def test_metadata_lists_internal_topics_marked_internal(broker, version):
    every = call(broker, "Metadata", version, MD(topics=None, allow_auto_topic_creation=False))
    listed = {t.name: (t.error_code, t.is_internal, len(t.partitions)) for t in every.topics}
    assert listed == {"orders": (0, False, 3), "audit": (0, False, 1),
                      "__consumer_offsets": (0, True, 1), "__transaction_state": (0, True, 1)}
    named = call(broker, "Metadata", version, MD(topics=[MD.MetadataRequestTopic(name="__transaction_state")],
                                                 allow_auto_topic_creation=True))
    assert [(t.name, t.error_code, t.is_internal) for t in named.topics] == [("__transaction_state", 0, True)]
    assert set(INTERNAL_TOPICS) & {t.name for t in broker.topics.all()} == set()    # nothing was created


def test_metadata_names_internal_topics_by_id(broker):
    offsets_id = broker.internal_topics["__consumer_offsets"].topic_id
    r = call(broker, "Metadata", 12, MD(topics=[MD.MetadataRequestTopic(name=None, topic_id=offsets_id)]))
    assert [(t.name, t.error_code, t.is_internal) for t in r.topics] == [("__consumer_offsets", 0, True)]


PR = req("Produce")


@pytest.mark.parametrize("version", [3, 8, 13])
def test_produce_to_an_internal_topic_is_invalid_topic(broker, version):
    batch = bytes(records.build_batch([(None, b"x")]))
    topic_id = broker.described_topic("__consumer_offsets").topic_id if version >= 13 else None
    offsets_end = broker.partition("__consumer_offsets", 0).log.log_end_offset
    r = call(broker, "Produce", version, PR(acks=1, timeout_ms=1000, topic_data=[PR.TopicProduceData(
        name="__consumer_offsets", topic_id=topic_id, partition_data=[
            PR.TopicProduceData.PartitionProduceData(index=0, records=batch)])]))
    [result] = r.responses[0].partition_responses
    assert result.error_code == E.INVALID_TOPIC_EXCEPTION.code
    if version >= 8:
        assert "__consumer_offsets" in result.error_message
    assert broker.partition("__consumer_offsets", 0).log.log_end_offset == offsets_end


def test_delete_records_of_an_internal_topic_is_invalid_topic(broker):
    DR = req("DeleteRecords")
    r = call(broker, "DeleteRecords", 2, DR(topics=[DR.DeleteRecordsTopic(name="__transaction_state", partitions=[
        DR.DeleteRecordsTopic.DeleteRecordsPartition(partition_index=0, offset=-1)])], timeout_ms=1000))
    assert r.topics[0].partitions[0].error_code == E.INVALID_TOPIC_EXCEPTION.code


# --- DescribeLogDirs -------------------------------------------------------------------------

DLD = req("DescribeLogDirs")


def _log_dirs(broker, version, topics):
    r = call(broker, "DescribeLogDirs", version, DLD(topics=topics))
    [result] = r.results
    sizes = {(t.name, p.partition_index): p.partition_size for t in result.topics for p in t.partitions}
    return r, result, sizes


@pytest.mark.parametrize("version", versions("DescribeLogDirs"))
def test_describe_log_dirs_reports_real_sizes(broker, version):
    append(broker, "orders", 1, 5)
    append(broker, "orders", 1, 3)
    r, result, sizes = _log_dirs(broker, version, None)
    expected_dir = os.path.abspath(os.path.join(broker.config.data_dir, "logs"))
    assert (result.error_code, result.log_dir) == (0, expected_dir)
    on_disk = sum(os.path.getsize(os.path.join(expected_dir, "orders-1", f))
                  for f in os.listdir(os.path.join(expected_dir, "orders-1")) if f.endswith(".log"))
    assert sizes[("orders", 1)] == on_disk > 0
    assert sizes[("orders", 0)] == sizes[("audit", 0)] == 0
    assert {name for name, _ in sizes} == {"orders", "audit", "__consumer_offsets", "__transaction_state"}
    assert all(p.offset_lag == 0 and p.is_future_key is False for t in result.topics for p in t.partitions)
    if version >= 3:
        assert r.error_code == 0
    if version >= 4:
        assert result.total_bytes >= result.usable_bytes > 0


def test_describe_log_dirs_named_partitions(broker):
    append(broker, "orders", 2, 1)
    topics = [DLD.DescribableLogDirTopic(topic="orders", partitions=[2, 7]),
              DLD.DescribableLogDirTopic(topic="nope", partitions=[0])]
    _, result, sizes = _log_dirs(broker, 4, topics)
    assert list(sizes) == [("orders", 2)] and sizes[("orders", 2)] > 0    # missing ones are left out
    _, result, sizes = _log_dirs(broker, 4, [])
    assert result.topics == [] and result.error_code == 0


# --- ElectLeaders ----------------------------------------------------------------------------

EL = req("ElectLeaders")


def _elect(broker, version, topic_partitions, election_type=0):
    tps = None if topic_partitions is None else [EL.TopicPartitions(topic=t, partitions=ps)
                                                 for t, ps in topic_partitions.items()]
    return call(broker, "ElectLeaders", version, EL(election_type=election_type, topic_partitions=tps,
                                                    timeout_ms=1000))


@pytest.mark.parametrize("version", versions("ElectLeaders"))
def test_elect_leaders_is_never_needed(broker, version):
    r = _elect(broker, version, {"orders": [0, 2, 3], "__consumer_offsets": [0], "nope": [0]})
    got = {(t.topic, p.partition_id): p.error_code for t in r.replica_election_results for p in t.partition_result}
    assert got == {("orders", 0): E.ELECTION_NOT_NEEDED.code, ("orders", 2): E.ELECTION_NOT_NEEDED.code,
                   ("orders", 3): E.UNKNOWN_TOPIC_OR_PARTITION.code,
                   ("__consumer_offsets", 0): E.ELECTION_NOT_NEEDED.code,
                   ("nope", 0): E.UNKNOWN_TOPIC_OR_PARTITION.code}
    if version >= 1:
        assert r.error_code == 0
        unclean = _elect(broker, version, {"orders": [1]}, election_type=1)
        assert unclean.replica_election_results[0].partition_result[0].error_code == E.ELECTION_NOT_NEEDED.code


def test_elect_leaders_for_all_partitions_lists_topics_without_results(broker):
    r = _elect(broker, 2, None)
    assert {t.topic: t.partition_result for t in r.replica_election_results} == {
        "orders": [], "audit": [], "__consumer_offsets": [], "__transaction_state": []}


def test_elect_leaders_unknown_election_type(broker):
    r = _elect(broker, 2, {"orders": [0]}, election_type=5)
    assert r.error_code == E.INVALID_REQUEST.code
    assert r.replica_election_results[0].partition_result[0].error_code == E.INVALID_REQUEST.code
    assert _elect(broker, 2, None, election_type=5).error_code == E.INVALID_REQUEST.code


# --- reassignments ---------------------------------------------------------------------------

APR = req("AlterPartitionReassignments")
LPR = req("ListPartitionReassignments")


@pytest.mark.parametrize("version", versions("AlterPartitionReassignments"))
def test_alter_partition_reassignments(broker, version):
    node = broker.node_id
    targets = {("orders", 0): [node], ("orders", 1): [node + 1], ("orders", 2): [node, node],
               ("audit", 0): [], ("__consumer_offsets", 0): [node], ("orders", 9): [node], ("nope", 0): [node]}
    topics = {}
    for (name, index), replicas in targets.items():
        topics.setdefault(name, []).append(APR.ReassignableTopic.ReassignablePartition(
            partition_index=index, replicas=replicas))
    r = call(broker, "AlterPartitionReassignments", version, APR(
        timeout_ms=1000, allow_replication_factor_change=False,
        topics=[APR.ReassignableTopic(name=n, partitions=ps) for n, ps in topics.items()]))
    got = {(t.name, p.partition_index): p.error_code for t in r.responses for p in t.partitions}
    assert got == {("orders", 0): 0, ("orders", 1): E.INVALID_REPLICA_ASSIGNMENT.code,
                   ("orders", 2): E.INVALID_REPLICA_ASSIGNMENT.code, ("audit", 0): E.INVALID_REPLICA_ASSIGNMENT.code,
                   ("__consumer_offsets", 0): 0, ("orders", 9): E.UNKNOWN_TOPIC_OR_PARTITION.code,
                   ("nope", 0): E.UNKNOWN_TOPIC_OR_PARTITION.code}
    messages = {(t.name, p.partition_index): p.error_message for t in r.responses for p in t.partitions}
    assert str(node + 1) in messages[("orders", 1)] and messages[("orders", 0)] is None
    assert (r.error_code, r.error_message) == (0, None)
    if version >= 1:
        assert r.allow_replication_factor_change is False
    listed = call(broker, "ListPartitionReassignments", 0, LPR(timeout_ms=1000, topics=None))
    assert (listed.error_code, listed.topics) == (0, [])          # completed at once: nothing in progress


def test_cancel_without_a_reassignment(broker):
    r = call(broker, "AlterPartitionReassignments", 0, APR(timeout_ms=1000, topics=[APR.ReassignableTopic(
        name="orders", partitions=[APR.ReassignableTopic.ReassignablePartition(partition_index=0, replicas=None)])]))
    assert r.responses[0].partitions[0].error_code == E.NO_REASSIGNMENT_IN_PROGRESS.code


def test_list_partition_reassignments_named(broker):
    r = call(broker, "ListPartitionReassignments", 0, LPR(timeout_ms=1000, topics=[
        LPR.ListPartitionReassignmentsTopics(name="orders", partition_indexes=[0, 1]),
        LPR.ListPartitionReassignmentsTopics(name="nope", partition_indexes=[0])]))
    assert (r.error_code, r.error_message, r.topics) == (0, None, [])


# --- ACLs, quotas, SCRAM ---------------------------------------------------------------------

@pytest.mark.parametrize("version", versions("DescribeAcls"))
def test_describe_acls_security_disabled(broker, version):
    DA = req("DescribeAcls")
    r = call(broker, "DescribeAcls", version, DA(resource_type_filter=1, resource_name_filter=None,
                                                 pattern_type_filter=1, principal_filter=None, host_filter=None,
                                                 operation=1, permission_type=1))
    assert (r.error_code, r.resources) == (E.SECURITY_DISABLED.code, [])
    assert r.error_message


DCQ = req("DescribeClientQuotas")


def _quotas(broker, version, *components, strict=False):
    return call(broker, "DescribeClientQuotas", version, DCQ(strict=strict, components=[
        DCQ.ComponentData(entity_type=t, match_type=m, match=v) for t, m, v in components]))


@pytest.mark.parametrize("version", versions("DescribeClientQuotas"))
def test_describe_client_quotas_none_configured(broker, version):
    for components in [(), (("user", 2, None),), (("user", 0, "alice"), ("client-id", 1, None)), (("ip", 2, None),)]:
        r = _quotas(broker, version, *components)
        assert (r.error_code, r.entries) == (0, [])


@pytest.mark.parametrize("components, error", [
    ((("user", 0, None),), E.INVALID_REQUEST),
    ((("user", 1, "alice"),), E.INVALID_REQUEST),
    ((("user", 2, "alice"),), E.INVALID_REQUEST),
    ((("user", 7, None),), E.INVALID_REQUEST),
    ((("user", 2, None), ("user", 1, None)), E.INVALID_REQUEST),
    ((("", 2, None),), E.INVALID_REQUEST),
    ((("ip", 2, None), ("client-id", 2, None)), E.INVALID_REQUEST),
    ((("group", 2, None),), E.UNSUPPORTED_VERSION),
])
def test_describe_client_quotas_bad_filters(broker, components, error):
    r = _quotas(broker, 1, *components)
    assert (r.error_code, r.entries) == (error.code, None) and r.error_message


def test_describe_user_scram_credentials(broker):
    DU = req("DescribeUserScramCredentials")
    for users in (None, []):
        r = call(broker, "DescribeUserScramCredentials", 0, DU(users=users))
        assert (r.error_code, r.results) == (0, [])
    r = call(broker, "DescribeUserScramCredentials", 0, DU(users=[DU.UserName(name=n) for n in ("a", "b", "a")]))
    assert [(x.user, x.error_code, x.credential_infos) for x in r.results] == [
        ("a", E.DUPLICATE_RESOURCE.code, []), ("b", E.RESOURCE_NOT_FOUND.code, [])]
    assert "b" in r.results[1].error_message


# --- ListConfigResources ---------------------------------------------------------------------

LCR = req("ListConfigResources")


def test_list_config_resources_v1(broker):
    node = str(broker.node_id)
    r = call(broker, "ListConfigResources", 1, LCR(resource_types=[]))
    assert r.error_code == 0
    assert [(c.resource_type, c.resource_name) for c in r.config_resources] == [
        (8, node), (4, node), (2, "__consumer_offsets"), (2, "__transaction_state"), (2, "audit"), (2, "orders")]
    r = call(broker, "ListConfigResources", 1, LCR(resource_types=[4, 16]))
    assert [(c.resource_type, c.resource_name) for c in r.config_resources] == [(4, node)]
    r = call(broker, "ListConfigResources", 1, LCR(resource_types=[2, 64]))
    assert (r.error_code, r.config_resources) == (E.UNSUPPORTED_VERSION.code, [])


def test_list_config_resources_v0_lists_client_metrics_only(broker):
    r = call(broker, "ListConfigResources", 0, LCR())
    assert (r.error_code, r.config_resources) == (0, [])
