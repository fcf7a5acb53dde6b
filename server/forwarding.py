"""Forwards the requests that change cluster metadata from a broker that is not the controller to the controller, in an Envelope (KIP-590), as Kafka's ForwardingManager does.

Only the controller (``broker.cluster.controller_id``, the leader of ``__cluster_metadata``) writes the metadata log,
so a CreateTopics, CreateAcls, IncrementalAlterConfigs... that reaches another broker is sent on, as the client sent
it (header and body), with the client's principal (:func:`serialize_principal`, Kafka's DefaultPrincipalData) and IP
address, in an Envelope through ``broker.peer(controller_id)``; the controller (server/handlers/envelope.py) handles it
as the client's own request and the embedded response goes back to the client as it is.  With the local engine the
broker is its own controller and nothing is forwarded.

As Kafka's forwarding channel, a request waits while there is no live controller and is sent again when the
controller could not be reached or answered NOT_CONTROLLER (it moved), for at most :data:`RETRY_TIMEOUT_S` (Kafka's
60 s), then the client gets its API's error response with REQUEST_TIMED_OUT; an Envelope error (a broker
misconfigured) is UNKNOWN_SERVER_ERROR for the client, except UNSUPPORTED_VERSION (a controller that cannot read
the client's request), which closes the client's connection, as in Kafka.  A Metadata request that would auto-create a
topic on a broker that is not the controller answers LEADER_NOT_AVAILABLE for it and sends CreateTopics to the
controller in the background (Kafka's AutoTopicCreationManager), in an Envelope with the client's principal.
"""
from __future__ import annotations

import ipaddress
import logging

import trio

from trireme.state.topics import TopicError
from trireme.wire import error_codes as E
from trireme.wire import headers
from trireme.wire.codec import message
from trireme.wire.primitives import INT16, CodecError

from . import dispatch
from .deferred import Deferred, settle
from .handlers import alter_partition_reassignments, create_acls, delete_acls, elect_leaders
from .peers import PeerUnavailable, decode_response, encode_request, handler_for, response_header_version

log = logging.getLogger("trireme.forwarding")

# The APIs a broker forwards to the controller (Kafka 4's forwardable APIs that this broker serves, except the
# delegation-token ones, which are refused here as unavailable by every broker alike).
FORWARDED = frozenset(dispatch.API_KEYS[name] for name in (
    "CreateTopics", "DeleteTopics", "CreatePartitions", "AlterConfigs", "IncrementalAlterConfigs",
    "CreateAcls", "DeleteAcls", "AlterClientQuotas", "AlterUserScramCredentials", "UpdateFeatures",
    "AlterPartitionReassignments", "ListPartitionReassignments", "ElectLeaders", "DescribeQuorum",
    "UnregisterBroker"))

RETRY_TIMEOUT_S = 60.0          # Kafka's forwarding channel gives a request 60 s to reach a controller
RETRY_BACKOFF_S = 0.1           # between attempts while there is no controller, or it cannot be reached

_PRINCIPAL = message("DefaultPrincipalData")
_PRINCIPAL_VERSION = 0
_ENVELOPE = message("EnvelopeRequest").cls


class EnvelopeError(Exception):
    """An Envelope that cannot be opened: ``error_code`` is the Envelope's answer."""

    def __init__(self, error_code: int, message: str):
        super().__init__(message)
        self.error_code = error_code


def serialize_principal(principal: str) -> bytes:
    """``"User:alice"`` as Kafka's DefaultKafkaPrincipalBuilder serializes it: an int16 version, then
    DefaultPrincipalData at that version (type, name, not token-authenticated)."""
    kind, _, name = principal.partition(":")
    return INT16.pack(_PRINCIPAL_VERSION) + _PRINCIPAL.encode_bytes(
        _PRINCIPAL.cls(type=kind, name=name, token_authenticated=False), _PRINCIPAL_VERSION)


def deserialize_principal(data: bytes | None) -> str:
    """:func:`serialize_principal`'s bytes → ``"Type:name"``; EnvelopeError(PRINCIPAL_DESERIALIZATION_FAILURE)."""
    try:
        if data is None or len(data) < 2:
            raise ValueError("no principal")
        version = INT16.unpack_from(data, 0)[0]
        if version != _PRINCIPAL_VERSION:
            raise ValueError(f"principal data version {version}")
        decoded, end = _PRINCIPAL.decode(memoryview(data), version, 2)
        if end != len(data):
            raise ValueError("bytes after the principal")
    except (CodecError, ValueError) as e:
        raise EnvelopeError(E.PRINCIPAL_DESERIALIZATION_FAILURE.code,
                            f"cannot deserialize the client principal: {e}") from None
    return f"{decoded.type}:{decoded.name}"


def address_bytes(host: str) -> bytes:
    """The client's IP address as the Envelope carries it (4 or 16 bytes)."""
    try:
        return ipaddress.ip_address(host).packed
    except ValueError:
        return bytes(4)                     # 0.0.0.0


