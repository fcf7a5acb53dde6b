"""The group and admin APIs' ACL checks against a real broker over SASL_PLAINTEXT: PLAIN users from JAAS, Kafka's
authorizer class name and super user, ACLs created with CreateAcls by the super user, raw frames as a client sends
them and kafka-python's admin client (which raises Kafka's authorization exceptions).  A user without the ACLs gets Kafka's codes and changes nothing; given them (Kafka's implied operations
included: Delete implies Describe), the same requests succeed.

The broker comes from compat_tests/sasl_support.py (a SASL_PLAINTEXT listener beside the PLAINTEXT one);
tests/test_acl_matrix_admin.py is the handler-level matrix of every group and admin API."""
from __future__ import annotations

import pytest

from compat_tests.sasl_support import plain_login, sasl_server  # noqa: F401  (fixture)
from compat_tests.test_bad_input import RawConn, req, unique
from trireme.wire import error_codes as E
from trireme.wire.codec import message

pytestmark = pytest.mark.trireme_only("a broker with a SASL_PLAINTEXT listener and JAAS users of its own")

JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="admin-pw" '
        'user_admin="admin-pw" user_alice="alice-secret";')
PROPS = {"listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
         "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
         "super.users": "User:admin", "group.initial.rebalance.delay.ms": 0}
TOPIC, GROUP, CLUSTER = 2, 3, 4                                  # resource types
LITERAL, PREFIXED, ALLOW = 3, 4, 3
READ, CREATE, DELETE, ALTER, DESCRIBE = 3, 5, 6, 7, 8            # operations
TOPIC_DENIED = E.TOPIC_AUTHORIZATION_FAILED.code
GROUP_DENIED = E.GROUP_AUTHORIZATION_FAILED.code
CLUSTER_DENIED = E.CLUSTER_AUTHORIZATION_FAILED.code


def login(srv, user, password):
    conn = RawConn(srv.sasl_bootstrap)
    assert plain_login(conn, user, password).error_code == 0
    return conn


def allow(admin, *acls):
    """Create ALLOW ACLs for User:alice: each ``(resource type, name, operation[, pattern type])``."""
    cls = message("CreateAclsRequest").cls
    r = admin.request("CreateAcls", 3, cls(creations=[cls.AclCreation(
        resource_type=rtype, resource_name=name, resource_pattern_type=pattern[0] if pattern else LITERAL,
        principal="User:alice", host="*", operation=op, permission_type=ALLOW) for rtype, name, op, *pattern in acls]))
    assert [x.error_code for x in r.results] == [0] * len(acls), r


def topics_of(conn):
    r = conn.request("Metadata", 12, req("Metadata", topics=None, allow_auto_topic_creation=False))
    return {t.name for t in r.topics}


def commit(conn, group, topic, offset, version=8):
    oc = message("OffsetCommitRequest").cls
    r = conn.request("OffsetCommit", version, oc(group_id=group, generation_id_or_member_epoch=-1, member_id="",
                                                  topics=[oc.OffsetCommitRequestTopic(name=topic, partitions=[
                                                      oc.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
                                                          partition_index=0, committed_offset=offset)])]))
    return [p.error_code for t in r.topics for p in t.partitions]


def fetched(conn, group, topic):
    of = message("OffsetFetchRequest").cls
    r = conn.request("OffsetFetch", 8, of(groups=[of.OffsetFetchRequestGroup(
        group_id=group, topics=[of.OffsetFetchRequestGroup.OffsetFetchRequestTopics(name=topic,
                                                                                   partition_indexes=[0])])]))
    [g] = r.groups
    return g.error_code, [(p.committed_offset, p.error_code) for t in g.topics for p in t.partitions]


