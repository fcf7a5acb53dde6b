"""ACLs and SCRAM users on a real broker with the authorizer on: confluent-kafka's AdminClient creates, describes and deletes them, and they survive a restart and a kill -9.

The clients here connect over PLAINTEXT, so their principal is User:ANONYMOUS, made a super user.
"""
from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (AclBinding, AclBindingFilter, AclOperation, AclPermissionType, AdminClient,
                                   ResourcePatternType, ResourceType, ScramCredentialInfo, ScramMechanism,
                                   UserScramCredentialDeletion, UserScramCredentialUpsertion)

from compat_tests.test_bad_input import RawConn, unique
from trireme.wire import error_codes as E
from trireme.wire.codec import message

STANDARD = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
SECURED = {"authorizer.class.name": STANDARD, "super.users": "User:ANONYMOUS",
           "trireme.storage.add.scram": "SCRAM-SHA-512=[name=admin,password=admin-secret]"}
TIMEOUT = 30


def admin(server):
    return AdminClient({"bootstrap.servers": server.bootstrap})


def results(futures):
    """Every future's result, in order (a failure raises its KafkaException)."""
    items = futures.values() if isinstance(futures, dict) else futures
    return [f.result(timeout=TIMEOUT) for f in items]


def everything():
    return AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
                            AclPermissionType.ANY)


def described(a):
    return sorted((b.restype, b.name, b.resource_pattern_type, b.principal, b.host, b.operation, b.permission_type)
                  for b in a.describe_acls(everything()).result(timeout=TIMEOUT))


def kill_or_restart(server, how):
    if how == "kill9":
        server.kill9()
    else:
        server.restart()


@pytest.mark.server_config(SECURED)
@pytest.mark.parametrize("how", ["restart", "kill9"])
def test_acls_through_admin_client_survive(server, how):
    topic, group = unique("acl-t"), unique("acl-g")
    a = admin(server)
    bindings = [
        AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, "User:alice", "*", AclOperation.READ,
                   AclPermissionType.ALLOW),
        AclBinding(ResourceType.GROUP, group, ResourcePatternType.PREFIXED, "User:alice", "10.1.2.3",
                   AclOperation.ALL, AclPermissionType.ALLOW),
        AclBinding(ResourceType.TOPIC, "*", ResourcePatternType.LITERAL, "User:mallory", "*", AclOperation.ALL,
                   AclPermissionType.DENY),
    ]
    assert results(a.create_acls(bindings)) == [None, None, None]
    before = described(a)
    assert len(before) == 3
    only_topic = AclBindingFilter(ResourceType.TOPIC, topic, ResourcePatternType.MATCH, None, None,
                                  AclOperation.ANY, AclPermissionType.ANY)
    matched = a.describe_acls(only_topic).result(timeout=TIMEOUT)
    assert sorted(b.principal for b in matched) == ["User:alice", "User:mallory"]      # MATCH: the wildcard too

    kill_or_restart(server, how)
    a = admin(server)
    assert described(a) == before

    deny_filter = AclBindingFilter(ResourceType.TOPIC, "*", ResourcePatternType.LITERAL, "User:mallory", None,
                                   AclOperation.ANY, AclPermissionType.DENY)
    deleted, = results(a.delete_acls([deny_filter]))
    assert [(b.name, b.principal) for b in deleted] == [("*", "User:mallory")]
    kill_or_restart(server, how)
    a = admin(server)
    assert len(described(a)) == 2


