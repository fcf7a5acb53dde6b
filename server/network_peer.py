"""Sends broker-to-broker requests to another broker's listener over one reused connection, pipelined, as Kafka's inter-broker NetworkClient does.

One :class:`NetworkPeer` per destination node: one connection, opened on first use (TLS and SASL as the destination
listener needs, :class:`PeerSecurity`), requests written in order with their correlation ids and answered in that
order (a response for any other request than the oldest one waiting breaks the connection, as Kafka's
NetworkClient's correlation check).  At most ``max_in_flight`` requests are in flight; a request not answered within
``request.timeout.ms`` (counted from the call, including its wait for a slot and a connection) raises
:class:`~trireme.server.peers.PeerUnavailable` with REQUEST_TIMED_OUT and closes the connection (answers come in
order, so a late one would hold up the rest; Kafka's NetworkClient disconnects too); a connection that cannot be
opened or breaks raises it with NETWORK_EXCEPTION for every request waiting on it, and the next connection is tried
no sooner than 50 ms later (the reconnect backoff of Kafka's marker channel).  No ApiVersions is sent, as Kafka's
marker channel does not discover versions either: our brokers serve the same versions, and every request sent here
is at a version Kafka 4 keeps (WriteTxnMarkers v1-2, AddPartitionsToTxn v5, DescribeProducers v0); an unsupported
version is answered by the destination like any client's (UNSUPPORTED_VERSION), which callers already handle.
Kafka's inter-broker channels keep one request in flight and batch what waits (all markers for a broker in one
request); the coordinator here sends one request per transaction and leader, so the connection pipelines instead.
"""
from __future__ import annotations

import dataclasses
import itertools
import logging
import socket
import ssl
import time
from collections import deque

import trio

from trireme.wire import error_codes as E
from trireme.wire.codec import message
from trireme.wire.primitives import INT32

from . import tls
from .authentication import ListenerSasl, SaslConfigError
from .config import ConfigError
from .peers import PeerUnavailable, decode_response, encode_request, handler_for
from .sasl_mechanisms import CLIENT_MECHANISMS, SaslClientError, client_tokens

log = logging.getLogger("trireme.network_peer")

RECONNECT_BACKOFF_S = 0.05           # after a failed connection (Kafka's marker channel: 50 ms, no growth)
MAX_IN_FLIGHT = 64                   # requests on one connection at once; further calls wait for a slot
MAX_RESPONSE_BYTES = 100 * 1024 * 1024   # a size prefix above this is no answer of ours: the connection is broken
READ_CHUNK = 65536

_HANDSHAKE = message("SaslHandshakeRequest").cls
_AUTHENTICATE = message("SaslAuthenticateRequest").cls
# A connection that failed: closed, reset, a TLS error, a frame that is no answer of ours (ValueError).
_STREAM_FAILED = (trio.BrokenResourceError, trio.ClosedResourceError, OSError, ssl.SSLError, ValueError)


@dataclasses.dataclass(frozen=True)
class PeerSecurity:
    """How to reach a listener: its security protocol, the TLS context (SSL, SASL_SSL) and the SASL mechanism and
    credentials (SASL_PLAINTEXT, SASL_SSL: PLAIN or SCRAM-SHA-256/512) the broker authenticates with."""

    protocol: str = "PLAINTEXT"
    ssl_context: ssl.SSLContext | None = None
    sasl_mechanism: str | None = None
    username: str | None = None
    password: str | None = dataclasses.field(default=None, repr=False)


PLAINTEXT = PeerSecurity()


def inter_broker_security(config) -> PeerSecurity:
    """How this broker reaches other brokers: as its own inter-broker listener (``inter.broker.listener.name`` /
    ``security.inter.broker.protocol``) is secured, since every broker of a cluster has the same one (Kafka's
    assumption).  SASL: ``sasl.mechanism.inter.broker.protocol``, with the username and password of that listener's
    JAAS entry for the mechanism.  ConfigError when the settings cannot work."""
    name = config.inter_broker_listener
    spec = next((s for s in config.listeners if s.name == name), None)
    protocol = spec.security_protocol if spec is not None else "PLAINTEXT"
    context = tls.client_context(config, name) if protocol in ("SSL", "SASL_SSL") else None
    if protocol not in ("SASL_PLAINTEXT", "SASL_SSL"):
        return PeerSecurity(protocol, context)
    mechanism = str(config["sasl.mechanism.inter.broker.protocol"]).strip().upper()
    try:
        module = ListenerSasl(config, name).jaas.get(mechanism)
    except SaslConfigError as e:
        raise ConfigError(str(e)) from None
    options = module.options if module is not None else {}
    if mechanism not in CLIENT_MECHANISMS or "username" not in options or "password" not in options:
        raise ConfigError(f"sasl.mechanism.inter.broker.protocol={mechanism}: a broker authenticates to listener "
                          f"{name} with PLAIN or SCRAM-SHA-256/512 and the username and password options of "
                          f"listener.name.{name.lower()}.{mechanism.lower()}.sasl.jaas.config")
    return PeerSecurity(protocol, context, mechanism, options["username"], options["password"])


