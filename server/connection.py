"""One client connection: reads size-prefixed frames, dispatches them, and writes responses back in request order.

Requests are read and dispatched one after another, so appends from one connection land in
the order they were sent.  A handler that has to wait (acks=all for the fsync, a long-polling
fetch) returns a Deferred; the reader goes on reading while the writer, which sends responses
strictly in request order, runs each Deferred's wait when its turn comes, so a client's pipelined
produce requests share one fsync.  The writer sends every answer that is ready with one
``sendmsg``.  Anything a client can send that is not a well-formed request — garbage, an
oversized or truncated frame, an unknown API key — closes this connection with a log line and
touches nothing else.

On PLAINTEXT and SASL_PLAINTEXT listeners the socket is read and written through its descriptor
(os.read/os.writev, the fast path); on SSL and SASL_SSL listeners :class:`TlsConnection` does the
bounded TLS handshake first and then reads and writes through trio's SSLStream, with the same
framing, budgets, deadlines and idle watchdog.
"""
from __future__ import annotations

import collections
import inspect
import itertools
import logging
import os
import re
import ssl
import time
import traceback

import trio

from trireme.wire import error_codes as E
from trireme.wire import headers
from trireme.wire.codec import message
from trireme.wire.primitives import INT32, CodecError

from . import authentication, dispatch, forwarding
from .deferred import Deferred
from .dispatch import CloseConnection, RequestContext
from .quotas import wait_throttled
from .tls import NoMatchingRule, peer_principal

log = logging.getLogger("trireme.connection")

MAX_IN_FLIGHT = 64
# What one read of a connection asks for.  Larger frames are read straight into their own buffer (_receive), so
# this only needs to hold a few pipelined small requests; above 128 KiB each read's buffer would be a fresh
# mmap (glibc), which cost 17 µs per read here against 4 µs at 64 KiB.
READ_CHUNK = 64 * 1024
GROW_MIN = 1 << 20          # a frame's buffer starts at this (or its size, if smaller) and then doubles
_API_VERSIONS = message("ApiVersionsResponse")
_IOV_MAX = 1024
# A client's burst of requests (Connection._burst_read) is waited for by the flusher only if its last one came whole
# within this: the Java producer's 4 requests after 4 answers come within 0.1-0.3 ms; a client that sends when
# its own batches fill (librdkafka's linger) is not waited for.
BURST_WINDOW_S = 0.0005
EOF_GRACE = 5.0             # seconds answers other than long polls may still take after the client's EOF
TLS_SEND_CHUNK = 256 * 1024     # plaintext bytes per SSLStream.send_all (the send deadline restarts after each)
TLS_CLOSE_TIMEOUT = 1.0     # seconds a TLS connection's close_notify may take before the socket is just closed

_ids = itertools.count(1)
_NEVER_HELD_BACK = frozenset((dispatch.API_KEYS["Produce"],))   # its answer is small whatever it carries
# An answer that grows with its request is taken to be up to this many times the request's size (a Fetch or
# ListOffsets naming many partitions answers 1.3-2.2 times the bytes that name them).
ANSWER_TO_REQUEST = 2

# Set TRIREME_CAPTURE_DIR to keep the first request and response body of every (API, version,
# client) seen: how golden vectors are captured from real clients (tools/capture_vectors.md).
CAPTURE_DIR = os.environ.get("TRIREME_CAPTURE_DIR")
# APIs whose bodies (either way) may carry a credential: a SASL token (PLAIN's password, SCRAM's proofs), a salted
# password, a delegation token's HMAC, a PASSWORD config's value.  Never captured; neither are SaslHandshake v0's raw
# tokens (the authenticator answers them before a request is decoded, so they never reach _capture).
NEVER_CAPTURED = frozenset(("SaslAuthenticate", "AlterUserScramCredentials", "CreateDelegationToken",
                            "RenewDelegationToken", "ExpireDelegationToken", "DescribeDelegationToken",
                            "AlterConfigs", "IncrementalAlterConfigs"))


def _capture(api: str, version: int, client: str | None, kind: str, body: bytes) -> None:
    if api in NEVER_CAPTURED:
        return
    if len(body) > 16384:
        return      # vectors stay small; the next smaller message of this kind is kept instead
    name = re.sub(r"[^A-Za-z0-9]+", "-", (client or "unknown")).strip("-").lower()
    path = os.path.join(CAPTURE_DIR, api, f"v{version}_{name}_{kind}.hex")
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(body.hex() + "\n")


class _Waiting:
    """A request in the in-order queue whose answer a Deferred gives later; the writer runs it in its turn."""

    __slots__ = ("deferred", "handler", "header", "charged", "received", "handled")

    def __init__(self, deferred: Deferred, handler, header, charged: int, received: float, handled: float):
        self.deferred = deferred
        self.handler = handler
        self.header = header
        self.charged = charged              # request budget bytes released when it completes
        self.received = received
        self.handled = handled              # when its handler returned: its wait phase starts there


class _Outgoing:
    """An encoded response: the buffers to send (size prefix first) and what they count against the budget."""

    __slots__ = ("buffers", "size", "api", "encode_seconds", "received")

    def __init__(self, buffers: list, size: int, api: str | None, encode_seconds: float, received: float | None):
        self.buffers = buffers
        self.size = size
        self.api = api
        self.encode_seconds = encode_seconds
        self.received = received            # when the request's frame began to arrive (request latency)