def address_text(data: bytes) -> str:
    """An Envelope's client address → its text; EnvelopeError(INVALID_REQUEST) unless 4 or 16 bytes."""
    if len(data) not in (4, 16):
        raise EnvelopeError(E.INVALID_REQUEST.code, f"client address of {len(data)} bytes")
    return str(ipaddress.ip_address(bytes(data)))


# AlterConfigs / IncrementalAlterConfigs naming a BROKER (4) or BROKER_LOGGER (8) resource are handled where they
# arrive: a broker's dynamic configs (its listeners' key material) live in its memory, and Kafka's brokers handle
# BROKER_LOGGER themselves too.
_CONFIG_APIS = frozenset((dispatch.API_KEYS["AlterConfigs"], dispatch.API_KEYS["IncrementalAlterConfigs"]))
_BROKER_RESOURCES = frozenset((4, 8))


def is_forwarded(broker, api_key: int, request=None) -> bool:
    """Whether ``request`` (of ``api_key``) arriving here goes to the controller: a forwarded API, this broker is
    not the controller (with no live controller it waits for one), and no broker config of this broker's."""
    if api_key not in FORWARDED or broker.cluster.controller_id == broker.node_id:
        return False
    return not (api_key in _CONFIG_APIS and any(r.resource_type in _BROKER_RESOURCES for r in request.resources))


def forward(ctx, request) -> Deferred:
    """The client's request (``ctx.frame``, decoded as ``request``) sent to the controller → its answer: the
    controller's embedded response (dispatch.Encoded), or the API's error response."""
    handler = dispatch.HANDLERS[ctx.api_key]
    frame = bytes(ctx.frame)

    async def wait():
        try:
            data = await send(ctx.broker, frame, ctx.principal, ctx.host)
        except _HereNow:                    # this broker became the controller meanwhile
            return await settle(handler.fn(ctx, request))
        except EnvelopeError as e:
            if e.error_code == E.UNSUPPORTED_VERSION.code:
                # the controller serves other versions (brokers of different releases): as Kafka, the client's
                # connection closes, and it learns the versions again on its next one
                raise dispatch.CloseConnection(f"forwarded {handler.name} v{ctx.api_version}: {e}") from None
            log.warning("forwarding %s to the controller failed: %s", handler.name, e)
            return error_response(ctx, request, e.error_code)
        try:
            correlation_id, size = headers.decode_response_header(
                data, response_header_version(handler, ctx.api_version))
        except CodecError:
            correlation_id, size = None, 0
        if correlation_id != ctx.correlation_id:
            log.warning("the controller's answer to a forwarded %s is not one", handler.name)
            return error_response(ctx, request, E.UNKNOWN_SERVER_ERROR.code)
        return dispatch.Encoded(bytes(data[size:]))

    return Deferred(wait)


class _HereNow(Exception):
    """This broker is the controller now: the request is handled here."""


async def send(broker, frame, principal: str, host: str) -> bytes:
    """Send a request ``frame`` (without its size prefix) of ``principal`` from ``host`` to the controller in an
    Envelope, waiting and retrying as Kafka's forwarding channel → the embedded
    response's bytes.  EnvelopeError: REQUEST_TIMED_OUT after RETRY_TIMEOUT_S, UNSUPPORTED_VERSION as the controller
    answered it, UNKNOWN_SERVER_ERROR for any other Envelope error; _HereNow when this broker became the controller."""
    envelope = _ENVELOPE(request_data=bytes(frame), request_principal=serialize_principal(principal),
                         client_host_address=address_bytes(host))
    with trio.move_on_after(RETRY_TIMEOUT_S):
        while True:
            controller = broker.cluster.controller_id
            if controller == broker.node_id:
                raise _HereNow()
            if controller >= 0:
                try:
                    answer = await broker.peer(controller).call("Envelope", 0, envelope)
                except PeerUnavailable as e:
                    log.info("cannot forward to the controller: %s", e)
                else:
                    if answer.error_code == 0 and answer.response_data is not None:
                        return answer.response_data
                    if answer.error_code == E.UNSUPPORTED_VERSION.code:
                        raise EnvelopeError(E.UNSUPPORTED_VERSION.code, "the controller cannot read the request")
                    if answer.error_code != E.NOT_CONTROLLER.code:
                        raise EnvelopeError(E.UNKNOWN_SERVER_ERROR.code, "the controller answered the Envelope "
                                            f"with {E.for_code(answer.error_code).name}")
            await trio.sleep(RETRY_BACKOFF_S)
    raise EnvelopeError(E.REQUEST_TIMED_OUT.code, f"no controller answered within {RETRY_TIMEOUT_S:.0f} s")


