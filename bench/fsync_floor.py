"""The fsync floor: what one request in flight can get through this disk when each request is appended and
fdatasynced before the next one is sent.

    .venv/bin/python bench/fsync_floor.py [--sizes 16KiB,64KiB,1MiB] [--seconds 5] [--rounds 3]
        [--modes disk,server,broker,librdkafka] [--dir /tmp] [--no-fsync] [--bootstrap HOST:PORT --server-pid PID]
        [--busy N]
    .venv/bin/python bench/fsync_floor.py --modes disk,disk-reserved,disk-written --busy 1   # what an fsync costs
    .venv/bin/python bench/fsync_floor.py --modes librdkafka,broker --sizes 100 --no-fsync   # one small message

A client that keeps one request in flight (librdkafka with idempotence on, a single acks=all message at a time)
waits for each answer before it sends the next, so nothing is shared between requests: each pays its own write and
fdatasync.  Two bare loops, both decoding nothing:

- ``disk``: in this process, ``os.write`` of the request's bytes to a file opened for appending (a fresh one every
  GiB, as a log rolls its segments), then ``os.fdatasync``, again and again: the disk's own floor for that request
  size;
- ``server``: a bare server process (one thread, blocking calls) reads a size-prefixed frame from a loopback socket
  into a reused buffer, appends it, fdatasyncs and answers 8 bytes; this process sends the next frame once the
  answer came: the same plus the request's trip through the kernel, what the broker's path cannot go below.

``disk-reserved`` and ``disk-written`` are the ``disk`` loop on a file whose blocks come otherwise: blocks reserved
ahead of the file's end before a write reaches them (``fallocate`` with ``FALLOC_FL_KEEP_SIZE``, RESERVE_AHEAD at a
time, the size kept: what Kafka's ``log.preallocate`` gives on Linux, and what the broker's append file did for a
while, docs/performance.md "The cost of an fsync"), and a file
written with zeros and fdatasynced beforehand (not timed), written over inside its size, so that an fdatasync has no
file system metadata to commit (what a preallocated, zero-filled segment would give).  ``--busy N`` keeps N processes spinning in ``poll()``
throughout, as librdkafka's broker thread does while its one request is in flight.

And the same one request in flight against a broker (a fresh ``trireme serve`` on a data dir in ``--dir``, fsync as
the flag says, or any ``--bootstrap`` broker: Apache Kafka too), on a topic of one partition:

- ``broker``: raw ProduceRequest frames (acks=all, one batch of ``size`` bytes of records, 1 KiB each or one record
  of ``size`` bytes if smaller), the next one sent once the answer came;
- ``librdkafka``: a confluent-kafka producer (acks=all, ``linger.ms=0``) sends one message of ``size`` bytes and
  ``flush()``es: the single-message acknowledgement latency the issue compares with Kafka's (``produce()`` to
  ``flush()`` returning).

The sizes are interleaved round by round (the machine is shared: see docs/performance.md).  Printed per mode and
size: MB/s (10^6 bytes per second) and requests/s, median and range over the rounds; the request's p50/p99 in ms;
the fdatasync's p50; CPU ms per MB of the process that writes (user + system; the broker's in the broker modes) and
in the broker modes its CPU µs per request and, from its metrics endpoint, its own µs per request in each phase
(receive the frame, handle, wait for the flush, respond) and fsyncs per request; the 1-minute load average.  The last
stdout line is a JSON summary.  ``floor()`` is the function other benchmarks call for one figure.  Nothing is
asserted.
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import resource
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from produce_consume import (ServerStats, broker, create_topic, parse_size, percentile,  # noqa: E402
                             scrape_metrics)
from request_cost import PRODUCE_VERSION, produce_frame, whole_frames  # noqa: E402

from trireme.wire.codec import message  # noqa: E402
from trireme.wire.headers import decode_response_header  # noqa: E402

MODES = ("disk", "disk-reserved", "disk-written", "server", "broker", "librdkafka")
DISK_MODES = {"disk": "grow", "disk-reserved": "reserved", "disk-written": "written"}
BROKER_MODES = ("broker", "librdkafka")
BATCH_OVERHEAD = 61             # a record batch's header
RECORD_OVERHEAD = 12            # a record's own fields around a value of up to 1 KiB (no key, no headers)
LIBRDKAFKA_MAX = 1_000_000      # librdkafka's message.max.bytes: one message of up to this many bytes
# A file is replaced by a fresh one past this: log.segment.bytes' default, as the broker rolls its segments.  Smaller
# files would flatter the floor: on this VM a write into a file that keeps growing costs about 3x one into a file
# whose predecessor was just deleted (its page cache pages are reused at once; docs/performance.md, issue 23).
FILE_BYTES = 1 << 30
WRITTEN_BYTES = 256 << 20       # the ``disk-written`` loop's files: written once (zeros) before the loop writes over them
_SIZE = struct.Struct(">i")
RESERVE_AHEAD = 16 << 20      # the ``reserved`` loop's blocks reserved ahead of the end
_FALLOC_FL_KEEP_SIZE = 1
_fallocate = ctypes.CDLL(None, use_errno=True).fallocate
_fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)


class _AppendFile:
    """A file appended to and fdatasynced; replaced by a fresh one once it holds FILE_BYTES.  ``kind`` says how its
    blocks come (docs/performance.md, "The cost of an fsync"): ``grow``, the file grows with each write; ``reserved``,
    blocks are reserved RESERVE_AHEAD ahead of the end before a write reaches them (the size kept); ``written``, the
    writes go over blocks written (zeros) and fdatasynced before, inside the file's size, WRITTEN_BYTES a file, their
    preparation not timed: an fdatasync then has no file system metadata to commit."""

    def __init__(self, directory: str, kind: str = "grow"):
        self.directory = directory
        self.kind = kind
        self.fd = -1
        self.size = 0
        self.untimed = 0.0          # seconds of preparation since the caller last took them
        self._open()

    def _open(self) -> None:
        self.close()
        fd, self.path = tempfile.mkstemp(prefix="fsync-floor-", dir=self.directory)
        os.close(fd)
        self.fd = os.open(self.path, os.O_WRONLY | (os.O_APPEND if self.kind in ("grow", "reserved") else 0))
        self.reserved = 0
        if self.kind == "written":
            started = time.perf_counter()
            zeros = bytes(8 << 20)
            for pos in range(0, WRITTEN_BYTES, len(zeros)):
                os.pwrite(self.fd, zeros, pos)
            os.fdatasync(self.fd)
            self.untimed += time.perf_counter() - started
        self.size = 0

    def append(self, data, fsync: bool) -> float:
        """Write ``data`` (all of it) and fdatasync → the seconds the fdatasync took (0 without it)."""
        if self.size + (len(data) if self.kind == "written" else 0) > (
                WRITTEN_BYTES if self.kind == "written" else FILE_BYTES) or self.size >= FILE_BYTES:
            self._open()
        if self.kind == "reserved" and self.size + len(data) > self.reserved:
            self.reserved = self.size + len(data) + RESERVE_AHEAD
            _fallocate(self.fd, _FALLOC_FL_KEEP_SIZE, self.size, self.reserved - self.size)
        with memoryview(data) as view:
            done = 0
            while done < len(view):
                done += (os.pwrite(self.fd, view[done:], self.size + done) if self.kind == "written"
                         else os.write(self.fd, view[done:]))
        self.size += len(data)
        if not fsync:
            return 0.0
        started = time.perf_counter()
        os.fdatasync(self.fd)
        return time.perf_counter() - started

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        else:
            return
        os.unlink(self.path)


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _summary(size: int, seconds: float, latencies: list[float], syncs: list[float], cpu: float | None) -> dict:
    latencies.sort()
    syncs.sort()
    count = len(latencies)
    mb = size * count / 1e6
    return {"size": size, "requests": count, "seconds": seconds,
            "mb_per_s": mb / seconds if seconds else None, "requests_per_s": count / seconds if seconds else None,
            "p50_ms": _ms(percentile(latencies, 0.50)), "p99_ms": _ms(percentile(latencies, 0.99)),
            "max_ms": _ms(latencies[-1] if latencies else None),
            "fdatasync_p50_ms": _ms(percentile(syncs, 0.50)) if syncs else None,
            "fdatasync_p90_ms": _ms(percentile(syncs, 0.90)) if syncs else None,
            "fdatasync_mean_ms": _ms(statistics.fmean(syncs)) if syncs else None,
            "cpu_ms_per_mb": cpu * 1000 / mb if cpu is not None and mb else None,
            "cpu_us_per_request": cpu * 1e6 / count if cpu is not None and count else None,
            "loadavg_1m": os.getloadavg()[0]}


def _ms(seconds):
    return None if seconds is None else seconds * 1000


def floor(size: int, seconds: float = 5.0, directory: str | None = None, fsync: bool = True,
          kind: str = "grow") -> dict:
    """The ``disk`` loop for ``seconds``: write ``size`` bytes and fdatasync, one after the other, on a file in
    ``directory`` (default: the temporary directory, where the benchmarks' brokers keep their data), its blocks as
    ``kind`` says (see _AppendFile) → its figures (``mb_per_s``, ``requests_per_s``, ``p50_ms``, ...)."""
    data = os.urandom(size)
    out = _AppendFile(directory or tempfile.gettempdir(), kind)
    latencies: list[float] = []
    syncs: list[float] = []
    try:
        out.untimed = 0.0
        cpu0 = _cpu()
        started = now = time.perf_counter()
        end = started + seconds
        while now < end:
            synced = out.append(data, fsync)
            after = time.perf_counter()
            untimed, out.untimed = out.untimed, 0.0
            started += untimed
            end += untimed
            latencies.append(after - now - untimed)
            if fsync:
                syncs.append(synced)
            now = after
        cpu = _cpu() - cpu0     # a ``disk-written`` file's preparation included
        return _summary(size, now - started, latencies, syncs, cpu)
    finally:
        out.close()


# --- the bare server (`--serve`, its own process) --------------------------------------------------------------

def serve(directory: str, fsync: bool) -> None:
    """Accept one connection; for each size-prefixed frame: read it whole into a reused buffer, append, fdatasync,
    answer 8 bytes (the frame's size, twice)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    print(listener.getsockname()[1], flush=True)
    sock, _ = listener.accept()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    out = _AppendFile(directory)
    buf = bytearray(4)
    try:
        while _read_exactly(sock, memoryview(buf)[:4]):
            size = _SIZE.unpack_from(buf)[0]
            if len(buf) < size:
                buf = bytearray(size)
            with memoryview(buf)[:size] as frame:
                if not _read_exactly(sock, frame):
                    break
                out.append(frame, fsync)
            sock.sendall(_SIZE.pack(size) * 2)
    finally:
        out.close()
        sock.close()


def _read_exactly(sock: socket.socket, view: memoryview) -> bool:
    done = 0
    while done < len(view):
        n = sock.recv_into(view[done:])
        if not n:
            return False
        done += n
    return True


def server_floor(size: int, seconds: float, directory: str, fsync: bool = True) -> dict:
    """The ``server`` loop for ``seconds``: one frame of ``size`` bytes in flight to the bare server → its figures,
    the CPU being the server process's."""
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve", "--dir", directory]
                            + ([] if fsync else ["--no-fsync"]), stdout=subprocess.PIPE)
    try:
        port = int(proc.stdout.readline())
        stats = ServerStats(proc.pid)
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        frame = _SIZE.pack(size) + os.urandom(size)
        answer = memoryview(bytearray(8))
        latencies: list[float] = []
        cpu0 = stats.cpu_seconds()
        started = now = time.perf_counter()
        end = started + seconds
        while now < end:
            sock.sendall(frame)
            if not _read_exactly(sock, answer):
                raise SystemExit("the bare server closed the connection")
            after = time.perf_counter()
            latencies.append(after - now)
            now = after
        cpu1 = stats.cpu_seconds()
        sock.close()
        return _summary(size, now - started, latencies, [], None if cpu0 is None else cpu1 - cpu0)
    finally:
        try:
            proc.wait(timeout=5)                    # it sees the client's EOF and removes its file
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()


# --- against a broker ------------------------------------------------------------------------------------------

def broker_loop(size: int, seconds: float, bootstrap: str, stats: ServerStats, topic: str) -> dict:
    """Raw ProduceRequests (acks=all) carrying ``size`` bytes of records, one in flight, for ``seconds``."""
    record = min(size, 1024)
    count = max(1, (size - BATCH_OVERHEAD) // (record + RECORD_OVERHEAD))       # a batch of about ``size`` bytes
    frame = produce_frame(topic, 0, -1, count, record)
    host, port = bootstrap.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray()
    latencies: list[float] = []
    try:
        for _ in range(3):                          # warm: the connection, the partition's first segment
            sock.sendall(frame)
            while not _answer_in(buf):
                _more(sock, buf)
        before = scrape_metrics(stats.metrics_url)
        cpu0 = stats.cpu_seconds()
        started = now = time.perf_counter()
        end = started + seconds
        while now < end:
            sock.sendall(frame)
            while not whole_frames(buf):
                _more(sock, buf)
            after = time.perf_counter()
            latencies.append(after - now)
            now = after
        cpu1 = stats.cpu_seconds()
        phases = broker_phases(before, scrape_metrics(stats.metrics_url))
    finally:
        sock.close()
    return _summary(size, now - started, latencies, [], None if cpu0 is None else cpu1 - cpu0) | phases


def _answer_in(buf: bytearray) -> bool:
    """Whether ``buf`` holds a whole ProduceResponse (dropped from it); one that refused the batch ends the run."""
    if len(buf) < 4 or len(buf) < 4 + _SIZE.unpack_from(buf)[0]:
        return False
    body = memoryview(buf)[4:4 + _SIZE.unpack_from(buf)[0]]
    _, start = decode_response_header(body, 1)
    answer, _ = message("ProduceResponse").decode(body, PRODUCE_VERSION, start)
    body.release()
    whole_frames(buf)
    errors = [p.error_code for t in answer.responses for p in t.partition_responses if p.error_code]
    if errors:
        raise SystemExit(f"the broker refused the batch: error code {errors[0]}")
    return True


def _more(sock: socket.socket, buf: bytearray) -> None:
    data = sock.recv(1 << 16)
    if not data:
        raise SystemExit("the broker closed the connection")
    buf += data


def librdkafka_loop(size: int, seconds: float, bootstrap: str, stats: ServerStats, topic: str) -> dict:
    """A confluent-kafka producer (acks=all, linger.ms=0): one message of ``size`` bytes, then ``flush()``, for
    ``seconds``; a request's time is produce() to flush() returning."""
    from confluent_kafka import Producer
    failed = []
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0,
                         "on_delivery": lambda err, msg: err is not None and failed.append(err)})
    value = os.urandom(size)
    for _ in range(3):                              # warm: metadata, the connection
        producer.produce(topic, value, partition=0)
        producer.flush(30)
    latencies: list[float] = []
    before = scrape_metrics(stats.metrics_url)
    cpu0 = stats.cpu_seconds()
    started = now = time.perf_counter()
    end = started + seconds
    while now < end:
        producer.produce(topic, value, partition=0)
        producer.flush(30)
        after = time.perf_counter()
        latencies.append(after - now)
        now = after
    cpu1 = stats.cpu_seconds()
    phases = broker_phases(before, scrape_metrics(stats.metrics_url))
    if failed:
        raise SystemExit(f"delivery failed: {failed[0]}")
    return _summary(size, now - started, latencies, [], None if cpu0 is None else cpu1 - cpu0) | phases


