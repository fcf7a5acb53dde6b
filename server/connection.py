"""One client connection: reads size-prefixed frames, dispatches them, and writes responses back in request order.

Requests are read and dispatched one after another, so appends from one connection land in
the order they were sent.  A handler that has to wait (acks=all for the fsync, a long-polling
fetch) returns a Deferred; its wait runs in a task of its own while the next requests are read,
so a client's pipelined produce requests share one fsync.  The writer sends responses strictly
in request order.  Anything a client can send that is not a well-formed request — garbage, an
oversized or truncated frame, an unknown API key — closes this connection with a log line and
touches nothing else.
"""
from __future__ import annotations

import inspect
import itertools
import logging
import os
import re
import time
import traceback

import trio

from trireme.wire import error_codes as E
from trireme.wire import headers
from trireme.wire.codec import message
from trireme.wire.primitives import INT32, CodecError

from . import dispatch
from .deferred import Deferred
from .dispatch import RequestContext

log = logging.getLogger("trireme.connection")

MAX_IN_FLIGHT = 64
READ_CHUNK = 256 * 1024
_API_VERSIONS = message("ApiVersionsResponse")
_IOV_MAX = 1024

_ids = itertools.count(1)

# Set TRIREME_CAPTURE_DIR to keep the first request and response body of every (API, version,
# client) seen: how golden vectors are captured from real clients (tools/capture_vectors.md).
CAPTURE_DIR = os.environ.get("TRIREME_CAPTURE_DIR")


def _capture(api: str, version: int, client: str | None, kind: str, body: bytes) -> None:
    if len(body) > 16384:
        return      # vectors stay small; the next smaller message of this kind is kept instead
    name = re.sub(r"[^A-Za-z0-9]+", "-", (client or "unknown")).strip("-").lower()
    path = os.path.join(CAPTURE_DIR, api, f"v{version}_{name}_{kind}.hex")
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(body.hex() + "\n")


class CloseConnection(Exception):
    """The client sent something that ends this connection; the message goes to the log."""


class _Pending:
    """A response slot in the in-order queue whose value a Deferred fills later."""

    __slots__ = ("event", "value", "header", "codec", "started")

    def __init__(self, header, codec, started: float):
        self.event = trio.Event()
        self.value = None
        self.header = header
        self.codec = codec
        self.started = started


class FrameReader:
    """Size-prefixed frames from a stream; large frames are received straight into their own buffer."""

    def __init__(self, stream: trio.SocketStream, max_size: int):
        self.stream = stream
        self.max_size = max_size
        self.buf = bytearray()
        self.started = 0.0

    async def _fill(self, want: int) -> bool:
        while len(self.buf) < want:
            data = await self.stream.receive_some(READ_CHUNK)
            if not data:
                if self.buf:
                    raise CloseConnection(f"connection closed inside a frame ({len(self.buf)} bytes of "
                                          f"{want} received)")
                return False
            self.buf += data
        return True

    async def read_frame(self) -> bytearray | None:
        if not await self._fill(4):
            return None
        self.started = time.perf_counter()        # the frame's size is known: receiving it starts
        size = INT32.unpack_from(self.buf, 0)[0]
        if size < 0 or size > self.max_size:
            raise CloseConnection(f"frame of {size} bytes is over socket.request.max.bytes={self.max_size}"
                                  if size > 0 else f"frame with negative size {size}")
        total = 4 + size
        if len(self.buf) >= total:
            frame = self.buf[4:total]
            del self.buf[:total]
            return frame
        frame = bytearray(size)
        have = len(self.buf) - 4
        frame[:have] = memoryview(self.buf)[4:]
        self.buf.clear()
        view = memoryview(frame)
        sock = self.stream.socket
        while have < size:
            n = await sock.recv_into(view[have:])
            if n == 0:
                raise CloseConnection(f"connection closed inside a frame ({have} bytes of {size} received)")
            have += n
        return frame


