"""Bad input from the network, sent with raw sockets to a live broker.

For every case the broker either answers correctly or closes *that* connection
(with a log line naming the reason), stays up, and an already-open connection
as well as a fresh one keep working.
"""
from __future__ import annotations

import itertools
import os
import socket
import struct
import threading
import time
import uuid
import zlib
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trireme.server.admin import client as admin_client
from trireme.wire import headers, records
from trireme.wire.codec import message
from trireme.wire.schema import api_names

MAX_REQUEST = 1 << 20                  # socket.request.max.bytes for this module's broker

pytestmark = pytest.mark.server_config({"socket.request.max.bytes": MAX_REQUEST})

API_KEYS = {name: key for key, name in api_names().items()}

NONE = 0
CORRUPT_MESSAGE = 2
UNKNOWN_TOPIC_OR_PARTITION = 3
MESSAGE_TOO_LARGE = 10
INVALID_REQUIRED_ACKS = 21
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
UNSUPPORTED_VERSION = 35
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
INVALID_RECORD = 87

_INT32 = struct.Struct(">i")


# --------------------------------------------------------------------------- raw client

class Closed(Exception):
    """The broker closed the connection (EOF or reset)."""


def frame(payload: bytes) -> bytes:
    return _INT32.pack(len(payload)) + payload


def encode_request(api: str, version: int, obj: Any, correlation_id: int, client_id: str | None = "bad-input",
                   codec_name: str | None = None) -> bytes:
    """A whole framed request (size, header, body) for API ``api`` (the admin client's framing)."""
    return admin_client.encode_request(api, version, obj, correlation_id, client_id, codec_name)


decode_response = admin_client.decode_response


