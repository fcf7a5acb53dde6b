"""Handler tests of CreateAcls, DescribeAcls, DeleteAcls, AlterUserScramCredentials and DescribeUserScramCredentials with the authorizer on.

Each call goes through the codec at the version under test (request encoded and decoded, response
encoded and decoded), with the principal and host the request comes from; answers that wait for
``__cluster_metadata`` are awaited with the broker's tasks running.
"""
from __future__ import annotations

import types

import pytest
import trio

from trireme.server import dispatch
from trireme.server.broker import Broker
from trireme.server.config import Config
from trireme.server.deferred import Deferred
from trireme.server.dispatch import API_KEYS, HANDLERS, RequestContext
from trireme.state.acls import CLUSTER_NAME, Operation, PatternType, Permission, ResourceType
from trireme.state.scram_credentials import salted_password
from trireme.wire import error_codes as E

dispatch.load_handlers()

ADMIN, ALICE = "User:admin", "User:alice"
T, C = ResourceType.TOPIC, ResourceType.CLUSTER
LIT, PRE = PatternType.LITERAL, PatternType.PREFIXED


def handler(api):
    return HANDLERS[API_KEYS[api]]


def req(api):
    return handler(api).request.cls


def versions(api):
    h = handler(api)
    return range(h.min_version, h.max_version + 1)


async def call(broker, api, version, request, principal=ADMIN, host="10.0.0.1"):
    h = handler(api)
    frame = bytearray(h.request.encode_bytes(request, version))
    decoded, _ = h.request.decode(frame, version)
    ctx = RequestContext(broker=broker, api_key=h.api_key, api_version=version, correlation_id=1, client_id="t",
                         principal=principal, connection=types.SimpleNamespace(host=host), frame=frame)
    response = h.fn(ctx, decoded)
    if isinstance(response, Deferred):
        response = await response.wait()
    data = h.response.encode_bytes(response, version)
    return h.response.decode(data, version)[0]


def run(broker, body):
    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            await body()
            nursery.cancel_scope.cancel()
    trio.run(main)


@pytest.fixture
def broker(tmp_path):
    config = Config(data_dir=str(tmp_path / "data"))
    config.update({"trireme.fsync.enable": False, "authorizer.class.name":
                   "org.apache.kafka.metadata.authorizer.StandardAuthorizer", "super.users": ADMIN})
    b = Broker(config)
    yield b
    b.close()


CA = req("CreateAcls")
DA = req("DescribeAcls")
DL = req("DeleteAcls")


def creation(name, op=Operation.READ, perm=Permission.ALLOW, rtype=T, pattern=LIT, principal=ALICE, host="*"):
    return CA.AclCreation(resource_type=rtype, resource_name=name, resource_pattern_type=pattern, principal=principal,
                          host=host, operation=op, permission_type=perm)


def describe_filter(rtype=ResourceType.ANY, name=None, pattern=PatternType.ANY, principal=None, host=None,
                    op=Operation.ANY, perm=Permission.ANY):
    return DA(resource_type_filter=rtype, resource_name_filter=name, pattern_type_filter=pattern,
              principal_filter=principal, host_filter=host, operation=op, permission_type=perm)


def delete_filter(**kw):
    d = describe_filter(**kw)
    return DL.DeleteAclsFilter(**{k: getattr(d, k) for k in DL.DeleteAclsFilter.__slots__})


def described(r):
    return sorted((x.resource_type, x.resource_name, x.pattern_type, a.principal, a.host, a.operation,
                   a.permission_type) for x in r.resources for a in x.acls)