def broker_phases(before: dict | None, after: dict | None) -> dict:
    """The broker's own account of the Produce requests between two scrapes: µs per request in each phase (receive
    its frame, handle it, wait for the flush, respond) and fsyncs per request ({} without a metrics endpoint)."""
    if before is None or after is None:
        return {}
    count = after["requests"].get("Produce", 0) - before["requests"].get("Produce", 0)
    if count <= 0:
        return {}
    phases = {phase: round((after["phases"].get(("Produce", phase), 0) - before["phases"].get(("Produce", phase), 0))
                           / count * 1e6, 1) for phase in ("receive", "handle", "wait", "respond")}
    return {"broker_us": phases, "fsyncs_per_request": (after["fsyncs"] - before["fsyncs"]) / count}


@contextlib.contextmanager
def _broker(args):
    """(bootstrap, ServerStats, topic): ``--bootstrap``, or a fresh broker on a data dir under ``--dir``."""
    options = argparse.Namespace(bootstrap=args.bootstrap, server_pid=args.server_pid, metrics_url=None,
                                 fsync=args.fsync, profile_server=None, server_set=args.server_set,
                                 server_cpus=None, client_cpus=None)
    saved = tempfile.tempdir
    tempfile.tempdir = args.dir                     # broker() makes its data dir in the temporary directory
    try:
        with broker(options, "fsync-floor-") as (bootstrap, stats):
            tempfile.tempdir = saved
            topic = "fsync-floor-" + uuid.uuid4().hex[:8]
            create_topic(bootstrap, topic, 1)
            yield bootstrap, stats, topic
    finally:
        tempfile.tempdir = saved


