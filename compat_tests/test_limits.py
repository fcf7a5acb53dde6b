"""Resource bounds under abuse, played against a real `trireme serve`: slow size prefixes, unread pipelined fetches,
too many partitions, a descriptor-starved broker, idle and abandoned long-poll connections.

Each test configures small bounds, plays the abuse, and checks that the broker's memory (VmRSS) and
descriptors (/proc/PID/fd) stay within them, that other clients are served meanwhile, that everything
is back to normal once the abuse stops, and that the broker restarts cleanly afterwards.
"""
from __future__ import annotations

import itertools
import os
import re
import resource
import socket
import struct
import time
import urllib.request

import pytest

from compat_tests.clients import wait_until
from compat_tests.test_bad_input import (Closed, LogWatch, RawConn, api_versions, batch, create_topic, fetch,
                                         metadata, proc_status_kib, produce, unique)
from trireme.wire.codec import message

MiB = 1 << 20
METRICS = {"trireme.metrics.listen": "127.0.0.1:0"}
POLICY_VIOLATION = 44


# --------------------------------------------------------------------------- observing the broker

def rss_kib(pid: int) -> int:
    return proc_status_kib(pid, "VmRSS")


def descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def metrics(server) -> dict[str, float]:
    """The broker's Prometheus metrics, by name with labels."""
    text = server.stderr_path.read_text(errors="replace")
    port = re.findall(r"metrics on http://[^:]+:(\d+)/metrics", text)[-1]
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def eventually(check, what: str):
    """Poll ``check`` until it returns something true (no timing is asserted: the timeout only bounds a hang)."""
    return wait_until(check, timeout=15.0, interval=0.05, what=what)


def assert_serves(server, topic: str, value: bytes) -> None:
    """A fresh client can produce to and fetch from ``topic``."""
    with RawConn(server.bootstrap) as c:
        assert api_versions(c).error_code == 0
        [part] = produce(c, topic, {0: batch([value])})
        assert part.error_code == 0, part
        _hw, data = fetch(c, topic, 0, part.base_offset)
        assert value in data


def restart_and_check(server, topic: str) -> None:
    server.restart()
    assert_serves(server, topic, b"after-restart")


def is_closed(conn: RawConn, timeout: float = 15.0) -> bool:
    """Whether the broker closes ``conn`` (any unread answers are skipped)."""
    deadline = time.monotonic() + timeout
    try:
        while True:
            conn._recv_into_buf(deadline)
            conn.buf.clear()
    except Closed:
        return True
    except TimeoutError:
        return False


# --------------------------------------------------------------------------- 1. request memory

REQUEST_BUDGET = 64 * MiB


@pytest.mark.server_config({**METRICS, "queued.max.request.bytes": REQUEST_BUDGET,
                            "trireme.request.receive.timeout.ms": 4000})
def test_slow_size_prefixes_stay_within_the_request_budget(server):
    topic = unique("prefix")
    witness = RawConn(server.bootstrap)
    create_topic(witness, topic)
    pid = server.proc.pid
    baseline = rss_kib(pid)
    log = LogWatch(server)
    # 20 connections announce 100 MB frames; each sends 6 MiB of it at once, then one byte now and then.
    # Unbounded, that is 2 GB of buffers; within the budget, at most 64 MiB are held.
    abusers = []
    for _ in range(20):
        c = RawConn(server.bootstrap)
        c.sock.setblocking(False)
        try:
            c.sock.send(struct.pack(">i", 100_000_000) + bytes(6 * MiB))
        except BlockingIOError:
            pass            # the broker stopped reading this one: the budget is full
        c.sock.setblocking(True)
        abusers.append(c)
    eventually(lambda: metrics(server)["trireme_request_memory_bytes"] >= REQUEST_BUDGET - 8 * MiB,
               what="the request budget filling up")
    for _ in range(3):
        for c in abusers:
            try:
                c.sock.send(b"\0")
            except OSError:
                pass
        # Other clients are served meanwhile: small requests need no budget beyond what they hold.
        assert metadata(witness).brokers
        assert_serves(server, topic, b"during")
        time.sleep(0.2)
    held = metrics(server)
    assert held["trireme_request_memory_peak_bytes"] <= REQUEST_BUDGET + 8 * MiB, held
    assert rss_kib(pid) - baseline <= (REQUEST_BUDGET + 48 * MiB) // 1024
    # No frame completes within trireme.request.receive.timeout.ms: every abuser is closed.
    for c in abusers:
        assert is_closed(c), "an abuser stayed connected past the receive deadline"
        c.close()
    log.wait_for("not received within trireme.request.receive.timeout.ms=4000")
    eventually(lambda: metrics(server)["trireme_request_memory_bytes"] == 0, what="request memory released")
    assert metadata(witness).brokers
    assert_serves(server, topic, b"after")
    witness.close()
    restart_and_check(server, topic)


