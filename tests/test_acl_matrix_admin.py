"""What the group and admin APIs check with an authorizer (issue 21): Kafka 4's checks and error codes, per entry where Kafka answers per entry, and nothing changed when refused.

The matrix (tests/acl_matrix.py) runs each case once without each permission it needs and once with all of them,
on a fresh broker whose Security is a stand-in allowing exactly the grants given (no implied operations: a case
lists every operation the handler asks for).  The snapshot compared around a refused call is acl_matrix's
broker_state plus what these APIs change besides (group members, topic configs, feature levels).  Answers that
mix codes (one topic refused, another not; the all-topics OffsetFetch; ListGroups' filter) have tests of their
own below, and a last test walks docs/protocol.md: every API has a matrix entry or a written reason.
"""
from __future__ import annotations

import importlib
import pathlib
import re

import pytest

import acl_matrix
from acl_matrix import (PRINCIPAL, Case, Changes, Grant, call_as, cluster, error_codes, grant, group, make_broker,
                        only, succeeded, topic)
from broker_runner import run_with_broker
from trireme.server.authorized_operations import SUPPORTED_OPERATIONS, operations_bits
from trireme.server.handlers.describe_log_dirs import log_dir
from trireme.state.acls import Operation, ResourceType
from trireme.wire import error_codes as E
from trireme.wire.codec import message

READ, DELETE, DESCRIBE, ALTER, CREATE = Operation.READ, Operation.DELETE, Operation.DESCRIBE, Operation.ALTER, \
    Operation.CREATE
DESCRIBE_CONFIGS, ALTER_CONFIGS = Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS
NONE = E.NONE.code
TOPIC_DENIED = E.TOPIC_AUTHORIZATION_FAILED.code
GROUP_DENIED = E.GROUP_AUTHORIZATION_FAILED.code
CLUSTER_DENIED = E.CLUSTER_AUTHORIZATION_FAILED.code
GROUP_PROPS = {"group.initial.rebalance.delay.ms": 0}
ROOT = pathlib.Path(__file__).resolve().parent.parent


def req(api):
    return message(api + "Request").cls


JG, SG, HB, LG = req("JoinGroup"), req("SyncGroup"), req("Heartbeat"), req("LeaveGroup")
OC, OF, OD = req("OffsetCommit"), req("OffsetFetch"), req("OffsetDelete")
DG, LGS, DLG = req("DescribeGroups"), req("ListGroups"), req("DeleteGroups")
CT, DT, CP = req("CreateTopics"), req("DeleteTopics"), req("CreatePartitions")
DC, AC, IAC = req("DescribeConfigs"), req("AlterConfigs"), req("IncrementalAlterConfigs")
DCL, DLD, ARL = req("DescribeCluster"), req("DescribeLogDirs"), req("AlterReplicaLogDirs")
EL, APR, LPR = req("ElectLeaders"), req("AlterPartitionReassignments"), req("ListPartitionReassignments")
UF, DQ, UB, LCR = req("UpdateFeatures"), req("DescribeQuorum"), req("UnregisterBroker"), req("ListConfigResources")
CDT, DDT = req("CreateDelegationToken"), req("DescribeDelegationToken")
RDT, EDT = req("RenewDelegationToken"), req("ExpireDelegationToken")


# --- the runner: acl_matrix's, with a snapshot that also sees members, configs and features ------------------

def state(broker) -> dict:
    groups = broker.groups.coordinator.groups
    return {
        **acl_matrix.broker_state(broker),
        "members": sorted((gid, str(g.state), g.generation, sorted(g.members), sorted(g.pending_members))
                          for gid, g in groups.items()),
        "topic configs": sorted((t.name, sorted(t.configs.items())) for t in broker.topics.all()),
        "features": sorted(broker.features.levels.items()),
    }


def run_case(case: Case) -> None:
    """acl_matrix.run_case with this module's snapshot and group properties."""
    acl_matrix.run_case(case, snapshot=state, props=GROUP_PROPS)


def run_calls(body, **props):
    """Run ``body(broker)`` on a fresh matrix broker (every permission until the body grants otherwise)."""
    broker = make_broker(**{**GROUP_PROPS, **props})
    try:
        run_with_broker(broker, body)
    finally:
        broker.close()


# --- checks ------------------------------------------------------------------------------------------------

def codes_are(expected: int):
    """Every error code of the answer is ``expected`` (top level and nested alike)."""
    def check(response, _):
        codes = error_codes(response)
        assert codes and set(codes) == {expected}, codes
    return check


def nested_are(expected: int, top: int = NONE):
    """Every nested error code is ``expected``; top-level ones are ``top``."""
    def check(response, _):
        nested = error_codes(response, top=False)
        assert nested and set(nested) == {expected}, nested
        assert set(error_codes(response)) - set(nested) <= {top}, response
    return check


def by_missing(codes: dict):
    """The refusal depends on which grant is missing: ``codes[resource type]`` everywhere."""
    def check(response, missing):
        only(codes[missing.resource_type])(response, missing)
    return check