class Connection:
    def __init__(self, stream: trio.SocketStream, broker, peer: str):
        self.id = next(_ids)
        self.stream = stream
        self.broker = broker
        self.peer = peer
        self.principal = "User:ANONYMOUS"
        self.client_id: str | None = None
        self.client_software_name: str | None = None
        self.client_software_version: str | None = None
        self.reader_scope = trio.CancelScope()
        self.requests = 0

    def _log_fields(self) -> str:
        return (f"conn={self.id} peer={self.peer} client_id={self.client_id!r} "
                f"software={self.client_software_name}/{self.client_software_version}")

    async def run(self) -> None:
        log.info("connection open conn=%d peer=%s", self.id, self.peer)
        reason = "closed by client"
        try:
            async with trio.open_nursery() as nursery:
                send, receive = trio.open_memory_channel(MAX_IN_FLIGHT)
                nursery.start_soon(self._write_responses, receive)
                async with send:
                    with self.reader_scope:
                        reason = await self._read_requests(send, nursery)
                    if self.reader_scope.cancelled_caught:
                        reason = "server shutting down"
        except* CloseConnection as group:
            reason = "; ".join(str(e) for e in group.exceptions)
            log.warning("closing connection: %s %s", reason, self._log_fields())
        except* (trio.BrokenResourceError, trio.ClosedResourceError, ConnectionError) as group:
            reason = f"connection lost: {group.exceptions[0]!r}"
        finally:
            with trio.CancelScope(shield=True):
                try:
                    await self.stream.aclose()
                except Exception:
                    pass
            log.info("connection close %s requests=%d reason=%r", self._log_fields(), self.requests, reason)

    async def _read_requests(self, send, nursery) -> str:
        reader = FrameReader(self.stream, self.broker.config["socket.request.max.bytes"])
        while True:
            frame = await reader.read_frame()
            if frame is None:
                return "closed by client"
            self.requests += 1
            item = await self._dispatch(frame, nursery, reader.started)
            if item is not None:
                await send.send(item)

    async def _dispatch(self, frame: bytearray, nursery, received: float):
        """Decode and handle one request → what the writer should send (or None); ``received`` is when its frame
        began to arrive (``time.perf_counter()``)."""
        dispatched = time.perf_counter()
        try:
            api_key, api_version = headers.peek_api(frame)
        except CodecError as e:
            raise CloseConnection(str(e)) from None
        handler = dispatch.HANDLERS.get(api_key)
        if handler is None:
            raise CloseConnection(f"unknown API key {api_key} (version {api_version})")
        legacy = dispatch.LEGACY.get(api_key)
        if legacy is not None and legacy.min_version <= api_version <= legacy.max_version:
            handler = legacy
        request_codec = handler.request
        if not handler.min_version <= api_version <= handler.max_version:
            if api_key == headers.API_VERSIONS_KEY:
                return self._api_versions_fallback(frame)
            raise CloseConnection(f"{handler.name} v{api_version} is not a version of this API that we "
                                  f"serve ({handler.min_version}-{handler.max_version})")
        try:
            header = headers.decode_request_header(frame, request_codec.is_flexible(api_version))
        except CodecError as e:
            raise CloseConnection(f"bad {handler.name} request header: {e}") from None
        self.client_id = header.client_id
        try:
            request, _ = request_codec.decode(memoryview(frame), api_version, header.size)
        except CodecError as e:
            raise CloseConnection(f"malformed {handler.name} v{api_version} request: {e}") from None
        if CAPTURE_DIR:
            _capture(handler.name, api_version, self.client_software_name or header.client_id,
                     "request", bytes(frame[header.size:]))
        ctx = RequestContext(self.broker, api_key, api_version, header.correlation_id, header.client_id,
                             self.principal, self, frame)
        started = time.perf_counter()
        try:
            result = handler.fn(ctx, request)
            if inspect.isawaitable(result):
                result = await result
        except CloseConnection:
            raise
        except Exception:
            log.error("handler %s v%d failed %s\n%s", handler.name, api_version, self._log_fields(),
                      traceback.format_exc())
            raise CloseConnection(f"internal error in {handler.name}") from None
        metrics = self.broker.metrics
        metrics.observe_request(handler.name, time.perf_counter() - started)
        metrics.observe_phase(handler.name, "receive", dispatched - received)
        if isinstance(result, Deferred):
            pending = _Pending(header, handler.response, received)
            nursery.start_soon(self._complete, pending, result, handler)
            return pending
        if result is None:
            metrics.observe_latency(handler.name, time.perf_counter() - received)
            return None
        return (header, result, handler.response, received)

    async def _complete(self, pending: _Pending, deferred: Deferred, handler) -> None:
        started = time.perf_counter()
        try:
            pending.value = await deferred.wait()
            self.broker.metrics.observe_phase(handler.name, "wait", time.perf_counter() - started)
        except Exception:
            log.error("deferred %s failed %s\n%s", handler.name, self._log_fields(), traceback.format_exc())
            raise CloseConnection(f"internal error in {handler.name}") from None
        pending.event.set()

    def _api_versions_fallback(self, frame) -> tuple:
        """A version of ApiVersions we don't know: answer in v0 layout with E.UNSUPPORTED_VERSION.code and, as
        Kafka, only ApiVersions' own range, so the client retries with one we have (the header is v1-shaped in
        every version)."""
        correlation_id = INT32.unpack_from(frame, 4)[0]
        body = _API_VERSIONS.cls(error_code=E.UNSUPPORTED_VERSION.code,
                                 api_keys=[e for e in api_version_entries(_API_VERSIONS.cls.ApiVersion)
                                           if e.api_key == headers.API_VERSIONS_KEY])
        return ("raw", correlation_id, 0, _API_VERSIONS.encode(body, 0))

    async def _write_responses(self, receive) -> None:
        async with receive:
            async for item in receive:
                if isinstance(item, _Pending):
                    await item.event.wait()
                    if item.value is None:
                        continue
                    item = (item.header, item.value, item.codec, item.started)
                ready = time.perf_counter()
                if item[0] == "raw":
                    _, correlation_id, header_version, body = item
                else:
                    header, response, codec, _ = item
                    correlation_id = header.correlation_id
                    header_version = headers.response_header_version(
                        header.api_key, codec.is_flexible(header.api_version))
                    body = codec.encode(response, header.api_version)
                    if CAPTURE_DIR:
                        _capture(codec.name[: -len("Response")], header.api_version,
                                 self.client_software_name or header.client_id, "response", b"".join(body))
                head = headers.encode_response_header(correlation_id, header_version)
                size = len(head) + sum(len(b) for b in body)
                if len(body) == 1:
                    await self.stream.send_all(b"".join((INT32.pack(size), head, body[0])))
                else:
                    body[0] = b"".join((INT32.pack(size), head, body[0]))
                    await self._send_vectored(body)
                if item[0] != "raw":
                    api, sent = item[2].name[:-len("Response")], time.perf_counter()
                    self.broker.metrics.observe_phase(api, "respond", sent - ready)
                    self.broker.metrics.observe_latency(api, sent - item[3])

    async def _send_vectored(self, buffers: list) -> None:
        """Send header pieces and stored record bytes with sendmsg, without joining them first."""
        views = [memoryview(b) for b in buffers if len(b)]
        sock = self.stream.socket
        first = 0
        while first < len(views):
            sent = await sock.sendmsg(views[first:first + _IOV_MAX])
            while sent:
                head = views[first]
                if sent >= len(head):
                    sent -= len(head)
                    first += 1
                else:
                    views[first] = head[sent:]
                    sent = 0


def api_version_entries(entry_cls) -> list:
    return [entry_cls(api_key=key, min_version=low, max_version=high)
            for key, (low, high) in dispatch.advertised_versions().items()]
