"""Forwarding to the controller (KIP-590): the Envelope handler on the controller, and a broker that is not the controller sending its clients' metadata changes there."""
from __future__ import annotations

import types

import pytest
import trio

import acl_matrix
from acl_matrix import PRINCIPAL, Grant, call_as, cluster, error_codes, grant, make_broker
from test_acl_matrix_admin import ADMIN_CASES, GROUP_PROPS, state
from trireme.server import forwarding
from trireme.server.dispatch import API_KEYS, HANDLERS, CloseConnection, Encoded, RequestContext, advertised_versions
from trireme.server.peers import PeerUnavailable, decode_response, encode_request
from trireme.state.acls import CLUSTER_NAME, Operation, ResourceType
from trireme.wire import error_codes as E
from trireme.wire.codec import message

BROKER = "User:broker"                       # the principal brokers authenticate as on the inter-broker listener
CLUSTER_ACTION = Grant(Operation.CLUSTER_ACTION, ResourceType.CLUSTER, CLUSTER_NAME, BROKER)
ENVELOPE = message("EnvelopeRequest").cls
CORRELATION_ID = 41


def req(api):
    return message(api + "Request").cls


def embedded_frame(api, version, request, correlation_id=CORRELATION_ID) -> bytearray:
    return encode_request(HANDLERS[API_KEYS[api]], version, correlation_id, request)


def envelope_of(api, version, request, principal=PRINCIPAL, host="10.1.2.3"):
    return ENVELOPE(request_data=bytes(embedded_frame(api, version, request)),
                    request_principal=forwarding.serialize_principal(principal),
                    client_host_address=forwarding.address_bytes(host))


async def send_in_envelope(broker, api, version, request, principal=PRINCIPAL):
    """As acl_matrix.call_as, but the request goes embedded in an Envelope that a broker (BROKER, with ClusterAction)
    sends → the embedded response, decoded."""
    broker.security.grants.add(CLUSTER_ACTION)
    return await in_envelope(broker, api, version, request, principal)


async def in_envelope(broker, api, version, request, principal=PRINCIPAL):
    answer = await call_as(broker, "Envelope", 0, envelope_of(api, version, request, principal), BROKER)
    assert answer.error_code == 0, answer
    return decode_response(HANDLERS[API_KEYS[api]], version, answer.response_data, CORRELATION_ID)


def run(broker, body):
    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            await body(broker)
            nursery.cancel_scope.cancel()
    try:
        trio.run(main)
    finally:
        broker.close()


# --- the controller's side: Envelope ------------------------------------------------------------------------------

def test_principal_serialized_as_kafka_default_principal_data():
    data = forwarding.serialize_principal("User:alice")
    # int16 version 0, then DefaultPrincipalData v0 (flexible): compact strings "User" and "alice", false, no tags
    assert data.hex() == "0000" + "05" + b"User".hex() + "06" + b"alice".hex() + "00" + "00"
    assert forwarding.deserialize_principal(data) == "User:alice"
    assert forwarding.deserialize_principal(forwarding.serialize_principal("User:CN=a:b")) == "User:CN=a:b"


def test_envelope_is_not_listed_by_api_versions():
    assert API_KEYS["Envelope"] == 58 and 58 in HANDLERS
    assert 58 not in advertised_versions()


FORWARDED_CASES = [c for c in ADMIN_CASES if API_KEYS[c.api] in forwarding.FORWARDED]


def test_matrix_covers_the_forwarded_apis_it_can():
    covered = {c.api for c in FORWARDED_CASES}
    # ACLs, SCRAM credentials and quotas have tests of their own below
    assert covered | {"CreateAcls", "DeleteAcls", "AlterClientQuotas", "AlterUserScramCredentials"} == \
        {HANDLERS[k].name for k in forwarding.FORWARDED}