class RawConn:
    """One TCP connection speaking size-prefixed frames."""

    def __init__(self, bootstrap: str, timeout: float = 10.0, receive_buffer: int | None = None):
        host, _, port = bootstrap.rpartition(":")
        if receive_buffer is None:
            self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        else:                       # set before connecting: it sets the window the broker sees
            family, kind, proto, _, address = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)[0]
            self.sock = socket.socket(family, kind, proto)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
            self.sock.settimeout(timeout)
            self.sock.connect(address)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout = timeout
        self._ids = itertools.count(1)
        self.buf = bytearray()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> "RawConn":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def next_id(self) -> int:
        return next(self._ids)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _recv_into_buf(self, deadline: float) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no data from the broker in time")
        self.sock.settimeout(remaining)
        try:
            data = self.sock.recv(1 << 16)
        except socket.timeout:
            raise TimeoutError("no data from the broker in time") from None
        except (ConnectionResetError, BrokenPipeError) as e:
            raise Closed(repr(e)) from None
        if not data:
            raise Closed("EOF")
        self.buf += data

    def read_frame(self, timeout: float | None = None) -> bytes:
        """One response frame's payload; Closed on EOF, TimeoutError when nothing comes."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while len(self.buf) < 4:
            self._recv_into_buf(deadline)
        size = _INT32.unpack_from(self.buf, 0)[0]
        assert 0 <= size < 64 << 20, f"implausible response size {size}"
        while len(self.buf) < 4 + size:
            self._recv_into_buf(deadline)
        payload = bytes(self.buf[4:4 + size])
        del self.buf[:4 + size]
        return payload

    def expect_closed(self, timeout: float = 5.0) -> None:
        """The broker closes this connection without sending anything (more)."""
        deadline = time.monotonic() + timeout
        try:
            while True:
                self._recv_into_buf(deadline)
                raise AssertionError(f"expected the broker to close the connection, got bytes {bytes(self.buf)!r}")
        except Closed:
            return

    def send_request(self, api: str, version: int, obj: Any, correlation_id: int | None = None,
                     **kw) -> int:
        cid = self.next_id() if correlation_id is None else correlation_id
        self.send(encode_request(api, version, obj, cid, **kw))
        return cid

    def read_response(self, api: str, version: int, correlation_id: int, timeout: float | None = None,
                      **kw) -> Any:
        got, obj = decode_response(api, version, self.read_frame(timeout), **kw)
        assert got == correlation_id, f"response correlation id {got}, expected {correlation_id}"
        return obj

    def request(self, api: str, version: int, obj: Any, timeout: float | None = None) -> Any:
        cid = self.send_request(api, version, obj)
        return self.read_response(api, version, cid, timeout)


def req(api: str, **fields) -> Any:
    return message(api + "Request").cls(**fields)


# --------------------------------------------------------------------------- request builders

def api_versions(conn: RawConn, version: int = 3) -> Any:
    fields = {"client_software_name": "trireme-bad-input", "client_software_version": "1.0"} if version >= 3 else {}
    return conn.request("ApiVersions", version, req("ApiVersions", **fields))


def metadata(conn: RawConn, topics: list[str] | None = None, version: int = 12) -> Any:
    cls = message("MetadataRequest").cls
    topic_list = None if topics is None else [cls.MetadataRequestTopic(name=t) for t in topics]
    return conn.request("Metadata", version, cls(topics=topic_list, allow_auto_topic_creation=False))


def create_topic(conn: RawConn, name: str, partitions: int = 1, configs: dict[str, str] | None = None) -> None:
    cls = message("CreateTopicsRequest").cls
    topic = cls.CreatableTopic(name=name, num_partitions=partitions, replication_factor=1,
                               configs=[cls.CreatableTopic.CreatableTopicConfig(name=k, value=v)
                                        for k, v in (configs or {}).items()])
    resp = conn.request("CreateTopics", 7, cls(topics=[topic], timeout_ms=10000))
    assert [(t.name, t.error_code) for t in resp.topics] == [(name, 0)], resp
    # Kafka answers NOT_LEADER_OR_FOLLOWER (or UNKNOWN_TOPIC_OR_PARTITION) for a moment after CreateTopics
    # returns, until the new partitions' leadership reaches the broker: wait until each one answers.
    lcls = message("ListOffsetsRequest").cls
    probe = lcls(replica_id=-1, topics=[lcls.ListOffsetsTopic(name=name, partitions=[
        lcls.ListOffsetsTopic.ListOffsetsPartition(partition_index=p, timestamp=-1) for p in range(partitions)])])
    deadline = time.monotonic() + 15
    while True:
        errors = [p.error_code for t in conn.request("ListOffsets", 7, probe).topics for p in t.partitions]
        if errors == [NONE] * partitions:
            return
        assert time.monotonic() < deadline, f"{name}: partitions not ready 15 s after CreateTopics: {errors}"
        time.sleep(0.1)


def produce_request(topic: str, batches_by_partition: dict[int, bytes | None], acks: int = -1,
                    transactional_id: str | None = None) -> Any:
    cls = message("ProduceRequest").cls
    tcls = cls.TopicProduceData
    return cls(transactional_id=transactional_id, acks=acks, timeout_ms=10000, topic_data=[tcls(name=topic, partition_data=[
        tcls.PartitionProduceData(index=p, records=data) for p, data in batches_by_partition.items()])])


def produce(conn: RawConn, topic: str, batches_by_partition: dict[int, bytes | None], acks: int = -1,
            version: int = 9, transactional_id: str | None = None) -> list[Any]:
    """→ the partition responses, in request order."""
    resp = conn.request("Produce", version, produce_request(topic, batches_by_partition, acks, transactional_id))
    assert [t.name for t in resp.responses] == [topic]
    return resp.responses[0].partition_responses


def list_offset(conn: RawConn, topic: str, partition: int, timestamp: int = -1, isolation_level: int = 0) -> int:
    cls = message("ListOffsetsRequest").cls
    tcls = cls.ListOffsetsTopic
    resp = conn.request("ListOffsets", 7, cls(replica_id=-1, isolation_level=isolation_level, topics=[tcls(name=topic, partitions=[
        tcls.ListOffsetsPartition(partition_index=partition, timestamp=timestamp)])]))
    part = resp.topics[0].partitions[0]
    assert part.error_code == 0, part
    return part.offset


def fetch(conn: RawConn, topic: str, partition: int, offset: int = 0) -> tuple[int, bytes]:
    """→ (high watermark, record bytes) of one partition (Fetch v11, no wait)."""
    cls = message("FetchRequest").cls
    tcls = cls.FetchTopic
    request = cls(replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, isolation_level=0,
                  session_id=0, session_epoch=-1, topics=[tcls(topic=topic, partitions=[
                      tcls.FetchPartition(partition=partition, fetch_offset=offset, log_start_offset=-1,
                                          partition_max_bytes=1 << 20)])])
    resp = conn.request("Fetch", 11, request)
    assert resp.error_code == 0, resp
    part = resp.responses[0].partitions[0]
    assert part.error_code == 0, part
    return part.high_watermark, bytes(part.records or b"")


def stored_values(conn: RawConn, topic: str, partition: int) -> list[bytes | None]:
    hw, data = fetch(conn, topic, partition)
    out = []
    for pos, header in records.iter_batch_headers(data):
        assert records.crc_ok(data, pos, header)
        out += [r.value for r in records.decode_records(data, pos)]
    return out


def batch(values: list[bytes], **kw) -> bytes:
    return records.build_batch([(None, v) for v in values], **kw)


def legacy_message(magic: int, value: bytes, key: bytes | None = None, offset: int = 0) -> bytes:
    """A magic 0/1 message (old message set entry) with a correct CRC-32."""
    def b(data):
        return _INT32.pack(-1) if data is None else _INT32.pack(len(data)) + data
    body = struct.pack(">bb", magic, 0)
    if magic >= 1:
        body += struct.pack(">q", int(time.time() * 1000))
    body += b(key) + b(value)
    msg = struct.pack(">I", zlib.crc32(body)) + body
    return struct.pack(">qi", offset, len(msg)) + msg


# --------------------------------------------------------------------------- broker checks

def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


class LogWatch:
    """New lines of the broker's stderr log since a point in time."""

    def __init__(self, server):
        self.path = server.stderr_path
        self.start = os.path.getsize(self.path)

    def text(self) -> str:
        with open(self.path, "rb") as f:
            f.seek(self.start)
            return f.read().decode(errors="replace")

    def wait_for(self, *needles: str, timeout: float = 5.0) -> str:
        """The first new log line containing every needle (fails after ``timeout``)."""
        deadline = time.monotonic() + timeout
        while True:
            for line in self.text().splitlines():
                if all(n in line for n in needles):
                    return line
            if time.monotonic() > deadline:
                raise AssertionError(f"no log line with {needles!r}; new log:\n{self.text()[-4000:]}")
            time.sleep(0.05)


def assert_close_logged(watch: LogWatch, *needles: str) -> str:
    line = watch.wait_for("closing connection:", *needles)
    assert "WARNING" in line, line
    return line