@pytest.mark.parametrize("version", versions("CreateAcls"))
def test_create_describe_delete(broker, version):
    async def body():
        r = await call(broker, "CreateAcls", version, CA(creations=[
            creation("orders"), creation("orders-", Operation.WRITE, pattern=PRE), creation("orders"),
            creation("", Operation.READ), creation("other", rtype=C), creation("t", op=Operation.ANY),
            creation("t", principal="alice"), creation("t", rtype=ResourceType.DELEGATION_TOKEN),
            creation("t", pattern=PatternType.MATCH), creation("t", perm=Permission.ANY)]))
        codes = [x.error_code for x in r.results]
        assert codes == [0, 0, 0] + [E.INVALID_REQUEST.code] * 7
        assert all(x.error_message for x in r.results[3:])
        assert broker.security.authorize(ALICE, "h", Operation.READ, T, "orders")        # in force when answered
        assert broker.security.authorize(ALICE, "h", Operation.DESCRIBE, T, "orders-eu")
        assert not broker.security.authorize(ALICE, "h", Operation.WRITE, T, "orders")

        r = await call(broker, "DescribeAcls", version, describe_filter())
        assert r.error_code == 0
        assert described(r) == [(T, "orders", LIT, ALICE, "*", Operation.READ, Permission.ALLOW),
                                (T, "orders-", PRE, ALICE, "*", Operation.WRITE, Permission.ALLOW)]
        r = await call(broker, "DescribeAcls", version, describe_filter(T, "orders-x", PatternType.MATCH))
        assert [x.resource_name for x in r.resources] == ["orders-"]
        r = await call(broker, "DescribeAcls", version, describe_filter(T, "orders", LIT))
        assert [x.resource_name for x in r.resources] == ["orders"]
        r = await call(broker, "DescribeAcls", version, describe_filter(ResourceType.UNKNOWN))
        assert r.error_code == E.INVALID_REQUEST.code

        r = await call(broker, "DeleteAcls", version, DL(filters=[
            delete_filter(rtype=T, name="orders", pattern=LIT), delete_filter(op=Operation.UNKNOWN),
            delete_filter(rtype=T, name="nothing")]))
        assert [x.error_code for x in r.filter_results] == [0, E.INVALID_REQUEST.code, 0]
        assert [(m.resource_name, m.operation) for m in r.filter_results[0].matching_acls] == \
            [("orders", Operation.READ)]
        assert r.filter_results[2].matching_acls == []
        assert not broker.security.authorize(ALICE, "h", Operation.READ, T, "orders")
        r = await call(broker, "DescribeAcls", version, describe_filter())
        assert [x.resource_name for x in r.resources] == ["orders-"]
    run(broker, body)


@pytest.mark.parametrize("version", versions("CreateAcls"))
def test_acl_apis_need_alter_or_describe_on_the_cluster(broker, version):
    async def body():
        r = await call(broker, "CreateAcls", version, CA(creations=[creation("t"), creation("u")]), principal=ALICE)
        assert [x.error_code for x in r.results] == [E.CLUSTER_AUTHORIZATION_FAILED.code] * 2
        r = await call(broker, "DeleteAcls", version, DL(filters=[delete_filter()]), principal=ALICE)
        assert [x.error_code for x in r.filter_results] == [E.CLUSTER_AUTHORIZATION_FAILED.code]
        r = await call(broker, "DescribeAcls", version, describe_filter(), principal=ALICE)
        assert (r.error_code, r.resources) == (E.CLUSTER_AUTHORIZATION_FAILED.code, [])
        assert len(broker.security.authorizer) == 0
        # DESCRIBE on the cluster (implied by ALTER) lets alice describe, ALTER lets her create
        r = await call(broker, "CreateAcls", version, CA(creations=[
            creation(CLUSTER_NAME, Operation.ALTER, rtype=C)]))
        assert r.results[0].error_code == 0
        r = await call(broker, "DescribeAcls", version, describe_filter(), principal=ALICE)
        assert r.error_code == 0 and len(r.resources) == 1
        r = await call(broker, "CreateAcls", version, CA(creations=[creation("t")]), principal=ALICE)
        assert r.results[0].error_code == 0
    run(broker, body)