@pytest.mark.parametrize("case", FORWARDED_CASES, ids=str)
def test_matrix_through_envelope(case):
    """Every forwarded API's matrix case, sent embedded in an Envelope: the client's principal is refused exactly as
    on a direct request (and nothing changes), and with every grant it succeeds."""
    acl_matrix.run_case(case, snapshot=state, props=GROUP_PROPS, send=send_in_envelope)


ACL = req("CreateAcls")
ACL_ENTRY = ACL.AclCreation(resource_type=2, resource_name="orders", resource_pattern_type=3, principal="User:bob",
                            host="*", operation=3, permission_type=3)


def test_create_and_delete_acls_through_envelope_as_the_client():
    """With Kafka's StandardAuthorizer: the broker (a super user) sends; the client's own ACLs decide."""
    broker = make_broker(**{"authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                            "super.users": BROKER})
    broker.security = broker.security.fallback           # the real authorizer, not the matrix's stand-in
    DA = req("DescribeAcls")
    everything = dict(resource_type_filter=1, resource_name_filter=None, pattern_type_filter=1, principal_filter=None,
                      host_filter=None, operation=1, permission_type=1)
    alter_cluster = ACL.AclCreation(resource_type=4, resource_name=CLUSTER_NAME, resource_pattern_type=3,
                                    principal=PRINCIPAL, host="*", operation=int(Operation.ALTER), permission_type=3)

    async def body(b):
        refused = await in_envelope(b, "CreateAcls", 3, ACL(creations=[ACL_ENTRY]))
        assert [r.error_code for r in refused.results] == [E.CLUSTER_AUTHORIZATION_FAILED.code]
        granted = await call_as(b, "CreateAcls", 3, ACL(creations=[alter_cluster]), BROKER)
        assert [r.error_code for r in granted.results] == [0]
        created = await in_envelope(b, "CreateAcls", 3, ACL(creations=[ACL_ENTRY]))
        assert [r.error_code for r in created.results] == [0]
        described = await call_as(b, "DescribeAcls", 3, DA(**everything), BROKER)
        assert sorted(a.principal for r in described.resources for a in r.acls) == ["User:alice", "User:bob"]
        DL = req("DeleteAcls")
        deleted = await in_envelope(b, "DeleteAcls", 3, DL(filters=[DL.DeleteAclsFilter(
            **{**everything, "principal_filter": "User:bob"})]))
        assert [m.principal for f in deleted.filter_results for m in f.matching_acls] == ["User:bob"]
    run(broker, body)


def test_scram_credentials_and_quotas_through_envelope():
    broker = make_broker()
    AU, AQ = req("AlterUserScramCredentials"), req("AlterClientQuotas")
    upsert = AU(upsertions=[AU.ScramCredentialUpsertion(name="bob", mechanism=1, iterations=8192, salt=b"s" * 16,
                                                        salted_password=b"p" * 32)])
    quota = AQ(entries=[AQ.EntryData(entity=[AQ.EntryData.EntityData(entity_type="user", entity_name="bob")],
                                     ops=[AQ.EntryData.OpData(key="producer_byte_rate", value=1024.0)])])

    async def body(b):
        grant(b, [])
        assert error_codes(await send_in_envelope(b, "AlterUserScramCredentials", 0, upsert)) == \
            [E.CLUSTER_AUTHORIZATION_FAILED.code]
        assert error_codes(await send_in_envelope(b, "AlterClientQuotas", 1, quota)) == \
            [E.CLUSTER_AUTHORIZATION_FAILED.code]
        grant(b, [cluster(Operation.ALTER), cluster(Operation.ALTER_CONFIGS)])
        assert error_codes(await send_in_envelope(b, "AlterUserScramCredentials", 0, upsert)) == [0]
        assert error_codes(await send_in_envelope(b, "AlterClientQuotas", 1, quota)) == [0]
        grant(b, allow_all=True)
        users = await call_as(b, "DescribeUserScramCredentials", 0, req("DescribeUserScramCredentials")(users=None))
        assert [r.user for r in users.results] == ["bob"]
        quotas = await call_as(b, "DescribeClientQuotas", 1, req("DescribeClientQuotas")(components=[], strict=False))
        assert [(e.entity[0].entity_name, [(v.key, v.value) for v in e.values]) for e in quotas.entries] == \
            [("bob", [("producer_byte_rate", 1024.0)])]
    run(broker, body)


CREATE = req("CreateTopics")


def create_request(name="fresh"):
    return CREATE(topics=[CREATE.CreatableTopic(name=name, num_partitions=2, replication_factor=-1, assignments=[],
                                                configs=[])], timeout_ms=5000)


def envelope_answer(broker, envelope, principal=BROKER, connection=None):
    """The Envelope handler's answer (a Deferred resolved), decoded."""
    handler = HANDLERS[API_KEYS["Envelope"]]
    frame = bytearray(handler.request.encode_bytes(envelope, 0))
    decoded, _ = handler.request.decode(frame, 0)
    ctx = RequestContext(broker, handler.api_key, 0, 3, "broker", principal,
                         connection or types.SimpleNamespace(host="127.0.0.1"), frame)
    result = handler.fn(ctx, decoded)
    data = handler.response.encode_bytes(result, 0)
    return handler.response.decode(memoryview(data), 0)[0]


def test_envelope_refused_without_cluster_action():
    broker = make_broker()
    grant(broker, [Grant(Operation.CREATE, ResourceType.CLUSTER, CLUSTER_NAME, "User:mallory")])
    answer = envelope_answer(broker, envelope_of("CreateTopics", 7, create_request()), principal="User:mallory")
    assert (answer.error_code, answer.response_data) == (E.CLUSTER_AUTHORIZATION_FAILED.code, None)
    assert broker.topics.get("fresh") is None
    broker.close()


def test_envelope_refused_on_a_listener_other_than_the_inter_broker_one():
    broker = make_broker()
    connection = types.SimpleNamespace(host="127.0.0.1", listener=types.SimpleNamespace(name="EXTERNAL"))
    answer = envelope_answer(broker, envelope_of("CreateTopics", 7, create_request()), connection=connection)
    assert answer.error_code == E.CLUSTER_AUTHORIZATION_FAILED.code
    assert broker.topics.get("fresh") is None
    broker.close()


def _with(envelope, **fields):
    for name, value in fields.items():
        setattr(envelope, name, value)
    return envelope


MALFORMED = {
    "principal-garbage": (lambda: _with(envelope_of("CreateTopics", 7, create_request()),
                                        request_principal=b"\x00\x00\x7f"), E.PRINCIPAL_DESERIALIZATION_FAILURE),
    "principal-version": (lambda: _with(envelope_of("CreateTopics", 7, create_request()),
                                        request_principal=b"\x00\x05" + forwarding.serialize_principal("User:a")[2:]),
                          E.PRINCIPAL_DESERIALIZATION_FAILURE),
    "principal-null": (lambda: _with(envelope_of("CreateTopics", 7, create_request()), request_principal=None),
                       E.PRINCIPAL_DESERIALIZATION_FAILURE),
    "address-5-bytes": (lambda: _with(envelope_of("CreateTopics", 7, create_request()),
                                      client_host_address=b"\x01\x02\x03\x04\x05"), E.INVALID_REQUEST),
    "not-forwardable": (lambda: envelope_of("Metadata", 12, req("Metadata")(topics=None)), E.INVALID_REQUEST),
    "header-cut-short": (lambda: _with(envelope_of("CreateTopics", 7, create_request()),
                                       request_data=b"\x00\x13\x00"), E.UNSUPPORTED_VERSION),
    "body-cut-short": (lambda: _with(envelope_of("CreateTopics", 7, create_request()),
                                     request_data=bytes(embedded_frame("CreateTopics", 7, create_request())[:-6])),
                       E.UNSUPPORTED_VERSION),
    "version-not-served": (lambda: _with(envelope_of("CreateTopics", 7, create_request()),
                                         request_data=b"\x00\x13\x00\x63" + bytes(
                                             embedded_frame("CreateTopics", 7, create_request())[4:])),
                           E.UNSUPPORTED_VERSION),
}


@pytest.mark.parametrize("name", MALFORMED)
def test_malformed_envelopes(name):
    broker = make_broker()
    make, error = MALFORMED[name]
    answer = envelope_answer(broker, make())
    assert (answer.error_code, answer.response_data) == (error.code, None)
    assert broker.topics.get("fresh") is None
    broker.close()


class OtherController:
    """The broker's cluster, but with another node as controller."""

    def __init__(self, cluster, controller_id):
        self._cluster = cluster
        self.controller_id = controller_id

    def __getattr__(self, name):
        return getattr(self._cluster, name)


def test_envelope_to_a_broker_that_is_not_the_controller():
    broker = make_broker()
    broker.cluster = OtherController(broker.cluster, broker.node_id + 1)
    answer = envelope_answer(broker, envelope_of("CreateTopics", 7, create_request()))
    assert answer.error_code == E.NOT_CONTROLLER.code
    assert broker.topics.get("fresh") is None
    broker.close()


# --- the forwarding side ------------------------------------------------------------------------------------------

class EnvelopePeer:
    """The controller as another node's peer: each Envelope goes to its handler as BROKER would send it, through the
    codec; ``before`` answers given first (a PeerUnavailable raised, or an Envelope error code)."""

    def __init__(self, controller, before=()):
        self.controller = controller
        self.before = list(before)
        self.calls = 0

    async def call(self, api, version, request):
        assert (api, version) == ("Envelope", 0)
        self.calls += 1
        if self.before:
            step = self.before.pop(0)
            if isinstance(step, Exception):
                raise step
            return message("EnvelopeResponse").cls(error_code=step, response_data=None)
        return await call_as(self.controller, api, version, request, BROKER)


def follower_of(controller_peer, controller_id=2):
    """A broker whose cluster's controller is node ``controller_id``, reached through ``controller_peer``."""
    follower = make_broker()
    follower.cluster = OtherController(follower.cluster, controller_id)
    follower.peer = lambda node_id: controller_peer
    return follower


def forwarded_context(broker, api, version, request, principal=PRINCIPAL):
    handler = HANDLERS[API_KEYS[api]]
    frame = embedded_frame(api, version, request)
    return RequestContext(broker, handler.api_key, version, CORRELATION_ID, "client", principal,
                          types.SimpleNamespace(host="10.9.8.7"), frame)


async def forwarded(broker, api, version, request, principal=PRINCIPAL):
    """What the connection sends back for a forwarded request, decoded."""
    handler = HANDLERS[API_KEYS[api]]
    assert broker.cluster.controller_id != broker.node_id
    result = await forwarding.forward(forwarded_context(broker, api, version, request, principal), request).wait()
    data = result.body if type(result) is Encoded else handler.response.encode_bytes(result, version)
    return handler.response.decode(memoryview(data), version)[0]


def run_two(controller, follower, body):
    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(controller.run)
            await nursery.start(follower.run)
            await body()
            nursery.cancel_scope.cancel()
    try:
        trio.run(main)
    finally:
        follower.close()
        controller.close()


def test_create_topics_forwarded_to_the_controller_with_the_clients_principal():
    controller = make_broker()
    peer = EnvelopePeer(controller)
    follower = follower_of(peer)

    async def body():
        grant(controller, [CLUSTER_ACTION])
        refused = await forwarded(follower, "CreateTopics", 7, create_request())
        assert [t.error_code for t in refused.topics] == [E.TOPIC_AUTHORIZATION_FAILED.code]
        assert (PRINCIPAL, Operation.CREATE, ResourceType.TOPIC, "fresh") in controller.security.asked
        grant(controller, [CLUSTER_ACTION, Grant(Operation.CREATE, ResourceType.TOPIC, "fresh")])
        created = await forwarded(follower, "CreateTopics", 7, create_request())
        assert [(t.name, t.error_code) for t in created.topics] == [("fresh", 0)]
        assert controller.topics.get("fresh").partitions == 2
        assert follower.topics.get("fresh") is None       # created by the controller, not here
    run_two(controller, follower, body)


def test_not_controller_and_unreachable_are_tried_again():
    controller = make_broker()
    peer = EnvelopePeer(controller, [PeerUnavailable(2, "down"), E.NOT_CONTROLLER.code])
    follower = follower_of(peer)

    async def body():
        created = await forwarded(follower, "CreateTopics", 7, create_request())
        assert [t.error_code for t in created.topics] == [0]
        assert peer.calls == 3
    run_two(controller, follower, body)


def test_envelope_error_is_unknown_server_error_for_the_client():
    controller = make_broker()
    follower = follower_of(EnvelopePeer(controller, [E.CLUSTER_AUTHORIZATION_FAILED.code]))

    async def body():
        answer = await forwarded(follower, "CreateTopics", 7, create_request())
        assert [t.error_code for t in answer.topics] == [E.UNKNOWN_SERVER_ERROR.code]
        assert controller.topics.get("fresh") is None
    run_two(controller, follower, body)


def test_unsupported_version_from_the_controller_closes_the_clients_connection():
    controller = make_broker()
    follower = follower_of(EnvelopePeer(controller, [E.UNSUPPORTED_VERSION.code]))

    async def body():
        with pytest.raises(CloseConnection):
            await forwarded(follower, "CreateTopics", 7, create_request())
        assert controller.topics.get("fresh") is None
    run_two(controller, follower, body)


@pytest.mark.parametrize("controller_id", [-1, 2], ids=["no-controller", "unreachable"])
def test_no_controller_is_request_timed_out(monkeypatch, controller_id):
    monkeypatch.setattr(forwarding, "RETRY_TIMEOUT_S", 0.3)

    class Down:
        calls = 0

        async def call(self, api, version, request):
            Down.calls += 1
            raise PeerUnavailable(2, "connection refused")

    follower = follower_of(Down(), controller_id)

    async def body(b):
        answer = await forwarded(b, "CreateTopics", 7, create_request())
        assert [(t.name, t.error_code) for t in answer.topics] == [("fresh", E.REQUEST_TIMED_OUT.code)]
        assert (Down.calls > 0) == (controller_id >= 0)
    run(follower, body)


def test_handled_here_once_this_broker_is_the_controller():
    broker = make_broker()
    cluster = OtherController(broker.cluster, -1)
    broker.cluster = cluster

    async def body(b):
        async with trio.open_nursery() as nursery:
            answer = []
            nursery.start_soon(lambda: _store(answer, forwarded(b, "CreateTopics", 7, create_request())))
            await trio.sleep(0.05)
            cluster.controller_id = b.node_id                # elected while the request waited
        assert [t.error_code for t in answer[0].topics] == [0]
        assert b.topics.get("fresh") is not None
    run(broker, body)


async def _store(into, awaitable):
    into.append(await awaitable)


ERROR_REQUESTS = {
    "CreateTopics": create_request(),
    "DeleteTopics": req("DeleteTopics")(topics=[req("DeleteTopics").DeleteTopicState(name="t")], topic_names=["t"]),
    "CreatePartitions": req("CreatePartitions")(topics=[req("CreatePartitions").CreatePartitionsTopic(
        name="t", count=3, assignments=None)]),
    "AlterConfigs": req("AlterConfigs")(resources=[req("AlterConfigs").AlterConfigsResource(
        resource_type=2, resource_name="t", configs=[])]),
    "IncrementalAlterConfigs": req("IncrementalAlterConfigs")(resources=[
        req("IncrementalAlterConfigs").AlterConfigsResource(resource_type=2, resource_name="t", configs=[])]),
    "CreateAcls": ACL(creations=[ACL_ENTRY, ACL_ENTRY]),
    "DeleteAcls": req("DeleteAcls")(filters=[req("DeleteAcls").DeleteAclsFilter()]),
    "AlterClientQuotas": req("AlterClientQuotas")(entries=[req("AlterClientQuotas").EntryData(
        entity=[req("AlterClientQuotas").EntryData.EntityData(entity_type="user", entity_name="bob")], ops=[])]),
    "AlterUserScramCredentials": req("AlterUserScramCredentials")(
        deletions=[req("AlterUserScramCredentials").ScramCredentialDeletion(name="bob", mechanism=1)],
        upsertions=[req("AlterUserScramCredentials").ScramCredentialUpsertion(name="bob", mechanism=2)]),
    "UpdateFeatures": req("UpdateFeatures")(feature_updates=[]),
    "AlterPartitionReassignments": req("AlterPartitionReassignments")(topics=[
        req("AlterPartitionReassignments").ReassignableTopic(name="t", partitions=[
            req("AlterPartitionReassignments").ReassignableTopic.ReassignablePartition(partition_index=1)])]),
    "ListPartitionReassignments": req("ListPartitionReassignments")(topics=None),
    "ElectLeaders": req("ElectLeaders")(topic_partitions=[req("ElectLeaders").TopicPartitions(
        topic="t", partitions=[0, 1])]),
    "DescribeQuorum": req("DescribeQuorum")(topics=[]),
    "UnregisterBroker": req("UnregisterBroker")(broker_id=3),
}


@pytest.mark.parametrize("api", sorted(ERROR_REQUESTS))
def test_error_response_of_every_forwarded_api(api):
    """The answer when forwarding fails, at every version served: every part of the request answered with the
    error, as Kafka's getErrorResponse (per topic, resource, ACL, entity, user, partition; or the top-level code)."""
    assert {HANDLERS[k].name for k in forwarding.FORWARDED} == set(ERROR_REQUESTS)
    handler = HANDLERS[API_KEYS[api]]
    broker = make_broker()
    for version in range(handler.min_version, handler.max_version + 1):
        data = handler.request.encode_bytes(ERROR_REQUESTS[api], version)
        request = handler.request.decode(memoryview(data), version)[0]
        ctx = forwarded_context(broker, api, version, request)
        response = forwarding.error_response(ctx, request, E.REQUEST_TIMED_OUT.code)
        out = handler.response.decode(memoryview(handler.response.encode_bytes(response, version)), version)[0]
        codes = [c for c in error_codes(out)]
        assert codes and set(codes) <= {E.REQUEST_TIMED_OUT.code, 0}, (version, out)
        assert E.REQUEST_TIMED_OUT.code in codes
    counts = {"CreateAcls": 2, "AlterUserScramCredentials": 1, "ElectLeaders": 2}
    if api in counts:
        assert error_codes(out, top=False).count(E.REQUEST_TIMED_OUT.code) == counts[api]
    broker.close()


def test_metadata_auto_creation_goes_to_the_controller():
    controller = make_broker()
    peer = EnvelopePeer(controller)
    follower = follower_of(peer)
    MD = req("Metadata")

    async def body():
        answer = await call_as(follower, "Metadata", 12, MD(topics=[MD.MetadataRequestTopic(name="auto")],
                                                              allow_auto_topic_creation=True))
        assert [(t.name, t.error_code) for t in answer.topics] == [("auto", E.LEADER_NOT_AVAILABLE.code)]
        with trio.fail_after(10):
            while controller.topics.get("auto") is None:
                await trio.sleep(0.01)
        assert controller.topics.get("auto").partitions == controller.config["num.partitions"]
        assert follower.topics.get("auto") is None
        assert (PRINCIPAL, Operation.CREATE, ResourceType.CLUSTER, CLUSTER_NAME) in controller.security.asked
        assert peer.calls == 1
    run_two(controller, follower, body)


def test_a_brokers_own_configs_are_not_forwarded():
    """AlterConfigs / IncrementalAlterConfigs naming a BROKER or BROKER_LOGGER resource are handled where they arrive
    (the broker's dynamic SSL configs live in its memory); topic configs go to the controller."""
    controller = make_broker()
    follower = follower_of(EnvelopePeer(controller))
    IAC, AC = req("IncrementalAlterConfigs"), req("AlterConfigs")
    for cls, key in ((IAC, API_KEYS["IncrementalAlterConfigs"]), (AC, API_KEYS["AlterConfigs"])):
        def of(*types):
            return cls(resources=[cls.AlterConfigsResource(resource_type=t, resource_name="1", configs=[])
                                  for t in types])
        assert forwarding.is_forwarded(follower, key, of(2))
        assert not forwarding.is_forwarded(follower, key, of(4))
        assert not forwarding.is_forwarded(follower, key, of(2, 8))
    assert forwarding.is_forwarded(follower, API_KEYS["CreateTopics"], create_request())
    assert not forwarding.is_forwarded(follower, API_KEYS["Metadata"], req("Metadata")(topics=None))
    follower.cluster = OtherController(follower.cluster, follower.node_id)
    assert not forwarding.is_forwarded(follower, API_KEYS["CreateTopics"], create_request())
    follower.close()
    controller.close()


# --- through a connection: the hook in Connection._dispatch --------------------------------------------------------

class CannedController:
    """A controller that answers every Envelope with ``error_code``, or else with a CreateTopics v7 response of its
    own making for the embedded request (its correlation id), and keeps what it was sent."""

    def __init__(self, error_code=0):
        self.error_code = error_code
        self.sent = []

    async def call(self, api, version, request):
        self.sent.append(request)
        response = message("EnvelopeResponse").cls
        if self.error_code:
            return response(error_code=self.error_code, response_data=None)
        correlation_id = int.from_bytes(request.request_data[4:8], "big")
        created = message("CreateTopicsResponse")
        body = created.cls(topics=[created.cls.CreatableTopicResult(name="made-there", error_code=0,
                                                                    num_partitions=7, replication_factor=1)])
        return response(error_code=0, response_data=correlation_id.to_bytes(4, "big") + b"\x00" +
                        created.encode_bytes(body, 7))


def exchange(port, frame: bytes) -> bytes:
    """Send one request frame; → the answer's frame (b"" if the broker closed the connection instead)."""
    import socket
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(len(frame).to_bytes(4, "big") + frame)
        data = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return data
            data += chunk
            if len(data) >= 4 and len(data) >= 4 + int.from_bytes(data[:4], "big"):
                return data[4:]


@pytest.mark.parametrize("error_code", [0, E.UNSUPPORTED_VERSION.code], ids=["answered", "unsupported-version"])
def test_a_client_connection_gets_the_controllers_answer(error_code):
    from trireme.testing import TriremeBroker
    controller = CannedController(error_code)
    with TriremeBroker() as running:
        broker = running._listener.broker
        broker.cluster = OtherController(broker.cluster, broker.node_id + 1)
        broker.peer = lambda node_id: controller
        frame = bytes(embedded_frame("CreateTopics", 7, create_request(), correlation_id=1234))
        answer = exchange(running.port, frame)
        assert [envelope.request_data for envelope in controller.sent] == [frame]     # the client's bytes as sent
        assert forwarding.deserialize_principal(controller.sent[0].request_principal) == "User:ANONYMOUS"
        assert forwarding.address_text(controller.sent[0].client_host_address) == "127.0.0.1"
        if error_code:
            assert answer == b""                            # closed, as Kafka closes it
            assert "internal error" not in running.log_text()
        else:
            response = decode_response(HANDLERS[API_KEYS["CreateTopics"]], 7, answer, 1234)
            assert [(t.name, t.num_partitions) for t in response.topics] == [("made-there", 7)]
            assert broker.topics.get("made-there") is None and broker.topics.get("fresh") is None
