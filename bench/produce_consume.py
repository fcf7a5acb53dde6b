"""Produce then consume throughput benchmark for Trireme (or any Kafka broker) with confluent-kafka (or, for the produce phase, the Java client).

    .venv/bin/python bench/produce_consume.py [--bytes 1GiB] [--record-size 1024] [--partitions 1]
        [--acks all] [--linger-ms 5] [--compression none] [--idempotent] [--transactional N]
        [--isolation read_uncommitted|read_committed] [--abort-every K] [--fsync/--no-fsync]
        [--bootstrap HOST:PORT [--server-pid PID] [--metrics-url URL]]

Without --bootstrap it starts ``python -m trireme serve`` on a fresh temporary data dir (deleted
afterwards), creates the topic, produces --bytes of records, then consumes them all back with
assign() from offset 0.  Per phase it prints MB/s (10^6 bytes of record values per second),
records/s, produce latency percentiles (produce() call to delivery callback, librdkafka's
Message.latency()), and the server's CPU time (/proc/PID/stat utime+stime) and peak RSS
(/proc/PID/status VmHWM).  The last stdout line is a JSON summary.  Nothing is asserted.

--transactional N produces in transactions of N records (every K-th aborted with --abort-every K)
and reports, per transaction, the wall time spent producing and in commit_transaction, and from the
broker's own metrics (the bench starts it with a metrics listener) the fsyncs and requests per API
per transaction.  --isolation read_committed consumes as a read_committed consumer.  --client
java-4.3.0 (or java-3.9.0) produces with the Apache Kafka Java client instead (up to 5 requests in
flight when idempotent, where librdkafka keeps one); its latencies are send() to acknowledgement.

See bench/README.md.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from array import array

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from speed_sampler import SpeedSampler, format_reference

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLK_TCK = os.sysconf("SC_CLK_TCK")
_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000 ** 2, "mb": 1000 ** 2,
          "mib": 1024 ** 2, "g": 1000 ** 3, "gb": 1000 ** 3, "gib": 1024 ** 3}


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 1GiB, 256MiB, 100MB, 4096)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def parse_props(items: list[str]) -> dict:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"expected KEY=VALUE, got {item!r}")
        out[key.strip()] = value
    return out


def parse_cpus(text: str) -> set[int]:
    """A CPU list as ``taskset -c`` takes it: "0", "1,3", "0-1"."""
    cpus: set[int] = set()
    for part in text.split(","):
        first, _, last = part.strip().partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    if not cpus:
        raise argparse.ArgumentTypeError(f"no CPUs in {text!r}")
    return cpus


def add_cpu_options(ap: argparse.ArgumentParser) -> None:
    """``--server-cpus`` and ``--client-cpus``: the broker on cores of its own, as on a machine of its own, so that
    its latency is not decided by the clients' threads competing for the same two cores (issue 11's seventh round)."""
    ap.add_argument("--server-cpus", type=parse_cpus, default=None, metavar="LIST",
                    help="run the started server on these CPUs only (taskset -c syntax, e.g. 0)")
    ap.add_argument("--client-cpus", type=parse_cpus, default=None, metavar="LIST",
                    help="run this benchmark's clients (its threads and worker processes) on these CPUs only")


def pinned_at_start(cpus: set[int] | None):
    """A ``preexec_fn`` for ``subprocess.Popen`` that runs the child on ``cpus`` from its first instruction (None:
    wherever it likes)."""
    return (lambda: os.sched_setaffinity(0, cpus)) if cpus else None


def pin_this_process(cpus: set[int] | None) -> None:
    """Every thread of this process (and so every thread and process it starts later) on ``cpus``."""
    if cpus:
        for tid in os.listdir("/proc/self/task"):
            os.sched_setaffinity(int(tid), cpus)


def cpu_affinity_note(args) -> str:
    """How the run placed its processes, for the printed result ("" when it did not)."""
    sets = (("server", args.server_cpus), ("client", args.client_cpus))
    return "; ".join(f"{name} on CPUs {','.join(map(str, sorted(cpus)))}" for name, cpus in sets if cpus)


def format_placement(placement: str) -> str:
    """``cpu_affinity_note``'s text as the end of a printed result line."""
    return f"; {placement}" if placement else ""