def test_acls_over_the_bound(tmp_path):
    config = Config(data_dir=str(tmp_path))
    config.update({"trireme.fsync.enable": False, "authorizer.class.name": "trireme", "trireme.max.acls": 2,
                   "super.users": ADMIN})
    broker = Broker(config)

    async def body():
        r = await call(broker, "CreateAcls", 3, CA(creations=[creation(n) for n in "abc"]))
        assert [x.error_code for x in r.results] == [0, 0, E.POLICY_VIOLATION.code]
    run(broker, body)
    assert len(broker.security.authorizer) == 2
    broker.close()


def test_security_disabled_without_an_authorizer(tmp_path):
    broker = Broker(Config(data_dir=str(tmp_path)))

    async def body():
        r = await call(broker, "CreateAcls", 3, CA(creations=[creation("t")]), principal=ALICE)
        assert r.results[0].error_code == E.SECURITY_DISABLED.code
        r = await call(broker, "DeleteAcls", 3, DL(filters=[delete_filter()]), principal=ALICE)
        assert r.filter_results[0].error_code == E.SECURITY_DISABLED.code
        r = await call(broker, "DescribeAcls", 3, describe_filter(), principal=ALICE)
        assert r.error_code == E.SECURITY_DISABLED.code
    run(broker, body)
    broker.close()


AU = req("AlterUserScramCredentials")
DU = req("DescribeUserScramCredentials")


def upsertion(name, mechanism=2, iterations=8192, password="pw", salt=b"NaCl"):
    salted = salted_password(mechanism if mechanism in (1, 2) else 1, password, salt, iterations)
    return AU.ScramCredentialUpsertion(name=name, mechanism=mechanism, iterations=iterations, salt=salt,
                                       salted_password=salted)


def test_scram_users(broker):
    async def body():
        r = await call(broker, "AlterUserScramCredentials", 0, AU(
            deletions=[AU.ScramCredentialDeletion(name="nobody", mechanism=1)],
            upsertions=[upsertion("alice"), upsertion("bob", 1, 4096), upsertion("bob", 2), upsertion("eve", 9),
                        upsertion("low", iterations=1000)]))
        assert [(x.user, x.error_code) for x in r.results] == [
            ("nobody", E.RESOURCE_NOT_FOUND.code), ("alice", 0), ("bob", E.DUPLICATE_RESOURCE.code),
            ("eve", E.UNSUPPORTED_SASL_MECHANISM.code), ("low", E.UNACCEPTABLE_CREDENTIAL.code)]
        assert broker.security.scram_credential("alice", "SCRAM-SHA-512").iterations == 8192

        r = await call(broker, "DescribeUserScramCredentials", 0, DU(users=None))
        assert [(x.user, x.error_code, [(c.mechanism, c.iterations) for c in x.credential_infos])
                for x in r.results] == [("alice", 0, [(2, 8192)])]
        r = await call(broker, "DescribeUserScramCredentials", 0, DU(users=[DU.UserName(name="bob")]))
        assert r.results[0].error_code == E.RESOURCE_NOT_FOUND.code

        r = await call(broker, "AlterUserScramCredentials", 0, AU(
            deletions=[AU.ScramCredentialDeletion(name="alice", mechanism=2)], upsertions=[]))
        assert [(x.user, x.error_code) for x in r.results] == [("alice", 0)]
        assert broker.security.scram_credential("alice", "SCRAM-SHA-512") is None
    run(broker, body)


def test_scram_apis_need_the_cluster(broker):
    async def body():
        r = await call(broker, "AlterUserScramCredentials", 0, AU(
            deletions=[AU.ScramCredentialDeletion(name="x", mechanism=1)],
            upsertions=[upsertion("alice"), upsertion("x")]), principal=ALICE)
        assert [(x.user, x.error_code) for x in r.results] == [
            ("x", E.CLUSTER_AUTHORIZATION_FAILED.code), ("alice", E.CLUSTER_AUTHORIZATION_FAILED.code)]
        assert broker.security.scram_credential("alice", "SCRAM-SHA-512") is None
        r = await call(broker, "DescribeUserScramCredentials", 0, DU(users=None), principal=ALICE)
        assert (r.error_code, r.results) == (E.CLUSTER_AUTHORIZATION_FAILED.code, [])
    run(broker, body)


