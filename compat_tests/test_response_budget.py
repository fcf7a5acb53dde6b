"""The broker-wide response budget (trireme.queued.max.response.bytes) as a hard cap on answers not yet written, against
a real `trireme serve`: many clients that each send one large Fetch (or one naming many partitions, or a ListOffsets
naming many) and never read its answer.

Each stuck client holds at most what the budget has room for, so the broker's memory (VmRSS) stays under the
budget plus a fixed allowance however many clients there are; a consumer on another connection keeps being
answered (a response cut to what fits, or an empty one after its max_wait); the memory comes back when the stuck
clients go.  ``TRIREME_FETCH_MEMORY_BENCH=1`` runs the large measurement (50 MiB answers, 100 and 1,000 clients,
the default 256 MiB budget) and prints the RSS figures.
"""
from __future__ import annotations

import os
import resource
import socket
import time

import pytest

from compat_tests.clients import wait_until
from compat_tests.test_bad_input import (RawConn, api_versions, batch, create_topic, encode_request, metadata, produce,
                                         unique)
from compat_tests.test_limits import eventually, fetch_request, metrics, rss_kib
from trireme.wire.codec import message

MiB = 1 << 20
BENCH = os.environ.get("TRIREME_FETCH_MEMORY_BENCH") == "1"

# What the broker may hold besides the budget: the interpreter's own growth with a few hundred connections (their
# tasks, buffers, objects) and one batch read beyond the budget.  Far below what one stuck client used to add per
# answer times the clients.
ALLOWANCE = 64 * MiB

if BENCH:
    BUDGET, ANSWER, BATCH, COUNTS = 256 * MiB, 50 * MiB, 1 * MiB - 200, (100, 1000)
else:
    BUDGET, ANSWER, BATCH, COUNTS = 8 * MiB, 5 * MiB, 1 * MiB - 200, (100, 300)

# The connection's share above one answer, so the whole-budget cap is what these tests exercise (the last test: the
# share).
CONFIG = {"trireme.metrics.listen": "127.0.0.1:0", "trireme.queued.max.response.bytes": BUDGET,
          "trireme.queued.max.response.bytes.per.connection": 64 * MiB,
          "fetch.max.bytes": max(ANSWER, 1 * MiB), "max.connections.per.ip": 4000, "max.connections": 4000}