class FrameReader:
    """Size-prefixed frames from a stream.  A large frame's buffer grows as its bytes arrive, each step taken from
    the broker's request budget, and the whole frame must arrive within the receive deadline."""

    def __init__(self, conn: "Connection", max_size: int):
        self.conn = conn
        self.stream = conn.stream
        self.fd = conn.stream.socket.fileno()
        self.max_size = max_size
        self.limit_name = "socket.request.max.bytes"     # the property max_size comes from (SASL changes both)
        self.buf = bytearray()
        self.started = 0.0
        self.charged = 0                # request budget bytes the last frame took
        self.eof_reason = "closed by client"
        self.drained = True             # the last read took all the socket had (it returned less than asked)

    async def receive_some(self) -> bytes:
        """Up to READ_CHUNK bytes of the socket, waiting for them; b"" at EOF.

        The connection's read fast path, in place of trio's ``SocketStream.receive_some``, which always reads
        first and, when that fails with EAGAIN (the usual case for a client that waits for its answer),
        waits for readability and reads again.  After a short read the socket is most likely drained, so this
        waits first and reads once: one syscall and one exception fewer per request.  After a full read it
        reads again at once, with a checkpoint, so a client that keeps the socket full does not starve other
        tasks.  Errors are trio's: BrokenResourceError for the socket's, ClosedResourceError when the idle
        watchdog closes the wait."""
        if self.drained:
            await trio.lowlevel.wait_readable(self.fd)
        else:
            await trio.lowlevel.checkpoint()
        while True:
            try:
                data = os.read(self.fd, READ_CHUNK)
            except BlockingIOError:
                await trio.lowlevel.wait_readable(self.fd)
                continue
            except OSError as e:
                raise trio.BrokenResourceError(f"receive failed: {e!r}") from e
            self.drained = len(data) < READ_CHUNK
            return data

    async def _wait_prefix(self) -> bool:
        """Receive until a size prefix is buffered; False at EOF or when the connection was idle too long (the
        connection's idle watchdog then wakes this receive)."""
        conn = self.conn
        while len(self.buf) < 4:
            conn.waiting_since = trio.current_time()
            try:
                data = await self.receive_some()
            except trio.ClosedResourceError:
                if conn.idle:
                    self.eof_reason = f"idle for connections.max.idle.ms={conn.limits.idle_timeout * 1000:.0f}"
                    return False
                raise
            finally:
                conn.waiting_since = None
            if not data:
                if self.buf:
                    raise CloseConnection(f"connection closed inside a frame ({len(self.buf)} bytes of 4 received)")
                return False
            self.buf += data
        return True

    async def read_frame(self) -> bytearray | None:
        if not await self._wait_prefix():
            return None
        self.started = time.perf_counter()        # the frame's size is known: receiving it starts
        size = INT32.unpack_from(self.buf, 0)[0]
        if size < 0 or size > self.max_size:
            raise CloseConnection(f"frame of {size} bytes is over {self.limit_name}={self.max_size}"
                                  if size > 0 else f"frame with negative size {size}")
        total = 4 + size
        budget = self.conn.limits.requests
        if len(self.buf) >= total:
            frame = self.buf[4:total]
            del self.buf[:total]
            budget.take(size)
            self.charged = size
            return frame
        timeout = self.conn.limits.receive_timeout
        with trio.move_on_after(timeout):
            return await self._receive(size)
        self.conn.limits.count(self.conn.limits.closed, "receive timeout")
        raise CloseConnection(f"request frame of {size} bytes not received within "
                              f"trireme.request.receive.timeout.ms={timeout * 1000:.0f}")

    async def _receive(self, size: int) -> bytearray:
        """The rest of a frame of ``size`` bytes.  Its buffer is allocated once bytes beyond the prefix are
        readable (a size prefix alone pins nothing), at GROW_MIN (or the frame's size, if smaller), and doubles
        as bytes fill it; each allocation waits for room in the request budget."""
        conn = self.conn
        budget = conn.limits.requests
        have = len(self.buf) - 4
        if not have:
            await self._wait_readable(size)
        first = min(size, max(GROW_MIN, have))
        await budget.acquire(first, conn.request_bytes)
        self.charged = first
        conn.request_bytes += first
        try:
            frame = bytearray(first)
            frame[:have] = memoryview(self.buf)[4:]
            self.buf.clear()
            while have < size:
                if have == len(frame):
                    await self._wait_readable(size - have)
                    step = min(size, 2 * have) - have
                    await budget.acquire(step, conn.request_bytes)
                    self.charged += step
                    conn.request_bytes += step
                    frame += bytes(step)
                with memoryview(frame) as view, view[have:] as rest:
                    n = await self._recv_into(rest)
                if n == 0:
                    raise CloseConnection(f"connection closed inside a frame ({have} bytes of {size} received)")
                have += n
        except BaseException:
            conn.request_bytes -= self.charged
            budget.release(self.charged)
            self.charged = 0
            raise
        conn.request_bytes -= self.charged      # the caller charges the whole frame to the request
        self.drained = False                    # the next frame may have followed this one: read before waiting
        return frame

    async def _wait_readable(self, wanted: int) -> None:
        """Wait until bytes of the frame (``wanted`` more to come) can be received."""
        await trio.lowlevel.wait_readable(self.fd)

    async def _recv_into(self, view: memoryview) -> int:
        return await self.stream.socket.recv_into(view)