def machine_busy_seconds() -> float | None:
    """CPU seconds all processes spent busy so far (/proc/stat, every core)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)      # idle + iowait
    return (sum(fields[:8]) - idle) / CLK_TCK                      # user..steal, without guest


class PhaseClock:
    """Wall time, server/client/other CPU seconds (the server's also split: `ServerStats.cpu_split`) and, unless
    ``sample_speed`` is off, the machine's speed (`SpeedSampler`: key "reference_us") over one phase."""

    def __init__(self, stats: ServerStats, sample_speed: bool = True):
        self.stats = stats
        self.speed = SpeedSampler() if sample_speed else None

    def _sample(self):
        usage = resource.getrusage(resource.RUSAGE_SELF)
        split = self.stats.cpu_split()
        return (time.perf_counter(), None if split is None else split["user"] + split["system"],
                usage.ru_utime + usage.ru_stime, machine_busy_seconds(), split)

    def start(self) -> float:
        if self.speed is not None:
            self.speed.start()
        self.t0 = self._sample()
        return self.t0[0]

    def stop(self) -> dict:
        t1 = self._sample()
        wall = t1[0] - self.t0[0]
        server = None if t1[1] is None or self.t0[1] is None else t1[1] - self.t0[1]
        client = t1[2] - self.t0[2]
        busy = None if t1[3] is None or self.t0[3] is None else t1[3] - self.t0[3]
        others = None if busy is None or server is None else max(0.0, busy - server - client)
        split = None if t1[4] is None or self.t0[4] is None else {k: t1[4][k] - self.t0[4][k] for k in t1[4]}
        return {"seconds": wall, "server_cpu_s": server, "server_cpu_split_s": split, "client_cpu_s": client,
                "other_processes_cpu_s": others, "cores": os.cpu_count(),
                "loadavg_1m": os.getloadavg()[0],
                "reference_us": None if self.speed is None else self.speed.stop()}


# --- the server process -------------------------------------------------------------------------

class ServerStats:
    """CPU time and peak RSS of a process, from /proc (Linux only)."""

    def __init__(self, pid: int | None):
        self.pid = pid
        self.metrics_url: str | None = None

    def cpu_seconds(self) -> float | None:
        split = self.cpu_split()
        return None if split is None else split["user"] + split["system"]

    def cpu_split(self) -> dict | None:
        """User and system CPU seconds of the process and of its main thread (the broker's event loop)."""
        if self.pid is None:
            return None
        split = {}
        # the thread first: its figures then never exceed the process's, read a moment later
        for name, path in (("main_thread_", f"/proc/{self.pid}/task/{self.pid}/stat"), ("", f"/proc/{self.pid}/stat")):
            try:
                with open(path) as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                return None
            split[name + "user"] = int(fields[11]) / CLK_TCK
            split[name + "system"] = int(fields[12]) / CLK_TCK
        return split

    def peak_rss_mib(self) -> float | None:
        if self.pid is None:
            return None
        try:
            with open(f"/proc/{self.pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) / 1024
        except OSError:
            pass
        return None


# Runs ``trireme serve`` under cProfile; argv: OUT.prof, wall|cpu, serve arguments.  "cpu" times the
# main thread's CPU (time.thread_time), so a machine busy with other work does not inflate the
# figures and time blocked in epoll/fsync does not count; "wall" is cProfile's default clock.
_PROFILE_SNIPPET = """
import cProfile, sys, time
out, timer = sys.argv[1], sys.argv[2]
prof = cProfile.Profile(time.thread_time if timer == "cpu" else time.perf_counter)
from trireme.server.cli import main
prof.enable()
try:
    main(sys.argv[3:])
finally:
    prof.disable()
    prof.dump_stats(out)
"""


class Server:
    """A Trireme broker in a child process on its own data dir."""

    def __init__(self, data_dir: str, fsync: bool, profile: str | None, extra: list[str],
                 profile_timer: str = "cpu", cpus: set[int] | None = None):
        self.data_dir = data_dir = os.path.abspath(data_dir)
        self.log_path = os.path.join(os.path.dirname(os.path.abspath(data_dir)),
                                     os.path.basename(data_dir.rstrip("/")) + ".server.log")
        serve = ["serve", "--data-dir", data_dir, "--listen", "127.0.0.1:0"]
        if profile:
            cmd = [sys.executable, "-c", _PROFILE_SNIPPET, os.path.abspath(profile), profile_timer] + serve
        else:
            cmd = [sys.executable, "-m", "trireme"] + serve
        if not fsync:
            cmd += ["--set", "trireme.fsync.enable=false"]
        for item in extra:
            cmd += ["--set", item]
        os.makedirs(os.path.dirname(self.log_path), exist_ok=True)
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=self.log,
                                     preexec_fn=pinned_at_start(cpus))
        line = self.proc.stdout.readline().decode()
        m = re.match(r"listening on (\S+)", line)
        if not m:
            self.proc.kill()
            self.proc.wait()
            self.log.close()
            with open(self.log_path, "rb") as f:
                tail = f.read()[-4000:].decode(errors="replace")
            raise SystemExit(f"server did not start (first line {line!r}); its log:\n{tail}")
        self.bootstrap = m.group(1)

    def metrics_url(self) -> str | None:
        """The address the broker logged for its metrics listener."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with open(self.log_path, "rb") as f:
                m = re.search(rb"metrics on (http://\S+/metrics)", f.read())
            if m:
                return m.group(1).decode()
            time.sleep(0.05)
        return None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self.log.close()


@contextlib.contextmanager
def broker(args, prefix: str):
    """(bootstrap, ServerStats) of the broker a benchmark runs against: ``--bootstrap`` (with ``--server-pid`` and
    ``--metrics-url``), or a fresh ``trireme serve`` with a metrics listener on a temporary data dir, stopped and
    removed afterwards.  For the benchmarks beside this one."""
    if args.bootstrap:
        pin_this_process(args.client_cpus)
        stats = ServerStats(args.server_pid)
        stats.metrics_url = args.metrics_url
        yield args.bootstrap, stats
        return
    temp = tempfile.mkdtemp(prefix=prefix)
    server = None
    try:
        server = Server(os.path.join(temp, "data"), args.fsync, args.profile_server,
                        args.server_set + ["trireme.metrics.listen=127.0.0.1:0"],
                        cpus=args.server_cpus)
        pin_this_process(args.client_cpus)     # after the server started, which has its own
        stats = ServerStats(server.proc.pid)
        stats.metrics_url = server.metrics_url()
        yield server.bootstrap, stats
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(temp, ignore_errors=True)


# --- phases -------------------------------------------------------------------------------------

def make_payloads(record_size: int) -> list[bytes]:
    """Distinct record values of random words from a 1,000-word vocabulary: text-like, so lz4 takes
    them to about 50 % (zstd/gzip about 30 %) of their size.  The pool (a power of two, >= 2 MiB
    in total) is larger than a 1 MB batch, so no batch holds the same record twice."""
    rnd = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rnd.choice(letters) for _ in range(rnd.randint(3, 10))) for _ in range(1000)]
    count = 256
    while count * record_size < 2 * 1024 * 1024:
        count *= 2
    pool = []
    for _ in range(count):
        out, size = [], 0
        while size < record_size:
            word = rnd.choice(words)
            out.append(word)
            size += len(word) + 1
        pool.append(" ".join(out).encode()[:record_size].ljust(record_size, b" "))
    return pool


def produce_waiting(producer, *args, **kwargs) -> None:
    """``producer.produce(*args, **kwargs)``, serving callbacks and retrying while its local queue is full."""
    while True:
        try:
            producer.produce(*args, **kwargs)
            return
        except BufferError:
            producer.poll(0.05)


def percentile(sorted_values, q: float):
    if not sorted_values:
        return None
    i = min(len(sorted_values) - 1, max(0, int(round(q * len(sorted_values))) - 1))
    return sorted_values[i]


def create_topic(bootstrap: str, topic: str, partitions: int, client_props: dict | None = None,
                 configs: dict[str, str] | None = None) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, **(client_props or {})})
    futures = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1,
                                            config=configs or {})],
                                  operation_timeout=30, request_timeout=30)
    for future in futures.values():
        try:
            future.result()
        except KafkaException as e:
            if e.args[0].name() != "TOPIC_ALREADY_EXISTS":
                raise
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:             # wait until metadata lists every partition
        md = admin.list_topics(topic, timeout=10).topics.get(topic)
        if md is not None and md.error is None and len(md.partitions) == partitions:
            return
        time.sleep(0.1)
    raise SystemExit(f"topic {topic} did not appear with {partitions} partitions")


def produce_phase(args, bootstrap: str, topic: str, stats: ServerStats) -> dict:
    """Produce with the chosen client; the broker's breakdown comes from its metrics before and after."""
    before = scrape_metrics(stats.metrics_url)
    clock = PhaseClock(stats)
    sent = (_send_java if args.client.startswith("java-") else _send_confluent)(args, bootstrap, topic, clock)
    times = clock.stop()
    after = scrape_metrics(stats.metrics_url)
    elapsed = max(sent.get("seconds") or times["seconds"], 1e-9)
    delivered = sent["records"]
    result = {
        **times,
        "client": args.client,
        "records": delivered,
        "warmup_records": sent.get("warmup_records", 0),   # acknowledged before the clock started
        "bytes": delivered * args.record_size,
        "seconds": elapsed,
        "mb_per_s": delivered * args.record_size / elapsed / 1e6,
        "records_per_s": delivered / elapsed,
        "latency_ms": sent["latency_ms"],
        "errors": sent["errors"],
        "first_errors": sent["first_errors"],
        "undelivered": sent["undelivered"],
        "backpressure_retries": sent["backpressure_retries"],
        "server_peak_rss_mib": stats.peak_rss_mib(),
    }
    if before is not None and after is not None:
        requests = after["requests"].get("Produce", 0) - before["requests"].get("Produce", 0)
        if requests:
            result["produce_request_ms"] = {
                phase: round((after["phases"].get(("Produce", phase), 0) - before["phases"].get(("Produce", phase), 0))
                             / requests * 1000, 3) for phase in ("receive", "handle", "wait", "respond")}
            result["produce_request_ms"]["requests"] = requests
            fsyncs = after["fsyncs"] - before["fsyncs"]
            result["produce_request_ms"]["fsyncs"] = fsyncs
            result["produce_request_ms"]["fsync_mean"] = round(
                (after["fsync_seconds"] - before["fsync_seconds"]) / max(1, fsyncs) * 1000, 3)
    txn = sent.get("transactions")
    if txn:
        n = max(1, txn["count"])
        result["transactions"] = dict(txn)
        if before is not None and after is not None:
            result["transactions"]["fsyncs_per_txn"] = (after["fsyncs"] - before["fsyncs"]) / n
            result["transactions"]["requests_per_txn"] = {
                api: round((c - before["requests"].get(api, 0)) / n, 2)
                for api, c in sorted(after["requests"].items()) if c - before["requests"].get(api, 0)}
            # Broker time per transaction by API (request read → response queued), the transaction's phases.
            result["transactions"]["broker_ms_per_txn"] = {
                api: round(sum(after["phases"].get((api, ph), 0) - before["phases"].get((api, ph), 0)
                               for ph in ("handle", "wait")) / n * 1000, 2)
                for api in ("AddPartitionsToTxn", "AddOffsetsToTxn", "Produce", "EndTxn", "TxnOffsetCommit",
                            "WriteTxnMarkers")
                if after["requests"].get(api, 0) - before["requests"].get(api, 0)}
            # What the broker sent itself: markers (PREPARE durable → every marker durable), implicit adds.
            for api in ("WriteTxnMarkers", "AddPartitionsToTxn"):
                peer = after["phases"].get((api, "peer"), 0) - before["phases"].get((api, "peer"), 0)
                if peer:
                    result["transactions"]["broker_ms_per_txn"][f"{api} (broker to itself)"] = round(peer / n * 1000, 2)
    return result


def _send_confluent(args, bootstrap: str, topic: str, clock) -> dict:
    """confluent-kafka (librdkafka): produce() as fast as its queue takes records, delivery-callback latencies."""
    conf = {
        "bootstrap.servers": bootstrap,
        "acks": args.acks,
        "linger.ms": args.linger_ms,
        "compression.type": args.compression,
        "enable.idempotence": args.idempotent,
    }
    if args.transactional:
        conf["transactional.id"] = "bench-" + uuid.uuid4().hex[:8]
        conf["enable.idempotence"] = True
    conf.update(parse_props(args.client_prop))
    conf.update(parse_props(args.producer_prop))
    latencies = array("d")
    errors = []
    lat_append = latencies.append
    counts = [0, 0]                                  # delivered, failed

    def on_delivery(err, msg):
        if err is not None:
            if len(errors) < 10:
                errors.append(str(err))
            counts[1] += 1
            return
        counts[0] += 1
        latency = msg.latency()
        if latency is not None:
            lat_append(latency)

    conf["on_delivery"] = on_delivery
    producer = Producer(conf)
    producer.list_topics(topic, timeout=30)          # connect before the clock starts
    payloads = make_payloads(args.record_size)
    mask = len(payloads) - 1
    count = max(1, args.bytes // args.record_size)
    produce = producer.produce
    poll = producer.poll
    backpressure = 0

    txn_size = args.transactional
    txn_times = {"produce": 0.0, "commit": 0.0, "transactions": 0, "aborted": 0}
    if txn_size:
        producer.init_transactions(60)
    else:
        # One record before the clock: an idempotent librdkafka producer asks for its producer id only when its
        # PID timer next fires, 500 ms after it first found no broker up (rdkafka_idempotence.c), whatever the
        # broker: that wait is the client's start-up, not throughput.  (The consume phase reads this record too.)
        produce(topic, payloads[0])
        producer.flush(30)
        counts[0] = counts[1] = 0
        del latencies[:]
        errors.clear()
    clock.start()
    txn_started = 0.0
    for i in range(count):
        if txn_size and i % txn_size == 0:
            producer.begin_transaction()
            txn_started = time.perf_counter()
        value = payloads[i & mask]
        try:
            produce(topic, value)
        except BufferError:                          # local queue full: serve callbacks, retry
            while True:
                backpressure += 1
                poll(0.01)
                try:
                    produce(topic, value)
                    break
                except BufferError:
                    continue
        if not i & 1023:
            poll(0)
        if txn_size and (i % txn_size == txn_size - 1 or i == count - 1):
            ended = time.perf_counter()
            txn_times["produce"] += ended - txn_started
            txn_times["transactions"] += 1
            if args.abort_every and txn_times["transactions"] % args.abort_every == 0:
                producer.flush(600)
                producer.abort_transaction(600)
                txn_times["aborted"] += 1
            else:
                producer.commit_transaction(600)
            txn_times["commit"] += time.perf_counter() - ended
    remaining = producer.flush(600)
    latencies = sorted(latencies)
    sent = {
        "records": counts[0], "warmup_records": 0 if txn_size else 1, "errors": counts[1], "first_errors": errors,
        "undelivered": remaining,
        "backpressure_retries": backpressure,
        "latency_ms": {name: (None if v is None else v * 1000) for name, v in (
            ("p50", percentile(latencies, 0.50)), ("p99", percentile(latencies, 0.99)),
            ("p999", percentile(latencies, 0.999)), ("max", latencies[-1] if latencies else None))},
    }
    if txn_size:
        n = max(1, txn_times["transactions"])
        sent["transactions"] = {"count": txn_times["transactions"], "aborted": txn_times["aborted"],
                                "produce_ms_per_txn": txn_times["produce"] / n * 1000,
                                "commit_ms_per_txn": txn_times["commit"] / n * 1000}
    return sent


def _send_java(args, bootstrap: str, topic: str, clock) -> dict:
    """The Apache Kafka Java client (compat_tests/java/Harness.java, op bench_produce): the same records, timed by
    the client from its first send to its last acknowledgement."""
    sys.path.insert(0, REPO)
    from compat_tests import clients
    version = args.client.removeprefix("java-")
    conf = {"acks": args.acks, "linger.ms": str(int(args.linger_ms)), "compression.type": args.compression,
            "enable.idempotence": str(bool(args.idempotent or args.transactional)).lower(),
            **({"transactional.id": "bench-" + uuid.uuid4().hex[:8]} if args.transactional else {}),
            **{k: str(v) for k, v in parse_props(args.producer_prop).items()}}
    count = max(1, args.bytes // args.record_size)
    with clients.java_harness(version, bootstrap) as harness:
        clock.start()
        r = harness.ok("bench_produce", timeout=3600, topic=topic, count=count, size=args.record_size,
                       txn_size=args.transactional, abort_every=args.abort_every, config=conf)
    sent = {"records": r["records"], "errors": r["failed"], "first_errors": [r["first_error"]] if r["first_error"]
            else [], "undelivered": count - r["records"] - r["failed"], "backpressure_retries": 0,
            "seconds": r["seconds"],
            "latency_ms": {"p50": r["p50_ms"], "p99": r["p99_ms"], "p999": r["p999_ms"], "max": r["max_ms"]}}
    if args.transactional:
        sent["transactions"] = {"count": r["transactions"], "aborted": r["aborted"],
                                "produce_ms_per_txn": r["send_ms_per_txn"], "commit_ms_per_txn": r["commit_ms_per_txn"]}
    return sent


def scrape_metrics(url: str | None) -> dict | None:
    """fsyncs, per-API request counts and three histograms (Produce latency; group commits as the flusher saw
    them and the time of their fsync thread) from the broker's Prometheus endpoint (None without one)."""
    if not url:
        return None
    import urllib.request
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {"fsyncs": int(_unlabelled(text, "trireme_fsyncs_total")),
            "fsync_seconds": _unlabelled(text, "trireme_fsync_seconds_total"),
            "phases": {(api, phase): float(sec) for api, phase, sec in re.findall(
                r'trireme_request_phase_seconds_total\{api="(\w+)",phase="(\w+)"\} (\S+)', text)}
            | {(api, "handle"): float(sec) for api, sec in re.findall(
                r'trireme_request_handler_seconds_total\{api="(\w+)"\} (\S+)', text)},
            "requests": {api: int(n) for api, n in re.findall(r'trireme_requests_total\{api="(\w+)"\} (\d+)', text)},
            "produce_latency": _buckets(text, "trireme_request_duration_seconds", 'api="Produce",'),
            "fsync_duration": _buckets(text, "trireme_fsync_duration_seconds"),
            "fsync_worker": _buckets(text, "trireme_fsync_worker_seconds"),
            "files_to_release": _unlabelled(text, "trireme_segment_files_to_release")}


def _unlabelled(text: str, name: str) -> float | None:
    """An unlabelled metric's value (None where the broker has no such metric)."""
    found = re.search(rf"^{name} (\S+)", text, re.M)
    return float(found.group(1)) if found else None


def _buckets(text: str, histogram: str, labels: str = "") -> list[tuple[float, int]]:
    """(upper bound, cumulative count) of each bucket of ``histogram`` (with ``labels``, written as in the text)."""
    return [(float(le), int(n)) for le, n in re.findall(
        rf'^{histogram}_bucket\{{{labels}le="([^"]+)"\}} (\d+)', text, re.M)]


def histogram_delta(before: dict | None, after: dict | None, key: str) -> dict | None:
    """What a broker histogram (``key`` of `scrape_metrics`) counted between two scrapes: how many, the share
    within 5 ms, and the bucket bounds that hold p50, p99 and the largest ("<= X ms"; inf beyond the last)."""
    if not before or not after or not after[key]:
        return None
    old = dict(before[key])
    buckets = [(le, n - old.get(le, 0)) for le, n in after[key]]
    total = buckets[-1][1]
    if not total:
        return None

    def bound(q: float) -> float:
        return next(le for le, n in buckets if n >= q * total) * 1000
    within = max((n for le, n in buckets if le <= 0.005), default=0)
    return {"count": total, "within_5ms": round(within / total, 4),
            "p50_le_ms": bound(0.5), "p99_le_ms": bound(0.99), "max_le_ms": bound(1.0)}


def broker_latency(before: dict | None, after: dict | None) -> dict | None:
    """The Produce latency the broker itself measured between two scrapes (first byte of the request read to
    last byte of the answer written; time in the socket before the broker reads is not in it)."""
    return histogram_delta(before, after, "produce_latency")


def fsync_latency(before: dict | None, after: dict | None) -> dict | None:
    """The broker's group commits between two scrapes: each whole round as its flusher saw it, and (key "worker")
    the worker thread's time on the fsyncs. A stalling disk shows in both, a busy event loop only in the round;
    a broker short of CPU in both (the worker waits for the GIL between fsyncs)."""
    rounds = histogram_delta(before, after, "fsync_duration")
    if rounds is not None:
        rounds["worker"] = histogram_delta(before, after, "fsync_worker")
    return rounds


def format_broker_latency(b: dict | None) -> str:
    if not b:
        return ""
    return (f"; broker-measured latency p50 <= {b['p50_le_ms']:g} ms, p99 <= {b['p99_le_ms']:g} ms, "
            f"{b['within_5ms'] * 100:.2f} % within 5ms")


def format_fsync_latency(f: dict | None) -> str:
    if not f:
        return ""
    worker = f.get("worker")
    return (f"; flush rounds p99 <= {f['p99_le_ms']:g} ms, max <= {f['max_le_ms']:g} ms"
            + (f" (in the fsync thread p99 <= {worker['p99_le_ms']:g} ms, max <= {worker['max_le_ms']:g} ms)"
               if worker else ""))


def consume_phase(args, bootstrap: str, topic: str, stats: ServerStats) -> dict:
    conf = {
        "bootstrap.servers": bootstrap,
        "group.id": f"bench-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        # librdkafka pauses fetching for fetch.queue.backoff.ms (default 1000) whenever its local
        # queue (queued.max.messages.kbytes, 64 MiB) is full, which happens as soon as the Python
        # loop is slower than the broker; 1 s pauses would measure that timer, not the broker.
        "fetch.queue.backoff.ms": 10,
        "isolation.level": args.isolation,
    }
    conf.update(parse_props(args.client_prop))
    conf.update(parse_props(args.consumer_prop))
    consumer = Consumer(conf)
    md = consumer.list_topics(topic, timeout=30).topics.get(topic)
    if md is None or md.error is not None:
        raise SystemExit(f"cannot consume {topic}: {md.error if md is not None else 'no such topic'}")
    targets = {}
    for p in sorted(md.partitions):
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
        if high > low:
            targets[p] = high
    expected = sum(targets.values())
    consumer.assign([TopicPartition(topic, p, 0) for p in targets])

    got = nbytes = bad = 0
    errors = []
    done = {}
    first = None
    clock = PhaseClock(stats)
    start = clock.start()
    deadline = start + args.consume_timeout
    consume = consumer.consume
    while len(done) < len(targets):
        # consume(n) waits until n messages or the timeout: never ask for more than are left
        asked = max(1, min(10000, expected - got + bad))
        # A short wait: the last call asks for more records than are left whenever markers or
        # aborted records took offsets, and would otherwise sit out its whole timeout.
        msgs = consume(asked, 0.005)
        for m in msgs:
            if m.error() is not None:
                bad += 1
                if len(errors) < 10:
                    errors.append(str(m.error()))
                continue
            nbytes += len(m)
        got += len(msgs)
        if msgs and first is None:
            first = time.perf_counter() - start
        if msgs:
            last = msgs[-1]
            if last.error() is None and last.offset() + 1 >= targets[last.partition()]:
                done[last.partition()] = True
            if len(targets) > 1:                     # batches can mix partitions
                for m in msgs:
                    if m.error() is None and m.offset() + 1 >= targets[m.partition()]:
                        done[m.partition()] = True
        if len(msgs) < asked:
            # Markers take offsets but are no records, and aborted records are skipped: use positions
            # (also for a topic written by another run: --phases consume knows nothing of its markers).
            for tp in consumer.position([TopicPartition(topic, p) for p in targets]):
                if tp.offset >= targets[tp.partition]:
                    done[tp.partition] = True
        if time.perf_counter() > deadline:
            errors.append(f"gave up after {args.consume_timeout}s with {got} of {expected} records")
            break
    times = clock.stop()
    elapsed = max(times["seconds"], 1e-9)
    consumer.close()
    return {
        "records": got - bad,
        "expected_records": expected,
        "bytes": nbytes,
        "seconds": elapsed,
        "mb_per_s": nbytes / elapsed / 1e6,
        "records_per_s": (got - bad) / elapsed,
        "first_record_s": first,
        "errors": errors,
        **times,
        "server_peak_rss_mib": stats.peak_rss_mib(),
    }


# --- output -------------------------------------------------------------------------------------

def _fmt(v, spec=".1f"):
    return "n/a" if v is None else format(v, spec)


def spread(values) -> dict | None:
    """Median, smallest and largest of the values that are there (None: none are): one figure over rounds."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def format_spread(sp: dict | None, spec: str) -> str:
    """A :func:`spread` as ``median [min-max]`` (the median alone for one value)."""
    if sp is None:
        return "n/a"
    if sp["n"] == 1:
        return format(sp["median"], spec)
    return f"{sp['median']:{spec}} [{sp['min']:{spec}}-{sp['max']:{spec}}]"


def report_produce(r: dict) -> None:
    lat = r["latency_ms"]
    if "produce_request_ms" in r:
        b = r["produce_request_ms"]
        print(f"per Produce request ({b['requests']}), broker ms: receive {b['receive']}, validate+append "
              f"{b['handle']}, wait for the flush {b['wait']}, respond {b['respond']}; {b['fsyncs']} fsyncs "
              f"({b['requests'] / max(1, b['fsyncs']):.1f} requests each), mean {b['fsync_mean']}")
    if "transactions" in r:
        t = r["transactions"]
        print(f"transactions: {t['count']} ({t['aborted']} aborted); per transaction: produce "
              f"{t['produce_ms_per_txn']:.1f} ms, commit {t['commit_ms_per_txn']:.1f} ms, "
              f"fsyncs {_fmt(t.get('fsyncs_per_txn'), '.1f')}; requests {t.get('requests_per_txn')}")
        if "broker_ms_per_txn" in t:
            print(f"  broker ms per transaction by API (handle + wait): {t['broker_ms_per_txn']}")
    print(f"produce: {r['mb_per_s']:.1f} MB/s, {r['records_per_s']:,.0f} records/s "
          f"({r['records']:,} records in {r['seconds']:.2f} s)")
    print(f"  latency ms: p50 {_fmt(lat['p50'], '.2f')}  p99 {_fmt(lat['p99'], '.2f')}  "
          f"p999 {_fmt(lat['p999'], '.2f')}  max {_fmt(lat['max'], '.2f')}")
    print(f"  server: cpu {_fmt(r['server_cpu_s'], '.2f')} s, peak RSS {_fmt(r['server_peak_rss_mib'])} MiB; "
          f"client cpu {r['client_cpu_s']:.2f} s; BufferError retries {r['backpressure_retries']}")
    print(f"  other processes: cpu {_fmt(r['other_processes_cpu_s'], '.2f')} s (load {r['loadavg_1m']:.1f})"
          f"{format_reference(r.get('reference_us'))}")
    if r["errors"] or r["undelivered"]:
        print(f"  delivery errors: {r['errors']}, undelivered: {r['undelivered']}; first: {r['first_errors']}")


def report_consume(r: dict) -> None:
    print(f"consume: {r['mb_per_s']:.1f} MB/s, {r['records_per_s']:,.0f} records/s "
          f"({r['records']:,} of {r['expected_records']:,} records in {r['seconds']:.2f} s; "
          f"first after {_fmt(r['first_record_s'], '.3f')} s)")
    print(f"  server: cpu {_fmt(r['server_cpu_s'], '.2f')} s, peak RSS {_fmt(r['server_peak_rss_mib'])} MiB; "
          f"client cpu {r['client_cpu_s']:.2f} s")
    print(f"  other processes: cpu {_fmt(r['other_processes_cpu_s'], '.2f')} s (load {r['loadavg_1m']:.1f})"
          f"{format_reference(r.get('reference_us'))}")
    if r["errors"]:
        print(f"  errors: {r['errors']}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bytes", type=parse_size, default=parse_size("1GiB"),
                    help="record value bytes to produce (default 1GiB; suffixes KiB MiB GiB KB MB GB)")
    ap.add_argument("--record-size", type=parse_size, default=1024, help="value size of each record (1024)")
    ap.add_argument("--partitions", type=int, default=1)
    ap.add_argument("--acks", default="all", choices=["0", "1", "all", "-1"])
    ap.add_argument("--linger-ms", type=float, default=5)
    ap.add_argument("--compression", default="none", choices=["none", "gzip", "snappy", "lz4", "zstd"])
    ap.add_argument("--idempotent", action="store_true", help="enable.idempotence=true")
    ap.add_argument("--client", default="confluent", choices=["confluent", "java-3.9.0", "java-4.3.0"],
                    help="producer client: confluent-kafka (default) or the Apache Kafka Java client (`make clients`)")
    ap.add_argument("--transactional", type=int, default=0, metavar="N",
                    help="produce in transactions of N records (a transactional producer)")
    ap.add_argument("--abort-every", type=int, default=0, metavar="K",
                    help="with --transactional: abort every K-th transaction")
    ap.add_argument("--isolation", default="read_uncommitted", choices=["read_uncommitted", "read_committed"],
                    help="isolation.level of the consumer")
    ap.add_argument("--fsync", action=argparse.BooleanOptionalAction, default=True,
                    help="fsync before acknowledging (server's trireme.fsync.enable; default on)")
    ap.add_argument("--bootstrap", default=None,
                    help="use a running broker instead of starting one (--fsync is then up to it)")
    ap.add_argument("--server-pid", type=int, default=None, help="with --bootstrap: pid for CPU/RSS figures")
    ap.add_argument("--metrics-url", default=None,
                    help="with --bootstrap: a Trireme's metrics endpoint, for the broker's per-request breakdown")
    ap.add_argument("--topic", default=None, help="topic name (default: a fresh bench-XXXX)")
    ap.add_argument("--phases", default="produce,consume",
                    help="comma list of produce,consume (consume alone reads an existing --topic)")
    ap.add_argument("--data-dir", default=None,
                    help="server data dir to use and keep (default: a temp dir, deleted afterwards)")
    ap.add_argument("--profile-server", metavar="OUT.prof", default=None,
                    help="run the server under cProfile, writing OUT.prof on exit (slows it down)")
    ap.add_argument("--profile-timer", choices=["cpu", "wall"], default="cpu",
                    help="cProfile clock: the server main thread's CPU time (default) or wall time")
    ap.add_argument("--server-set", action="append", default=[], metavar="NAME=VALUE",
                    help="extra --set for the started server")
    ap.add_argument("--producer-prop", action="append", default=[], metavar="KEY=VALUE",
                    help="extra librdkafka producer property")
    ap.add_argument("--consumer-prop", action="append", default=[], metavar="KEY=VALUE",
                    help="extra librdkafka consumer property")
    ap.add_argument("--client-prop", action="append", default=[], metavar="KEY=VALUE",
                    help="librdkafka property of the admin client, producer and consumer alike (security.protocol, "
                         "ssl.ca.location: bench/tls_throughput.py)")
    ap.add_argument("--consume-timeout", type=float, default=600, help="give up consuming after this (s)")
    args = ap.parse_args(argv)
    phases = {p.strip() for p in args.phases.split(",") if p.strip()}
    if not phases <= {"produce", "consume"}:
        ap.error("--phases takes produce and/or consume")
    if phases == {"consume"} and not args.topic:
        ap.error("--phases consume needs --topic (an existing topic)")
    if args.acks == "-1":
        args.acks = "all"
    topic = args.topic or f"bench-{uuid.uuid4().hex[:8]}"

    server = None
    temp_root = None
    try:
        if args.bootstrap:
            bootstrap = args.bootstrap
            stats = ServerStats(args.server_pid)
            stats.metrics_url = args.metrics_url
        else:
            if args.data_dir:
                data_dir = args.data_dir
            else:
                temp_root = tempfile.mkdtemp(prefix="trireme-bench-")
                data_dir = os.path.join(temp_root, "data")
            server = Server(data_dir, args.fsync, args.profile_server,
                            args.server_set + ["trireme.metrics.listen=127.0.0.1:0"], args.profile_timer)
            bootstrap = server.bootstrap
            stats = ServerStats(server.proc.pid)
            stats.metrics_url = server.metrics_url()
        config = {"client": args.client, "bytes": args.bytes, "record_size": args.record_size,
                  "partitions": args.partitions,
                  "acks": args.acks, "linger_ms": args.linger_ms, "compression": args.compression,
                  "idempotent": args.idempotent, "transactional": args.transactional,
                  "abort_every": args.abort_every, "isolation": args.isolation,
                  "fsync": args.fsync if server else None,
                  "bootstrap": bootstrap, "topic": topic}
        print(f"bench: {json.dumps(config)}", flush=True)
        summary = {"config": config}
        if "produce" in phases:
            create_topic(bootstrap, topic, args.partitions, parse_props(args.client_prop))
            summary["produce"] = produce_phase(args, bootstrap, topic, stats)
            report_produce(summary["produce"])
        if "consume" in phases:
            summary["consume"] = consume_phase(args, bootstrap, topic, stats)
            report_consume(summary["consume"])
        summary["server_peak_rss_mib"] = stats.peak_rss_mib()
        print(json.dumps(summary, separators=(",", ":")), flush=True)
        return 0
    except KafkaException as e:
        print(f"bench: kafka error: {e}", file=sys.stderr)
        return 1
    finally:
        if server is not None:
            server.stop()
            if server.proc.returncode not in (0, -signal.SIGINT):
                print(f"bench: server exited with {server.proc.returncode}; log {server.log_path}",
                      file=sys.stderr)
        if temp_root is not None:
            shutil.rmtree(temp_root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