class AutoCreation:
    """Topics a Metadata request asked for on a broker that is not the controller, being created by the controller
    (Kafka's AutoTopicCreationManager): one CreateTopics in an Envelope per topic, with the asking client's principal,
    sent in the background (:meth:`run`'s task group); a topic already on its way is not asked for again."""

    def __init__(self, broker):
        self.broker = broker
        self.in_flight: set[str] = set()
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                self._nursery = None

    def create(self, name: str, ctx) -> None:
        """Have the controller create topic ``name`` (num.partitions, default.replication.factor) for ``ctx``'s
        client, unless it is on its way already."""
        if name in self.in_flight or self._nursery is None:
            return
        self.in_flight.add(name)
        self._nursery.start_soon(self._create, name, ctx.principal, ctx.host)

    async def _create(self, name: str, principal: str, host: str) -> None:
        try:
            handler = handler_for("CreateTopics", _CREATE_TOPICS_VERSION)
            topic = handler.request.cls.CreatableTopic(name=name, num_partitions=-1, replication_factor=-1)
            request = handler.request.cls(topics=[topic], timeout_ms=self.broker.config["request.timeout.ms"])
            frame = encode_request(handler, _CREATE_TOPICS_VERSION, 0, request)
            try:
                data = await send(self.broker, frame, principal, host)
            except _HereNow:
                try:
                    await self.broker.auto_create(name)
                except TopicError as e:
                    log.warning("auto-creating topic %s failed: %s", name, e.message)
                return
            except EnvelopeError as e:
                log.warning("auto-creating topic %s through the controller failed: %s", name, e)
                return
            try:
                answer = decode_response(handler, _CREATE_TOPICS_VERSION, data, 0)
            except (CodecError, ValueError) as e:
                log.warning("auto-creating topic %s: the controller's answer could not be read: %s", name, e)
                return
            for result in answer.topics:
                if result.error_code and result.error_code != E.TOPIC_ALREADY_EXISTS.code:
                    log.warning("the controller did not auto-create topic %s: %s %s", name,
                                E.for_code(result.error_code).name, result.error_message or "")
        finally:
            self.in_flight.discard(name)


_CREATE_TOPICS_VERSION = 7


# --- the forwarded APIs' error responses (Kafka's getErrorResponse of each request) ---------------------------------

def error_response(ctx, request, code: int):
    """The response of ``ctx``'s API that answers every part of ``request`` with ``code``."""
    name = dispatch.HANDLERS[ctx.api_key].name
    return _ERRORS[name](ctx.response(), request, code, ctx.api_version)


def _create_topics(r, request, code, version):
    cls = type(r).CreatableTopicResult
    r.topics = [cls(name=t.name, error_code=code, error_message=None) for t in request.topics]
    return r


def _delete_topics(r, request, code, version):
    cls = type(r).DeletableTopicResult
    if version >= 6:
        r.responses = [cls(name=t.name, topic_id=t.topic_id, error_code=code) for t in request.topics]
    else:
        r.responses = [cls(name=n, error_code=code) for n in request.topic_names]
    return r


def _create_partitions(r, request, code, version):
    cls = type(r).CreatePartitionsTopicResult
    r.results = [cls(name=t.name, error_code=code, error_message=None) for t in request.topics]
    return r


def _alter_configs(r, request, code, version):
    cls = type(r).AlterConfigsResourceResponse
    r.responses = [cls(error_code=code, error_message=None, resource_type=c.resource_type,
                       resource_name=c.resource_name) for c in request.resources]
    return r


def _alter_client_quotas(r, request, code, version):
    cls = type(r).EntryData
    r.entries = [cls(error_code=code, error_message=None,
                     entity=[cls.EntityData(entity_type=e.entity_type, entity_name=e.entity_name) for e in q.entity])
                 for q in request.entries]
    return r


def _alter_user_scram_credentials(r, request, code, version):
    cls = type(r).AlterUserScramCredentialsResult
    users = dict.fromkeys([d.name for d in request.deletions] + [u.name for u in request.upsertions])
    r.results = [cls(user=user, error_code=code, error_message=None) for user in users]
    return r


def _top_level(r, request, code, version):
    r.error_code = code
    return r


_ERRORS = {
    "CreateTopics": _create_topics, "DeleteTopics": _delete_topics, "CreatePartitions": _create_partitions,
    "AlterConfigs": _alter_configs, "IncrementalAlterConfigs": _alter_configs,
    "CreateAcls": lambda r, request, code, version: create_acls.refuse_all(
        r, request.creations, type(r).AclCreationResult, E.for_code(code)),
    "DeleteAcls": lambda r, request, code, version: delete_acls.refuse_all(r, request, E.for_code(code)),
    "AlterClientQuotas": _alter_client_quotas, "AlterUserScramCredentials": _alter_user_scram_credentials,
    "UpdateFeatures": _top_level, "ListPartitionReassignments": _top_level,
    "AlterPartitionReassignments": lambda r, request, code, version: alter_partition_reassignments.refuse_all(
        r, request, code, None, version),
    "ElectLeaders": lambda r, request, code, version: elect_leaders.refuse_all(r, request, code, None),
    "DescribeQuorum": _top_level, "UnregisterBroker": _top_level,
}