# --- the report ------------------------------------------------------------------------------------------------

def _range(values: list) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    return f"{statistics.median(values):.3g} ({min(values):.3g}-{max(values):.3g})"


def combine(runs: list[dict]) -> dict:
    """One mode's and size's rounds → median and range of each figure."""
    keys = ("mb_per_s", "requests_per_s", "p50_ms", "p99_ms", "fdatasync_p50_ms", "cpu_ms_per_mb",
            "cpu_us_per_request", "loadavg_1m")
    out = {"size": runs[0]["size"], "rounds": len(runs)}
    for key in keys:
        values = [r[key] for r in runs if r.get(key) is not None]
        out[key] = {"median": statistics.median(values), "min": min(values), "max": max(values)} if values else None
    phases = [r["broker_us"] for r in runs if r.get("broker_us")]
    if phases:
        out["broker_us_median"] = {k: statistics.median(p[k] for p in phases) for k in phases[0]}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="16KiB,64KiB,1MiB", help="request sizes, comma-separated (16KiB,64KiB,1MiB)")
    ap.add_argument("--seconds", type=float, default=5.0, help="length of each mode's loop per size and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", default="disk,server",
                    help="comma-separated, of disk, server, broker, librdkafka (default: disk,server)")
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where the files go (default: the temp dir)")
    ap.add_argument("--fsync", action=argparse.BooleanOptionalAction, default=True,
                    help="fdatasync after each write (--no-fsync: the same loops without it)")
    ap.add_argument("--bootstrap", default=None, help="the broker modes against a running broker (HOST:PORT)")
    ap.add_argument("--server-pid", type=int, default=None, help="with --bootstrap: its pid, for its CPU")
    ap.add_argument("--server-set", action="append", default=[], metavar="NAME=VALUE",
                    help="a setting of the started broker")
    ap.add_argument("--busy", type=int, default=0, metavar="N",
                    help="N processes that spin in poll() with a zero timeout throughout, as librdkafka's broker thread "
                         "does while its one request is in flight: the loops with the cores taken")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve:
        serve(args.dir, args.fsync)
        return 0
    sizes = [parse_size(s) for s in args.sizes.split(",") if s]
    modes = [m for m in args.modes.split(",") if m]
    for mode in modes:
        if mode not in MODES:
            ap.error(f"unknown mode {mode!r} ({', '.join(MODES)})")
    runs: dict[tuple[str, int], list[dict]] = {(m, s): [] for m in modes for s in sizes}
    with contextlib.ExitStack() as stack:
        for _ in range(args.busy):
            spinner = subprocess.Popen([sys.executable, "-c", "import select\np = select.poll()\nwhile True: p.poll(0)"])
            stack.callback(spinner.wait)
            stack.callback(spinner.kill)
        target = stack.enter_context(_broker(args)) if set(modes) & set(BROKER_MODES) else None
        for round_ in range(args.rounds):
            for size in sizes:
                for mode in modes:
                    _run(mode, size, args, target, runs, round_)
    print(f"\nfsync floor ({'write + fdatasync' if args.fsync else 'write only'}, one request in flight, "
          f"{args.rounds} rounds of {args.seconds:g} s, dir {args.dir}): median (range)")
    summary = []
    for (mode, size), rs in runs.items():
        if not rs:
            continue
        c = combine(rs)
        c["mode"] = mode
        summary.append(c)
        get = lambda key: [r[key] for r in rs]     # noqa: E731
        print(f"  {mode:13} {size:>8} B: {_range(get('mb_per_s'))} MB/s, {_range(get('requests_per_s'))} req/s, "
              f"p50 {_range(get('p50_ms'))} ms, p99 {_range(get('p99_ms'))} ms, "
              f"CPU {_range(get('cpu_ms_per_mb'))} ms/MB"
              + (f" = {_range(get('cpu_us_per_request'))} µs/request" if mode in BROKER_MODES else "")
              + f", load {_range(get('loadavg_1m'))}")
    print(json.dumps({"config": {"sizes": sizes, "seconds": args.seconds, "rounds": args.rounds, "modes": modes,
                                 "dir": args.dir, "fsync": args.fsync, "bootstrap": args.bootstrap, "busy": args.busy},
                      "floor": summary}))
    return 0