def assert_healthy(server, witness: RawConn) -> None:
    """The broker is alive; an already-open connection and a fresh one both work."""
    assert server.external or server.proc.poll() is None, \
        f"broker exited with {server.proc.returncode}\n{server.stderr_tail()}"
    versions = api_versions(witness)
    assert versions.error_code == 0
    assert metadata(witness).brokers, "Metadata on the already-open connection lists no broker"
    with RawConn(server.bootstrap) as fresh:
        assert api_versions(fresh).error_code == 0
        assert metadata(fresh).brokers


@pytest.fixture
def witness(module_server):
    conn = RawConn(module_server.bootstrap)
    assert api_versions(conn).error_code == 0
    yield conn
    conn.close()


@pytest.fixture
def log(module_server) -> LogWatch:
    return LogWatch(module_server)


def proc_status_kib(pid: int, field: str) -> int:
    """A kB figure of /proc/PID/status (VmHWM: peak RSS, VmRSS: RSS now)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc status")


def rss_peak_kib(pid: int) -> int:
    return proc_status_kib(pid, "VmHWM")


# --------------------------------------------------------------------------- framing

def test_garbage_bytes(module_server, witness, log):
    # An HTTP request: its first four bytes "GET " read as a 1.2 GB frame size.
    with RawConn(module_server.bootstrap) as c:
        c.send(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
        c.expect_closed()
    assert_close_logged(log, f"frame of {int.from_bytes(b'GET ', 'big')} bytes is over "
                             f"socket.request.max.bytes={MAX_REQUEST}")
    assert_healthy(module_server, witness)

    # A plausibly sized frame of garbage: API key 0x7a7a is no API.
    garbage = bytes.fromhex("7a7a 7a7a 0102 0304 ffff ffff deadbeef") + os.urandom(40)
    with RawConn(module_server.bootstrap) as c:
        c.send(frame(garbage))
        c.expect_closed()
    assert_close_logged(log, "unknown API key 31354")
    assert_healthy(module_server, witness)

    # Shorter than any request header.
    with RawConn(module_server.bootstrap) as c:
        c.send(frame(b"\x00\x12\x00"))
        c.expect_closed()
    assert_close_logged(log, "shorter than a request header")
    with RawConn(module_server.bootstrap) as c:
        c.send(frame(b""))
        c.expect_closed()
    assert_close_logged(log, "request of 0 bytes is shorter than a request header")
    assert_healthy(module_server, witness)


@pytest.mark.parametrize("claimed", [2 * MAX_REQUEST, MAX_REQUEST + 1, 0x7FFFFFFF])
def test_oversized_frame_closes_without_reading(module_server, witness, log, claimed):
    peak_before = rss_peak_kib(module_server.proc.pid)
    with RawConn(module_server.bootstrap) as c:
        # Only the size: the broker must not wait for (or make room for) the body.
        c.send(_INT32.pack(claimed))
        t0 = time.monotonic()
        c.expect_closed(timeout=5)
        assert time.monotonic() - t0 < 2
    assert_close_logged(log, f"frame of {claimed} bytes is over socket.request.max.bytes={MAX_REQUEST}")
    assert_healthy(module_server, witness)
    grew = rss_peak_kib(module_server.proc.pid) - peak_before
    assert grew < 64 * 1024, f"peak RSS grew by {grew} KiB on a refused {claimed}-byte frame"


def test_frame_at_the_limit_is_read(module_server, witness, log):
    """A frame of exactly socket.request.max.bytes is read (then refused as the garbage it is)."""
    with RawConn(module_server.bootstrap) as c:
        c.send(_INT32.pack(MAX_REQUEST) + b"\x03\xe7\x00\x00" + bytes(MAX_REQUEST - 4))
        c.expect_closed()
    assert_close_logged(log, "unknown API key 999")
    assert_healthy(module_server, witness)


@pytest.mark.parametrize("size", [-1, -2, -0x80000000])
def test_negative_size(module_server, witness, log, size):
    with RawConn(module_server.bootstrap) as c:
        c.send(_INT32.pack(size) + b"\x00" * 16)
        c.expect_closed()
    assert_close_logged(log, f"frame with negative size {size}")
    assert_healthy(module_server, witness)


def test_truncated_frames(module_server, witness, log):
    whole = encode_request("ApiVersions", 3, req("ApiVersions", client_software_name="x",
                                                 client_software_version="1"), 7)
    # Size says 100, 20 bytes follow, then the client half-closes.
    with RawConn(module_server.bootstrap) as c:
        c.send(_INT32.pack(100) + whole[4:24])
        c.sock.shutdown(socket.SHUT_WR)
        c.expect_closed()
    assert_close_logged(log, "connection closed inside a frame (20 bytes of 100 received)")
    assert_healthy(module_server, witness)

    # Half a size field, then a full close.
    c = RawConn(module_server.bootstrap)
    c.send(b"\x00\x00")
    c.close()
    assert_close_logged(log, "connection closed inside a frame (2 bytes of 4 received)")
    assert_healthy(module_server, witness)

    # A big frame cut short (the broker receives it into its own buffer).
    with RawConn(module_server.bootstrap) as c:
        c.send(_INT32.pack(500_000) + whole[4:] + bytes(300_000))
        c.sock.shutdown(socket.SHUT_WR)
        c.expect_closed()
    assert_close_logged(log, f"connection closed inside a frame ({len(whole) - 4 + 300_000} bytes of "
                             "500000 received)")

    # A client that stalls mid-frame holds only its own connection.
    stalled = RawConn(module_server.bootstrap)
    stalled.send(whole[:10])
    assert_healthy(module_server, witness)
    stalled.send(whole[10:])        # ... and when the rest arrives, it is answered.
    cid, resp = decode_response("ApiVersions", 3, stalled.read_frame())
    assert cid == 7 and resp.error_code == 0
    stalled.close()
    assert_healthy(module_server, witness)


# --------------------------------------------------------------------------- header level

def test_unknown_api_key(module_server, witness, log):
    with RawConn(module_server.bootstrap) as c:
        c.send(frame(struct.pack(">hhi", 999, 0, 42) + struct.pack(">h", 3) + b"abc"))
        c.expect_closed()
    assert_close_logged(log, "unknown API key 999 (version 0)")
    assert_healthy(module_server, witness)


def test_unsupported_metadata_version_closes(module_server, witness, log):
    with RawConn(module_server.bootstrap) as c:
        c.send(frame(struct.pack(">hhi", API_KEYS["Metadata"], 99, 5) + struct.pack(">h", -1) + b"\x00" * 8))
        c.expect_closed()
    assert_close_logged(log, "Metadata v99 is not a version of this API")
    assert_healthy(module_server, witness)


def test_unsupported_api_versions_version_answers_v0(module_server, witness, log):
    with RawConn(module_server.bootstrap) as c:
        # Future versions of ApiVersions may be flexible: a v2 header with tagged fields and a body we
        # cannot know.  The answer is still a v0 response with UNSUPPORTED_VERSION and, as Kafka, only
        # ApiVersions' own range.
        c.send(frame(struct.pack(">hhi", 18, 99, 1234) + struct.pack(">h", 4) + b"test" + b"\x00"
                     + b"\x07future\x041.0\x00"))
        cid, resp = decode_response("ApiVersions", 0, c.read_frame(), header_version=0)
        assert cid == 1234
        assert resp.error_code == UNSUPPORTED_VERSION
        [entry] = resp.api_keys
        assert (entry.api_key, entry.min_version) == (18, 0) and entry.max_version >= 3
        # The connection stays usable: the client retries with a version we have.
        assert api_versions(c, 3).error_code == 0
    assert_healthy(module_server, witness)


@pytest.mark.kafka_version(4)           # KIP-896 (Kafka 4.0): Produce v0-2 refused; Kafka 3.9 stores them
@pytest.mark.parametrize("version", [0, 1, 2])
def test_old_produce_versions_refused_per_partition(module_server, witness, version):
    topic = unique("legacy")
    create_topic(witness, topic, partitions=2)
    magic = 0 if version < 2 else 1
    cls = message("LegacyProduceRequest").cls
    tcls = cls.TopicProduceData
    request = cls(acks=1, timeout_ms=5000, topic_data=[tcls(name=topic, partition_data=[
        tcls.PartitionProduceData(index=0, records=legacy_message(magic, b"old-0")),
        tcls.PartitionProduceData(index=1, records=legacy_message(magic, b"old-1"))])])
    with RawConn(module_server.bootstrap) as c:
        cid = c.send_request("Produce", version, request, codec_name="LegacyProduceRequest")
        resp = c.read_response("Produce", version, cid, codec_name="LegacyProduceResponse", header_version=0)
        assert len(resp.responses) == 1 and resp.responses[0].name == topic
        parts = resp.responses[0].partition_responses
        assert [(p.index, p.error_code) for p in parts] == [(0, UNSUPPORTED_VERSION), (1, UNSUPPORTED_VERSION)]
        assert api_versions(c).error_code == 0           # still open
    for p in (0, 1):
        assert list_offset(witness, topic, p) == 0
        assert fetch(witness, topic, p) == (0, b"")
    assert_healthy(module_server, witness)


# --------------------------------------------------------------------------- malformed bodies

def _header(api: str, version: int, cid: int = 9) -> bytes:
    codec = message(api + "Request")
    return headers.encode_request_header(API_KEYS[api], version, cid, "bad-input", codec.is_flexible(version))


@pytest.mark.parametrize("case", ["truncated", "garbage", "huge-array", "huge-compact-array", "huge-string",
                                  "bad-header"])
def test_malformed_body_closes(module_server, witness, log, case):
    peak_before = rss_peak_kib(module_server.proc.pid)
    good = encode_request("Metadata", 4, req("Metadata", topics=[
        message("MetadataRequest").cls.MetadataRequestTopic(name="some-topic")]), 9)
    if case == "truncated":
        payload, needle = good[4:-5], "malformed Metadata v4 request"
    elif case == "garbage":
        payload, needle = _header("Metadata", 4) + b"\x00\x00\x00\x01\xff\xff\xff\xff\xff\xff", \
            "malformed Metadata v4 request"
    elif case == "huge-array":
        # Non-flexible Metadata v4: topics = int32 count 0x7fffffff, then a few bytes.
        payload, needle = _header("Metadata", 4) + b"\x7f\xff\xff\xff" + b"\x00\x01a" * 4 + b"\x01", \
            "malformed Metadata v4 request"
    elif case == "huge-compact-array":
        # Flexible Metadata v12: compact array length as a varint of ~2**31.
        payload, needle = _header("Metadata", 12) + b"\xff\xff\xff\xff\x07" + b"\x00" * 8, \
            "malformed Metadata v12 request"
    elif case == "huge-string":
        # CreateTopics v4 (non-flexible): one topic whose name claims 32767 bytes.
        payload, needle = _header("CreateTopics", 4) + b"\x00\x00\x00\x01\x7f\xffabc", \
            "malformed CreateTopics v4 request"
    else:
        # ApiVersions v3 header with a client id longer than the frame.
        payload, needle = struct.pack(">hhi", 18, 3, 9) + b"\x7f\xf0abc", "bad ApiVersions request header"
    with RawConn(module_server.bootstrap) as c:
        c.send(frame(payload))
        c.expect_closed()
    assert_close_logged(log, needle)
    assert_healthy(module_server, witness)
    grew = rss_peak_kib(module_server.proc.pid) - peak_before
    assert grew < 64 * 1024, f"peak RSS grew by {grew} KiB on a malformed {case} request"


# --------------------------------------------------------------------------- produce validation

@pytest.fixture
def topic(witness) -> str:
    name = unique("bad")
    create_topic(witness, name, partitions=2, configs={"max.message.bytes": "10000"})
    return name


def assert_nothing_stored(conn: RawConn, topic: str, partition: int, expected_end: int = 0) -> None:
    assert list_offset(conn, topic, partition) == expected_end
    hw, data = fetch(conn, topic, partition, expected_end)
    assert (hw, data) == (expected_end, b"")
    # The next good batch lands right at the old end: nothing was slipped in between.
    [ok] = produce(conn, topic, {partition: batch([b"after"])})
    assert (ok.error_code, ok.base_offset) == (NONE, expected_end)


def test_corrupt_crc(module_server, witness, topic):
    good = bytearray(batch([b"v1", b"v2"]))
    good[-1] ^= 0x01                 # flip a bit in the last record: the CRC no longer matches
    [r] = produce(witness, topic, {0: bytes(good)})
    assert r.error_code == CORRUPT_MESSAGE and r.base_offset == -1, r   # (Kafka leaves error_message empty)
    assert_nothing_stored(witness, topic, 0)
    assert_healthy(module_server, witness)


def test_corrupt_crc_seen_by_a_consumer(module_server, witness, topic):
    from confluent_kafka import Consumer, TopicPartition
    [ok] = produce(witness, topic, {1: batch([b"good-0", b"good-1"])})
    assert ok.error_code == NONE
    bad = bytearray(batch([b"evil"]))
    bad[records.CRC_OFFSET] ^= 0xFF
    [r] = produce(witness, topic, {1: bytes(bad)})
    assert r.error_code == CORRUPT_MESSAGE
    consumer = Consumer({"bootstrap.servers": module_server.bootstrap, "group.id": unique("g"),
                         "enable.auto.commit": False, "check.crcs": True})
    try:
        assert consumer.get_watermark_offsets(TopicPartition(topic, 1), timeout=10) == (0, 2)
        consumer.assign([TopicPartition(topic, 1, 0)])
        got = []
        deadline = time.monotonic() + 10
        while len(got) < 2 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None:
                assert msg.error() is None, msg.error()
                got.append((msg.offset(), msg.value()))
        assert got == [(0, b"good-0"), (1, b"good-1")]
        assert consumer.poll(1.0) is None
    finally:
        consumer.close()


def test_client_control_batch(module_server, witness, topic):
    control = records.build_control_batch(True, producer_id=1, producer_epoch=0, coordinator_epoch=0,
                                          timestamp=int(time.time() * 1000))
    # A control batch has the transactional bit: without a transactional id the whole request is refused
    # before its records are looked at, every partition with TRANSACTIONAL_ID_AUTHORIZATION_FAILED.
    rs = produce(witness, topic, {0: control, 1: batch([b"innocent"])})
    assert [(r.index, r.error_code, r.base_offset) for r in rs] == [
        (0, TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1), (1, TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1)]
    # With one, the batch itself is refused: clients may not write control batches.
    [r] = produce(witness, topic, {0: control}, transactional_id=unique("tx"))
    assert r.error_code == INVALID_RECORD, r
    assert_nothing_stored(witness, topic, 0)
    assert_nothing_stored(witness, topic, 1)
    assert_healthy(module_server, witness)


def test_two_batches_in_one_partition(module_server, witness, topic):
    [r] = produce(witness, topic, {0: batch([b"a"]) + batch([b"b"])})
    assert r.error_code == INVALID_RECORD, r
    assert_nothing_stored(witness, topic, 0)
    assert_healthy(module_server, witness)


def test_empty_and_null_records(module_server, witness, topic):
    rs = produce(witness, topic, {0: b"", 1: None})
    assert [(r.index, r.error_code) for r in rs] == [(0, INVALID_RECORD), (1, INVALID_RECORD)]
    assert_nothing_stored(witness, topic, 0)
    assert_nothing_stored(witness, topic, 1)
    assert_healthy(module_server, witness)


@pytest.mark.parametrize("acks", [5, 2, -2])
def test_invalid_acks(module_server, witness, topic, acks):
    rs = produce(witness, topic, {0: batch([b"x"]), 1: batch([b"y"])}, acks=acks)
    assert [(r.index, r.error_code) for r in rs] == [(0, INVALID_REQUIRED_ACKS), (1, INVALID_REQUIRED_ACKS)]
    assert_nothing_stored(witness, topic, 0)
    assert_nothing_stored(witness, topic, 1)
    assert_healthy(module_server, witness)


def test_unknown_topic_or_partition(module_server, witness, topic):
    missing = unique("missing")
    [r] = produce(witness, missing, {0: batch([b"x"])})
    assert r.error_code == UNKNOWN_TOPIC_OR_PARTITION, r
    rs = produce(witness, topic, {7: batch([b"x"]), -1: batch([b"y"]), 0: batch([b"z"])})
    assert [(r.index, r.error_code) for r in rs] == [(7, UNKNOWN_TOPIC_OR_PARTITION),
                                                     (-1, UNKNOWN_TOPIC_OR_PARTITION), (0, NONE)]
    # Produce does not create topics.
    meta = metadata(witness, [missing])
    assert [(t.name, t.error_code) for t in meta.topics] == [(missing, UNKNOWN_TOPIC_OR_PARTITION)]
    assert_nothing_stored(witness, topic, 0, expected_end=1)
    assert_healthy(module_server, witness)


def test_batch_over_max_message_bytes(module_server, witness, topic):
    big = batch([os.urandom(4000) for _ in range(3)])       # ~12 KB > max.message.bytes=10000
    [r] = produce(witness, topic, {0: big})
    assert r.error_code == MESSAGE_TOO_LARGE, r
    assert_nothing_stored(witness, topic, 0)
    fits = batch([os.urandom(3000) for _ in range(3)])
    [r] = produce(witness, topic, {1: fits})
    assert (r.error_code, r.base_offset) == (NONE, 0)
    assert_healthy(module_server, witness)


@pytest.mark.parametrize("compression", [0, 3])
def test_keyless_record_on_compacted_topic(module_server, witness, compression):
    name = unique("compacted")
    create_topic(witness, name, partitions=1, configs={"cleanup.policy": "compact"})
    keyless = records.build_batch([(b"k1", b"v1"), (None, b"v2")], compression=compression)
    [r] = produce(witness, name, {0: keyless})
    assert r.error_code == INVALID_RECORD, r
    assert list_offset(witness, name, 0) == 0
    keyed = records.build_batch([(b"k1", b"v1"), (b"k2", b"v2")], compression=compression)
    [r] = produce(witness, name, {0: keyed})
    assert (r.error_code, r.base_offset) == (NONE, 0)
    assert_healthy(module_server, witness)


@pytest.mark.parametrize("magic", [0, 1])
def test_old_magic_batch(module_server, witness, topic, magic):
    # Long enough to be read as a batch header: the magic byte is what is wrong.
    data = legacy_message(magic, b"m" * 100) + legacy_message(magic, b"n" * 100, offset=1)
    assert data[records.MAGIC_OFFSET] == magic
    [r] = produce(witness, topic, {0: data})
    assert r.error_code == INVALID_RECORD, r            # only magic 2 from Produce v3 on
    assert_nothing_stored(witness, topic, 0)
    assert_healthy(module_server, witness)


def test_transactional_batch_without_transactional_id(module_server, witness, topic):
    data = batch([b"t"], producer_id=1, producer_epoch=0, base_sequence=0, transactional=True)
    [r] = produce(witness, topic, {0: data})
    assert (r.error_code, r.base_offset) == (TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1), r
    assert_nothing_stored(witness, topic, 0)
    assert_healthy(module_server, witness)


def test_idempotent_sequences(module_server, witness, topic):
    pid_resp = witness.request("InitProducerId", 4, req("InitProducerId", transactional_id=None,
                                                        transaction_timeout_ms=60000, producer_id=-1,
                                                        producer_epoch=-1))
    assert pid_resp.error_code == 0
    pid, epoch = pid_resp.producer_id, pid_resp.producer_epoch

    def idem(values, seq):
        return batch(values, producer_id=pid, producer_epoch=epoch, base_sequence=seq)

    first = idem([b"s0", b"s1", b"s2"], 0)
    second = idem([b"s3", b"s4"], 3)
    [r] = produce(witness, topic, {0: first})
    assert (r.error_code, r.base_offset) == (NONE, 0)
    [r] = produce(witness, topic, {0: second})
    assert (r.error_code, r.base_offset) == (NONE, 3)

    # A gap: sequence 10 when 5 is next.
    [r] = produce(witness, topic, {0: idem([b"gap"], 10)})
    assert r.error_code == OUT_OF_ORDER_SEQUENCE_NUMBER, r
    # Same first sequence as a stored batch but a different length: not a duplicate, out of order.
    [r] = produce(witness, topic, {0: idem([b"s0", b"s1"], 0)})
    assert r.error_code == OUT_OF_ORDER_SEQUENCE_NUMBER, r

    # Exact retries of recent batches: NONE with their original offsets, stored once.
    [r] = produce(witness, topic, {0: first})
    assert (r.error_code, r.base_offset) == (NONE, 0), r
    [r] = produce(witness, topic, {0: second})
    assert (r.error_code, r.base_offset) == (NONE, 3), r

    # The producer goes on where it was.
    [r] = produce(witness, topic, {0: idem([b"s5"], 5)})
    assert (r.error_code, r.base_offset) == (NONE, 5), r
    assert list_offset(witness, topic, 0) == 6
    assert stored_values(witness, topic, 0) == [b"s0", b"s1", b"s2", b"s3", b"s4", b"s5"]
    assert_healthy(module_server, witness)


# --------------------------------------------------------------------------- pipelining

def test_pipelined_requests_answered_in_order(module_server, witness, topic):
    """Many requests written back to back: every response, in order, with its correlation id.
    Mixes answers that are immediate (ApiVersions, Metadata, errors) with ones that wait for
    the fsync (acks=all / acks=1) and acks=0 produces that get no answer at all."""
    plan: list[tuple[str, int, Any, bool]] = []     # (api, version, request, answered)
    for i in range(300):
        kind = i % 6
        if kind == 0:
            plan.append(("ApiVersions", 3, req("ApiVersions", client_software_name="p", client_software_version="1"),
                         True))
        elif kind == 1:
            plan.append(("Metadata", 12, req("Metadata", topics=None), True))
        elif kind in (2, 3):
            plan.append(("Produce", 9, produce_request(topic, {i % 2: batch([b"%d" % i])}, acks=-1 if kind == 2 else 1),
                         True))
        elif kind == 4:
            plan.append(("Produce", 9, produce_request(topic, {i % 2: batch([b"%d" % i])}, acks=0), False))
        else:
            plan.append(("Produce", 9, produce_request(topic, {0: batch([b"bad"])}, acks=7), True))
    wire_bytes = [encode_request(api, v, obj, 1000 + i) for i, (api, v, obj, _) in enumerate(plan)]

    with RawConn(module_server.bootstrap, timeout=30) as c:
        sender = threading.Thread(target=c.send, args=(b"".join(wire_bytes),), daemon=True)
        sender.start()
        produced: dict[int, list[int]] = {0: [], 1: []}
        for i, (api, version, obj, answered) in enumerate(plan):
            if not answered:
                continue
            cid, resp = decode_response(api, version, c.read_frame(timeout=30))
            assert cid == 1000 + i, f"response #{i}: correlation id {cid}, expected {1000 + i} ({api})"
            if api == "Produce":
                [part] = resp.responses[0].partition_responses
                if obj.acks in (1, -1):
                    assert part.error_code == NONE, part
                    produced[part.index].append(part.base_offset)
                else:
                    assert part.error_code == INVALID_REQUIRED_ACKS
            else:
                assert resp.error_code == 0
        sender.join(10)
        # Nothing else comes: acks=0 produces were not answered.
        with pytest.raises(TimeoutError):
            c.read_frame(timeout=0.5)
    for p, offsets in produced.items():
        assert offsets == sorted(offsets), f"partition {p}: acknowledged offsets out of order {offsets}"
    # 50 acks=0 produces + 100 acknowledged ones, each one record.
    total = list_offset(witness, topic, 0) + list_offset(witness, topic, 1)
    assert total == 150
    values = stored_values(witness, topic, 0) + stored_values(witness, topic, 1)
    expected = {b"%d" % i for i, (api, _, obj, _) in enumerate(plan) if api == "Produce" and obj.acks in (0, 1, -1)}
    assert sorted(values) == sorted(expected)
    assert_healthy(module_server, witness)


def test_acknowledgements_to_a_client_that_reads_late_all_arrive_in_order(module_server, witness, topic):
    """A producer pipelines 4,000 acks=all requests and reads nothing until it has sent them all, through a small
    receive buffer.  Their answers, sent after each flush, fill the socket; what it does not take is sent once
    the client reads.  Every answer arrives, in order."""
    count = 4000
    wire_bytes = b"".join(encode_request("Produce", 9, produce_request(topic, {0: batch([b"late%d" % i])}), i)
                          for i in range(count))
    with RawConn(module_server.bootstrap, timeout=30, receive_buffer=4096) as conn:
        conn.sock.sendall(wire_bytes)
        time.sleep(0.5)                         # the answers pile up against the unread socket
        offsets = []
        for i in range(count):
            cid, resp = decode_response("Produce", 9, conn.read_frame(timeout=30))
            assert cid == i
            [part] = resp.responses[0].partition_responses
            assert part.error_code == NONE
            offsets.append(part.base_offset)
    assert offsets == list(range(offsets[0], offsets[0] + count))
    assert_healthy(module_server, witness)


def test_a_client_that_resets_with_acknowledgements_pending_is_dropped_cleanly(module_server, witness, topic):
    """Producers that reset their connection (RST) right after pipelining acks=all requests, whose answers the
    next flush would send: the broker drops those connections, sends nothing to them, and goes on serving."""
    log = LogWatch(module_server)
    for _ in range(20):
        wire_bytes = b"".join(encode_request("Produce", 9, produce_request(topic, {1: batch([b"rst"])}), i)
                              for i in range(50))
        with RawConn(module_server.bootstrap) as c:
            c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            c.sock.sendall(wire_bytes)
    deadline = time.monotonic() + 10
    while log.text().count("connection close") < 20 and time.monotonic() < deadline:
        time.sleep(0.05)
    closed = [line for line in log.text().splitlines() if "connection close" in line]
    assert len(closed) == 20 and all("client_id='bad-input'" in line for line in closed), closed
    assert "Traceback" not in log.text() and "internal error" not in log.text()
    assert_healthy(module_server, witness)


def test_half_close_after_requests_still_answered(module_server, witness, topic):
    """A client that sends its requests and shuts down its sending side still gets every answer
    (including one waiting for the fsync) before the broker closes."""
    with RawConn(module_server.bootstrap) as c:
        c.send(encode_request("Produce", 9, produce_request(topic, {1: batch([b"hc"])}), 1)
               + encode_request("Metadata", 12, req("Metadata", topics=None), 2))
        c.sock.shutdown(socket.SHUT_WR)
        cid, resp = decode_response("Produce", 9, c.read_frame())
        assert cid == 1
        [part] = resp.responses[0].partition_responses
        assert (part.error_code, part.base_offset) == (NONE, 0)
        cid, resp = decode_response("Metadata", 12, c.read_frame())
        assert cid == 2 and resp.brokers
        c.expect_closed()
    assert stored_values(witness, topic, 1) == [b"hc"]


def test_an_answer_ready_at_once_stays_behind_a_long_poll_before_it(module_server, witness, topic):
    """A client sends a long-polling Fetch, then a Metadata request alone, and waits: the Metadata answer, ready at
    once, is sent only after the Fetch's, once a write ends the poll."""
    end = list_offset(witness, topic, 1)
    cls = message("FetchRequest").cls
    tcls = cls.FetchTopic
    poll = cls(replica_id=-1, max_wait_ms=20000, min_bytes=1, max_bytes=1 << 20, isolation_level=0, session_id=0,
               session_epoch=-1, topics=[tcls(topic=topic, partitions=[
                   tcls.FetchPartition(partition=1, fetch_offset=end, log_start_offset=-1,
                                       partition_max_bytes=1 << 20)])])
    with RawConn(module_server.bootstrap) as c:
        c.send(encode_request("Fetch", 11, poll, 1))
        time.sleep(0.3)                         # the poll is parked
        c.send(encode_request("Metadata", 12, req("Metadata", topics=None), 2))
        with pytest.raises(TimeoutError):
            c.read_frame(timeout=0.5)           # nothing yet: the Metadata answer waits behind the poll
        [part] = produce(witness, topic, {1: batch([b"wake"])})
        assert part.error_code == NONE
        cid, resp = decode_response("Fetch", 11, c.read_frame(timeout=10))
        assert cid == 1
        data = bytes(resp.responses[0].partitions[0].records or b"")
        assert [r.value for pos, _ in records.iter_batch_headers(data)
                for r in records.decode_records(data, pos)] == [b"wake"]
        cid, resp = decode_response("Metadata", 12, c.read_frame(timeout=10))
        assert cid == 2 and resp.brokers


