"""The admin and security APIs Kafka 4.3 lists beside the everyday ones, over raw frames against a real broker.

Each used to close the connection (a client's admin test suite met AlterReplicaLogDirs and
DescribeQuorum).  Now: the ones that mean something on one node are answered (legacy AlterConfigs with its
whole-set semantics, AlterReplicaLogDirs to the one log directory, DescribeQuorum with this node as the
single voter), the others as Kafka answers with the feature off (no SASL listener, no authorizer, no
delegation tokens).  Also: InitProducerId v6 is listed and served only with unstable.api.versions.enable,
as Kafka's definition marks it unstable.
"""
from __future__ import annotations

import os

import pytest

from compat_tests.test_bad_input import (LogWatch, RawConn, api_versions, assert_close_logged, create_topic, req,
                                        unique)
from trireme.wire import error_codes as E
from trireme.wire.codec import message

TOPIC, BROKER = 2, 4                # config resource types
NODE = 1                            # node.id default
PLAINTEXT_PRINCIPAL = ("User", "ANONYMOUS")

# What a Kafka 4.3 broker lists for these APIs (its JSON definitions' validVersions, broker listener).
KAFKA_4_3_RANGES = {
    "SaslHandshake": (0, 1), "CreateAcls": (1, 3), "DeleteAcls": (1, 3), "AlterConfigs": (0, 2),
    "AlterReplicaLogDirs": (1, 2), "SaslAuthenticate": (0, 2), "CreateDelegationToken": (1, 3),
    "RenewDelegationToken": (1, 2), "ExpireDelegationToken": (1, 2), "DescribeDelegationToken": (1, 3),
    "AlterClientQuotas": (0, 1), "AlterUserScramCredentials": (0, 0), "DescribeQuorum": (0, 2),
    "UnregisterBroker": (0, 0), "InitProducerId": (0, 5),
}


@pytest.fixture
def conn(module_server):
    with RawConn(module_server.bootstrap) as c:
        yield c


def _versions(conn: RawConn) -> dict[str, tuple[int, int]]:
    from trireme.wire.schema import api_names
    names = api_names()
    return {names[k.api_key]: (k.min_version, k.max_version) for k in api_versions(conn).api_keys}


def test_api_versions_lists_them_as_kafka_4_3(conn):
    listed = _versions(conn)
    assert {name: listed.get(name) for name in KAFKA_4_3_RANGES} == KAFKA_4_3_RANGES


# --- AlterConfigs (legacy, whole set) ----------------------------------------------------------

def _alter_configs(conn: RawConn, resources, version: int = 2, validate_only: bool = False):
    cls = message("AlterConfigsRequest").cls
    rcls = cls.AlterConfigsResource
    r = conn.request("AlterConfigs", version, cls(validate_only=validate_only, resources=[
        rcls(resource_type=kind, resource_name=name, configs=[rcls.AlterableConfig(name=k, value=v)
                                                              for k, v in configs])
        for kind, name, configs in resources]))
    return [(x.resource_type, x.resource_name, x.error_code) for x in r.responses], r


def _dynamic_configs(conn: RawConn, topic: str) -> dict[str, str]:
    cls = message("DescribeConfigsRequest").cls
    r = conn.request("DescribeConfigs", 4, cls(resources=[cls.DescribeConfigsResource(
        resource_type=TOPIC, resource_name=topic, configuration_keys=None)]))
    [result] = r.results
    assert result.error_code == 0
    return {c.name: c.value for c in result.configs if c.config_source == 1}      # DYNAMIC_TOPIC_CONFIG


@pytest.mark.parametrize("version", [0, 1, 2])
def test_alter_configs_replaces_the_whole_set(conn, version):
    topic = unique("legacy-cfg")
    create_topic(conn, topic, configs={"retention.ms": "3600000", "cleanup.policy": "compact"})
    assert _dynamic_configs(conn, topic) == {"retention.ms": "3600000", "cleanup.policy": "compact"}
    given = [("segment.ms", "600000"), ("retention.ms", "7200000")]
    assert _alter_configs(conn, [(TOPIC, topic, given)], version, validate_only=True)[0] == [(TOPIC, topic, 0)]
    assert _dynamic_configs(conn, topic) == {"retention.ms": "3600000", "cleanup.policy": "compact"}
    assert _alter_configs(conn, [(TOPIC, topic, given)], version)[0] == [(TOPIC, topic, 0)]
    assert _dynamic_configs(conn, topic) == {"segment.ms": "600000", "retention.ms": "7200000"}
    assert _alter_configs(conn, [(TOPIC, topic, [])], version)[0] == [(TOPIC, topic, 0)]
    assert _dynamic_configs(conn, topic) == {}


