"""Broker CPU per small Produce request, measured with a raw-protocol client that costs the machine little.

    .venv/bin/python bench/request_cost.py [--connections 4] [--in-flight 8] [--requests 20000]
        [--records 10] [--record-size 100] [--acks -1] [--partitions 4] [--no-fsync]
        [--bootstrap HOST:PORT --server-pid PID]

Each connection is a thread with a blocking socket that keeps ``--in-flight`` ProduceRequests (v9,
one partition, one batch of ``--records`` records, encoded once with ``trireme.wire``) outstanding;
connection i writes partition i mod ``--partitions``.  Unlike librdkafka this client does no work
per request beyond a send and a receive, so on a shared 2-core machine the broker's CPU per request
(``utime+stime`` from ``/proc/PID/stat`` over the run, divided by the requests answered) is
disturbed less.  Prints requests/s, broker CPU µs per request (split into user and system time, for the
process and for its event-loop thread) and the client's round-trip p50/p99.
The last stdout line is a JSON summary.  Nothing is asserted.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import selectors
import socket
import struct
import sys
import threading
import time
import uuid
from collections import deque

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from produce_consume import (PhaseClock, ServerStats, add_cpu_options, broker, broker_latency,  # noqa: E402
                             cpu_affinity_note, create_topic, format_broker_latency, format_fsync_latency,
                             format_placement, fsync_latency, percentile, scrape_metrics)
from speed_sampler import format_reference  # noqa: E402

from trireme.wire import headers, records  # noqa: E402
from trireme.wire.codec import message  # noqa: E402

PRODUCE_VERSION = 9
_SIZE = struct.Struct(">i")


def produce_frame(topic: str, partition: int, acks: int, count: int, size: int) -> bytes:
    """One size-prefixed ProduceRequest v9 carrying one batch of ``count`` records of ``size`` bytes."""
    codec = message("ProduceRequest")
    batch = records.build_batch([(None, b"x" * size)] * count)
    cls = codec.cls
    topic_cls = cls.TopicProduceData
    request = cls(acks=acks, timeout_ms=30000, topic_data=[topic_cls(name=topic, partition_data=[
        topic_cls.PartitionProduceData(index=partition, records=batch)])])
    body = headers.encode_request_header(0, PRODUCE_VERSION, 1, "request-cost", True) + codec.encode_bytes(
        request, PRODUCE_VERSION)
    return _SIZE.pack(len(body)) + body


def _connection(bootstrap: str, frame: bytes, requests: int, in_flight: int, expect_answers: bool,
                latencies: list, start: threading.Event) -> None:
    host, port = bootstrap.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    start.wait()
    sent_at = []
    sent = answered = 0
    buf = bytearray()
    while answered < requests:
        while sent < requests and sent - answered < in_flight:
            sock.sendall(frame)
            sent_at.append(time.perf_counter())
            sent += 1
        if not expect_answers:
            answered = sent
            continue
        now, count = _receive_answers(sock, buf)
        for _ in range(count):
            latencies.append(now - sent_at[answered])
            answered += 1
    sock.close()


def _receive_answers(sock, buf: bytearray) -> tuple[float, int]:
    """One recv into ``buf`` → (when, how many whole answers it completed); those are dropped from ``buf``."""
    data = sock.recv(1 << 16)
    if not data:
        raise SystemExit("the broker closed the connection")
    buf += data
    return time.perf_counter(), whole_frames(buf)


def whole_frames(buf: bytearray) -> int:
    """Drop the whole size-prefixed frames at the start of ``buf`` → how many there were."""
    count = 0
    while len(buf) >= 4:
        end = 4 + _SIZE.unpack_from(buf)[0]
        if len(buf) < end:
            break
        del buf[:end]
        count += 1
    return count


def paced_requests(bootstrap: str, frames: list[bytes], rate: float, seconds: float, latencies: list,
                   start: threading.Event) -> int:
    """Open loop from one thread: the connections together send ``rate`` requests/s for ``seconds``, each
    on its own staggered schedule, whatever the answers do; a request's latency runs from the time it was
    due (not sent), so a client that fell behind does not hide the broker's delay.  → requests answered."""
    socks = []
    for _ in frames:
        host, port = bootstrap.rsplit(":", 1)
        sock = socket.create_connection((host, int(port)))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        socks.append(sock)
    n = len(socks)
    interval = n / rate
    selector = selectors.DefaultSelector()
    state = []
    for i, sock in enumerate(socks):
        entry = {"sock": sock, "buf": bytearray(), "due": deque()}
        selector.register(sock, selectors.EVENT_READ, entry)
        state.append(entry)
    # Connection i's k-th request is due at t0 + interval * (k + i/n), for every k with k + i/n < seconds /
    # interval: counted up front, so how many a run sends does not hang on the rounding of a sum of floats.
    counts = [max(0, math.ceil(seconds * rate / n - i / n)) for i in range(n)]
    sent = [0] * n
    start.wait()
    t0 = time.perf_counter()
    answered = outstanding = 0
    while True:
        now = time.perf_counter()
        upcoming = None
        for i in range(n):
            if sent[i] == counts[i]:
                continue
            due = t0 + interval * (sent[i] + i / n)
            if due <= now:
                state[i]["sock"].sendall(frames[i])    # small frames: the socket buffer takes them whole
                state[i]["due"].append(due)
                sent[i] += 1
                outstanding += 1
                if sent[i] == counts[i]:
                    continue
                due += interval
            if upcoming is None or due < upcoming:
                upcoming = due
        if upcoming is None and not outstanding:
            break
        timeout = 1.0 if upcoming is None else max(0.0, upcoming - time.perf_counter())
        for key, _ in selector.select(timeout):
            entry = key.data
            now, count = _receive_answers(entry["sock"], entry["buf"])
            for _ in range(count):
                latencies.append(now - entry["due"].popleft())
            answered += count
            outstanding -= count
    for sock in socks:
        sock.close()
    return answered