# --------------------------------------------------------------------------- fuzz

def _templates() -> list[bytes]:
    t = "fuzz-topic"
    data = batch([b"fuzz-value", b"another"])
    return [
        encode_request("ApiVersions", 3, req("ApiVersions", client_software_name="fz", client_software_version="1"), 1),
        encode_request("ApiVersions", 0, req("ApiVersions"), 2),
        encode_request("Metadata", 12, req("Metadata", topics=None), 3),
        encode_request("Metadata", 4, req("Metadata", topics=[
            message("MetadataRequest").cls.MetadataRequestTopic(name=t)], allow_auto_topic_creation=False), 4),
        encode_request("Produce", 9, produce_request(t, {0: data}), 5),
        encode_request("Produce", 3, produce_request(t, {0: data}, acks=1), 6),
        encode_request("ListOffsets", 7, message("ListOffsetsRequest").cls(replica_id=-1, topics=[
            message("ListOffsetsRequest").cls.ListOffsetsTopic(name=t, partitions=[
                message("ListOffsetsRequest").cls.ListOffsetsTopic.ListOffsetsPartition(partition_index=0,
                                                                                       timestamp=-1)])]), 7),
        encode_request("InitProducerId", 4, req("InitProducerId", transactional_id=None, transaction_timeout_ms=1,
                                                producer_id=-1, producer_epoch=-1), 8),
    ]