@pytest.fixture(autouse=True)
def _enough_descriptors():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 2 * max(COUNTS) + 256
    if soft < want:
        if hard != resource.RLIM_INFINITY and hard < want:
            pytest.skip(f"needs {want} open files, the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def fill_topic(conn: RawConn, topic: str, total: int) -> None:
    """``total`` bytes of record batches of about BATCH bytes each in partition 0."""
    for i in range(total // BATCH + 1):
        [part] = produce(conn, topic, {0: batch([bytes([i % 251]) * (BATCH - 100)])})
        assert part.error_code == 0, part


def stuck_client(server, topic: str, max_bytes: int = 64 * MiB) -> socket.socket:
    """A client that sends one Fetch for everything from offset 0 and reads nothing (a tiny receive window)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect((server.host, server.port))
    s.sendall(encode_request("Fetch", 11, fetch_request(topic, max_bytes), 1))
    return s


def fetches_handled(server) -> float:
    return metrics(server).get('trireme_requests_total{api="Fetch"}', 0)


def add_stuck(server, topic: str, clients: list, count: int) -> None:
    """Grow ``clients`` to ``count`` stuck clients; returns once the broker has handled every one's Fetch."""
    before = fetches_handled(server)
    added = count - len(clients)
    clients += [stuck_client(server, topic) for _ in range(added)]
    # (unbounded, 100 answers of 50 MiB took longer than 15 s to read: the bound only guards a hang)
    wait_until(lambda: fetches_handled(server) >= before + added, timeout=120, interval=0.1,
               what=f"{added} more fetches handled")
    time.sleep(0.5)     # their answers are built in the same step; let the writers try to send them


def consume(server, topic: str, max_wait_ms: int = 500) -> bytes:
    """One Fetch (min_bytes 1, waiting up to ``max_wait_ms``) from a consumer's connection → its record bytes."""
    with RawConn(server.bootstrap, timeout=10) as c:
        resp = c.request("Fetch", 11, fetch_request(topic, 64 * MiB, max_wait_ms=max_wait_ms, min_bytes=1), timeout=10)
        [part] = resp.responses[0].partitions
        assert resp.error_code == 0 and part.error_code == 0, resp
        return bytes(part.records or b"")


@pytest.mark.server_config(CONFIG)
def test_unread_fetch_answers_stay_within_the_budget_however_many_clients(server):
    topic = unique("stuck")
    with RawConn(server.bootstrap) as c:
        create_topic(c, topic)
        fill_topic(c, topic, ANSWER)
    assert len(consume(server, topic)) >= ANSWER - BATCH       # one answer holds the whole partition
    pid = server.proc.pid
    baseline = rss_kib(pid)
    clients: list[socket.socket] = []
    seen = []
    try:
        for count in COUNTS:
            add_stuck(server, topic, clients, count)
            held = metrics(server)
            rss = rss_kib(pid)
            seen.append((count, rss, held["trireme_response_memory_bytes"]))
            print(f"\n{count} stuck clients: VmRSS {rss / 1024:.0f} MiB (baseline {baseline / 1024:.0f} MiB), "
                  f"response memory {held['trireme_response_memory_bytes'] / MiB:.1f} MiB, "
                  f"peak {held['trireme_response_memory_peak_bytes'] / MiB:.1f} MiB")
            # Unbounded, each client held one whole answer: count x ANSWER.
            assert held["trireme_response_memory_peak_bytes"] <= BUDGET + BATCH + 64 * 1024, held
            assert (rss - baseline) * 1024 <= BUDGET + 16 * MiB + ALLOWANCE, seen
        # The budget is in use (the clients hold what fits, less the eighth left for answers without records).
        assert seen[-1][2] >= BUDGET - BUDGET // 8 - 2 * BATCH, seen
    finally:
        for s in clients:
            s.close()
    eventually(lambda: metrics(server)["trireme_response_memory_bytes"] == 0, what="response memory released")


@pytest.mark.server_config(CONFIG)
def test_a_consumer_is_served_while_the_budget_is_exhausted_and_memory_comes_back(server):
    topic = unique("starve")
    with RawConn(server.bootstrap) as c:
        create_topic(c, topic)
        fill_topic(c, topic, ANSWER)
    pid = server.proc.pid
    baseline = rss_kib(pid)
    clients: list[socket.socket] = []
    try:
        add_stuck(server, topic, clients, 50)
        held = metrics(server)
        holding = rss_kib(pid)
        assert BUDGET - BUDGET // 8 - 2 * BATCH <= held["trireme_response_memory_bytes"], held
        assert held["trireme_response_memory_peak_bytes"] <= BUDGET + BATCH + 64 * 1024, held
        # Answered (a response cut to what fits, or an empty one at its max_wait), never left waiting: the bound
        # on this read only guards against a hang.
        for _ in range(3):
            assert len(consume(server, topic)) <= BUDGET
        assert metrics(server)['trireme_response_memory_waits_total{api="Fetch"}'] >= 3
        # A large request (its answer over 64 KiB) still has room beside all the records the budget allows.
        with RawConn(server.bootstrap) as c:
            resp = c.request("ListOffsets", 7, wide_list_offsets(topic, 5_000))
            assert [p.error_code for p in resp.topics[0].partitions][:2] == [0, 3]
    finally:
        for s in clients:
            s.close()
    eventually(lambda: metrics(server)["trireme_response_memory_bytes"] == 0, what="response memory released")
    assert len(consume(server, topic)) >= ANSWER - BATCH       # the whole answer again
    # The memory came back: the allocator may keep freed buffers for reuse rather than give them to the system, so
    # a second round of stuck clients must fit in what the first one left (no leak), not add to it.
    clients = []
    try:
        add_stuck(server, topic, clients, 50)
        again = rss_kib(pid)
        print(f"\nVmRSS baseline {baseline} KiB, first round {holding} KiB, second round {again} KiB")
        assert (again - holding) * 1024 <= 4 * MiB
    finally:
        for s in clients:
            s.close()


BIG = 6 * MiB


@pytest.mark.server_config({**CONFIG, "trireme.queued.max.response.bytes": 4 * MiB, "message.max.bytes": 8 * MiB})
def test_a_batch_larger_than_the_budget_is_served_when_it_is_alone(server):
    """A batch over the whole budget is not cut (never below one batch): it waits until no other answer holds
    budget, then goes out whole; meanwhile its consumer gets empty answers at its max_wait, not a hang."""
    assert "message.max.bytes=8388608 is over what trireme.queued.max.response.bytes=4194304 leaves to records" \
        in server.stderr_path.read_text()
    big, small = unique("big"), unique("small")
    with RawConn(server.bootstrap) as c:
        create_topic(c, big, configs={"max.message.bytes": str(8 * MiB)})
        create_topic(c, small)
        [part] = produce(c, big, {0: batch([bytes(range(256)) * (BIG // 256)])})
        assert part.error_code == 0, part
        fill_topic(c, small, 3 * MiB)
    assert len(consume(server, big)) > BIG          # alone: served whole, over the 4 MiB budget
    holder = stuck_client(server, small)            # holds about 3 MiB of the 4 MiB budget
    try:
        eventually(lambda: metrics(server)["trireme_response_memory_bytes"] >= 2 * MiB, what="the budget in use")
        assert consume(server, big) == b""          # does not fit beside it: waits, then empty at max_wait
    finally:
        holder.close()
    eventually(lambda: metrics(server)["trireme_response_memory_bytes"] == 0, what="response memory released")
    assert len(consume(server, big)) > BIG


SHARE = 2 * MiB


@pytest.mark.server_config({**CONFIG, "trireme.queued.max.response.bytes.per.connection": SHARE})
def test_one_slow_reader_holds_at_most_its_share(server):
    """A connection's records stop at its share of the budget, so one client that reads nothing cannot take the
    budget from everybody: a consumer beside it still gets records."""
    topic = unique("share")
    with RawConn(server.bootstrap) as c:
        create_topic(c, topic)
        fill_topic(c, topic, ANSWER)
    assert 0 < len(consume(server, topic)) <= SHARE             # cut at the share, KIP-74 style
    slow = stuck_client(server, topic)
    try:
        eventually(lambda: metrics(server)["trireme_response_memory_bytes"] > 0, what="the slow reader's answer")
        assert metrics(server)["trireme_response_memory_bytes"] <= SHARE + 64 * 1024
        assert len(consume(server, topic)) > 0
    finally:
        slow.close()



def wide_fetch(topic: str, partitions: int) -> object:
    """A Fetch naming ``partitions`` partitions of ``topic`` (no wait): its answer lists every one of them."""
    cls = message("FetchRequest").cls
    tcls = cls.FetchTopic
    return cls(replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, isolation_level=0, session_id=0,
               session_epoch=-1, topics=[tcls(topic=topic, partitions=[
                   tcls.FetchPartition(partition=p, fetch_offset=0, log_start_offset=-1, partition_max_bytes=1 << 20)
                   for p in range(partitions)])])


@pytest.mark.server_config({**CONFIG, "queued.max.request.bytes": 16 * MiB})
def test_answers_listing_many_partitions_stay_within_the_budget(server):
    """A Fetch's answer lists every partition it names, records or not: 50,000 partitions of an absent topic (a
    1.4 MB request) take a 2.3 MB answer.  Those answers wait for room like records do."""
    frame = encode_request("Fetch", 11, wide_fetch(unique("absent"), 50_000), 1)
    pid = server.proc.pid
    baseline = rss_kib(pid)
    clients: list[socket.socket] = []
    seen = []
    try:
        for count in (20, 100):
            for _ in range(count - len(clients)):
                s = socket.socket()
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                s.connect((server.host, server.port))
                s.sendall(frame)
                clients.append(s)
            time.sleep(2)        # nothing to wait for: most of them wait for room, or for request budget to read
            held = metrics(server)
            rss = rss_kib(pid)
            seen.append(rss)
            print(f"\n{count} wide fetches: VmRSS {rss / 1024:.0f} MiB (baseline {baseline / 1024:.0f} MiB), "
                  f"response memory {held['trireme_response_memory_bytes'] / MiB:.1f} MiB")
            # Unbounded, each client held one 2.3 MB answer (230 MB for 100).  The requests waiting for room are
            # held as their frames, within the request budget (16 MiB here), not decoded.
            assert held["trireme_response_memory_peak_bytes"] <= BUDGET + 3 * MiB, held
            assert (rss - baseline) * 1024 <= BUDGET + 16 * MiB + ALLOWANCE, seen
    finally:
        for s in clients:
            s.close()
    eventually(lambda: metrics(server)["trireme_response_memory_bytes"] == 0, what="response memory released")


def wide_list_offsets(topic: str, partitions: int) -> object:
    """A ListOffsets naming ``partitions`` partitions of ``topic``: its answer lists every one of them."""
    cls = message("ListOffsetsRequest").cls
    tcls = cls.ListOffsetsTopic
    return cls(replica_id=-1, isolation_level=0, topics=[tcls(name=topic, partitions=[
        tcls.ListOffsetsPartition(partition_index=p, timestamp=-1) for p in range(partitions)])])


@pytest.mark.server_config(CONFIG)
def test_other_answers_that_grow_with_their_request_stay_within_the_budget(server):
    """Not only Fetch: a ListOffsets naming 50,000 partitions (a 0.9 MB request) takes a 1.3 MB answer.  A
    request waits before it is handled until the budget has room for an answer of its size, so clients that
    read nothing hold no more than the budget; small requests (a consumer's) are still answered."""
    topic = unique("small")
    with RawConn(server.bootstrap) as c:
        create_topic(c, topic)
        [part] = produce(c, topic, {0: batch([b"small"])})
        assert part.error_code == 0, part
    frame = encode_request("ListOffsets", 7, wide_list_offsets(unique("absent"), 50_000), 1)
    clients: list[socket.socket] = []
    try:
        for _ in range(40):         # 52 MB of answers unbounded
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect((server.host, server.port))
            s.sendall(frame)
            clients.append(s)
        eventually(lambda: metrics(server)["trireme_response_memory_bytes"] >= BUDGET - BUDGET // 8 - 2 * MiB,
                   what="the answers filling the budget")
        time.sleep(1)               # nothing to wait for: the rest wait for room
        held = metrics(server)
        assert held["trireme_response_memory_peak_bytes"] <= BUDGET + 2 * MiB, held
        assert held['trireme_response_memory_waits_total{api="ListOffsets"}'] >= 1, held
        # Small requests use the headroom large answers leave: a client's metadata, a consumer's fetch (answered,
        # with the records that have room, if any).
        with RawConn(server.bootstrap) as c:
            assert api_versions(c).error_code == 0
            assert metadata(c).brokers
        consume(server, topic, max_wait_ms=0)
    finally:
        for s in clients:
            s.close()
    # (requests that waited for room are handled once it frees, after their clients went: they end at the send)
    eventually(lambda: consume(server, topic, max_wait_ms=0) != b"", what="records served again")
    eventually(lambda: metrics(server)["trireme_response_memory_bytes"] == 0, what="response memory released")