def allowed_code(expected: int):
    def check(response, broker):
        codes = error_codes(response)
        assert codes and set(codes) == {expected}, codes
    return check


# --- set-up ----------------------------------------------------------------------------------

ORDERS = "orders"
G, G2 = "g", "g2"


async def orders(broker):
    await broker.create_topic(ORDERS, 2)


async def stable_member(broker):
    """Group G with one member (its leader) in a Stable generation → (member id, generation)."""
    await orders(broker)
    joined = await call_as(broker, "JoinGroup", 3, JG(
        group_id=G, session_timeout_ms=30000, rebalance_timeout_ms=30000, member_id="", protocol_type="consumer",
        protocols=[JG.JoinGroupRequestProtocol(name="range", metadata=b"m")]))
    assert joined.error_code == NONE, joined
    synced = await call_as(broker, "SyncGroup", 3, SG(
        group_id=G, generation_id=joined.generation_id, member_id=joined.member_id,
        assignments=[SG.SyncGroupRequestAssignment(member_id=joined.member_id, assignment=b"a")]))
    assert synced.error_code == NONE, synced
    return joined.member_id, joined.generation_id


def commit_request(group_id, partitions=(0, 1), topic_name=ORDERS, offset=5):
    return OC(group_id=group_id, generation_id_or_member_epoch=-1, member_id="", topics=[
        OC.OffsetCommitRequestTopic(name=topic_name, partitions=[
            OC.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
                partition_index=p, committed_offset=offset, committed_metadata="") for p in partitions])])


async def committed(broker):
    """Group G2 (no members) with offsets committed for orders-0 and orders-1."""
    await orders(broker)
    out = await call_as(broker, "OffsetCommit", 8, commit_request(G2))
    assert set(error_codes(out)) == {NONE}


# --- the group APIs ------------------------------------------------------------------------------------------

def join_request(b, _):
    return JG(group_id=G, session_timeout_ms=30000, rebalance_timeout_ms=30000, member_id="",
              protocol_type="consumer", protocols=[JG.JoinGroupRequestProtocol(name="range", metadata=b"m")])


def check_join_refused(response, missing):
    assert response.error_code == GROUP_DENIED
    assert (response.generation_id, response.member_id, response.leader, response.members) == (-1, "", "", [])
    assert response.protocol_name is None                        # v7+: null, as Kafka's error answer


GROUP_CASES = [
    Case("join-group", "JoinGroup", 9, join_request, (group(G, READ),), check_join_refused,
         allowed_code(E.MEMBER_ID_REQUIRED.code)),
    Case("sync-group", "SyncGroup", 5, lambda b, m: SG(
        group_id=G, generation_id=m[1], member_id=m[0], protocol_type="consumer", protocol_name="range",
        assignments=[SG.SyncGroupRequestAssignment(member_id=m[0], assignment=b"b")]),
         (group(G, READ),), codes_are(GROUP_DENIED), succeeded, setup=stable_member, changes=Changes.NOTHING),
    Case("heartbeat", "Heartbeat", 4, lambda b, m: HB(group_id=G, generation_id=m[1], member_id=m[0]),
         (group(G, READ),), codes_are(GROUP_DENIED), succeeded, setup=stable_member, changes=Changes.NOTHING),
    Case("leave-group-v5", "LeaveGroup", 5, lambda b, m: LG(group_id=G, members=[LG.MemberIdentity(member_id=m[0])]),
         (group(G, READ),), codes_are(GROUP_DENIED), succeeded, setup=stable_member),
    Case("leave-group-v0", "LeaveGroup", 0, lambda b, m: LG(group_id=G, member_id=m[0]),
         (group(G, READ),), codes_are(GROUP_DENIED), succeeded, setup=stable_member),
    Case("offset-commit", "OffsetCommit", 8, lambda b, _: commit_request(G2),
         (group(G2, READ), topic(ORDERS, READ)), by_missing({ResourceType.GROUP: GROUP_DENIED,
                                                             ResourceType.TOPIC: TOPIC_DENIED}),
         succeeded, setup=orders),
    Case("offset-commit-v2", "OffsetCommit", 2, lambda b, _: commit_request(G2),
         (group(G2, READ), topic(ORDERS, READ)), by_missing({ResourceType.GROUP: GROUP_DENIED,
                                                             ResourceType.TOPIC: TOPIC_DENIED}),
         succeeded, setup=orders),
    Case("offset-commit-member", "OffsetCommit", 8, lambda b, m: OC(
        group_id=G, generation_id_or_member_epoch=m[1], member_id=m[0], topics=[OC.OffsetCommitRequestTopic(
            name=ORDERS, partitions=[OC.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
                partition_index=0, committed_offset=3)])]),
         (group(G, READ), topic(ORDERS, READ)), by_missing({ResourceType.GROUP: GROUP_DENIED,
                                                            ResourceType.TOPIC: TOPIC_DENIED}),
         succeeded, setup=stable_member),
    Case("offset-delete", "OffsetDelete", 0, lambda b, _: OD(group_id=G2, topics=[OD.OffsetDeleteRequestTopic(
        name=ORDERS, partitions=[OD.OffsetDeleteRequestTopic.OffsetDeleteRequestPartition(partition_index=0)])]),
         (group(G2, DELETE), topic(ORDERS, READ)), by_missing({ResourceType.GROUP: GROUP_DENIED,
                                                               ResourceType.TOPIC: TOPIC_DENIED}),
         succeeded, setup=committed),
    Case("delete-groups", "DeleteGroups", 2, lambda b, _: DLG(groups_names=[G2]), (group(G2, DELETE),),
         codes_are(GROUP_DENIED), succeeded, setup=committed),
    Case("describe-groups", "DescribeGroups", 5, lambda b, _: DG(groups=[G], include_authorized_operations=True),
         (group(G, DESCRIBE),), codes_are(GROUP_DENIED), succeeded, setup=stable_member, changes=Changes.NOTHING),
]


