"""What a small request costs a bare Python server on this machine: the floor under the broker's CPU per request.

    .venv/bin/python bench/request_floor.py [--servers trio,trio-group-commit,epoll] [--connections 64]
        [--rate 10000] [--seconds 10] [--no-fsync] [--records 1] [--record-size 100]
    .venv/bin/python bench/request_floor.py --connections 1 --in-flight 5 --requests 17477 \
        --records 15 --record-size 1024        # the Java producer's shape: 16 KiB batches, 5 in flight

The client is `request_cost.py`'s open loop (the same ProduceRequest frames, one thread, latency from the time each
request was due), or with ``--in-flight N`` its closed loop (a thread per connection that keeps N requests in
flight, ``--requests`` in all).  Each server is a separate process that reads size-prefixed frames and answers
each with a fixed 60-byte frame (the size of a small Produce answer), decoding nothing:

- ``trio``: a task per connection (``wait_readable``, ``os.read``, answer at once) — the broker's connection
  model without any Kafka work and without a durability wait;
- ``trio-group-commit``: the same tasks append each frame to one file and answer after a group commit: a flusher
  task writes what the connections appended, fsyncs it in a worker thread (``trio.to_thread``, as the broker
  did before its own flush thread) and writes every waiting connection's answers — the broker's architecture,
  still without Kafka work;
- ``epoll``: one thread and one edge-triggered ``epoll`` for all connections, answering at once: no tasks.

Prints, per server, requests/s, its CPU µs per request split into user and system time (``/proc/PID/stat``),
the client's p50/p99, and the machine's reference speed; the last stdout line is a JSON list.  Nothing is
asserted.  ``docs/performance.md`` (issue 11's sixth round) compares these floors with the broker.
"""
from __future__ import annotations

import argparse
import json
import os
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from produce_consume import (PhaseClock, ServerStats, add_cpu_options, cpu_affinity_note,  # noqa: E402
                             format_placement, percentile, pin_this_process, pinned_at_start)
from request_cost import _connection, paced_requests, produce_frame, whole_frames  # noqa: E402
from speed_sampler import format_reference  # noqa: E402

SERVERS = ("trio", "trio-group-commit", "epoll")
ANSWER = (56).to_bytes(4, "big") + bytes(56)          # a size-prefixed 60-byte answer
READ_CHUNK = 65536


# --- the servers (each runs in its own process: `--serve KIND`) --------------------------------------------------

def serve_trio(listener: socket.socket, group_commit: bool, fsync: bool, data_dir: str) -> None:
    import trio

    class GroupCommit:
        """Appends of all connections, made durable together; answers written once the round is on disk."""

        def __init__(self, path: str):
            self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            self.chunks: list[bytes] = []
            self.waiting: dict = {}                 # connection's socket → answers owed after this round
            self.dirty = trio.Event()

        def append(self, sock, chunk: bytes, count: int) -> None:
            self.chunks.append(chunk)
            if count:
                self.waiting[sock] = self.waiting.get(sock, 0) + count
                self.dirty.set()

        async def run(self) -> None:
            while True:
                await self.dirty.wait()
                self.dirty = trio.Event()
                chunks, waiting, self.chunks, self.waiting = self.chunks, self.waiting, [], {}
                os.write(self.fd, b"".join(chunks))
                if fsync:
                    await trio.to_thread.run_sync(os.fdatasync, self.fd)
                for sock, count in waiting.items():
                    if sock.fileno() != -1:         # not closed meanwhile
                        _answer(sock.fileno(), count)

    async def connection(sock, commit: GroupCommit | None) -> None:
        fd = sock.fileno()
        buf = bytearray()
        with sock:
            while True:
                await trio.lowlevel.wait_readable(fd)
                try:
                    data = os.read(fd, READ_CHUNK)
                except BlockingIOError:
                    continue
                except OSError:
                    return
                if not data:
                    return
                buf += data
                count = whole_frames(buf)
                if commit is not None:
                    commit.append(sock, data, count)
                elif count:
                    _answer(fd, count)

    async def main() -> None:
        tsock = trio.socket.from_stdlib_socket(listener)
        commit = GroupCommit(os.path.join(data_dir, "log")) if group_commit else None
        async with trio.open_nursery() as nursery:
            if commit is not None:
                nursery.start_soon(commit.run)
            print("ready", flush=True)
            while True:
                sock, _ = await tsock.accept()
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                nursery.start_soon(connection, sock, commit)

    trio.run(main)


def serve_epoll(listener: socket.socket) -> None:
    listener.setblocking(False)
    poll = select.epoll()
    poll.register(listener.fileno(), select.EPOLLIN)
    hangup = select.EPOLLRDHUP | select.EPOLLHUP | select.EPOLLERR
    edge = select.EPOLLIN | select.EPOLLET | select.EPOLLRDHUP
    conns: dict[int, tuple[socket.socket, bytearray]] = {}
    print("ready", flush=True)
    while True:
        for fd, events in poll.poll():
            if fd == listener.fileno():
                while True:
                    try:
                        sock, _ = listener.accept()
                    except BlockingIOError:
                        break
                    sock.setblocking(False)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    conns[sock.fileno()] = (sock, bytearray())
                    poll.register(sock.fileno(), edge)
                continue
            sock, buf = conns[fd]
            closed = False
            while True:             # edge-triggered: read until EAGAIN (a short read is not enough: see FIN)
                try:
                    data = os.read(fd, READ_CHUNK)
                except BlockingIOError:
                    break
                except OSError:
                    closed = True
                    break
                if not data:
                    closed = True
                    break
                buf += data
                if len(data) < READ_CHUNK and not events & hangup:
                    break
            count = whole_frames(buf)
            if count and not closed:
                _answer(fd, count)
            if closed:
                poll.unregister(fd)
                conns.pop(fd)[0].close()