def test_alter_configs_refusals_change_nothing(conn):
    topic, other = unique("legacy-cfg"), unique("legacy-cfg")
    create_topic(conn, topic, configs={"retention.ms": "3600000"})
    create_topic(conn, other)
    results, r = _alter_configs(conn, [
        (TOPIC, topic, [("retention.ms", "1000"), ("retention.ms", "2000")]),     # a key twice
        (TOPIC, other, [("retention.ms", None)]),                                  # a null value
        (TOPIC, unique("missing"), [("retention.ms", "1000")]),
        (TOPIC, "bad/name", []),
        (BROKER, str(NODE), [("log.retention.ms", "1000")]),
    ])
    assert [code for _, _, code in results] == [
        E.INVALID_REQUEST.code, E.INVALID_REQUEST.code, E.UNKNOWN_TOPIC_OR_PARTITION.code,
        E.INVALID_TOPIC_EXCEPTION.code, E.INVALID_REQUEST.code]
    assert r.responses[0].error_message == "Error due to duplicate config keys"
    assert r.responses[1].error_message == "Null value not supported for : retention.ms"
    assert _alter_configs(conn, [(TOPIC, topic, [("retention.ms", "soon")])])[0] == \
        [(TOPIC, topic, E.INVALID_CONFIG.code)]
    assert _alter_configs(conn, [(TOPIC, topic, [("no.such.config", "1")])])[0] == \
        [(TOPIC, topic, E.INVALID_CONFIG.code)]
    assert _alter_configs(conn, [(TOPIC, topic, []), (TOPIC, topic, [])])[0] == \
        [(TOPIC, topic, E.INVALID_REQUEST.code)] * 2
    assert _dynamic_configs(conn, topic) == {"retention.ms": "3600000"}
    assert _dynamic_configs(conn, other) == {}


# --- AlterReplicaLogDirs -----------------------------------------------------------------------

def _alter_log_dirs(conn: RawConn, moves: dict[str, dict[str, list[int]]], version: int = 2):
    cls = message("AlterReplicaLogDirsRequest").cls
    dcls = cls.AlterReplicaLogDir
    r = conn.request("AlterReplicaLogDirs", version, cls(dirs=[
        dcls(path=path, topics=[dcls.AlterReplicaLogDirTopic(name=t, partitions=ps) for t, ps in topics.items()])
        for path, topics in moves.items()]))
    return {(t.topic_name, p.partition_index): p.error_code for t in r.results for p in t.partitions}


@pytest.mark.parametrize("version", [1, 2])
def test_alter_replica_log_dirs_to_the_one_dir(module_server, conn, version):
    topic = unique("logdir")
    create_topic(conn, topic, partitions=2)
    cls = message("DescribeLogDirsRequest").cls
    [only] = conn.request("DescribeLogDirs", 4, cls(topics=None)).results
    assert only.log_dir == os.path.abspath(os.path.join(module_server.data_dir, "logs"))
    missing = unique("missing")
    assert _alter_log_dirs(conn, {only.log_dir: {topic: [0, 1, 9], missing: [0]}}, version) == {
        (topic, 0): 0, (topic, 1): 0, (topic, 9): E.UNKNOWN_TOPIC_OR_PARTITION.code,
        (missing, 0): E.UNKNOWN_TOPIC_OR_PARTITION.code}
    assert _alter_log_dirs(conn, {only.log_dir + "/": {topic: [0]}}, version) == \
        {(topic, 0): E.LOG_DIR_NOT_FOUND.code}                  # Kafka compares the path as given
    assert _alter_log_dirs(conn, {"/elsewhere/logs": {topic: [0]}, only.log_dir + "-2": {topic: [1]}},
                           version) == {(topic, 0): E.LOG_DIR_NOT_FOUND.code, (topic, 1): E.LOG_DIR_NOT_FOUND.code}
    # Nothing moved: the partitions are where they were, with their data.
    [again] = conn.request("DescribeLogDirs", 4, cls(topics=None)).results
    assert again.log_dir == only.log_dir
    assert {(t.name, p.partition_index) for t in again.topics for p in t.partitions} >= {(topic, 0), (topic, 1)}


# --- DescribeQuorum ----------------------------------------------------------------------------

def _describe_quorum(conn: RawConn, version: int, topics=(("__cluster_metadata", [0]),)):
    cls = message("DescribeQuorumRequest").cls
    tcls = cls.TopicData
    return conn.request("DescribeQuorum", version, cls(topics=[
        tcls(topic_name=name, partitions=[tcls.PartitionData(partition_index=i) for i in parts])
        for name, parts in topics]))