def offset_fetch_cases():
    def v8(topics):
        return lambda b, _: OF(groups=[OF.OffsetFetchRequestGroup(group_id=G2, topics=topics)])
    named = [OF.OffsetFetchRequestGroup.OffsetFetchRequestTopics(name=ORDERS, partition_indexes=[0, 1])]
    refusals = {ResourceType.GROUP: lambda r: _fetch_group_refused(r), ResourceType.TOPIC: _fetch_topic_refused}

    def refused(response, missing):
        refusals[missing.resource_type](response)

    def fetched(response, broker):
        assert set(error_codes(response)) == {NONE}
        offsets = [p.committed_offset for g in (response.groups or [response]) for t in g.topics for p in t.partitions]
        assert offsets == [5, 5], response
    needs = (group(G2, DESCRIBE), topic(ORDERS, DESCRIBE))
    return [
        Case("offset-fetch-v8", "OffsetFetch", 8, v8(named), needs, refused, fetched, setup=committed,
             changes=Changes.NOTHING),
        Case("offset-fetch-v5", "OffsetFetch", 5, lambda b, _: OF(group_id=G2, topics=[OF.OffsetFetchRequestTopic(
            name=ORDERS, partition_indexes=[0, 1])]), needs, refused, fetched, setup=committed,
             changes=Changes.NOTHING),
    ]


def _groups_of(response):
    return response.groups if response.groups else None


def _fetch_group_refused(response):
    groups = _groups_of(response)
    if groups is not None:
        assert [(g.error_code, g.topics) for g in groups] == [(GROUP_DENIED, [])]
    else:
        assert (response.error_code, response.topics) == (GROUP_DENIED, [])


def _fetch_topic_refused(response):
    container = _groups_of(response)[0] if _groups_of(response) else response
    assert container.error_code == NONE
    assert [(t.name, [(p.partition_index, p.committed_offset, p.error_code) for p in t.partitions])
            for t in container.topics] == [(ORDERS, [(0, -1, TOPIC_DENIED), (1, -1, TOPIC_DENIED)])]


# --- the admin APIs ------------------------------------------------------------------------------------------

NEW = "fresh"


def create_request(b, _):
    return CT(topics=[CT.CreatableTopic(name=NEW, num_partitions=2, replication_factor=1)])


def check_created_without_configs(response, broker):
    [t] = response.topics
    assert (t.error_code, t.topic_config_error_code, t.num_partitions, t.replication_factor, t.configs) == \
        (NONE, TOPIC_DENIED, -1, -1, [])         # no DescribeConfigs: the topic is made, its configs not shown
    assert broker.described_topic(NEW).partitions == 2


def check_create_refused(response, missing):
    assert [(t.name, t.error_code, t.error_message) for t in response.topics] == \
        [(NEW, TOPIC_DENIED, "Authorization failed.")]


def delete_by_id(b, _):
    return DT(topics=[DT.DeleteTopicState(name=None, topic_id=b.described_topic(ORDERS).topic_id)])


def check_config_refused(code):
    def check(response, missing):
        [r] = response.results if hasattr(response, "results") else response.responses
        assert r.error_code == code and r.error_message.endswith("authorization failed.")
        assert getattr(r, "configs", []) == []
    return check


def alter_topic(cls, incremental):
    def build(b, _):
        entry = cls.AlterConfigsResource.AlterableConfig(name="retention.ms", value="1234", **(
            {"config_operation": 0} if incremental else {}))
        return cls(resources=[cls.AlterConfigsResource(resource_type=2, resource_name=ORDERS, configs=[entry])])
    return build


def check_elected(response, broker):
    assert response.error_code == NONE
    assert {p.error_code for r in response.replica_election_results for p in r.partition_result} == \
        {E.ELECTION_NOT_NEEDED.code}


def check_refused_cluster_everywhere(response, missing):
    codes = error_codes(response)
    assert codes and set(codes) == {CLUSTER_DENIED}, codes


