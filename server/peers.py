"""Broker-to-broker requests: the Peer interface, the frames both kinds of peer send, and the "peer for node id" lookup.

A *peer* sends a request to one broker and answers the decoded response: ``await peer.call(api, version, request)``.
:class:`~trireme.server.local_peer.LocalPeer` is this broker (its own handlers, through the request's bytes);
:class:`~trireme.server.network_peer.NetworkPeer` is another broker's listener, over a socket.  :class:`Peers`
holds both behind one lookup (``broker.peer(node_id)``): the local peer for this node, a network peer per other node
of the address book (:meth:`Peers.set_address`), which the cluster fills in.  A peer that cannot be reached, or
answers nothing within ``request.timeout.ms``, raises :class:`PeerUnavailable`, which carries the retriable Kafka
error callers answer or retry with (NETWORK_EXCEPTION, REQUEST_TIMED_OUT).
"""
from __future__ import annotations

import logging
from typing import Protocol

import trio

from trireme.wire import error_codes as E
from trireme.wire import headers

from . import dispatch

log = logging.getLogger("trireme.peers")

CLIENT_ID = "trireme-broker"


class Peer(Protocol):
    async def call(self, api: str, version: int, request):
        """Send ``request`` (an object of ``{api}Request``) at ``version``; → the decoded response."""


class PeerUnavailable(Exception):
    """A broker-to-broker request got no answer: the peer could not be reached, the connection broke, or no answer
    came within the request timeout.  ``error_code``: the retriable Kafka error it stands for (NETWORK_EXCEPTION:
    disconnected, as Kafka's ``ClientResponse.wasDisconnected``; REQUEST_TIMED_OUT: timed out)."""

    def __init__(self, node_id: int, message: str, error_code: int = E.NETWORK_EXCEPTION.code):
        super().__init__(f"node {node_id}: {message}")
        self.node_id = node_id
        self.error_code = error_code


def handler_for(api: str, version: int):
    """The codecs of ``api`` (the handler this broker serves it with; our brokers serve the same versions)."""
    handler = dispatch.HANDLERS.get(dispatch.API_KEYS[api])
    if handler is None:              # a peer used outside a broker (a test, a tool): the handlers not imported yet
        dispatch.load_handlers()
        handler = dispatch.HANDLERS[dispatch.API_KEYS[api]]
    if not handler.min_version <= version <= handler.max_version:
        raise ValueError(f"{api} v{version} is not served ({handler.min_version}-{handler.max_version})")
    return handler


def encode_request(handler, version: int, correlation_id: int, request) -> bytearray:
    """A request frame without its size prefix: the request header, then the body."""
    head = headers.encode_request_header(handler.api_key, version, correlation_id, CLIENT_ID,
                                         handler.request.is_flexible(version))
    return bytearray(head + handler.request.encode_bytes(request, version))


def response_header_version(handler, version: int) -> int:
    return headers.response_header_version(handler.api_key, handler.response.is_flexible(version))


def decode_response(handler, version: int, data, correlation_id: int):
    """A response frame (without its size prefix) → the decoded response; ValueError if it answers another request."""
    got, size = headers.decode_response_header(data, response_header_version(handler, version))
    if got != correlation_id:
        raise ValueError(f"correlation id {got} != {correlation_id}")
    return handler.response.decode(memoryview(data), version, size)[0]


class Peers:
    """The "peer for node id" lookup: the local peer for this node; for another node, one network peer (one
    connection) per address of the address book, made on first use and run in :meth:`run`'s task group."""

    def __init__(self, node_id: int, local: Peer, make_network_peer):
        self.node_id = node_id
        self.local = local
        self._make = make_network_peer          # (node id, host, port, nursery) → NetworkPeer
        self.addresses: dict[int, tuple[str, int]] = {}
        self._network: dict[int, Peer] = {}
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """The task group the network peers' connections run in, until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                self._nursery = None
                for peer in self._network.values():
                    peer.close()

    def set_address(self, node_id: int, host: str, port: int) -> None:
        """Where ``node_id``'s inter-broker listener is; a changed address closes the connection to the old one."""
        if self.addresses.get(node_id) == (host, port):
            return
        self.addresses[node_id] = (host, port)
        old = self._network.pop(node_id, None)
        if old is not None:
            old.close()

    def peer(self, node_id: int) -> Peer:
        """The peer that sends requests to ``node_id``; PeerUnavailable for a node without an address (Kafka's
        marker channel keeps such requests for a broker it does not know yet, and retries them)."""
        if node_id == self.node_id:
            return self.local
        peer = self._network.get(node_id)
        if peer is None:
            if node_id not in self.addresses:
                raise PeerUnavailable(node_id, "no address known for this node")
            if self._nursery is None:
                raise PeerUnavailable(node_id, "broker-to-broker connections are not running")
            peer = self._network[node_id] = self._make(node_id, *self.addresses[node_id], self._nursery)
        return peer