@pytest.mark.server_config({**METRICS, "queued.max.request.bytes": 4 * MiB,
                            "trireme.queued.max.request.bytes.per.connection": 1 * MiB})
def test_a_frame_larger_than_the_budget_still_completes(server):
    """A frame over the whole budget is received when nothing else is held (the budget never deadlocks)."""
    topic = unique("big")
    with RawConn(server.bootstrap) as c:
        create_topic(c, topic, configs={"max.message.bytes": str(8 * MiB)})
        value = bytes(range(256)) * (6 * MiB // 256)
        [part] = produce(c, topic, {0: batch([value])})
        assert part.error_code == 0, part
    assert metrics(server)["trireme_request_memory_bytes"] == 0


# --------------------------------------------------------------------------- 2. response memory

def fetch_request(topic: str, max_bytes: int, max_wait_ms: int = 0, min_bytes: int = 0) -> object:
    cls = message("FetchRequest").cls
    tcls = cls.FetchTopic
    return cls(replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=min_bytes, max_bytes=max_bytes, isolation_level=0,
               session_id=0, session_epoch=-1, topics=[tcls(topic=topic, partitions=[
                   tcls.FetchPartition(partition=0, fetch_offset=0, log_start_offset=-1,
                                       partition_max_bytes=max_bytes)])])


@pytest.mark.server_config({**METRICS, "trireme.queued.max.response.bytes": 32 * MiB,
                            "trireme.queued.max.response.bytes.per.connection": 4 * MiB,
                            "trireme.response.send.timeout.ms": 6000})
def test_unread_pipelined_fetches_are_bounded_and_disconnected(server):
    from compat_tests.test_bad_input import encode_request
    topic = unique("unread")
    witness = RawConn(server.bootstrap)
    create_topic(witness, topic)
    for i in range(8):          # 8 MiB in the partition: each fetch below answers all of it
        [part] = produce(witness, topic, {0: batch([bytes([i]) * (1 * MiB - 200)])})
        assert part.error_code == 0
    pid = server.proc.pid
    baseline = rss_kib(pid)
    log = LogWatch(server)
    # 10 clients with a tiny receive buffer pipeline 100 fetches of up to 50 MiB each and read nothing.
    # Unbounded, ~66 answers of 8 MiB per client were kept; muted, each client holds about one, and all of them
    # together no more than the 32 MiB budget (the rest of their answers are cut to what fits, or empty).
    abusers = []
    pipelined = b"".join(encode_request("Fetch", 11, fetch_request(topic, 50 * MiB), cid) for cid in range(100))
    for _ in range(10):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect((server.host, server.port))
        s.setblocking(False)
        try:
            s.send(pipelined)
        except BlockingIOError:
            pass
        abusers.append(s)
    # (records leave an eighth of the budget to answers without records)
    eventually(lambda: metrics(server)["trireme_response_memory_bytes"] >= 32 * MiB - 4 * MiB - 2 * MiB,
               what="the abusers' answers filling the budget")
    # Other clients (a consumer here) are answered meanwhile (with what fits, here nothing: no wait).
    for _ in range(3):
        _hw, data = fetch(witness, topic, 0)
        time.sleep(0.3)
    held = metrics(server)
    # The budget is a hard cap: about 2.5 GB unbounded, 10 x 8 MiB with only the per-connection mute.
    assert held["trireme_response_memory_peak_bytes"] <= 33 * MiB, held
    assert rss_kib(pid) - baseline <= (32 * MiB + 64 * MiB) // 1024
    # A client that reads nothing for trireme.response.send.timeout.ms is disconnected, which frees what it held.
    log.wait_for("read nothing of a response for trireme.response.send.timeout.ms=6000", timeout=30)
    wait_until(lambda: metrics(server)["trireme_response_memory_bytes"] == 0, timeout=120, interval=0.2,
               what="response memory released")
    assert metrics(server)['trireme_connections_closed_total{reason="send timeout"}'] >= 4
    for s in abusers:
        s.close()
    assert_serves(server, topic, b"after")
    witness.close()
    restart_and_check(server, topic)


# --------------------------------------------------------------------------- 3. partitions and descriptors

def create_topics(conn: RawConn, name: str, partitions: int) -> tuple[int, str | None]:
    cls = message("CreateTopicsRequest").cls
    resp = conn.request("CreateTopics", 7, cls(topics=[cls.CreatableTopic(
        name=name, num_partitions=partitions, replication_factor=1)], timeout_ms=10000), timeout=120)
    [t] = resp.topics
    return t.error_code, t.error_message


def create_partitions(conn: RawConn, name: str, count: int) -> tuple[int, str | None]:
    cls = message("CreatePartitionsRequest").cls
    resp = conn.request("CreatePartitions", 3, cls(topics=[cls.CreatePartitionsTopic(
        name=name, count=count, assignments=None)], timeout_ms=10000, validate_only=False), timeout=120)
    [t] = resp.results
    return t.error_code, t.error_message


@pytest.mark.server_config({**METRICS, "trireme.max.partitions": 400, "trireme.log.max.open.files": 64,
                            "trireme.fsync.enable": False})
def test_partitions_beyond_the_limit_are_refused_and_descriptors_stay_bounded(server):
    topic = unique("many")
    with RawConn(server.bootstrap) as c:
        # 10,000 partitions at once, and then twice: refused with a message, nothing half-created.
        for _ in range(2):
            code, text = create_topics(c, unique("huge"), 10_000)
            assert code == POLICY_VIOLATION and "trireme.max.partitions" in text, (code, text)
        assert create_topics(c, topic, 300) == (0, None)
        code, text = create_partitions(c, topic, 5_000)
        assert code == POLICY_VIOLATION and "trireme.max.partitions" in text, (code, text)
        assert create_partitions(c, topic, 390) == (0, None)
        code, _ = create_topics(c, unique("over"), 11)
        assert code == POLICY_VIOLATION
        names = [t.name for t in metadata(c).topics if not t.is_internal]
        assert names == [topic], names
        # Every one of the 390 partitions works, while the logs hold at most 64 descriptors.
        for p in range(0, 390, 7):
            [part] = produce(c, topic, {p: batch([b"v%d" % p])})
            assert part.error_code == 0, part
        for p in range(0, 390, 7):
            assert fetch(c, topic, p)[1]
        m = metrics(server)
        assert m["trireme_log_open_files"] <= 64
        assert descriptors(server.proc.pid) <= 64 + 64
    server.restart()
    assert descriptors(server.proc.pid) <= 64 + 64
    with RawConn(server.bootstrap) as c:
        topics = [t for t in metadata(c).topics if not t.is_internal]
        assert [(t.name, len(t.partitions)) for t in topics] == [(topic, 390)]
        assert b"v385" in fetch(c, topic, 385)[1]


NOFILE = 200


def low_nofile() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))