class TlsFrameReader(FrameReader):
    """FrameReader over the connection's SSLStream: records are decrypted by trio/OpenSSL, the framing and the
    budget and deadline rules are FrameReader's.  A TLS protocol error closes the connection (one log line); an EOF
    without close_notify is an EOF."""

    def __init__(self, conn: "TlsConnection", max_size: int):
        super().__init__(conn, max_size)
        self.tls = conn.tls_stream
        self._pending: bytes | None = None     # received by _wait_readable, for the next _recv_into

    async def receive_some(self, max_bytes: int = READ_CHUNK) -> bytes:
        """Up to ``max_bytes`` decrypted bytes (b"" at EOF): one SSLStream.receive_some, which yields one TLS record
        and a checkpoint, then whatever records it already buffered, taken without another trip through the
        scheduler (clients write many small records: one scheduler pass per record cost 4x the throughput)."""
        data = await self._receive_record(max_bytes)
        if data and len(data) < max_bytes:
            buffer = bytearray(max_bytes - len(data))
            n = self._buffered_into(buffer)
            if n:
                data = b"".join((data, memoryview(buffer)[:n]))
        return data

    async def _receive_record(self, max_bytes: int) -> bytes:
        """SSLStream.receive_some (one record's bytes at most): a TLS protocol error closes the connection with one
        log line, an EOF with or without close_notify is b""."""
        try:
            return await self.tls.receive_some(max_bytes)
        except trio.BrokenResourceError as e:
            cause = e.__cause__
            if cause is None or isinstance(cause, (ssl.SSLEOFError, ssl.SSLSyscallError, ssl.SSLZeroReturnError)):
                return b""
            if isinstance(cause, ssl.SSLError):
                raise CloseConnection(f"TLS error: {cause.reason or cause}") from None
            raise

    def _buffered_into(self, view) -> int:
        """Decrypted records already in trio's receive buffer, read into ``view`` without waiting → the bytes read:
        the same SSLObject.read SSLStream.receive_some makes, stopping where it would wait (an error is left for the
        next receive to raise)."""
        ssl_object = getattr(self.tls, "_ssl_object", None)     # trio's SSLStream keeps its SSLObject here
        if ssl_object is None:
            return 0                            # another trio: one record per receive, still correct
        done = 0
        with memoryview(view) as whole:
            while done < len(whole):
                try:
                    n = ssl_object.read(len(whole) - done, whole[done:])
                except ssl.SSLError:
                    break
                if not n:
                    break
                done += n
        return done

    async def _wait_readable(self, wanted: int) -> None:
        if self._pending is None:
            self._pending = await self.receive_some(min(wanted, READ_CHUNK))

    async def _recv_into(self, view: memoryview) -> int:
        """Into the frame's buffer: the bytes _wait_readable took, or one record, then the records already buffered
        decrypted straight into it."""
        data, self._pending = self._pending, None
        if data is None:
            data = await self._receive_record(min(len(view), 1 << 20))
        n = min(len(data), len(view))
        view[:n] = data[:n]
        if n < len(data):
            self._pending = data[n:]
            return n
        return n + self._buffered_into(view[n:]) if n else 0