@pytest.mark.server_config(SECURED)
@pytest.mark.parametrize("how", ["restart", "kill9"])
def test_scram_users_survive(server, how):
    user = unique("user")
    a = admin(server)
    upsert = UserScramCredentialUpsertion(user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 8192),
                                          b"secret-pw")
    results(a.alter_user_scram_credentials([upsert]))
    kill_or_restart(server, how)
    a = admin(server)
    info = {u: f.result(timeout=TIMEOUT) for u, f in a.describe_user_scram_credentials([user, "admin"]).items()}
    assert [(c.mechanism, c.iterations) for c in info[user].scram_credential_infos] == \
        [(ScramMechanism.SCRAM_SHA_256, 8192)]
    # the first user from trireme.storage.add.scram is there too (4096 iterations: the storage tool's default)
    assert [(c.mechanism, c.iterations) for c in info["admin"].scram_credential_infos] == \
        [(ScramMechanism.SCRAM_SHA_512, 4096)]
    results(a.alter_user_scram_credentials([UserScramCredentialDeletion(user, ScramMechanism.SCRAM_SHA_256)]))
    kill_or_restart(server, how)
    a = admin(server)                   # kept until the answer is in
    with pytest.raises(KafkaException) as missing:
        a.describe_user_scram_credentials([user])[user].result(timeout=TIMEOUT)
    assert missing.value.args[0].code() == E.RESOURCE_NOT_FOUND.code


@pytest.mark.server_config({"authorizer.class.name": "trireme", "super.users": "User:admin"})
def test_anonymous_without_acls_is_refused(server):
    """Nothing allows User:ANONYMOUS (no ACLs, allow.everyone.if.no.acl.found false): the ACL APIs answer
    CLUSTER_AUTHORIZATION_FAILED and nothing is created."""
    a = admin(server)
    binding = AclBinding(ResourceType.TOPIC, "t", ResourcePatternType.LITERAL, "User:alice", "*", AclOperation.READ,
                         AclPermissionType.ALLOW)
    with pytest.raises(KafkaException) as refused:
        results(a.create_acls([binding]))
    assert refused.value.args[0].code() == E.CLUSTER_AUTHORIZATION_FAILED.code
    with RawConn(server.bootstrap) as conn:
        cls = message("DescribeAclsRequest").cls
        r = conn.request("DescribeAcls", 3, cls(resource_type_filter=1, resource_name_filter=None,
                                                 pattern_type_filter=1, principal_filter=None, host_filter=None,
                                                 operation=1, permission_type=1))
        assert (r.error_code, r.resources) == (E.CLUSTER_AUTHORIZATION_FAILED.code, [])


@pytest.mark.server_config({"authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
                            "super.users": "User:ANONYMOUS"})
def test_cluster_metadata_topic_is_hidden(server):
    a = admin(server)
    assert "__cluster_metadata" not in a.list_topics(timeout=TIMEOUT).topics
    with RawConn(server.bootstrap) as conn:
        cls = message("ListOffsetsRequest").cls
        r = conn.request("ListOffsets", 7, cls(replica_id=-1, isolation_level=0, topics=[cls.ListOffsetsTopic(
            name="__cluster_metadata", partitions=[cls.ListOffsetsTopic.ListOffsetsPartition(
                partition_index=0, current_leader_epoch=-1, timestamp=-1)])]))
        assert r.topics[0].partitions[0].error_code == E.UNKNOWN_TOPIC_OR_PARTITION.code


SCRAM_LISTENER = {"listeners": "SASL_PLAINTEXT://127.0.0.1:0", "sasl.enabled.mechanisms": "SCRAM-SHA-512,SCRAM-SHA-256",
                  "authorizer.class.name": STANDARD, "super.users": "User:admin",
                  "trireme.storage.add.scram": "SCRAM-SHA-512=[name=admin,password=admin-secret]"}


def sasl_admin(server, user, password, mechanism="SCRAM-SHA-512"):
    return AdminClient({"bootstrap.servers": server.bootstrap_for("SASL_PLAINTEXT"),
                        "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": mechanism,
                        "sasl.username": user, "sasl.password": password})