class _Waiter:
    __slots__ = ("event", "data")

    def __init__(self):
        self.event = trio.Event()
        self.data: bytearray | None = None


class _Channel:
    """One open connection: frames written under a lock, answers read by :meth:`read_loop` in send order."""

    def __init__(self, node_id: int, stream, session_ends: float | None):
        self.node_id = node_id
        self.stream = stream
        self.session_ends = session_ends       # SASL session lifetime (KIP-368): a new connection after it
        self.closed = False
        self._send_lock = trio.Lock()
        self._sent: deque[tuple[int, _Waiter]] = deque()
        self._buffer = bytearray()

    async def exchange(self, frame: bytearray, correlation_id: int) -> bytearray:
        waiter = _Waiter()
        async with self._send_lock:
            if self.closed:
                raise PeerUnavailable(self.node_id, "connection closed")
            self._sent.append((correlation_id, waiter))     # before the send: its answer may come before it returns
            try:
                await self.stream.send_all(INT32.pack(len(frame)) + frame)
            except BaseException:
                self.close()                  # a frame cut short (a failure, a timeout) leaves the stream unusable
                raise
        await waiter.event.wait()
        if waiter.data is None:
            raise PeerUnavailable(self.node_id, "connection closed before the answer")
        return waiter.data

    async def read_frame(self) -> bytearray | None:
        """The next size-prefixed frame (without the prefix); None at the end of the stream."""
        while True:
            if len(self._buffer) >= 4:
                size = INT32.unpack_from(self._buffer, 0)[0]
                if not 0 <= size <= MAX_RESPONSE_BYTES:
                    raise ValueError(f"response size {size}")
                if len(self._buffer) >= 4 + size:
                    frame = self._buffer[4:4 + size]
                    del self._buffer[:4 + size]
                    return frame
            chunk = await self.stream.receive_some(READ_CHUNK)
            if not chunk:
                return None
            self._buffer += chunk

    async def read_loop(self) -> None:
        try:
            while True:
                frame = await self.read_frame()
                if frame is None or len(frame) < 4:
                    break
                got = INT32.unpack_from(frame, 0)[0]
                if not self._sent or self._sent[0][0] != got:
                    log.warning("node %d answered correlation id %d, expected %s: closing the connection",
                                self.node_id, got, self._sent[0][0] if self._sent else "none")
                    break
                _, waiter = self._sent.popleft()
                waiter.data = frame
                waiter.event.set()
        except _STREAM_FAILED as e:
            if not self.closed:
                log.info("connection to node %d broke: %s", self.node_id, e)
        finally:
            self.close()
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(self.stream)

    def close(self) -> None:
        """Fail every request waiting for an answer; the read loop closes the stream."""
        self.closed = True
        while self._sent:
            self._sent.popleft()[1].event.set()
        # wake the read loop (it owns the stream's close): a socket shut for reading and writing ends its wait
        stream = self.stream.transport_stream if isinstance(self.stream, trio.SSLStream) else self.stream
        try:
            stream.socket.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class NetworkPeer:
    """Requests to the broker ``node_id`` at ``host``:``port`` (the :class:`~trireme.server.peers.Peer` interface);
    its connection's reader runs in ``nursery``."""

    def __init__(self, node_id: int, host: str, port: int, nursery: trio.Nursery, *, request_timeout_s: float,
                 security: PeerSecurity = PLAINTEXT, max_in_flight: int = MAX_IN_FLIGHT, metrics=None):
        self.node_id = node_id
        self.host, self.port = host, port
        self.request_timeout_s = request_timeout_s
        self.security = security
        self.metrics = metrics
        self._nursery = nursery
        self._slots = trio.Semaphore(max_in_flight)
        self._connect_lock = trio.Lock()
        self._channel: _Channel | None = None
        self._retry_at = 0.0
        self._correlation = itertools.count(1)     # int32 on the wire: taken modulo 2**31 (_next_id)

    async def call(self, api: str, version: int, request):
        """Send ``request`` (an object of ``{api}Request``) at ``version`` → the decoded response; PeerUnavailable
        (NETWORK_EXCEPTION or REQUEST_TIMED_OUT) when no answer comes.  Its time shows as the ``peer`` phase of the
        API in trireme_request_phase_seconds_total."""
        handler = handler_for(api, version)
        correlation_id = self._next_id()
        frame = encode_request(handler, version, correlation_id, request)
        started = time.perf_counter()
        channel = data = None
        with trio.move_on_after(self.request_timeout_s):
            async with self._slots:
                channel = await self._connected()
                try:
                    data = await channel.exchange(frame, correlation_id)
                except _STREAM_FAILED as e:
                    channel.close()
                    raise PeerUnavailable(self.node_id, f"connection broke: {e}") from None
        if data is None:
            if channel is not None:
                channel.close()             # answers come in order: a late one would hold up every later request
            raise PeerUnavailable(self.node_id, f"{api} not answered within {self.request_timeout_s * 1000:.0f} ms",
                                  E.REQUEST_TIMED_OUT.code)
        if self.metrics is not None:
            self.metrics.observe_phase(api, "peer", time.perf_counter() - started)
        try:
            return decode_response(handler, version, data, correlation_id)
        except ValueError as e:             # CodecError: not an answer of ours; what follows cannot be trusted either
            channel.close()
            raise PeerUnavailable(self.node_id, f"{api} answer cannot be read: {e}") from None

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()

    def _next_id(self) -> int:
        return next(self._correlation) % 2**31

    async def _connected(self) -> _Channel:
        async with self._connect_lock:
            channel = self._channel
            if channel is not None and not channel.closed and (
                    channel.session_ends is None or trio.current_time() < channel.session_ends):
                return channel
            if channel is not None:
                channel.close()
            await trio.sleep_until(self._retry_at)
            try:
                channel = await self._connect()
            except (OSError, trio.BrokenResourceError, ssl.SSLError, ValueError, PeerUnavailable) as e:
                self._retry_at = trio.current_time() + RECONNECT_BACKOFF_S
                log.info("cannot connect to node %d at %s:%d: %s", self.node_id, self.host, self.port, e)
                if isinstance(e, PeerUnavailable):
                    raise
                raise PeerUnavailable(self.node_id, f"cannot connect to {self.host}:{self.port}: {e}") from None
            self._channel = channel
            self._nursery.start_soon(channel.read_loop)
            return channel

    async def _connect(self) -> _Channel:
        stream = await trio.open_tcp_stream(self.host, self.port)
        try:
            security = self.security
            if security.protocol in ("SSL", "SASL_SSL"):
                stream = trio.SSLStream(stream, security.ssl_context, server_hostname=self.host,
                                        https_compatible=True)
                await stream.do_handshake()
            channel = _Channel(self.node_id, stream, None)
            if security.protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
                lifetime_ms = await self._authenticate(channel)
                if lifetime_ms:
                    channel.session_ends = trio.current_time() + lifetime_ms / 1000 * 0.9
            return channel
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise

    # --- SASL (Kafka's SaslClientAuthenticator: SaslHandshake v1, then SaslAuthenticate rounds) ----------------

    async def _round_trip(self, channel: _Channel, api: str, version: int, request):
        """One request and its answer on a connection whose read loop has not started (authentication)."""
        handler = handler_for(api, version)
        correlation_id = self._next_id()
        frame = encode_request(handler, version, correlation_id, request)
        await channel.stream.send_all(INT32.pack(len(frame)) + frame)
        data = await channel.read_frame()
        if data is None:
            raise PeerUnavailable(self.node_id, f"connection closed during {api}")
        return decode_response(handler, version, data, correlation_id)

    async def _authenticate(self, channel: _Channel) -> int:
        """Authenticate with the broker's credentials → the session lifetime in ms (0: none)."""
        mechanism = self.security.sasl_mechanism
        answer = await self._round_trip(channel, "SaslHandshake", 1, _HANDSHAKE(mechanism=mechanism))
        if answer.error_code:
            raise PeerUnavailable(self.node_id, f"SASL mechanism {mechanism} refused "
                                                f"({E.for_code(answer.error_code).name}; offered: "
                                                f"{', '.join(answer.mechanisms)})")
        rounds = client_tokens(mechanism, self.security.username, self.security.password)
        token = next(rounds)
        while True:
            answer = await self._round_trip(channel, "SaslAuthenticate", 2, _AUTHENTICATE(auth_bytes=token))
            if answer.error_code:
                raise PeerUnavailable(self.node_id, f"SASL authentication failed: {answer.error_message}")
            try:
                token = rounds.send(bytes(answer.auth_bytes))
            except StopIteration:
                return answer.session_lifetime_ms
            except SaslClientError as e:
                raise PeerUnavailable(self.node_id, f"SASL {mechanism} exchange failed: {e}") from None