@pytest.fixture
def starved_server(request):
    """A broker started under a hard open files limit of NOFILE."""
    import shutil
    import tempfile
    from pathlib import Path

    from compat_tests.conftest import ServerProcess
    workdir = Path(tempfile.mkdtemp(prefix="trireme-limits-"))
    srv = ServerProcess(workdir, config={**METRICS, "trireme.fsync.enable": False})
    srv.preexec_fn = low_nofile
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()
        if not request.node.rep_call.failed:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(srv.stderr_tail())


def test_descriptor_starved_broker_refuses_connections_and_recovers(starved_server):
    server = starved_server
    pid = server.proc.pid
    assert f"open files limit soft={NOFILE}" in server.stderr_path.read_text()
    m = metrics(server)
    cap = int(m["trireme_connections_limit"])
    files = int(m["trireme_log_open_files_limit"])
    assert cap + files < NOFILE                  # connections can never take the logs' descriptors
    topic = unique("starved")
    witness = RawConn(server.bootstrap)
    create_topic(witness, topic, partitions=files + 50)      # more partitions than the logs may keep open
    # A flood of connections, far more than the limit allows.
    flood = []
    for _ in range(cap + 60):
        try:
            flood.append(RawConn(server.bootstrap, timeout=5))
        except OSError:
            pass
    served = refused = 0
    for c in flood:
        try:
            served += api_versions(c).error_code == 0
        except (Closed, OSError):
            refused += 1
    assert refused >= 60 and served <= cap, (served, refused)
    # The broker keeps working for connected clients, on every partition.
    for p in range(0, files + 50, 5):
        [part] = produce(witness, topic, {p: batch([b"x%d" % p])})
        assert part.error_code == 0, part
        assert fetch(witness, topic, p)[1]
    m = metrics(server)
    assert m['trireme_connections_refused_total{reason="max.connections"}'] >= 60
    assert m["trireme_log_open_files"] <= files
    for c in flood:
        c.close()
    # Once the flood is gone, new connections are served again, without a restart.
    eventually(lambda: metrics(server)["trireme_connections"] <= 2, what="flood connections closed")
    more = [RawConn(server.bootstrap) for _ in range(cap - 5)]
    for c in more:
        assert api_versions(c).error_code == 0
        c.close()
    assert_serves(server, topic, b"after")
    witness.close()
    restart_and_check(server, topic)
    assert server.proc.poll() is None