@pytest.mark.parametrize("version", [0, 1, 2])
def test_describe_quorum_single_voter(module_server, conn, version):
    r = _describe_quorum(conn, version)
    assert r.error_code == 0
    [topic] = r.topics
    [p] = topic.partitions
    assert (topic.topic_name, p.partition_index, p.error_code, p.leader_id) == ("__cluster_metadata", 0, 0, NODE)
    assert p.leader_epoch >= 1 and p.high_watermark >= 0
    assert [v.replica_id for v in p.current_voters] == [NODE] and p.observers == []
    assert p.current_voters[0].log_end_offset == p.high_watermark
    if version >= 1:
        assert p.current_voters[0].last_caught_up_timestamp > 0
    if version >= 2:
        host, port = module_server.bootstrap.rsplit(":", 1)
        assert [(n.node_id, [(li.name, li.host, li.port) for li in n.listeners]) for n in r.nodes] == \
            [(NODE, [("PLAINTEXT", host, int(port))])]


def test_describe_quorum_other_partitions_unknown(conn):
    r = _describe_quorum(conn, 2, topics=(("__cluster_metadata", [1]), ("t", [0])))
    assert r.error_code == 0
    assert [(t.topic_name, [(p.partition_index, p.error_code) for p in t.partitions]) for t in r.topics] == [
        ("__cluster_metadata", [(1, E.UNKNOWN_TOPIC_OR_PARTITION.code)]),
        ("t", [(0, E.UNKNOWN_TOPIC_OR_PARTITION.code)])]


# --- UnregisterBroker --------------------------------------------------------------------------

def test_unregister_broker(conn):
    r = conn.request("UnregisterBroker", 0, req("UnregisterBroker", broker_id=NODE + 5))
    assert (r.error_code, r.error_message) == (E.BROKER_ID_NOT_REGISTERED.code,
                                               f"Broker ID {NODE + 5} is not currently registered")
    r = conn.request("UnregisterBroker", 0, req("UnregisterBroker", broker_id=NODE))
    assert r.error_code == E.INVALID_REQUEST.code
    assert conn.request("Metadata", 12, req("Metadata", topics=None)).brokers[0].node_id == NODE


# --- delegation tokens, SASL, ACLs, quotas, SCRAM: the feature is off -----------------------------

@pytest.mark.parametrize("version", [1, 2, 3])
def test_delegation_tokens_not_allowed_on_plaintext(conn, version):
    create = req("CreateDelegationToken", owner_principal_type=None, owner_principal_name=None,
                 renewers=[], max_lifetime_ms=-1)
    r = conn.request("CreateDelegationToken", version, create)
    assert r.error_code == E.DELEGATION_TOKEN_REQUEST_NOT_ALLOWED.code
    assert (r.principal_type, r.principal_name) == PLAINTEXT_PRINCIPAL
    assert (r.issue_timestamp_ms, r.expiry_timestamp_ms, r.max_timestamp_ms, r.token_id, r.hmac) == \
        (-1, -1, -1, "", b"")
    if version >= 3:
        assert (r.token_requester_principal_type, r.token_requester_principal_name) == PLAINTEXT_PRINCIPAL
    described = conn.request("DescribeDelegationToken", version, req("DescribeDelegationToken", owners=None))
    assert (described.error_code, described.tokens) == (E.DELEGATION_TOKEN_REQUEST_NOT_ALLOWED.code, [])
    for api, period in (("RenewDelegationToken", "renew_period_ms"), ("ExpireDelegationToken",
                                                                       "expiry_time_period_ms")):
        r = conn.request(api, min(version, 2), req(api, hmac=b"\x01\x02", **{period: 1000}))
        assert (r.error_code, r.expiry_timestamp_ms) == (E.DELEGATION_TOKEN_REQUEST_NOT_ALLOWED.code, -1)


def test_sasl_on_a_plaintext_listener(conn):
    for version in (0, 1):
        r = conn.request("SaslHandshake", version, req("SaslHandshake", mechanism="PLAIN"))
        assert (r.error_code, r.mechanisms) == (E.ILLEGAL_SASL_STATE.code, [])
    for version in (0, 1, 2):
        r = conn.request("SaslAuthenticate", version, req("SaslAuthenticate", auth_bytes=b"\x00user\x00pw"))
        assert (r.error_code, r.auth_bytes) == (E.ILLEGAL_SASL_STATE.code, b"")
    assert api_versions(conn).error_code == 0                  # the connection goes on