def test_group_and_admin_apis_refuse_then_allow(sasl_server):
    srv = sasl_server(**PROPS)
    topic, group, fresh = unique("orders"), unique("g"), unique("fresh")
    with login(srv, "admin", "admin-pw") as admin, login(srv, "alice", "alice-secret") as alice:
        ct = message("CreateTopicsRequest").cls
        r = admin.request("CreateTopics", 7, ct(topics=[ct.CreatableTopic(name=topic, num_partitions=1,
                                                                          replication_factor=1)]))
        assert r.topics[0].error_code == 0
        assert commit(admin, group, topic, 7) == [0]               # the super user may do anything

        # --- alice without any ACL ---------------------------------------------------------------------
        assert commit(alice, group, topic, 99) == [GROUP_DENIED]
        assert fetched(alice, group, topic)[0] == GROUP_DENIED
        jg = message("JoinGroupRequest").cls
        r = alice.request("JoinGroup", 9, jg(group_id=group, session_timeout_ms=30000, rebalance_timeout_ms=30000,
                                             member_id="", protocol_type="consumer", protocols=[
                                                 jg.JoinGroupRequestProtocol(name="range", metadata=b"")]))
        assert (r.error_code, r.generation_id, r.member_id) == (GROUP_DENIED, -1, "")
        dg = req("DescribeGroups", groups=[group], include_authorized_operations=True)
        assert [g.error_code for g in alice.request("DescribeGroups", 5, dg).groups] == [GROUP_DENIED]
        assert alice.request("ListGroups", 4, req("ListGroups")).groups == []
        r = alice.request("CreateTopics", 7, ct(topics=[ct.CreatableTopic(name=fresh, num_partitions=1,
                                                                          replication_factor=1)]))
        assert [(t.error_code, t.error_message) for t in r.topics] == [(TOPIC_DENIED, "Authorization failed.")]
        dt = message("DeleteTopicsRequest").cls
        r = alice.request("DeleteTopics", 6, dt(topics=[dt.DeleteTopicState(name=topic)]))
        assert [x.error_code for x in r.responses] == [TOPIC_DENIED]
        dc = message("DescribeConfigsRequest").cls
        r = alice.request("DescribeConfigs", 4, dc(resources=[dc.DescribeConfigsResource(
            resource_type=2, resource_name=topic)]))
        assert [(x.error_code, x.configs) for x in r.results] == [(TOPIC_DENIED, [])]
        r = alice.request("DescribeLogDirs", 4, req("DescribeLogDirs", topics=None))
        assert (r.error_code, r.results) == (CLUSTER_DENIED, [])
        r = alice.request("DescribeCluster", 1, req("DescribeCluster", include_cluster_authorized_operations=True))
        assert (r.error_code, r.cluster_authorized_operations) == (0, 0)
        r = alice.request("CreateDelegationToken", 3, req("CreateDelegationToken"))
        assert r.error_code == E.DELEGATION_TOKEN_AUTH_DISABLED.code       # authenticated: tokens are just off
        # Nothing changed.
        assert fetched(admin, group, topic) == (0, [(7, 0)])
        assert topic in topics_of(admin) and fresh not in topics_of(admin)

        # --- given the ACLs -----------------------------------------------------------------------------
        allow(admin, (GROUP, group, READ), (TOPIC, topic, READ), (TOPIC, topic, DELETE),
              (TOPIC, "fre", CREATE, PREFIXED))
        assert commit(alice, group, topic, 42) == [0]
        assert fetched(alice, group, topic) == (0, [(42, 0)])             # Read implies Describe
        r = alice.request("DescribeGroups", 5, dg)
        assert [(g.error_code, g.authorized_operations) for g in r.groups] == [(0, (1 << READ) | (1 << DESCRIBE))]
        assert [g.group_id for g in alice.request("ListGroups", 4, req("ListGroups")).groups] == [group]
        r = alice.request("CreateTopics", 7, ct(topics=[ct.CreatableTopic(name=fresh, num_partitions=1,
                                                                          replication_factor=1)]))
        assert [(t.error_code, t.topic_config_error_code, t.configs) for t in r.topics] == [(0, TOPIC_DENIED, [])]
        r = alice.request("DeleteTopics", 6, dt(topics=[dt.DeleteTopicState(name=topic)]))
        assert [x.error_code for x in r.responses] == [0]                 # Delete implies Describe
        assert topic not in topics_of(admin) and fresh in topics_of(admin)
        allow(admin, (CLUSTER, "kafka-cluster", DESCRIBE))
        r = alice.request("DescribeLogDirs", 4, req("DescribeLogDirs", topics=None))
        assert r.error_code == 0 and r.results
        r = alice.request("DescribeCluster", 1, req("DescribeCluster", include_cluster_authorized_operations=True))
        assert r.cluster_authorized_operations == 1 << DESCRIBE
        assert {g.group_id for g in alice.request("ListGroups", 4, req("ListGroups")).groups} >= {group}


def test_kafka_python_admin_sees_kafkas_authorization_errors(sasl_server):
    from kafka import KafkaAdminClient
    from kafka.admin import NewPartitions, NewTopic
    from kafka.errors import GroupAuthorizationFailedError, TopicAuthorizationFailedError
    srv = sasl_server(**PROPS)
    topic, group = unique("kp-orders"), unique("kp-g")
    common = {"bootstrap_servers": srv.sasl_bootstrap, "security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN",
              "request_timeout_ms": 15000}
    admin = KafkaAdminClient(sasl_plain_username="admin", sasl_plain_password="admin-pw", **common)
    alice = KafkaAdminClient(sasl_plain_username="alice", sasl_plain_password="alice-secret", **common)
    try:
        admin.create_topics([NewTopic(topic, 1, 1)])
        with login(srv, "admin", "admin-pw") as raw:
            assert commit(raw, group, topic, 3) == [0]
        with pytest.raises(TopicAuthorizationFailedError):
            alice.create_topics([NewTopic(unique("kp-new"), 1, 1)])
        with pytest.raises(TopicAuthorizationFailedError):
            alice.create_partitions({topic: NewPartitions(3)})
        with pytest.raises(TopicAuthorizationFailedError):
            alice.delete_topics([topic])
        with pytest.raises(GroupAuthorizationFailedError):
            alice.list_group_offsets(group)
        assert list(alice.list_groups()) == []
        assert len(admin.describe_topics([topic])[0]["partitions"]) == 1       # nothing changed
        with login(srv, "admin", "admin-pw") as raw:
            allow(raw, (TOPIC, topic, ALTER), (GROUP, group, DESCRIBE), (TOPIC, topic, DESCRIBE))
        alice.create_partitions({topic: NewPartitions(3)})
        assert len(admin.describe_topics([topic])[0]["partitions"]) == 3
        offsets = alice.list_group_offsets(group)[group]
        assert {tp.partition: meta.offset for tp, meta in offsets.items()} == {0: 3}
    finally:
        alice.close()
        admin.close()