TEMPLATES = _templates()


@st.composite
def fuzz_input(draw) -> bytes:
    kind = draw(st.sampled_from(["random", "framed-random", "flip", "truncate", "splice", "resize"]))
    if kind == "random":
        return draw(st.binary(min_size=1, max_size=200))
    if kind == "framed-random":
        return frame(draw(st.binary(min_size=0, max_size=200)))
    base = bytearray(draw(st.sampled_from(TEMPLATES)))
    if kind == "flip":
        for _ in range(draw(st.integers(1, 6))):
            i = draw(st.integers(4, len(base) - 1))
            base[i] = draw(st.integers(0, 255))
        return bytes(base)
    if kind == "truncate":
        cut = draw(st.integers(5, len(base) - 1))
        body = base[4:cut]
        return frame(bytes(body))          # consistent size, truncated request
    if kind == "splice":
        i = draw(st.integers(4, len(base)))
        junk = draw(st.binary(min_size=1, max_size=40))
        body = base[4:i] + junk + base[i:]
        return frame(bytes(body))
    size = draw(st.integers(-10, len(base) + 10))
    return _INT32.pack(size) + bytes(base[4:])


def _exchange(bootstrap: str, data: bytes) -> None:
    """Send, half-close, and read until the broker closes: every reply is a well-formed frame."""
    with RawConn(bootstrap, timeout=5) as c:
        try:
            c.send(data)
            c.sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            return                           # already refused
        deadline = time.monotonic() + 5
        while True:
            try:
                c.read_frame(timeout=deadline - time.monotonic())
            except Closed:
                return
            except TimeoutError:
                raise AssertionError(f"broker neither answered nor closed within 5 s after {data!r}") from None


@settings(max_examples=50, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=fuzz_input())
def test_fuzz_frames(module_server, data):
    _exchange(module_server.bootstrap, data)
    assert module_server.proc.poll() is None, f"broker died on {data!r}\n{module_server.stderr_tail()}"


def test_healthy_after_fuzz(module_server, witness, log):
    """A second fuzz round (mutations of every template), then the broker is fully working and
    never hit an internal error."""
    import random
    rnd = random.Random(1234)
    for _ in range(60):
        base = bytearray(rnd.choice(TEMPLATES))
        for _ in range(rnd.randint(1, 4)):
            base[rnd.randrange(4, len(base))] = rnd.randrange(256)
        _exchange(module_server.bootstrap, bytes(base))
    assert module_server.proc.poll() is None
    assert_healthy(module_server, witness)
    name = unique("after-fuzz")
    create_topic(witness, name)
    [r] = produce(witness, name, {0: batch([b"still", b"works"])})
    assert (r.error_code, r.base_offset) == (NONE, 0)
    assert stored_values(witness, name, 0) == [b"still", b"works"]
    text = log.text()
    assert "Traceback" not in text and "internal error" not in text, text[-4000:]