ADMIN_CASES = [
    Case("create-topics", "CreateTopics", 7, create_request, (topic(NEW, CREATE),), check_create_refused,
         check_created_without_configs),
    Case("delete-topics-by-name", "DeleteTopics", 6, lambda b, _: DT(topics=[DT.DeleteTopicState(name=ORDERS)]),
         (topic(ORDERS, DESCRIBE), topic(ORDERS, DELETE)), only(TOPIC_DENIED), succeeded, setup=orders),
    Case("delete-topics-v4", "DeleteTopics", 4, lambda b, _: DT(topic_names=[ORDERS]),
         (topic(ORDERS, DESCRIBE), topic(ORDERS, DELETE)), only(TOPIC_DENIED), succeeded, setup=orders),
    Case("delete-topics-by-id", "DeleteTopics", 6, delete_by_id, (topic(ORDERS, DELETE),), only(TOPIC_DENIED),
         succeeded, setup=orders),
    Case("create-partitions", "CreatePartitions", 3, lambda b, _: CP(topics=[CP.CreatePartitionsTopic(
        name=ORDERS, count=4, assignments=None)]), (topic(ORDERS, ALTER),), only(TOPIC_DENIED), succeeded, setup=orders),
    Case("describe-configs-topic", "DescribeConfigs", 4, lambda b, _: DC(resources=[DC.DescribeConfigsResource(
        resource_type=2, resource_name=ORDERS)]), (topic(ORDERS, DESCRIBE_CONFIGS),),
         check_config_refused(TOPIC_DENIED), succeeded, setup=orders, changes=Changes.NOTHING),
    Case("describe-configs-broker", "DescribeConfigs", 4, lambda b, _: DC(resources=[DC.DescribeConfigsResource(
        resource_type=4, resource_name=str(b.node_id))]), (cluster(DESCRIBE_CONFIGS),),
         check_config_refused(CLUSTER_DENIED), succeeded, changes=Changes.NOTHING),
    Case("alter-configs", "AlterConfigs", 2, alter_topic(AC, False), (topic(ORDERS, ALTER_CONFIGS),),
         check_config_refused(TOPIC_DENIED), succeeded, setup=orders),
    Case("incremental-alter-configs", "IncrementalAlterConfigs", 1, alter_topic(IAC, True),
         (topic(ORDERS, ALTER_CONFIGS),), check_config_refused(TOPIC_DENIED), succeeded, setup=orders),
    Case("describe-log-dirs", "DescribeLogDirs", 4, lambda b, _: DLD(topics=None), (cluster(DESCRIBE),),
         lambda r, m: (codes_are(CLUSTER_DENIED)(r, m), r.results == [] or pytest.fail(r)), succeeded,
         setup=orders, changes=Changes.NOTHING),
    Case("alter-replica-log-dirs", "AlterReplicaLogDirs", 2, lambda b, _: ARL(dirs=[ARL.AlterReplicaLogDir(
        path=log_dir(b), topics=[ARL.AlterReplicaLogDir.AlterReplicaLogDirTopic(name=ORDERS, partitions=[0, 1])])]),
         (cluster(ALTER),), codes_are(CLUSTER_DENIED), succeeded, setup=orders, changes=Changes.NOTHING),
    Case("elect-leaders", "ElectLeaders", 2, lambda b, _: EL(election_type=0, topic_partitions=[EL.TopicPartitions(
        topic=ORDERS, partitions=[0, 1])]), (cluster(ALTER),), check_refused_cluster_everywhere, check_elected,
         setup=orders, changes=Changes.NOTHING),
    Case("alter-partition-reassignments", "AlterPartitionReassignments", 0, lambda b, _: APR(topics=[
        APR.ReassignableTopic(name=ORDERS, partitions=[APR.ReassignableTopic.ReassignablePartition(
            partition_index=0, replicas=[b.node_id])])]), (cluster(ALTER),), codes_are(CLUSTER_DENIED), succeeded,
         setup=orders, changes=Changes.NOTHING),
    Case("list-partition-reassignments", "ListPartitionReassignments", 0, lambda b, _: LPR(topics=None),
         (cluster(DESCRIBE),), codes_are(CLUSTER_DENIED), succeeded, changes=Changes.NOTHING),
    Case("update-features", "UpdateFeatures", 1, lambda b, _: UF(feature_updates=[UF.FeatureUpdateKey(
        feature="transaction.version", max_version_level=1, upgrade_type=2)]), (cluster(ALTER),),
         codes_are(CLUSTER_DENIED), succeeded),
    Case("describe-quorum", "DescribeQuorum", 2, lambda b, _: DQ(topics=[DQ.TopicData(
        topic_name="__cluster_metadata", partitions=[DQ.TopicData.PartitionData(partition_index=0)])]),
         (cluster(DESCRIBE),), lambda r, m: (codes_are(CLUSTER_DENIED)(r, m), r.topics == [] or pytest.fail(r)),
         succeeded, changes=Changes.NOTHING),
    Case("unregister-broker", "UnregisterBroker", 0, lambda b, _: UB(broker_id=b.node_id + 1), (cluster(ALTER),),
         codes_are(CLUSTER_DENIED), allowed_code(E.BROKER_ID_NOT_REGISTERED.code), changes=Changes.NOTHING),
    Case("list-config-resources", "ListConfigResources", 1, lambda b, _: LCR(resource_types=[]),
         (cluster(DESCRIBE_CONFIGS),), lambda r, m: (codes_are(CLUSTER_DENIED)(r, m),
                                                    r.config_resources == [] or pytest.fail(r)),
         succeeded, setup=orders, changes=Changes.NOTHING),
]

