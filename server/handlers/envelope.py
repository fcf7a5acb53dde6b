"""Envelope (KIP-590), the controller's side of forwarding: a broker's request carrying a client's request, handled as that client's own, its response sent back inside.

Another broker sends it (server/forwarding.py) with the client's request as the client sent it (header and body), the
client's principal (Kafka's DefaultPrincipalData, version-prefixed) and its IP address.  Only a broker may send
it: the request must come in on the inter-broker listener (Kafka's privileged listener) with a principal that has
ClusterAction on the cluster, else CLUSTER_AUTHORIZATION_FAILED.  The embedded request is then handled by its API's
handler with the client's principal and address, so every ACL check applies to the client exactly as on a direct
request, and the answer (header and body, the client's correlation id) is the Envelope's ResponseData.  Kafka's
errors for an Envelope that cannot be opened: a principal that cannot be read PRINCIPAL_DESERIALIZATION_FAILURE; a
client address of other than 4 or 16 bytes, or an API that is not forwarded, INVALID_REQUEST; an embedded header or
body that cannot be read, or a version not served, UNSUPPORTED_VERSION; a broker that is not the controller
NOT_CONTROLLER (the sender tries the controller again).  Kafka 4's brokers do not list Envelope in ApiVersions (only
their controllers serve it), and neither do ours.
"""
from __future__ import annotations

import inspect

from trireme.state.acls import CLUSTER_NAME, Operation, ResourceType
from trireme.wire import error_codes as E
from trireme.wire import headers
from trireme.wire.primitives import CodecError

from .. import dispatch, forwarding
from ..deferred import Deferred, settle
from ..dispatch import handles
from ..peers import response_header_version


@handles("Envelope", 0, 0, advertised=False)
def envelope(ctx, request):
    try:
        inner, handler, embedded = _open(ctx, request)
    except forwarding.EnvelopeError as e:
        return ctx.response(error_code=e.error_code, response_data=None)
    result = handler.fn(inner, embedded)
    if not inspect.isawaitable(result) and not isinstance(result, Deferred):
        return _answer(ctx, inner, handler, result)

    async def wait():
        return _answer(ctx, inner, handler, await settle(result))
    return Deferred(wait)


def _open(ctx, request):
    """→ (the embedded request's context, its handler, the decoded request); EnvelopeError for Kafka's answers."""
    broker = ctx.broker
    listener = getattr(ctx.connection, "listener", None)
    if listener is not None and listener.name != broker.config.inter_broker_listener:
        raise forwarding.EnvelopeError(E.CLUSTER_AUTHORIZATION_FAILED.code, "not the inter-broker listener")
    if not ctx.authorize(Operation.CLUSTER_ACTION, ResourceType.CLUSTER, CLUSTER_NAME):
        raise forwarding.EnvelopeError(E.CLUSTER_AUTHORIZATION_FAILED.code, "no ClusterAction")
    if broker.cluster.controller_id != broker.node_id:
        raise forwarding.EnvelopeError(E.NOT_CONTROLLER.code, "not the controller")
    principal = forwarding.deserialize_principal(request.request_principal)
    host = forwarding.address_text(request.client_host_address)
    frame = bytearray(request.request_data)
    try:
        api_key, version = headers.peek_api(frame)
    except CodecError:
        raise forwarding.EnvelopeError(E.UNSUPPORTED_VERSION.code, "embedded request header") from None
    if api_key not in forwarding.FORWARDED:
        raise forwarding.EnvelopeError(E.INVALID_REQUEST.code, f"API {api_key} is not forwarded")
    handler = dispatch.HANDLERS[api_key]
    if not handler.min_version <= version <= handler.max_version:
        raise forwarding.EnvelopeError(E.UNSUPPORTED_VERSION.code, f"{handler.name} v{version}")
    try:
        header = headers.decode_request_header(frame, handler.request.is_flexible(version))
        embedded, _ = handler.request.decode(memoryview(frame), version, header.size)
    except CodecError:
        raise forwarding.EnvelopeError(E.UNSUPPORTED_VERSION.code, "embedded request") from None
    inner = dispatch.RequestContext(broker, api_key, version, header.correlation_id, header.client_id, principal,
                                    ctx.connection, frame, client_host=host)
    return inner, handler, embedded


def _answer(ctx, inner, handler, response):
    """The Envelope's answer carrying the embedded response, header and body, as the client will read it."""
    version = inner.api_version
    head = headers.encode_response_header(inner.correlation_id, response_header_version(handler, version))
    body = response.body if type(response) is dispatch.Encoded else handler.response.encode_bytes(response, version)
    return ctx.response(error_code=0, response_data=head + bytes(body))