@pytest.mark.server_config(SCRAM_LISTENER)
def test_stored_scram_users_log_in_and_are_authorized_as_themselves(server):
    """The add.scram user logs in with SCRAM-SHA-512 and, a super user, creates alice (SCRAM-SHA-256) and an ACL for
    her; alice logs in as User:alice, is refused what no ACL allows, allowed what one does; after a kill -9 both
    still log in; a wrong password fails."""
    admin_client = sasl_admin(server, "admin", "admin-secret")
    upsert = UserScramCredentialUpsertion("alice", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096),
                                          b"alice-secret")
    results(admin_client.alter_user_scram_credentials([upsert]))

    alice = sasl_admin(server, "alice", "alice-secret", "SCRAM-SHA-256")
    # (refused through CreateAcls: librdkafka 2.16 often crashes the process (SIGSEGV, or "munmap_chunk(): invalid
    # pointer") after a DescribeUserScramCredentials answer with a top-level error, with or without its message)
    ours = AclBinding(ResourceType.TOPIC, "t", ResourcePatternType.LITERAL, "User:alice", "*", AclOperation.READ,
                      AclPermissionType.ALLOW)
    with pytest.raises(KafkaException) as refused:
        results(alice.create_acls([ours]))
    assert refused.value.args[0].code() == E.CLUSTER_AUTHORIZATION_FAILED.code
    results(admin_client.create_acls([AclBinding(ResourceType.BROKER, "kafka-cluster", ResourcePatternType.LITERAL,
                                                 "User:alice", "*", AclOperation.DESCRIBE,
                                                 AclPermissionType.ALLOW)]))
    users = alice.describe_user_scram_credentials().result(timeout=TIMEOUT)
    assert sorted(users) == ["admin", "alice"]

    server.kill9()
    alice = sasl_admin(server, "alice", "alice-secret", "SCRAM-SHA-256")
    assert sorted(alice.describe_user_scram_credentials().result(timeout=TIMEOUT)) == ["admin", "alice"]
    wrong = sasl_admin(server, "alice", "not-her-password", "SCRAM-SHA-256")
    with pytest.raises(KafkaException) as failed:
        wrong.list_topics(timeout=10)
    assert failed.value.args[0].code() in (KafkaError._AUTHENTICATION, KafkaError._TRANSPORT,
                                           KafkaError._TIMED_OUT), failed.value
    assert "Authentication failed" in server.stderr_tail() or "authentication" in server.stderr_tail().lower()


@pytest.mark.server_config(SECURED)
def test_acls_through_kafka_python(server):
    from kafka import KafkaAdminClient
    from kafka.admin import ACL, ACLFilter, ACLOperation, ACLPermissionType, ResourcePattern, ResourcePatternFilter
    from kafka.admin import ResourceType as KResourceType
    from kafka.admin._acls import ACLResourcePatternType
    topic = unique("kp-acl")
    a = KafkaAdminClient(bootstrap_servers=server.bootstrap)
    try:
        acl = ACL(principal="User:bob", host="*", operation=ACLOperation.WRITE, permission_type=ACLPermissionType.ALLOW,
                  resource_pattern=ResourcePattern(KResourceType.TOPIC, topic, ACLResourcePatternType.PREFIXED))
        outcome = a.create_acls([acl])
        assert outcome["failed"] == [] and len(outcome["succeeded"]) == 1
        match = ACLFilter(principal=None, host=None, operation=ACLOperation.ANY, permission_type=ACLPermissionType.ANY,
                          resource_pattern=ResourcePatternFilter(KResourceType.TOPIC, topic + "-x",
                                                                 ACLResourcePatternType.MATCH))
        found, error = a.describe_acls(match)
        assert error.errno == 0 and [(x.principal, x.resource_pattern.resource_name) for x in found] == \
            [("User:bob", topic)]
        [(_, matched, error)] = a.delete_acls([match])
        assert error.errno == 0 and [m.principal for m in matched] == ["User:bob"]
        found, _ = a.describe_acls(match)
        assert found == []
    finally:
        a.close()
