"""A blocking Kafka admin client for the command line: our own ``wire`` codec over plain sockets, one connection per broker.

Each connection starts with ApiVersions (after the TLS handshake on an SSL listener; followed by
SaslHandshake and SaslAuthenticate on a SASL one, see ``security.py``); a call names the versions its caller's code was written
for and uses the highest one the broker serves too.  Requests go where Kafka's admin client sends
them: Metadata to any broker, group and transaction calls to the coordinator FindCoordinator names,
ListOffsets, DescribeProducers and WriteTxnMarkers to the partition's leader.
"""
from __future__ import annotations

import itertools
import socket
import struct
import time
from typing import Any, Callable, Iterable, TypeVar

from trireme import __version__
from trireme.wire import error_codes as E
from trireme.wire import headers
from trireme.wire.codec import message
from trireme.wire.primitives import CodecError
from trireme.wire.schema import api_names

CLIENT_ID = "trireme-admin"
API_KEYS = {name: key for key, name in api_names().items()}
GROUP, TRANSACTION = 0, 1                     # FindCoordinator key types
_SIZE = struct.Struct(">i")
_MAX_RESPONSE = 256 << 20

T = TypeVar("T")


class AdminError(Exception):
    """A failure the command line reports with its message (exit status 1)."""


class KafkaCodeError(AdminError):
    """A Kafka error code in a response, with what was being done."""

    def __init__(self, what: str, code: int, message: str | None = None):
        self.error = E.for_code(code)
        detail = f": {message}" if message else ""
        super().__init__(f"{what}: {self.error.name}{detail}")


def check(code: int, what: str, message: str | None = None) -> None:
    """Raise :class:`KafkaCodeError` unless ``code`` is 0."""
    if code:
        raise KafkaCodeError(what, code, message)


def request_class(api: str) -> type:
    """The ``{api}Request`` class; its nested structs are attributes (``request_class("Metadata").MetadataRequestTopic``)."""
    return message(api + "Request").cls


def request(api: str, **fields) -> Any:
    return request_class(api)(**fields)


def encode_request(api: str, version: int, obj: Any, correlation_id: int, client_id: str | None = CLIENT_ID,
                   codec_name: str | None = None) -> bytes:
    """A whole request frame (size, header, body) of ``api`` at ``version``; ``codec_name``: another message's
    codec for the body (the compat tests' malformed requests)."""
    codec = message(codec_name or api + "Request")
    head = headers.encode_request_header(API_KEYS[api], version, correlation_id, client_id,
                                         codec.is_flexible(version))
    body = head + codec.encode_bytes(obj, version)
    return _SIZE.pack(len(body)) + body


def decode_response(api: str, version: int, payload: bytes, codec_name: str | None = None,
                    header_version: int | None = None) -> tuple[int, Any]:
    """A response frame's payload (without its size) → (correlation id, the decoded response)."""
    codec = message(codec_name or api + "Response")
    if header_version is None:
        header_version = headers.response_header_version(API_KEYS[api], codec.is_flexible(version))
    correlation_id, end = headers.decode_response_header(payload, header_version)
    return correlation_id, codec.decode(memoryview(payload), version, end)[0]


def parse_host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.strip().rpartition(":")
    if not sep or not port.isdigit():
        raise AdminError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