# --------------------------------------------------------------------------- 4. connections

@pytest.mark.server_config({**METRICS, "connections.max.idle.ms": 1000})
def test_idle_connections_are_closed_but_long_polls_are_not_idle(server):
    topic = unique("idle")
    with RawConn(server.bootstrap) as c:
        create_topic(c, topic)
    idle = [RawConn(server.bootstrap) for _ in range(30)]
    for c in idle:
        assert api_versions(c).error_code == 0
    # A long poll of 3 s on an empty partition is not idle, although nothing is sent for 3 s.
    poller = RawConn(server.bootstrap)
    cid = poller.send_request("Fetch", 11, fetch_request(topic, MiB, max_wait_ms=3000, min_bytes=1))
    for c in idle:
        assert is_closed(c), "an idle connection was not closed"
        c.close()
    resp = poller.read_response("Fetch", 11, cid, timeout=10)
    assert resp.responses[0].partitions[0].error_code == 0
    poller.close()
    assert metrics(server)['trireme_connections_closed_total{reason="idle"}'] >= 30
    restart_and_check(server, topic)


@pytest.mark.server_config(METRICS)
def test_abandoned_long_polls_release_their_connections_at_once(server):
    topic = unique("abandoned")
    pid = server.proc.pid
    with RawConn(server.bootstrap) as c:
        create_topic(c, topic)
    eventually(lambda: metrics(server)["trireme_connections"] == 0, what="no connections left")
    base = descriptors(pid)
    # 300 clients each ask for a fetch that may wait 24.8 days, then go away.
    for _ in range(300):
        c = RawConn(server.bootstrap)
        c.send_request("Fetch", 11, fetch_request(topic, MiB, max_wait_ms=2**31 - 1, min_bytes=1))
        c.close()
    # Their sockets are closed on EOF, not left in CLOSE-WAIT until the wait ends.
    eventually(lambda: descriptors(pid) <= base + 2, what="abandoned connections closed")
    eventually(lambda: metrics(server)["trireme_connections"] == 0, what="no connections left")
    # A long poll that stays gets its answer when data arrives.
    poller = RawConn(server.bootstrap)
    cid = poller.send_request("Fetch", 11, fetch_request(topic, MiB, max_wait_ms=20000, min_bytes=1))
    with RawConn(server.bootstrap) as p:
        [part] = produce(p, topic, {0: batch([b"wake"])})
        assert part.error_code == 0
    resp = poller.read_response("Fetch", 11, cid, timeout=20)
    assert b"wake" in bytes(resp.responses[0].partitions[0].records)
    poller.close()
    restart_and_check(server, topic)