MATRIX = GROUP_CASES + offset_fetch_cases() + ADMIN_CASES


@pytest.mark.parametrize("case", MATRIX, ids=str)
def test_matrix(case):
    run_case(case)


# --- answers that mix codes ----------------------------------------------------------------------------------

SECRET = "secret"


async def two_topics(broker):
    await broker.create_topic(ORDERS, 2)
    await broker.create_topic(SECRET, 1)


def partition_codes(response):
    return {(t.name, p.partition_index): p.error_code for t in response.topics for p in t.partitions}


def test_offset_commit_refuses_per_topic_and_commits_the_rest():
    async def body(b):
        await two_topics(b)
        grant(b, [group(G2, READ), topic(ORDERS, READ)])
        request = commit_request(G2)
        request.topics += commit_request(G2, (0,), SECRET).topics + commit_request(G2, (0,), "nowhere").topics
        out = await call_as(b, "OffsetCommit", 8, request)
        # An unknown topic the principal may not Read is refused, not reported unknown (its existence stays hidden).
        assert partition_codes(out) == {(ORDERS, 0): NONE, (ORDERS, 1): NONE, (SECRET, 0): TOPIC_DENIED,
                                        ("nowhere", 0): TOPIC_DENIED}
        grant(b, allow_all=True)
        error, fetched = b.groups.coordinator.fetch_offsets(G2, None)
        assert sorted((f.topic, f.partition) for f in fetched) == [(ORDERS, 0), (ORDERS, 1)]
        grant(b, [group(G2, READ), topic("nowhere", READ)])
        out = await call_as(b, "OffsetCommit", 8, commit_request(G2, (0,), "nowhere"))
        assert partition_codes(out) == {("nowhere", 0): E.UNKNOWN_TOPIC_OR_PARTITION.code}
    run_calls(body)


def test_offset_fetch_all_topics_leaves_out_what_may_not_be_described():
    async def body(b):
        await two_topics(b)
        request = commit_request(G2)
        request.topics += commit_request(G2, (0,), SECRET).topics
        assert set(error_codes(await call_as(b, "OffsetCommit", 8, request))) == {NONE}
        grant(b, [group(G2, DESCRIBE), topic(ORDERS, DESCRIBE)])
        for version in (2, 7):
            out = await call_as(b, "OffsetFetch", version, OF(group_id=G2, topics=None))
            assert out.error_code == NONE and partition_codes(out) == {(ORDERS, 0): NONE, (ORDERS, 1): NONE}
        out = await call_as(b, "OffsetFetch", 8, OF(groups=[OF.OffsetFetchRequestGroup(group_id=G2, topics=None)]))
        assert [(t.name, len(t.partitions)) for t in out.groups[0].topics] == [(ORDERS, 2)]
        # Named topics: the refused ones come after the others, offset -1, and are not looked up.
        out = await call_as(b, "OffsetFetch", 5, OF(group_id=G2, topics=[
            OF.OffsetFetchRequestTopic(name=SECRET, partition_indexes=[0]),
            OF.OffsetFetchRequestTopic(name=ORDERS, partition_indexes=[1])]))
        assert [(t.name, [(p.committed_offset, p.error_code) for p in t.partitions]) for t in out.topics] == \
            [(ORDERS, [(5, NONE)]), (SECRET, [(-1, TOPIC_DENIED)])]
    run_calls(body)


def test_offset_fetch_group_refusal_per_group_and_in_v1():
    async def body(b):
        await committed(b)
        grant(b, [group(G2, DESCRIBE), topic(ORDERS, DESCRIBE)])
        out = await call_as(b, "OffsetFetch", 8, OF(groups=[
            OF.OffsetFetchRequestGroup(group_id="other", topics=None),
            OF.OffsetFetchRequestGroup(group_id=G2, topics=None)]))
        assert [(g.group_id, g.error_code, len(g.topics)) for g in out.groups] == \
            [("other", GROUP_DENIED, 0), (G2, NONE, 1)]
        # v1 has no group-level error: each partition asked for carries it, as Kafka answers.
        out = await call_as(b, "OffsetFetch", 1, OF(group_id="other", topics=[
            OF.OffsetFetchRequestTopic(name=ORDERS, partition_indexes=[0, 1])]))
        assert partition_codes(out) == {(ORDERS, 0): GROUP_DENIED, (ORDERS, 1): GROUP_DENIED}
        assert {p.committed_offset for t in out.topics for p in t.partitions} == {-1}
    run_calls(body)