def _answer(fd: int, count: int) -> None:
    """Write ``count`` answers (a few KiB at most: the socket buffer takes them whole, or the server stops: an
    answer lost would leave the client waiting)."""
    answers = ANSWER * count
    try:
        written = os.write(fd, answers)
    except (BrokenPipeError, ConnectionResetError):
        return                      # the client is gone
    if written != len(answers):
        raise RuntimeError(f"{written} of {len(answers)} answer bytes written: the socket buffer is full")


def serve(kind: str, fsync: bool, data_dir: str) -> None:
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(512)
    print(listener.getsockname()[1], flush=True)
    if kind == "epoll":
        serve_epoll(listener)
    else:
        serve_trio(listener, kind == "trio-group-commit", fsync, data_dir)


# --- the client ---------------------------------------------------------------------------------------------------

def measure(kind: str, args) -> dict:
    with tempfile.TemporaryDirectory(prefix="request-floor-") as data_dir:    # the group commit's file
        return _measure(kind, args, data_dir)


def _measure(kind: str, args, data_dir: str) -> dict:
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve", kind, "--data-dir", data_dir]
                            + ([] if args.fsync else ["--no-fsync"]), stdout=subprocess.PIPE, text=True,
                            preexec_fn=pinned_at_start(args.server_cpus))
    try:
        port = int(proc.stdout.readline())
        if proc.stdout.readline() != "ready\n":
            raise SystemExit(f"{kind} server did not start")
        frames = [produce_frame("floor", 0, -1, args.records, args.record_size)] * args.connections
        latencies: list[float] = []
        answered: list[int] = []
        start = threading.Event()
        bootstrap = f"127.0.0.1:{port}"
        if args.in_flight:
            per_connection = args.requests // args.connections
            answered.append(per_connection * args.connections)
            clients = [threading.Thread(target=_connection, args=(
                bootstrap, frame, per_connection, args.in_flight, True, latencies, start)) for frame in frames]
        else:
            clients = [threading.Thread(target=lambda: answered.append(paced_requests(
                bootstrap, frames, args.rate, args.seconds, latencies, start)))]
        for client in clients:
            client.start()
        time.sleep(0.5)                     # connected
        clock = PhaseClock(ServerStats(proc.pid))
        clock.start()
        start.set()
        for client in clients:
            client.join()
        times = clock.stop()
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    done = answered[0] if answered else 0
    latencies.sort()
    split = times["server_cpu_split_s"] or {}

    def per(seconds: float | None) -> float | None:
        return None if seconds is None or not done else round(seconds / done * 1e6, 1)
    return {"server": kind, "connections": args.connections, "rate": None if args.in_flight else args.rate,
            "in_flight": args.in_flight or None, "request_bytes": len(frames[0]), "fsync": args.fsync,
            "requests": done, "requests_per_s": round(done / times["seconds"]),
            "cpu_us_per_request": per(times["server_cpu_s"]),
            "user_us_per_request": per(split.get("user")), "system_us_per_request": per(split.get("system")),
            "cpu_s_per_256mib": None if times["server_cpu_s"] is None or not done else round(
                times["server_cpu_s"] * (256 << 20) / (done * len(frames[0])), 2),
            "latency_ms": {q: None if not latencies else round(percentile(latencies, p) * 1000, 3)
                           for q, p in (("p50", 0.5), ("p99", 0.99))},
            "client_cpu_s": round(times["client_cpu_s"], 2), "reference_us": times["reference_us"],
            "placement": cpu_affinity_note(args)}


def report(r: dict) -> str:
    durable = " (fsync on)" if r["server"] == "trio-group-commit" and r["fsync"] else ""
    shape = f"{r['in_flight']} in flight each" if r["in_flight"] else "paced"
    return (f"{r['server']}{durable}: {r['requests_per_s']:,} requests/s of {r['request_bytes']:,} B from "
            f"{r['connections']} connections ({shape}), server CPU {r['cpu_us_per_request']} us/request "
            f"({r['cpu_s_per_256mib']} s per 256 MiB of requests; user {r['user_us_per_request']}, system "
            f"{r['system_us_per_request']}); round trip ms p50 {r['latency_ms']['p50']} p99 {r['latency_ms']['p99']}"
            f"{format_reference(r['reference_us'])}{format_placement(r['placement'])}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--servers", default=",".join(SERVERS), help="comma-separated, of: " + ", ".join(SERVERS))
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument("--rate", type=float, default=10000, help="requests/s from all connections together")
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--in-flight", type=int, default=0,
                    help="closed loop: each connection keeps this many requests in flight (in place of --rate)")
    ap.add_argument("--requests", type=int, default=20000, help="with --in-flight: requests in all")
    ap.add_argument("--records", type=int, default=1, help="records per request")
    ap.add_argument("--record-size", type=int, default=100)
    ap.add_argument("--fsync", action=argparse.BooleanOptionalAction, default=True,
                    help="trio-group-commit: fdatasync each round")
    ap.add_argument("--serve", choices=SERVERS, help=argparse.SUPPRESS)
    ap.add_argument("--data-dir", help=argparse.SUPPRESS)
    add_cpu_options(ap)
    args = ap.parse_args(argv)
    if args.serve:
        serve(args.serve, args.fsync, args.data_dir)
        return 0
    pin_this_process(args.client_cpus)          # servers start with --server-cpus (or, without it, these)
    results = []
    for kind in args.servers.split(","):
        if kind not in SERVERS:
            ap.error(f"unknown server {kind!r}")
        results.append(measure(kind, args))
        print(report(results[-1]), flush=True)
    print(json.dumps(results, separators=(",", ":")), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
