"""Sends a request to this broker's own handlers as bytes, the way a network peer would: encode, handle, encode the answer, decode it.

The peer of this node in :class:`~trireme.server.peers.Peers` (``broker.peer(node_id)``); other nodes' are
:class:`~trireme.server.network_peer.NetworkPeer`, which send the same frames (server/peers.py) over a socket.

The transaction coordinator writes markers (WriteTxnMarkers) and the produce path asks the
coordinator to verify a transaction (AddPartitionsToTxn with VerifyOnly) through here, so that
a broker-to-broker request is exercised exactly as it will be when coordinator and partition
leader are different nodes: only a socket would be added.  Its requests carry Kafka's ClusterAction
(``RequestContext.cluster_action``), as an authenticated broker's would: WriteTxnMarkers trusts
only those with markers a client may not write (see server/handlers/write_txn_markers.py).
"""
from __future__ import annotations

import inspect
import itertools
import time

from trireme.wire import headers

from . import dispatch
from .deferred import Deferred, settle
from .peers import decode_response, encode_request, handler_for, response_header_version


class LocalPeer:
    def __init__(self, broker):
        self.broker = broker
        self._correlation = itertools.count(1)

    def _invoke(self, api: str, version: int, request):
        handler = handler_for(api, version)
        correlation_id = next(self._correlation)
        frame = encode_request(handler, version, correlation_id, request)
        header = headers.decode_request_header(frame, handler.request.is_flexible(version))
        decoded, _ = handler.request.decode(memoryview(frame), version, header.size)
        ctx = dispatch.RequestContext(self.broker, handler.api_key, version, header.correlation_id, header.client_id,
                                      "User:ANONYMOUS", None, frame, cluster_action=True)
        return handler, correlation_id, handler.fn(ctx, decoded)

    @staticmethod
    def _response(handler, version: int, correlation_id: int, response):
        """The response through its bytes, as the peer on the other end of a socket would read it."""
        data = headers.encode_response_header(correlation_id, response_header_version(handler, version)) + \
            handler.response.encode_bytes(response, version)
        return decode_response(handler, version, data, correlation_id)

    async def call(self, api: str, version: int, request):
        """Send ``request`` (an object of ``{api}Request``) at ``version``; → the decoded response.  Its time shows
        as the ``peer`` phase of the API in trireme_request_phase_seconds_total."""
        started = time.perf_counter()
        handler, correlation_id, result = self._invoke(api, version, request)
        result = await settle(result)
        self.broker.metrics.observe_phase(api, "peer", time.perf_counter() - started)
        return self._response(handler, version, correlation_id, result)

    def call_now(self, api: str, version: int, request):
        """:meth:`call` for a request its handler answers without waiting (raises otherwise)."""
        handler, correlation_id, result = self._invoke(api, version, request)
        if isinstance(result, Deferred) or inspect.isawaitable(result):
            raise RuntimeError(f"{api} v{version} did not answer at once")
        return self._response(handler, version, correlation_id, result)