def test_describe_groups_refused_first_and_authorized_operations_exact():
    async def body(b):
        await stable_member(b)
        grant(b, [group(G, DESCRIBE), group(G, READ)])
        out = await call_as(b, "DescribeGroups", 5, DG(groups=[G, "hidden"], include_authorized_operations=True))
        hidden, described = out.groups
        assert (hidden.group_id, hidden.error_code, hidden.group_state, hidden.members,
                hidden.authorized_operations) == ("hidden", GROUP_DENIED, "", [], -2**31)
        assert (described.group_id, described.error_code, described.group_state) == (G, NONE, "Stable")
        assert described.authorized_operations == operations_bits([DESCRIBE, READ])
        grant(b, allow_all=True)
        out = await call_as(b, "DescribeGroups", 5, DG(groups=[G], include_authorized_operations=True))
        assert out.groups[0].authorized_operations == operations_bits(SUPPORTED_OPERATIONS[ResourceType.GROUP])
    run_calls(body)


def test_list_groups_by_cluster_or_group_describe():
    async def body(b):
        await stable_member(b)
        await call_as(b, "OffsetCommit", 8, commit_request(G2))
        for grants, listed in (([], []), ([group(G2, DESCRIBE)], [G2]), ([group(G2, READ)], []),
                               ([cluster(DESCRIBE)], [G, G2])):
            security = grant(b, grants)
            out = await call_as(b, "ListGroups", 4, LGS())
            assert (out.error_code, sorted(g.group_id for g in out.groups)) == (NONE, listed), grants
            assert (PRINCIPAL, DESCRIBE, ResourceType.CLUSTER, "kafka-cluster") in security.asked
        assert not b.metrics.denied           # a list filtered by the principal's rights is no denial (logIfDenied)
    run_calls(body)


def test_delete_groups_refused_after_the_others_once_each():
    async def body(b):
        await committed(b)
        await call_as(b, "OffsetCommit", 8, commit_request("g3"))
        grant(b, [group("g3", DELETE)])
        out = await call_as(b, "DeleteGroups", 2, DLG(groups_names=[G2, "g3", G2]))
        assert [(r.group_id, r.error_code) for r in out.results] == [("g3", NONE), (G2, GROUP_DENIED)]
        assert G2 in b.groups.coordinator.groups and "g3" not in b.groups.coordinator.offsets
    run_calls(body)


def test_sync_group_v5_checks_protocol_presence_before_authorization():
    async def body(b):
        member, generation = await stable_member(b)
        grant(b, [])
        out = await call_as(b, "SyncGroup", 5, SG(group_id=G, generation_id=generation, member_id=member,
                                                  protocol_type=None, protocol_name="range"))
        assert out.error_code == E.INCONSISTENT_GROUP_PROTOCOL.code
    run_calls(body)


def test_create_topics_cluster_create_and_describe_configs():
    async def body(b):
        grant(b, [cluster(CREATE), topic("a", DESCRIBE_CONFIGS)])
        out = await call_as(b, "CreateTopics", 7, CT(topics=[
            CT.CreatableTopic(name="a", num_partitions=1, replication_factor=1),
            CT.CreatableTopic(name="b", num_partitions=3, replication_factor=1)]))
        a, bb = out.topics
        assert (a.error_code, a.topic_config_error_code, a.num_partitions) == (NONE, NONE, 1) and a.configs
        assert (bb.error_code, bb.topic_config_error_code, bb.num_partitions, bb.configs) == (NONE, TOPIC_DENIED, -1, [])
        assert b.described_topic("b").partitions == 3
        # Without Create: refused before any check of the topic (an illegal name too), after every other result.
        grant(b, [topic("c", CREATE)])
        out = await call_as(b, "CreateTopics", 7, CT(topics=[
            CT.CreatableTopic(name="bad name!", num_partitions=1, replication_factor=1),
            CT.CreatableTopic(name="c", num_partitions=1, replication_factor=1),
            CT.CreatableTopic(name="dup", num_partitions=1, replication_factor=1),
            CT.CreatableTopic(name="dup", num_partitions=1, replication_factor=1)]))
        assert [(t.name, t.error_code) for t in out.topics] == [
            ("c", NONE), ("dup", E.INVALID_REQUEST.code), ("bad name!", TOPIC_DENIED)]
    run_calls(body)