def test_describe_configs_never_tells_the_add_scram_password(tmp_path):
    config = Config(data_dir=str(tmp_path))
    config.update({"trireme.storage.add.scram": "SCRAM-SHA-512=[name=admin,password=hunter2]"})
    broker = Broker(config)
    DC = req("DescribeConfigs")

    async def body():
        r = await call(broker, "DescribeConfigs", 4, DC(include_synonyms=True, include_documentation=False,
                                                        resources=[DC.DescribeConfigsResource(
                                                            resource_type=4, resource_name=str(broker.node_id),
                                                            configuration_keys=["trireme.storage.add.scram"])]))
        entry, = r.results[0].configs
        assert (entry.value, entry.is_sensitive, entry.config_type) == (None, True, 9)
        assert entry.synonyms and all(s.value is None for s in entry.synonyms)
    run(broker, body)
    broker.close()


def test_acl_changes_on_a_full_disk_answer_storage_errors_and_never_hang(monkeypatch):
    from trireme.server import broker as broker_module
    from trireme.state.storage import MemoryStorage
    monkeypatch.setattr(broker_module, "STORAGE_RETRY_FIRST_S", 0.01)
    monkeypatch.setattr(broker_module, "STORAGE_RETRY_MAX_S", 0.05)
    storage = MemoryStorage()
    config = Config(data_dir="<memory:acls-full>")
    config.update({"authorizer.class.name": "trireme", "super.users": ADMIN})
    broker = Broker(config, storage)

    async def body():
        storage.full = True
        with trio.fail_after(10):
            r = await call(broker, "CreateAcls", 3, CA(creations=[creation("a")]))
            assert r.results[0].error_code == E.KAFKA_STORAGE_ERROR.code
            r = await call(broker, "CreateAcls", 3, CA(creations=[creation("b")]))      # offline: refused at once
            assert r.results[0].error_code == E.KAFKA_STORAGE_ERROR.code
            r = await call(broker, "AlterUserScramCredentials", 0, AU(deletions=[], upsertions=[upsertion("u")]))
            assert r.results[0].error_code == E.KAFKA_STORAGE_ERROR.code
        assert not broker.security.authorize(ALICE, "h", Operation.READ, T, "a")
        storage.full = False
        with trio.fail_after(10):
            while broker.cluster_metadata.partition.storage_error:
                await trio.sleep(0.01)
            r = await call(broker, "CreateAcls", 3, CA(creations=[creation("c")]))
        assert r.results[0].error_code == 0
        # the first write was retried when space came back: like a timed-out request, it may have happened
        assert broker.security.authorize(ALICE, "h", Operation.READ, T, "c")
        assert broker.security.authorize(ALICE, "h", Operation.READ, T, "a")
    run(broker, body)
    broker.close()


def test_describe_producers_does_not_reach_cluster_metadata(tmp_path):
    broker = Broker(Config(data_dir=str(tmp_path)))
    DP = req("DescribeProducers")

    async def body():
        r = await call(broker, "DescribeProducers", 0, DP(topics=[DP.TopicRequest(name="__cluster_metadata",
                                                                                 partition_indexes=[0])]))
        assert r.topics[0].partitions[0].error_code == E.UNKNOWN_TOPIC_OR_PARTITION.code
    run(broker, body)
    broker.close()


def test_create_topics_of_cluster_metadata_is_prohibited(tmp_path):
    broker = Broker(Config(data_dir=str(tmp_path)))
    CT = req("CreateTopics")

    async def body():
        r = await call(broker, "CreateTopics", 7, CT(timeout_ms=1000, validate_only=False, topics=[
            CT.CreatableTopic(name="__cluster_metadata", num_partitions=1, replication_factor=1, assignments=[],
                              configs=[])]))
        assert (r.topics[0].error_code, r.topics[0].error_message) == (
            E.INVALID_REQUEST.code, "Creation of internal topic __cluster_metadata is prohibited.")
    run(broker, body)
    broker.close()