class Connection:
    reader_class = FrameReader
    sends_inline = True         # the reader sends an answer ready at once itself (not over TLS: see _send_now)

    def __init__(self, stream: trio.SocketStream, broker, peer: str, listener=None):
        self.id = next(_ids)
        self.stream = stream
        self.broker = broker
        self.limits = broker.limits
        self.peer = peer
        self.host = peer.rpartition(":")[0].strip("[]")      # the client's IP address (ACL host)
        # The listener it came in on (server.listener.EndPoint: name, security_protocol, advertised address).
        self.listener = listener
        self.principal = "User:ANONYMOUS"
        self.tls_principal: str | None = None       # the client certificate's mapped principal (TLS listeners)
        self.unstable_api_versions = bool(broker.config["unstable.api.versions.enable"])
        self.client_id: str | None = None
        self.client_software_name: str | None = None
        self.client_software_version: str | None = None
        self.reader_scope = trio.CancelScope()
        self.requests = 0
        self.outstanding = 0            # requests read whose answer is not written yet
        # A burst (Broker.gather_burst): after a send of several produce answers, how many, and the produce requests
        # read since.
        self._burst_expected = 0
        self._burst_seen = 0
        self._burst_started = 0.0
        self.bursts_gathered = True     # this client's last burst came whole within BURST_WINDOW_S
        self.request_bytes = 0          # request budget bytes this connection holds
        self.response_bytes = 0         # response budget bytes this connection holds (encoded, unwritten)
        self._polls: set[trio.CancelScope] = set()     # long polls pending (Deferred.poll)
        self._tasks: trio.Nursery | None = None    # run()'s task group, while it runs (start_soon)
        self._queue: collections.deque = collections.deque()   # _Outgoing | _Waiting, in request order
        self._queued: trio.Event | None = None     # set when the writer, waiting for work, may go on
        self._room: trio.Event | None = None       # set when the reader, waiting for a queue slot, may go on
        self._reading_done = False
        self._closed = False                       # run() ended: nothing more is sent
        self._unsent = None                        # (views, batch, ready time): a send from a flush left these
        self._failure: BaseException | None = None     # what a send from a flush hit, for the writer to raise
        self._eof = False                          # the client's EOF (or idle): polls not yet started are skipped
        self.waiting_since: float | None = None    # trio time the reader began waiting for a request's bytes
        self.idle = False                          # the idle watchdog ended the wait for a request
        self.throttled_until = 0.0                 # trio time a quota mutes this connection until (server/quotas.py)
        self.authentication = authentication.for_connection(self)     # SASL state on a SASL listener, else None

    def _log_fields(self) -> str:
        return (f"conn={self.id} peer={self.peer} client_id={self.client_id!r} "
                f"software={self.client_software_name}/{self.client_software_version}")

    async def run(self) -> None:
        log.info("connection open conn=%d peer=%s", self.id, self.peer)
        reason = "closed by client"
        try:
            async with trio.open_nursery() as nursery:
                self._tasks = nursery
                nursery.start_soon(self._write_responses)
                watchdog = trio.CancelScope()
                nursery.start_soon(self._watch_idle, watchdog)
                try:
                    with self.reader_scope:
                        reason = await self._read_requests()
                    if self.reader_scope.cancelled_caught:
                        reason = "server shutting down"
                    else:
                        # EOF or idle: long polls end now instead of at their own deadlines; other
                        # answers (an acks=all produce waiting for its fsync) still go to a client that
                        # only half-closed, for up to EOF_GRACE.
                        self._eof = True
                        for scope in self._polls:
                            scope.cancel()
                        nursery.cancel_scope.deadline = trio.current_time() + EOF_GRACE
                finally:
                    watchdog.cancel()
                    self._reading_done = True       # the writer ends once the queue is empty
                    self._wake_writer()
        except* CloseConnection as group:
            reason = "; ".join(str(e) for e in group.exceptions)
            log.warning("closing connection: %s %s", reason, self._log_fields())
        except* (trio.BrokenResourceError, trio.ClosedResourceError, ConnectionError) as group:
            reason = f"connection lost: {group.exceptions[0]!r}"
        finally:
            self._closed = True
            self.broker.burst_ends(self)
            self.limits.requests.release(self.request_bytes)
            self.limits.responses.release(self.response_bytes)
            self.request_bytes = self.response_bytes = 0
            with trio.CancelScope(shield=True):
                await self._close_transport()
            log.info("connection close %s requests=%d reason=%r", self._log_fields(), self.requests, reason)

    def start_soon(self, fn) -> None:
        """Start ``async fn()`` now, in the connection's task group (ended with it): the part of a request's handling
        that must not wait for the answers before it, as a Deferred's wait does (the writer runs those in request
        order): a transactional Produce's implicit add and append (server/handlers/produce.py)."""
        self._tasks.start_soon(fn)

    def stop_reading(self) -> None:
        """The broker is shutting down: read no further request (those in flight still get their answers)."""
        self.reader_scope.cancel()

    async def _close_transport(self) -> None:
        try:
            await self.stream.aclose()
        except Exception:
            pass

    async def _watch_idle(self, scope: trio.CancelScope) -> None:
        """connections.max.idle.ms: wake the reader's receive (trio's notify_closing) once it has waited that long
        for a request with no answer outstanding.  One sleeping task per connection instead of a timeout per
        receive."""
        timeout = self.limits.idle_timeout
        with scope:
            while True:
                since = self.waiting_since
                now = trio.current_time()
                if since is not None and now - since >= timeout and not self.outstanding:
                    self.idle = True
                    self.limits.count(self.limits.closed, "idle")
                    trio.lowlevel.notify_closing(self.stream.socket)
                    return
                # checked every quarter period while busy: an idle connection is closed within 1.25 periods
                await trio.sleep(timeout / 4 if since is None or self.outstanding else since + timeout - now)

    async def _wait_for_room(self) -> None:
        """Back-pressure: read no new request while this connection holds its share of request memory, or its
        unwritten responses fill its share or the broker's response budget (Kafka mutes such a channel)."""
        limits = self.limits
        while True:
            while self.request_bytes >= limits.request_share:
                await limits.requests.wait_release()
            if self.response_bytes < limits.response_share and limits.responses.has_room(self.response_bytes):
                return
            await limits.responses.wait_release()

    async def _wait_for_answer_room(self, frame: bytearray) -> None:
        """The response budget as a hard cap on answers that grow with their request (Fetch, ListOffsets,
        OffsetFetch, Metadata naming many partitions or topics): such a request is handled once an answer of its
        size (ANSWER_TO_REQUEST times the request's) fits, and waits as the frame it is (the request budget holds
        it), not decoded.  Produce is not held back.  Fetch then cuts its records to the room left
        (handlers/fetch.py)."""
        try:
            api_key, _version = headers.peek_api(frame)
        except CodecError:
            return                  # _dispatch closes the connection
        if api_key in _NEVER_HELD_BACK:
            return
        limits = self.limits
        handler = dispatch.HANDLERS.get(api_key)
        limits.count(limits.response_waits, handler.name if handler is not None else str(api_key))
        await limits.room_for_answer(ANSWER_TO_REQUEST * len(frame), self.response_bytes)

    def _burst_read(self) -> None:
        """A produce request read after a send of several produce answers: the client may be sending as many
        again, one by one, to keep its window of requests in flight full (the Java producer does); while it does,
        and if its last burst came whole within BURST_WINDOW_S, the flusher waits for the rest of it, so that one
        fsync covers the whole burst (Broker.gather_burst)."""
        self._burst_seen += 1
        if self._burst_seen == 1:
            self._burst_started = time.perf_counter()
            if self.bursts_gathered:
                self.broker.burst_begins(self)
        if self._burst_seen == self._burst_expected:
            self.bursts_gathered = time.perf_counter() - self._burst_started < BURST_WINDOW_S
            self._burst_expected = 0
            self.broker.burst_ends(self)

    def _release_request(self, charged: int) -> None:
        self.request_bytes -= charged
        self.limits.requests.release(charged)

    def _wake_writer(self) -> None:
        if self._queued is not None:
            self._queued.set()
            self._queued = None

    async def _read_requests(self) -> str:
        reader = self.reader_class(self, self.broker.config["socket.request.max.bytes"])
        if self.authentication is not None:
            self.authentication.limit_frames(reader)
        queue = self._queue
        while True:
            await self._wait_for_room()
            while len(queue) >= MAX_IN_FLIGHT:
                self._room = trio.Event()
                await self._room.wait()
            frame = await reader.read_frame()
            if frame is None:
                return reader.eof_reason
            self.requests += 1
            if self._burst_expected and frame[:2] == b"\x00\x00":       # Produce (API key 0)
                self._burst_read()
            charged = reader.charged
            self.request_bytes += charged
            if self.throttled_until and not await wait_throttled(self):     # KIP-219 (server/quotas.py)
                return "throttled for longer than connections.max.idle.ms"
            try:
                if not self.limits.answer_fits(ANSWER_TO_REQUEST * len(frame), self.response_bytes):
                    await self._wait_for_answer_room(frame)
                item = await self._dispatch(frame, charged, reader.started)
            except BaseException:
                self._release_request(charged)
                raise
            if type(item) is not _Waiting:
                self._release_request(charged)      # the handler is done with the frame (a Deferred releases later)
            if item is not None:
                self.outstanding += 1
                queue.append(item)
                if type(item) is _Waiting and _waits_for_flush(item.deferred):
                    # Nothing to send before the next flush: the flush sends it (_send_ready), the
                    # writer is not woken.  A writer that is busy meanwhile gets to it anyway.
                    self.broker.call_on_next_wake(self._send_ready)
                elif not reader.buf and self.sends_inline:
                    # No more of the client's bytes are buffered: the reader now reads or waits, after a
                    # checkpoint at least, where the writer would send this answer alone; the reader sends it
                    # itself, one task switch fewer (an acks=1 produce, acks=all with Kafka's flush policy, any
                    # answer that is ready at once).
                    self._send_ready()
                else:
                    self._wake_writer()
            if self.authentication is not None and self.authentication.closing is not None:
                return await self.authentication.finish()     # a failed authentication: its answer, then close

    async def _dispatch(self, frame: bytearray, charged: int, received: float):
        """Decode and handle one request → what the writer should send (an _Outgoing, a _Waiting) or None.
        ``received`` is when its frame began to arrive (``time.perf_counter()``).  A Deferred releases the
        request's ``charged`` budget bytes when it completes."""
        dispatched = time.perf_counter()
        if self.authentication is not None and not self.authentication.passes:    # SASL, not (for good) authenticated
            verdict = await self.authentication.gate(frame)
            if verdict is not None:
                return None if verdict is authentication.NO_ANSWER else self._raw_token(verdict, received)
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
        if not handler.min_version <= api_version <= handler.enabled_max(self.unstable_api_versions):
            if api_key == headers.API_VERSIONS_KEY:
                return self._api_versions_fallback(frame)
            raise CloseConnection(f"{handler.name} v{api_version} is not a version of this API that we "
                                  f"serve ({handler.min_version}-{handler.enabled_max(self.unstable_api_versions)})")
        try:
            header = headers.decode_request_header(frame, request_codec.is_flexible(api_version))
        except CodecError as e:
            raise CloseConnection(f"bad {handler.name} request header: {e}") from None
        self.client_id = header.client_id
        if CAPTURE_DIR:
            _capture(handler.name, api_version, self.client_software_name or header.client_id,
                     "request", bytes(frame[header.size:]))
        ctx = RequestContext(self.broker, api_key, api_version, header.correlation_id, header.client_id,
                             self.principal, self, frame)
        started = time.perf_counter()
        try:
            result = dispatch.NOT_HANDLED if handler.fast is None else handler.fast(ctx, frame, header.size)
            if result is dispatch.NOT_HANDLED:
                try:
                    request, _ = request_codec.decode(memoryview(frame), api_version, header.size)
                except CodecError as e:
                    raise CloseConnection(f"malformed {handler.name} v{api_version} request: {e}") from None
                started = time.perf_counter()           # handler time: decoding is not the handler's
                if forwarding.is_forwarded(self.broker, api_key, request):
                    result = forwarding.forward(ctx, request)       # to the controller, in an Envelope
                else:
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
        handled = time.perf_counter()
        metrics.observe_request(handler.name, handled - started)
        metrics.observe_phase(handler.name, "receive", dispatched - received)
        if self.broker.quotas.enabled:
            result = self.broker.quotas.charge(self, handler.name, api_version, header.client_id, len(frame),
                                               handled - started, result)
        if type(result) is Deferred:
            return _Waiting(result, handler, header, charged, received, handled)
        if result is None:
            metrics.observe_latency(handler.name, time.perf_counter() - received)
            return None
        return self._encode(header, result, handler.response, received)

    def _encode(self, header, response, codec, received: float) -> _Outgoing:
        """Encode a response now, so its size counts against the response budgets while it waits to be written."""
        started = time.perf_counter()
        header_version = headers.response_header_version(header.api_key, codec.is_flexible(header.api_version))
        body = [response.body] if type(response) is dispatch.Encoded else codec.encode(response, header.api_version)
        if CAPTURE_DIR:
            _capture(codec.name[: -len("Response")], header.api_version,
                     self.client_software_name or header.client_id, "response", b"".join(body))
        return self._outgoing(header.correlation_id, header_version, body, codec.name[: -len("Response")],
                              started, received)

    def _raw_token(self, token: bytes, received: float) -> _Outgoing:
        """A SASL token sent as it is, size-prefixed without a Kafka header (the exchange after SaslHandshake v0)."""
        self.response_bytes += 4 + len(token)
        self.limits.responses.take(4 + len(token))
        return _Outgoing([INT32.pack(len(token)) + token], 4 + len(token), None, 0.0, received)

    def _outgoing(self, correlation_id: int, header_version: int, body: list, api: str | None,
                  started: float, received: float | None = None) -> _Outgoing:
        head = headers.encode_response_header(correlation_id, header_version)
        size = len(head) + sum(len(b) for b in body)
        body[0] = b"".join((INT32.pack(size), head, body[0]))
        self.response_bytes += size + 4
        self.limits.responses.take(size + 4)
        return _Outgoing(body, size + 4, api, time.perf_counter() - started, received)

    async def _finish(self, item: _Waiting) -> _Outgoing | None:
        """Run a Deferred's wait → its encoded answer (None: no answer, or a long poll the client's EOF ended)."""
        deferred = item.deferred
        value = None
        try:
            if not deferred.poll:
                value = await deferred.wait()
            elif not self._eof:
                with trio.CancelScope() as scope:
                    self._polls.add(scope)
                    try:
                        value = await deferred.wait()
                    finally:
                        self._polls.discard(scope)
        except BaseException as e:
            self._release_request(item.charged)
            if isinstance(e, Exception) and not isinstance(e, CloseConnection):
                raise self._failed(item) from None
            raise                   # CloseConnection: the answer ends the connection (a forwarded request's)
        return self._finished(item, value)

    def _finish_now(self, item: _Waiting) -> _Outgoing | None:
        """:meth:`_finish` of a Deferred that is ready: its wait runs to its end here, without a task switch (a ready
        Deferred's wait does not suspend, as Deferred's contract says; one that does is an internal error)."""
        wait = item.deferred.wait()
        try:
            wait.send(None)
        except StopIteration as done:
            return self._finished(item, done.value)
        except Exception:
            self._release_request(item.charged)
            raise self._failed(item) from None
        wait.close()
        self._release_request(item.charged)
        raise CloseConnection(f"internal error in {item.handler.name}: a ready answer waited")

    def _finished(self, item: _Waiting, value=None) -> _Outgoing | None:
        """A Deferred's wait is over: release its request, and encode its answer (None: no answer)."""
        self._release_request(item.charged)
        # from the handler's return: the time queued behind earlier answers counts as waiting, as it did when
        # every Deferred ran in a task of its own
        self.broker.metrics.observe_phase(item.handler.name, "wait", time.perf_counter() - item.handled)
        if value is None:
            return None
        return self._encode(item.header, value, item.handler.response, item.received)

    def _failed(self, item: _Waiting) -> CloseConnection:
        log.error("deferred %s failed %s\n%s", item.handler.name, self._log_fields(), traceback.format_exc())
        return CloseConnection(f"internal error in {item.handler.name}")

    def _api_versions_fallback(self, frame) -> _Outgoing:
        """A version of ApiVersions we don't know: answer in v0 layout with E.UNSUPPORTED_VERSION.code and, as
        Kafka, only ApiVersions' own range, so the client retries with one we have (the header is v1-shaped in
        every version)."""
        correlation_id = INT32.unpack_from(frame, 4)[0]
        body = _API_VERSIONS.cls(error_code=E.UNSUPPORTED_VERSION.code,
                                 api_keys=[e for e in api_version_entries(_API_VERSIONS.cls.ApiVersion,
                                                                          self.unstable_api_versions)
                                           if e.api_key == headers.API_VERSIONS_KEY])
        return self._outgoing(correlation_id, 0, _API_VERSIONS.encode(body, 0), None, time.perf_counter())

    async def _write_responses(self) -> None:
        """Send answers in request order: run each Deferred in its turn, and send every answer that is ready
        with one sendmsg.  An answer that is ready is not held back while a Deferred after it waits."""
        queue = self._queue
        batch: list[_Outgoing] = []
        while True:
            if self._failure is not None:
                raise self._failure
            if self._unsent is not None:
                (views, first), unsent, ready = self._unsent
                self._unsent = None
                await self._send_rest(views, first)
                self._sent(unsent, ready)
            self._take_ready(batch)
            if not batch and queue:             # nothing ready: wait for the head's answer, then take what follows
                self._dequeued(await self._finish(queue[0]), batch)
                continue
            if batch:
                await self._send(batch)
                batch = []
            elif self._reading_done and not queue:
                return
            elif not queue:
                self._queued = trio.Event()
                await self._queued.wait()

    def _take_ready(self, batch: list[_Outgoing]) -> None:
        """Move the answers ready at the head of the queue into ``batch`` (a ready Deferred's wait runs here, see
        :meth:`_finish_now`), up to MAX_IN_FLIGHT; stop at the first that still waits."""
        queue = self._queue
        while queue and len(batch) < MAX_IN_FLIGHT:
            item = queue[0]
            if type(item) is _Waiting:
                deferred = item.deferred
                if deferred.poll or deferred.ready is None or not deferred.ready():
                    return
                item = self._finish_now(item)
            self._dequeued(item, batch)

    def _dequeued(self, item: _Outgoing | None, batch: list[_Outgoing]) -> None:
        """The head of the queue is answered (``item``, or None for no answer): take it off, add it to ``batch``."""
        self._queue.popleft()
        if self._room is not None:
            self._room.set()
            self._room = None
        if item is None:
            self.outstanding -= 1
        else:
            batch.append(item)

    def _send_ready(self) -> None:
        """While the writer sleeps, send the answers ready at the head of the queue from here, in the caller's turn,
        so that they cost no task switch of their own.  Called by a flush (Broker.call_on_next_wake) for a
        connection whose next answer waited for it, and by the reader for an answer ready at once when none of the
        client's bytes are buffered.  The writer is woken only for what this leaves: an answer that waits for
        something else, the rest of a send the socket did not take at once, or a failure to raise."""
        if self._queued is None or self._closed:
            return                              # the writer is awake, or gone: it sends, or nothing is sent
        queue = self._queue
        batch: list[_Outgoing] = []
        try:
            self._take_ready(batch)
            if batch:
                ready = time.perf_counter()
                views, first = self._send_now([b for item in batch for b in item.buffers])
                if first < len(views):
                    self._unsent = ((views, first), batch, ready)
                    self._wake_writer()
                    return
                self._sent(batch, ready)
        except Exception as e:                  # never into the flusher: the writer raises it for this connection
            if isinstance(e, OSError):
                self._failure = trio.BrokenResourceError(f"send failed: {e!r}")
            elif isinstance(e, CloseConnection):
                self._failure = e
            else:
                log.error("sending ready answers failed %s\n%s", self._log_fields(), traceback.format_exc())
                self._failure = CloseConnection("internal error sending answers")
            self._wake_writer()
            return
        head = queue[0] if queue else None
        if type(head) is _Waiting and _waits_for_flush(head.deferred):
            self.broker.call_on_next_wake(self._send_ready)
        elif queue or self._reading_done:
            self._wake_writer()

    async def _send(self, batch: list[_Outgoing]) -> None:
        ready = time.perf_counter()
        await self._send_vectored([b for item in batch for b in item.buffers])
        self._sent(batch, ready)

    def _sent(self, batch: list[_Outgoing], ready: float) -> None:
        """``batch`` was sent (it was ready to send at ``ready``): metrics, and its budget bytes are free."""
        sent = time.perf_counter()
        size = produced = 0
        metrics = self.broker.metrics
        for item in batch:
            size += item.size
            if item.api is not None:
                if item.api == "Produce":
                    produced += 1
                metrics.observe_phase(item.api, "respond", item.encode_seconds + sent - ready)
                if item.received is not None:
                    metrics.observe_latency(item.api, sent - item.received)
        self.outstanding -= len(batch)
        self.response_bytes -= size
        self.limits.responses.release(size)
        if produced > 1:                # a burst of produce requests may follow (_burst_read)
            self.broker.burst_ends(self)
            self._burst_expected = produced
            self._burst_seen = 0

    async def _send_vectored(self, buffers: list) -> None:
        """Send header pieces and stored record bytes with sendmsg, without joining them first.  What the socket
        takes at once is sent without waiting (no checkpoint); a client that then takes none of the rest for
        trireme.response.send.timeout.ms is disconnected."""
        await self._send_rest(*self._send_now(buffers))

    def _send_now(self, buffers: list) -> tuple[list, int]:
        """One writev of ``buffers`` → (their views, the first not sent whole: len(views) once all went)."""
        views = [memoryview(b) for b in buffers if len(b)]
        try:
            sent = os.writev(self.stream.socket.fileno(), views[:_IOV_MAX])
        except BlockingIOError:
            sent = 0
        return views, _consumed(views, 0, sent)

    async def _send_rest(self, views: list, first: int) -> None:
        if first == len(views):
            return
        sock = self.stream.socket
        timeout = self.limits.send_timeout
        with trio.move_on_after(timeout) as stalled:
            while first < len(views):
                sent = await sock.sendmsg(views[first:first + _IOV_MAX])
                stalled.deadline = trio.current_time() + timeout
                first = _consumed(views, first, sent)
        if stalled.cancelled_caught:
            self.limits.count(self.limits.closed, "send timeout")
            raise CloseConnection(f"the client read nothing of a response for "
                                  f"trireme.response.send.timeout.ms={timeout * 1000:.0f}")