def test_delete_topics_hides_existence_from_those_who_may_not_describe():
    async def body(b):
        await two_topics(b)
        secret_id = b.described_topic(SECRET).topic_id
        grant(b, [topic("ghost", DESCRIBE)])
        out = await call_as(b, "DeleteTopics", 6, DT(topics=[
            DT.DeleteTopicState(name="nothing"), DT.DeleteTopicState(name="ghost"),
            DT.DeleteTopicState(name=None, topic_id=secret_id)]))
        assert [(r.name, r.error_code) for r in out.responses] == [
            ("nothing", TOPIC_DENIED), ("ghost", E.UNKNOWN_TOPIC_OR_PARTITION.code),
            (None, TOPIC_DENIED)]                                  # by id, not describable: no name shown
        grant(b, [topic(SECRET, DESCRIBE)])
        out = await call_as(b, "DeleteTopics", 6, DT(topics=[DT.DeleteTopicState(name=None, topic_id=secret_id)]))
        assert [(r.name, r.error_code, r.error_message) for r in out.responses] == \
            [(SECRET, TOPIC_DENIED, "Topic authorization failed.")]
        grant(b, [cluster(DELETE)])
        out = await call_as(b, "DeleteTopics", 6, DT(topics=[DT.DeleteTopicState(name=SECRET)]))
        assert [(r.name, r.error_code) for r in out.responses] == [(SECRET, NONE)]
        assert b.described_topic(SECRET) is None and b.described_topic(ORDERS) is not None
    run_calls(body)


def test_describe_configs_refused_resources_come_last():
    async def body(b):
        await two_topics(b)
        grant(b, [topic(SECRET, DESCRIBE_CONFIGS)])
        out = await call_as(b, "DescribeConfigs", 4, DC(resources=[
            DC.DescribeConfigsResource(resource_type=2, resource_name=ORDERS),
            DC.DescribeConfigsResource(resource_type=4, resource_name=str(b.node_id)),
            DC.DescribeConfigsResource(resource_type=32, resource_name=G),
            DC.DescribeConfigsResource(resource_type=2, resource_name=SECRET)]))
        assert [(r.resource_name, r.error_code, r.error_message, len(r.configs) > 0) for r in out.results] == [
            (SECRET, NONE, None, True), (ORDERS, TOPIC_DENIED, "Topic authorization failed.", False),
            (str(b.node_id), CLUSTER_DENIED, "Cluster authorization failed.", False),
            (G, GROUP_DENIED, "Group authorization failed.", False)]
    run_calls(body)


def test_alter_configs_checks_after_duplicates_and_for_broker_resources():
    async def body(b):
        await orders(b)
        grant(b, [])
        entry = IAC.AlterConfigsResource.AlterableConfig
        out = await call_as(b, "IncrementalAlterConfigs", 1, IAC(resources=[
            IAC.AlterConfigsResource(resource_type=2, resource_name=ORDERS, configs=[
                entry(name="retention.ms", config_operation=0, value="1"),
                entry(name="retention.ms", config_operation=0, value="2")]),
            IAC.AlterConfigsResource(resource_type=4, resource_name=str(b.node_id), configs=[
                entry(name="log.retention.ms", config_operation=0, value="1")])]))
        assert [(r.error_code, r.error_message) for r in out.responses] == [
            (E.INVALID_REQUEST.code, "Error due to duplicate config keys"),
            (CLUSTER_DENIED, "Cluster authorization failed.")]
    run_calls(body)


def test_describe_cluster_authorized_operations():
    async def body(b):
        for grants, expected in (([], 0), ([cluster(DESCRIBE)], operations_bits([DESCRIBE])),
                                 ([cluster(DESCRIBE), cluster(ALTER)], operations_bits([DESCRIBE, ALTER]))):
            grant(b, grants)
            out = await call_as(b, "DescribeCluster", 1, DCL(include_cluster_authorized_operations=True))
            assert (out.error_code, out.cluster_authorized_operations) == (NONE, expected), grants
            assert [x.broker_id for x in out.brokers] == [b.node_id]       # describing the cluster needs nothing
        out = await call_as(b, "DescribeCluster", 1, DCL(include_cluster_authorized_operations=False))
        assert out.cluster_authorized_operations == -2**31
    run_calls(body)


def test_delegation_tokens_on_authenticated_and_plaintext_connections():
    async def body(b):
        grant(b, [])
        anonymous = "User:ANONYMOUS"
        out = await call_as(b, "CreateDelegationToken", 3, CDT(), principal=anonymous)
        assert (out.error_code, out.issue_timestamp_ms) == (E.DELEGATION_TOKEN_REQUEST_NOT_ALLOWED.code, -1)
        out = await call_as(b, "CreateDelegationToken", 3, CDT())
        assert (out.error_code, out.principal_name, out.token_requester_principal_name, out.issue_timestamp_ms) == \
            (E.DELEGATION_TOKEN_AUTH_DISABLED.code, "alice", "alice", 0)
        bob = CDT(owner_principal_type="User", owner_principal_name="bob")
        out = await call_as(b, "CreateDelegationToken", 3, bob)
        assert (out.error_code, out.principal_name) == (E.DELEGATION_TOKEN_AUTHORIZATION_FAILED.code, "bob")
        grant(b, [Grant(Operation.CREATE_TOKENS, ResourceType.USER, "User:bob")])
        assert (await call_as(b, "CreateDelegationToken", 3, bob)).error_code == E.DELEGATION_TOKEN_AUTH_DISABLED.code
        for api, request in (("DescribeDelegationToken", DDT(owners=None)), ("RenewDelegationToken", RDT(hmac=b"x")),
                             ("ExpireDelegationToken", EDT(hmac=b"x"))):
            assert (await call_as(b, api, 2, request)).error_code == E.DELEGATION_TOKEN_AUTH_DISABLED.code
            out = await call_as(b, api, 2, request, principal=anonymous)
            assert out.error_code == E.DELEGATION_TOKEN_REQUEST_NOT_ALLOWED.code
    run_calls(body)