@pytest.mark.parametrize("version", [1, 2, 3])
def test_create_and_delete_acls_security_disabled(conn, version):
    cls = message("CreateAclsRequest").cls
    creation = cls.AclCreation(resource_type=2, resource_name="t", resource_pattern_type=3, principal="User:a",
                               host="*", operation=3, permission_type=3)
    r = conn.request("CreateAcls", version, cls(creations=[creation, creation]))
    assert [(x.error_code, x.error_message) for x in r.results] == \
        [(E.SECURITY_DISABLED.code, "No Authorizer is configured.")] * 2
    dcls = message("DeleteAclsRequest").cls
    flt = dcls.DeleteAclsFilter(resource_type_filter=1, resource_name_filter=None, pattern_type_filter=1,
                                principal_filter=None, host_filter=None, operation=1, permission_type=1)
    r = conn.request("DeleteAcls", version, dcls(filters=[flt]))
    assert [(x.error_code, x.matching_acls) for x in r.filter_results] == [(E.SECURITY_DISABLED.code, [])]


@pytest.mark.parametrize("version", [0, 1])
def test_alter_client_quotas_validate_only(conn, version):
    """Checked and answered, nothing stored (compat_tests/test_client_quotas.py sets quotas on a broker of its own)."""
    cls = message("AlterClientQuotasRequest").cls
    ecls = cls.EntryData
    entries = [ecls(entity=[ecls.EntityData(entity_type="user", entity_name="alice")],
                    ops=[ecls.OpData(key="producer_byte_rate", value=1024.0, remove=False)]),
               ecls(entity=[ecls.EntityData(entity_type="user", entity_name="bob")],
                    ops=[ecls.OpData(key="producer_byte_rate", value=-1.0, remove=False)])]
    r = conn.request("AlterClientQuotas", version, cls(entries=entries, validate_only=True))
    assert [(x.error_code, [(e.entity_type, e.entity_name) for e in x.entity]) for x in r.entries] == \
        [(0, [("user", "alice")]), (E.INVALID_REQUEST.code, [("user", "bob")])]
    quotas = conn.request("DescribeClientQuotas", 1, req("DescribeClientQuotas", components=[], strict=False))
    assert (quotas.error_code, quotas.entries) == (0, [])


def test_alter_user_scram_credentials_validation(conn):
    """Kafka's ScramControlManager: a user's first error stands (bob: deleting what does not exist), a user named
    twice is DUPLICATE_RESOURCE (carol), too few iterations UNACCEPTABLE_CREDENTIAL; the valid change is stored."""
    cls = message("AlterUserScramCredentialsRequest").cls
    alice, bob, carol, dave = (unique(n) for n in ("alice", "bob", "carol", "dave"))
    up = lambda name, mechanism=1, iterations=8192: cls.ScramCredentialUpsertion(     # noqa: E731
        name=name, mechanism=mechanism, iterations=iterations, salt=b"s", salted_password=b"p" * 32)
    r = conn.request("AlterUserScramCredentials", 0, cls(
        deletions=[cls.ScramCredentialDeletion(name=bob, mechanism=1)],
        upsertions=[up(alice), up(bob, 2), up(carol), up(carol, 2), up(dave, iterations=100)]))
    assert {x.user: x.error_code for x in r.results} == {
        bob: E.RESOURCE_NOT_FOUND.code, alice: 0, carol: E.DUPLICATE_RESOURCE.code,
        dave: E.UNACCEPTABLE_CREDENTIAL.code}
    dcls = message("DescribeUserScramCredentialsRequest").cls
    described = conn.request("DescribeUserScramCredentials", 0, dcls(users=[dcls.UserName(name=alice)]))
    assert [(c.mechanism, c.iterations) for c in described.results[0].credential_infos] == [(1, 8192)]


# --- unstable versions -------------------------------------------------------------------------

def test_init_producer_id_v6_is_not_enabled_by_default(module_server, conn):
    """Kafka's InitProducerId definition marks v6 (KIP-939) unstable: not listed, and a request at v6 closes the
    connection, as a Kafka broker does with a version it has not enabled."""
    assert _versions(conn)["InitProducerId"] == (0, 5)
    log = LogWatch(module_server)
    conn.send_request("InitProducerId", 6, req("InitProducerId", transactional_id=unique("tx"),
                                               transaction_timeout_ms=60000, producer_id=-1, producer_epoch=-1))
    conn.expect_closed()
    assert_close_logged(log, "InitProducerId v6 is not a version of this API that we serve (0-5)")
    with RawConn(module_server.bootstrap) as again:
        assert api_versions(again).error_code == 0


@pytest.mark.server_config({"unstable.api.versions.enable": True})
def test_unstable_api_versions_enable_lists_init_producer_id_v6(server):
    with RawConn(server.bootstrap) as conn:
        assert _versions(conn)["InitProducerId"] == (0, 6)
        r = conn.request("InitProducerId", 6, req("InitProducerId", transactional_id=unique("tx"),
                                                  transaction_timeout_ms=60000, producer_id=-1, producer_epoch=-1))
        assert r.error_code == 0 and r.producer_id >= 0