def run(args, bootstrap: str, stats: ServerStats) -> dict:
    topic = f"cost-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, args.partitions)
    per_connection = args.requests // args.connections
    start = threading.Event()
    latencies: list[float] = []
    frames = [produce_frame(topic, i % args.partitions, args.acks, args.records, args.record_size)
              for i in range(args.connections)]
    paced_answers: list[int] = []
    if args.rate:
        threads = [threading.Thread(target=lambda: paced_answers.append(
            paced_requests(bootstrap, frames, args.rate, args.seconds, latencies, start)))]
    else:
        threads = [threading.Thread(target=_connection, args=(
            bootstrap, frames[i], per_connection, args.in_flight, args.acks != 0, latencies, start))
            for i in range(args.connections)]
    for t in threads:
        t.start()
    time.sleep(0.5)                     # connected
    before = scrape_metrics(stats.metrics_url)
    clock = PhaseClock(stats)
    clock.start()
    start.set()
    for t in threads:
        t.join()
    times = clock.stop()
    after = scrape_metrics(stats.metrics_url)
    done = paced_answers[0] if args.rate else per_connection * args.connections
    server_cpu = times["server_cpu_s"]
    latencies.sort()
    result = {"connections": args.connections, "in_flight": None if args.rate else args.in_flight,
              "rate": args.rate or None, "records": args.records,
              "record_size": args.record_size, "acks": args.acks, "partitions": args.partitions,
              "fsync": args.fsync, "requests": done, "seconds": round(times["seconds"], 3),
              "requests_per_s": round(done / times["seconds"]),
              "broker_cpu_us_per_request": None if server_cpu is None else round(server_cpu / done * 1e6, 1),
              "broker_cpu_split_us": None if times["server_cpu_split_s"] is None else {
                  k: round(v / done * 1e6, 1) for k, v in times["server_cpu_split_s"].items()},
              "latency_ms": {"p50": _ms(percentile(latencies, 0.5)), "p99": _ms(percentile(latencies, 0.99)),
                             "max": _ms(latencies[-1] if latencies else None)},
              "fsyncs": None if before is None else after["fsyncs"] - before["fsyncs"],
              "broker_latency": broker_latency(before, after), "fsync_latency": fsync_latency(before, after),
              **{k: times[k] for k in ("server_cpu_s", "client_cpu_s", "other_processes_cpu_s", "reference_us")},
              "placement": cpu_affinity_note(args)}
    shape = (f"{args.rate:,} requests/s paced" if args.rate else f"{args.in_flight} in flight")
    print(f"{done:,} requests ({args.connections} connections x {shape}, {args.records} x "
          f"{args.record_size} B, acks={args.acks}, fsync {'on' if args.fsync else 'off'}): "
          f"{result['requests_per_s']:,} requests/s, broker CPU {result['broker_cpu_us_per_request']} us/request"
          f"{_format_split(result['broker_cpu_split_us'])}, "
          f"round trip ms p50 {result['latency_ms']['p50']} p99 {result['latency_ms']['p99']} max "
          f"{result['latency_ms']['max']}; flushes "
          f"{result['fsyncs']}; CPU s: broker "
          f"{server_cpu}, client {round(times['client_cpu_s'], 2)}, others "
          f"{None if times['other_processes_cpu_s'] is None else round(times['other_processes_cpu_s'], 2)}"
          f"{format_broker_latency(result['broker_latency'])}{format_fsync_latency(result['fsync_latency'])}"
          f"{format_reference(result['reference_us'])}{format_placement(result['placement'])}", flush=True)
    return result


def _format_split(split: dict | None) -> str:
    """The printed split of the broker's CPU per request (`ServerStats.cpu_split`; "" without one)."""
    if not split:
        return ""
    return (f" (user {split['user']}, system {split['system']}; event-loop thread user "
            f"{split['main_thread_user']}, system {split['main_thread_system']})")


def _ms(v):
    return None if v is None else round(v * 1000, 3)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--connections", type=int, default=4)
    ap.add_argument("--in-flight", type=int, default=8)
    ap.add_argument("--requests", type=int, default=20000, help="requests in all")
    ap.add_argument("--records", type=int, default=10, help="records per request")
    ap.add_argument("--record-size", type=int, default=100)
    ap.add_argument("--rate", type=float, default=0,
                    help="open loop: all connections together send this many requests/s (one thread) for --seconds")
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--acks", type=int, default=-1, choices=[-1, 0, 1])
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--fsync", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--bootstrap", default=None)
    ap.add_argument("--server-pid", type=int, default=None)
    ap.add_argument("--metrics-url", default=None, help="the running broker's http://HOST:PORT/metrics")
    ap.add_argument("--server-set", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--profile-server", metavar="OUT.prof", default=None)
    add_cpu_options(ap)
    args = ap.parse_args(argv)
    with broker(args, "trireme-cost-") as (bootstrap, stats):
        print(json.dumps(run(args, bootstrap, stats), separators=(",", ":")), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