# --- every API in docs/protocol.md: a matrix entry or a written reason -------------------------------------

NO_ACL_REASONS = {
    "ApiVersions": "answered before authentication and without any ACL, as Kafka does",
    "SaslHandshake": "authentication itself: Kafka checks no ACL",
    "SaslAuthenticate": "authentication itself: Kafka checks no ACL",
    "ListGroups": "never refused, only filtered (Describe on the cluster, else Describe per group): "
                  "test_list_groups_by_cluster_or_group_describe",
    "DescribeCluster": "no ACL to describe the cluster; only the authorized-operations bit set needs Describe on it: "
                       "test_describe_cluster_authorized_operations",
    "CreateDelegationToken": "delegation tokens are refused (DelegationToken): Kafka's answers on PLAINTEXT and on an "
                             "authenticated connection, CreateTokens for another owner: "
                             "test_delegation_tokens_on_authenticated_and_plaintext_connections",
    "RenewDelegationToken": "delegation tokens are refused, no ACL before it: "
                            "test_delegation_tokens_on_authenticated_and_plaintext_connections",
    "ExpireDelegationToken": "delegation tokens are refused, no ACL before it: "
                             "test_delegation_tokens_on_authenticated_and_plaintext_connections",
    "DescribeDelegationToken": "delegation tokens are refused, no ACL before it: "
                               "test_delegation_tokens_on_authenticated_and_plaintext_connections",
}

# APIs whose checks (and matrix entries) are another engineer's on issue 21 and that no matrix module covers yet;
# the matrix modules are found below (tests/test_acl_*.py: any Case they hold counts), so an entry here can go once
# one of them has a case for it.
OWNED_ELSEWHERE = {
    **dict.fromkeys(["WriteTxnMarkers", "DescribeTransactions", "ListTransactions", "DescribeTopicPartitions"],
                    "authz-data's: tested in tests/test_acl_data.py, outside its module-level Case tables"),
    **dict.fromkeys(["DescribeAcls", "CreateAcls", "DeleteAcls", "DescribeUserScramCredentials",
                     "AlterUserScramCredentials"], "acls (their handler tests)"),
    **dict.fromkeys(["DescribeClientQuotas", "AlterClientQuotas"], "quotas (their handler tests)"),
}


def documented_apis() -> list[str]:
    """The API names of docs/protocol.md's coverage table."""
    text = (ROOT / "docs" / "protocol.md").read_text()
    return re.findall(r"^\| ([A-Za-z]+) \| \d+ \|", text, re.M)


def matrix_apis() -> set[str]:
    """Every API with a Case in this module or in another tests/test_acl_*.py matrix module."""
    apis = {case.api for case in MATRIX}
    for path in sorted((ROOT / "tests").glob("test_acl*.py")):
        if path.stem == __name__.rpartition(".")[2]:
            continue
        module = importlib.import_module(path.stem)
        for value in vars(module).values():
            for item in value if isinstance(value, (list, tuple)) else [value]:
                if isinstance(item, Case):
                    apis.add(item.api)
    return apis


def test_every_documented_api_has_a_matrix_entry_or_a_reason():
    documented = documented_apis()
    assert len(documented) > 50 and "JoinGroup" in documented
    covered = matrix_apis()
    missing = [api for api in documented if api not in covered and api not in NO_ACL_REASONS
               and api not in OWNED_ELSEWHERE]
    assert not missing, f"no ACL matrix entry and no written reason: {missing}"
    stale = (covered | set(NO_ACL_REASONS) | set(OWNED_ELSEWHERE)) - set(documented)
    assert not stale, f"not in docs/protocol.md: {stale}"
    assert not (set(NO_ACL_REASONS) & {case.api for case in MATRIX})


def test_broker_logger_configs_checked_only_by_incremental_alter_configs():
    async def body(b):
        grant(b, [])
        logger = [IAC.AlterConfigsResource(resource_type=8, resource_name=str(b.node_id), configs=[
            IAC.AlterConfigsResource.AlterableConfig(name="kafka", config_operation=0, value="INFO")])]
        out = await call_as(b, "IncrementalAlterConfigs", 1, IAC(resources=logger))
        assert [(r.error_code, r.error_message) for r in out.responses] == [(CLUSTER_DENIED, None)]
        out = await call_as(b, "AlterConfigs", 2, AC(resources=[AC.AlterConfigsResource(
            resource_type=8, resource_name=str(b.node_id), configs=[
                AC.AlterConfigsResource.AlterableConfig(name="kafka", value="INFO")])]))
        assert [r.error_code for r in out.responses] == [E.INVALID_REQUEST.code]
    run_calls(body)