class Connection:
    """One socket to one broker, speaking size-prefixed request/response frames in order."""

    def __init__(self, host: str, port: int, timeout: float, security=None):
        self.address = f"{host}:{port}"
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as e:
            raise AdminError(f"cannot connect to {self.address}: {e.strerror or e}") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            self.sock = security.wrap(sock, host) if security is not None else sock
        except BaseException:
            sock.close()
            raise
        self._correlation = itertools.count(1)
        self.versions: dict[int, tuple[int, int]] = {}
        self.security = security
        self.reauthenticate_at: float | None = None      # KIP-368: when the SASL session must be renewed
        response = self.send("ApiVersions", 3, request("ApiVersions", client_software_name=CLIENT_ID,
                                                          client_software_version=__version__))
        check(response.error_code, f"ApiVersions from {self.address}")
        self.versions = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
        if security is not None:
            try:
                self._authenticate()
            except BaseException:
                self.close()
                raise

    def _authenticate(self) -> None:
        """SaslHandshake + SaslAuthenticate on a SASL listener; a session lifetime the broker gives (KIP-368,
        connections.max.reauth.ms) is renewed on this connection at 85 % of it, before the request that would
        find it over, as Kafka's clients do."""
        lifetime_ms = self.security.authenticate(self)
        self.reauthenticate_at = time.monotonic() + lifetime_ms * 0.85 / 1000 if lifetime_ms else None

    def close(self) -> None:
        self.sock.close()

    def version(self, api: str, low: int, high: int) -> int:
        """The highest version in ``low..high`` that both the broker and our codec serve."""
        served = self.versions.get(API_KEYS[api])
        codec = message(api + "Request")
        if served is not None:
            version = min(high, served[1], codec.max_version)
            if version >= max(low, served[0]):
                return version
        shown = "not at all" if served is None else f"v{served[0]}-{served[1]}"
        raise AdminError(f"the broker at {self.address} serves {api} {shown}; this tool needs v{low}-{high}")

    def send(self, api: str, version: int, obj: Any) -> Any:
        """Send one request and wait for its response, decoded."""
        if self.reauthenticate_at is not None and time.monotonic() >= self.reauthenticate_at \
                and api not in ("SaslHandshake", "SaslAuthenticate"):
            self.reauthenticate_at = None
            self._authenticate()
        correlation_id = next(self._correlation)
        data = encode_request(api, version, obj, correlation_id)
        try:
            self.sock.sendall(data)
            (size,) = _SIZE.unpack(self._read(4))
            if not 0 <= size <= _MAX_RESPONSE:
                raise AdminError(f"{self.address} answered {api} with an implausible frame size {size}")
            frame = self._read(size)
        except socket.timeout:
            raise AdminError(f"no answer from {self.address} to {api} v{version} in time") from None
        except OSError as e:
            raise AdminError(f"connection to {self.address} failed during {api} v{version}: {e}") from None
        try:
            got, response = decode_response(api, version, frame)
            if got != correlation_id:
                raise AdminError(f"{self.address} answered correlation id {got}, expected {correlation_id}")
            return response
        except CodecError as e:
            raise AdminError(f"{self.address} sent a malformed {api} v{version} response: {e}") from None

    def _read(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(min(n - len(buf), 1 << 20))
            if not chunk:
                raise AdminError(f"{self.address} closed the connection (the broker could not serve the request)")
            buf += chunk
        return bytes(buf)


class Client:
    """Connections to a cluster found from its bootstrap servers, with the metadata that routes requests."""

    def __init__(self, bootstrap_servers: str, timeout: float = 30.0, security=None):
        """``security``: a :class:`~trireme.server.admin.security.ClientSecurity` (TLS, SASL) for every connection."""
        self.timeout = timeout
        self.security = security
        self._connections: dict[tuple[str, int], Connection] = {}
        self._bootstrap: Connection | None = None
        self.brokers: dict[int, tuple[str, int]] = {}
        errors = []
        for server in filter(None, (s.strip() for s in bootstrap_servers.split(","))):
            try:
                self._bootstrap = self._connect(parse_host_port(server))
                break
            except AdminError as e:
                errors.append(str(e))
        if self._bootstrap is None:
            raise AdminError("; ".join(errors) or "no bootstrap server given")

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for conn in self._connections.values():
            conn.close()
        self._connections.clear()

    def _connect(self, address: tuple[str, int]) -> Connection:
        conn = self._connections.get(address)
        if conn is None:
            conn = self._connections[address] = Connection(*address, self.timeout, self.security)
        return conn

    def connection(self, node: int | None = None) -> Connection:
        """The connection to broker ``node`` (the bootstrap connection for ``None``)."""
        if node is None:
            return self._bootstrap
        if node not in self.brokers:
            self.metadata([])
        if node not in self.brokers:
            raise AdminError(f"broker {node} is not in the cluster's metadata")
        return self._connect(self.brokers[node])

    def call(self, api: str, obj: Any, versions: tuple[int, int], node: int | None = None) -> Any:
        """Send ``obj`` to broker ``node`` at the highest version in ``versions`` it serves."""
        conn = self.connection(node)
        return conn.send(api, conn.version(api, *versions), obj)

    def retry(self, fn: Callable[[], T], also: tuple[E.KafkaError, ...] = ()) -> T:
        """``fn()``, again while it fails with a retriable Kafka error (a coordinator loading or moving) or one of
        ``also``, until the timeout."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                return fn()
            except KafkaCodeError as e:
                if not (e.error.retriable or e.error in also) or time.monotonic() > deadline:
                    raise
            time.sleep(0.2)

    # --- routing ------------------------------------------------------------------------------

    def metadata(self, topics: Iterable[str] | None = None) -> Any:
        """Metadata for ``topics`` (every topic for ``None``, none for ``[]``); refreshes the broker list."""
        cls = request_class("Metadata")
        wanted = None if topics is None else [cls.MetadataRequestTopic(name=t) for t in topics]
        response = self.call("Metadata", cls(topics=wanted, allow_auto_topic_creation=False), (1, 12))
        self.brokers = {b.node_id: (b.host, b.port) for b in response.brokers}
        return response

    def leaders(self, partitions: Iterable[tuple[str, int]],
                skip_unknown: bool = False) -> dict[int, list[tuple[str, int]]]:
        """Leader node → the given partitions it leads; an unknown topic or partition is an error (or left out)."""
        partitions = list(partitions)
        response = self.metadata(sorted({t for t, _ in partitions}))
        leader = {}
        for t in response.topics:
            if not (skip_unknown and t.error_code == E.UNKNOWN_TOPIC_OR_PARTITION.code):
                check(t.error_code, f"topic {t.name!r}")
            for p in t.partitions:
                leader[(t.name, p.partition_index)] = p.leader_id
        out: dict[int, list[tuple[str, int]]] = {}
        for tp in partitions:
            if tp not in leader:
                if skip_unknown:
                    continue
                raise KafkaCodeError(f"partition {tp[0]}-{tp[1]}", E.UNKNOWN_TOPIC_OR_PARTITION.code)
            if leader[tp] < 0:
                raise KafkaCodeError(f"partition {tp[0]}-{tp[1]}", E.LEADER_NOT_AVAILABLE.code)
            out.setdefault(leader[tp], []).append(tp)
        return out

    def coordinator(self, key: str, key_type: int) -> int:
        """The node id of the group (``GROUP``) or transaction (``TRANSACTION``) coordinator for ``key``."""
        def find() -> int:
            response = self.call("FindCoordinator", request("FindCoordinator", key_type=key_type,
                                                            coordinator_keys=[key]), (4, 6))
            (found,) = response.coordinators
            check(found.error_code, f"finding the coordinator of {key!r}", found.error_message)
            self.brokers.setdefault(found.node_id, (found.host, found.port))
            return found.node_id
        return self.retry(find)

    # --- offsets ------------------------------------------------------------------------------

    def list_offsets(self, partitions: Iterable[tuple[str, int]], timestamp: int,
                     skip_unknown: bool = False) -> dict[tuple[str, int], int]:
        """ListOffsets (read_uncommitted) at each partition's leader: ``timestamp`` -2 earliest, -1 latest, else the
        first offset with a timestamp at or after it (-1 when there is none)."""
        cls = request_class("ListOffsets")
        tcls = cls.ListOffsetsTopic
        out = {}
        for node, tps in self.leaders(partitions, skip_unknown).items():
            by_topic: dict[str, list[int]] = {}
            for t, p in tps:
                by_topic.setdefault(t, []).append(p)
            response = self.call("ListOffsets", cls(replica_id=-1, isolation_level=0, topics=[
                tcls(name=t, partitions=[tcls.ListOffsetsPartition(partition_index=p, timestamp=timestamp,
                                                                   current_leader_epoch=-1) for p in ps])
                for t, ps in by_topic.items()]), (2, 9), node)
            for t in response.topics:
                for p in t.partitions:
                    check(p.error_code, f"listing offsets of {t.name}-{p.partition_index}")
                    out[(t.name, p.partition_index)] = p.offset
        return out