def _run(mode: str, size: int, args, target, runs: dict, round_: int) -> None:
    if mode in DISK_MODES:
        r = floor(size, args.seconds, args.dir, args.fsync, DISK_MODES[mode])
    elif mode == "server":
        r = server_floor(size, args.seconds, args.dir, args.fsync)
    elif mode == "librdkafka" and size > LIBRDKAFKA_MAX:
        print(f"round {round_ + 1} {mode:13} {size:>8} B: skipped (over librdkafka's message.max.bytes)")
        return
    else:
        r = (broker_loop if mode == "broker" else librdkafka_loop)(size, args.seconds, *target)
    runs[(mode, size)].append(r)
    print(f"round {round_ + 1} {mode:13} {size:>8} B: {r['mb_per_s']:7.1f} MB/s "
          f"{r['requests_per_s']:7.0f} req/s  p50 {r['p50_ms']:.3f} ms  p99 {r['p99_ms']:.3f} ms"
          + (f"  fdatasync p50 {r['fdatasync_p50_ms']:.3f} p90 {r['fdatasync_p90_ms']:.3f} mean "
             f"{r['fdatasync_mean_ms']:.3f} ms" if r["fdatasync_p50_ms"] else "")
          + (f"  CPU {r['cpu_ms_per_mb']:.2f} ms/MB" if r["cpu_ms_per_mb"] is not None else "")
          + (f" {r['cpu_us_per_request']:.0f} µs/request" if mode in BROKER_MODES and r["cpu_us_per_request"] else "")
          + f"  load {r['loadavg_1m']:.1f}"
          + ("".join(f"\n    broker µs/request: {k} {v}" if i == 0 else f", {k} {v}"
                     for i, (k, v) in enumerate(r["broker_us"].items()))
             + f"; fsyncs/request {r['fsyncs_per_request']:.2f}" if r.get("broker_us") else ""), flush=True)


if __name__ == "__main__":
    sys.exit(main())