class ConnFrom(RawConn):
    """A RawConn from a chosen local address (any 127.x.y.z reaches a broker on 127.0.0.1)."""

    def __init__(self, server, source: str):
        self.sock = socket.create_connection((server.host, server.port), timeout=10, source_address=(source, 0))
        self.timeout = 10.0
        self._ids = itertools.count(1)
        self.buf = bytearray()


@pytest.mark.server_config({**METRICS, "max.connections.per.ip": 3,
                            "max.connections.per.ip.overrides": "127.0.0.2:5"})
def test_connections_per_ip_with_overrides(server):
    def connect(source: str) -> RawConn:
        return ConnFrom(server, source)

    def served(conns) -> list[bool]:
        out = []
        for c in conns:
            try:
                out.append(api_versions(c).error_code == 0)
            except (Closed, OSError):
                out.append(False)
        return out

    local = [connect("127.0.0.1") for _ in range(4)]
    assert served(local) == [True, True, True, False]
    other = [connect("127.0.0.2") for _ in range(6)]
    assert served(other) == [True] * 5 + [False]
    assert metrics(server)['trireme_connections_refused_total{reason="max.connections.per.ip"}'] == 2
    for c in local + other:
        c.close()
    eventually(lambda: metrics(server)["trireme_connections"] == 0, what="connections closed")
    again = [connect("127.0.0.1") for _ in range(3)]
    assert served(again) == [True] * 3
    for c in again:
        c.close()


def test_serve_help_prints_every_limit_with_its_default():
    import subprocess

    from compat_tests.conftest import server_command
    out = subprocess.run(server_command() + ["--help"], capture_output=True, text=True, check=True).stdout
    for name, default in [("queued.max.request.bytes", 268435456), ("connections.max.idle.ms", 600000),
                          ("max.connections", 4096), ("max.connections.per.ip", 2048),
                          ("max.connection.creation.rate", 1000), ("trireme.max.partitions", 20000),
                          ("trireme.queued.max.response.bytes", 268435456),
                          ("trireme.request.receive.timeout.ms", 60000),
                          ("trireme.response.send.timeout.ms", 60000), ("trireme.log.max.open.files", 4096)]:
        assert f"  {name} (default {default})" in out, name


@pytest.mark.server_config(METRICS)
def test_topic_creation_is_all_or_nothing(server):
    """A partition whose files cannot be created fails the whole topic: nothing is registered, the partitions
    created before it are removed, and once the obstacle is gone the same topic is created and survives a restart."""
    topic = unique("atomic")
    obstacle = server.data_dir / "logs" / f"{topic}-5"
    obstacle.parent.mkdir(parents=True, exist_ok=True)
    obstacle.write_text("not a directory")
    with RawConn(server.bootstrap) as c:
        code, text = create_topics(c, topic, 8)
        assert code == 56 and "could not create the partition files" in text, (code, text)   # KAFKA_STORAGE_ERROR
        assert [t.name for t in metadata(c).topics if not t.is_internal] == []
        assert sorted(p.name for p in obstacle.parent.iterdir() if p.name.startswith(topic)) == [obstacle.name]
    server.restart()                     # start-up is not bothered by the leftover
    obstacle.unlink()
    with RawConn(server.bootstrap) as c:
        assert create_topics(c, topic, 8) == (0, None)
    with RawConn(server.bootstrap) as c:
        for p in range(8):
            [part] = produce(c, topic, {p: batch([b"p%d" % p])})
            assert part.error_code == 0
    restart_and_check(server, topic)