class TlsConnection(Connection):
    """A connection of an SSL or SASL_SSL listener: the TLS handshake, bounded by trireme.ssl.handshake.timeout.ms,
    then the request loop of :class:`Connection` over trio's SSLStream.  The context is the listener's at accept
    (a reload changes it for later connections only).  The client certificate's principal is ``tls_principal``,
    and ``principal`` on SSL listeners (SASL_SSL authenticates with SASL, as Kafka)."""

    reader_class = TlsFrameReader
    sends_inline = False

    def __init__(self, stream: trio.SocketStream, broker, peer: str, listener):
        super().__init__(stream, broker, peer, listener)
        self.tls_stream = trio.SSLStream(stream, listener.tls.context, server_side=True)
        self.client_dn: str | None = None
        self._handshake_scope = trio.CancelScope()

    def stop_reading(self) -> None:
        self._handshake_scope.cancel()          # a handshake under way ends at once: nothing was asked yet
        super().stop_reading()

    async def run(self) -> None:
        try:
            established = await self._handshake()
        except BaseException:
            with trio.CancelScope(shield=True):
                await self._close_transport()
            raise
        if established:
            await super().run()
        else:
            with trio.CancelScope(shield=True):
                await self._close_transport()

    async def _handshake(self) -> bool:
        """The TLS handshake and the client's principal → whether the connection goes on; a failure is logged in one
        line and counted (metrics.authentication for client certificates)."""
        listener = self.listener
        tls = listener.tls
        metrics = self.broker.metrics
        timeout = self.broker.config["trireme.ssl.handshake.timeout.ms"] / 1000
        reason = None
        scope = self._handshake_scope
        scope.deadline = trio.current_time() + timeout
        with scope:
            try:
                await self.tls_stream.do_handshake()
            except trio.BrokenResourceError as e:
                cause = e.__cause__
                reason = (f"{cause.reason or cause}" if isinstance(cause, ssl.SSLError) and
                          not isinstance(cause, (ssl.SSLEOFError, ssl.SSLSyscallError)) else "closed by client")
        if scope.cancelled_caught:
            if scope.cancel_called and trio.current_time() < scope.deadline:
                return False                    # the broker is shutting down
            self.limits.count(self.limits.closed, "TLS handshake timeout")
            reason = f"not finished within trireme.ssl.handshake.timeout.ms={timeout * 1000:.0f}"
        if reason is None:
            try:
                self.tls_principal, self.client_dn = peer_principal(self.tls_stream, tls.mapper)
            except NoMatchingRule as e:
                reason = str(e)
        if reason is not None:
            if tls.client_auth != "none":
                metrics.authentication(listener.name, "SSL", False)
            log.warning("TLS handshake failed: %s listener=%s conn=%d peer=%s", reason, listener.name, self.id,
                        self.peer)
            await self._send_alert()
            return False
        if self.client_dn is not None or tls.client_auth == "required":
            metrics.authentication(listener.name, "SSL", True)
        if listener.security_protocol == "SSL":
            self.principal = self.tls_principal
        log.info("TLS established conn=%d peer=%s listener=%s version=%s cipher=%s client_dn=%r tls_principal=%s",
                 self.id, self.peer, listener.name, self.tls_stream.version(), self.tls_stream.cipher()[0],
                 self.client_dn, self.tls_principal)
        return True

    async def _send_alert(self) -> None:
        """Send what OpenSSL left to send when the handshake failed: its alert (bad certificate, unknown CA), which
        Kafka sends before closing (SslTransportLayer.handshakeFailure) and from which a client tells a refused
        certificate (the Java client's SslAuthenticationException) from a network failure.  trio's SSLStream raises
        before writing it: it is read from the stream's outgoing buffer (a trio internal; without it, nothing is
        sent)."""
        outgoing = getattr(self.tls_stream, "_outgoing", None)
        try:
            alert = outgoing.read() if outgoing is not None else b""
        except Exception:
            return
        if alert:
            with trio.move_on_after(TLS_CLOSE_TIMEOUT):
                try:
                    await self.stream.send_all(alert)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    pass

    async def _close_transport(self) -> None:
        """close_notify when it can be sent at once, then the socket closed whatever happened."""
        with trio.move_on_after(TLS_CLOSE_TIMEOUT):
            try:
                await self.tls_stream.aclose()
            except Exception:
                pass
        await super()._close_transport()

    def _send_now(self, buffers: list) -> tuple[list, int]:
        """Over TLS nothing is sent synchronously: the writer sends it all (_send_rest)."""
        return [memoryview(b) for b in buffers if len(b)], 0

    async def _send_rest(self, views: list, first: int) -> None:
        if first == len(views):
            return
        timeout = self.limits.send_timeout
        with trio.move_on_after(timeout) as stalled:
            for chunk in _tls_chunks(views, first):
                await self.tls_stream.send_all(chunk)
                stalled.deadline = trio.current_time() + timeout
        if stalled.cancelled_caught:
            self.limits.count(self.limits.closed, "send timeout")
            raise CloseConnection(f"the client read nothing of a response for "
                                  f"trireme.response.send.timeout.ms={timeout * 1000:.0f}")


def _tls_chunks(views: list, first: int):
    """``views[first:]`` as pieces of about TLS_SEND_CHUNK bytes (small views joined, large ones sliced)."""
    pending: list = []
    size = 0
    for view in views[first:]:
        if pending and size + len(view) > TLS_SEND_CHUNK:
            yield b"".join(pending)
            pending, size = [], 0
        if len(view) > TLS_SEND_CHUNK:
            for start in range(0, len(view), TLS_SEND_CHUNK):
                yield view[start:start + TLS_SEND_CHUNK]
            continue
        pending.append(view)
        size += len(view)
    if pending:
        yield pending[0] if len(pending) == 1 else b"".join(pending)


def _waits_for_flush(deferred: Deferred) -> bool:
    """Whether ``deferred`` is a wait for durability (it has a ``ready`` check) that cannot finish yet."""
    ready = deferred.ready
    return ready is not None and not ready()


def _consumed(views: list, first: int, sent: int) -> int:
    """Drop ``sent`` bytes from ``views[first:]`` (trimming a view sent in part) → the first view left."""
    while sent:
        head = views[first]
        if sent >= len(head):
            sent -= len(head)
            first += 1
        else:
            views[first] = head[sent:]
            sent = 0
    return first


def api_version_entries(entry_cls, unstable_enabled: bool = False) -> list:
    return [entry_cls(api_key=key, min_version=low, max_version=high)
            for key, (low, high) in dispatch.advertised_versions(unstable_enabled).items()]
