"""Issue 23's workloads side by side on several brokers in interleaved rounds: MB/s, CPU per MB, fsync floor, load.

    .venv/bin/python bench/kafka_side_by_side.py [--rounds 3] [--records 200000] [--java-bytes 256MiB]
        [--trireme fsync,no-fsync] [--bootstrap HOST:PORT --server-pid PID [--name kafka]]
        [--workloads produce,idempotent,transactional,java,java_idempotent,latency,small]

Targets: the Trireme brokers it starts (``--trireme``: ``fsync``, the default, and/or ``no-fsync``, each a fresh
``trireme serve`` on a temporary data dir) and at most one running broker (``--bootstrap``, e.g. Apache Kafka started
outside the project; ``--server-pid`` gives its CPU).  Each round runs every workload on every target, one target
right after the other (their order reversed every other round), so the same workload's runs on different brokers
are minutes apart at most; before each run the page cache's dirty data is written back (``sync``), so that a
no-fsync run's writeback does not slow the fsyncs of the run after it.  The workloads reuse the other
benchmarks: ``produce_consume.py`` (confluent-kafka 1 KiB acks=all linger 5: produce then consume read_uncommitted;
idempotent; transactional 1,000 records per transaction then consume read_committed; the Java 4.3 producer, not
idempotent, and with all its defaults: idempotent),
``cleaner_isolation.latencies`` (acks=all, one 100-byte message at a time) and ``small_requests.py`` (1, 4 and 64
producers of at most 10 × 100 B per request).

Per workload and target it prints the median and range over the rounds of MB/s (records/s, ack p50/p99), broker
CPU per MB (``utime+stime`` of the broker process), the fsync floor where one request in flight meets the disk
(``fsync_floor.floor``: a bare write + fdatasync loop of the request size, on the started broker's disk, in the
same round), and the 1-minute load average; with both started brokers, the serial floor of the rows whose requests
in flight meet the disk together (the client's time for them without fsync plus one fdatasync) and the share of it
reached; for the Java runs the
broker's peak resident size (VmHWM, reset before the run), and for a started broker the restart after kill -9 with
1 GiB in a partition (to ``listening on``, to its logs loaded, to the first acknowledged record); with
``--bootstrap``, each started target's ratio to it, round by round.
The last stdout line is a JSON summary.  Nothing is asserted.  See bench/README.md.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fsync_floor  # noqa: E402
import produce_consume  # noqa: E402
import small_requests  # noqa: E402
from cleaner_isolation import latencies  # noqa: E402
from confluent_kafka import Producer  # noqa: E402
from confluent_kafka.admin import AdminClient  # noqa: E402
from produce_consume import (PhaseClock, Server, ServerStats, create_topic, parse_size, scrape_metrics,  # noqa: E402
                             spread)
from produce_consume import format_spread as _fmt  # noqa: E402

# The rows, in the order of the issue's table.
WORKLOADS = ("produce", "idempotent", "transactional", "consume", "consume_committed", "java", "java_idempotent",
             "latency", "small-1", "small-4", "small-64", "restart")
# What --workloads selects, each run once per round and target: produce (rows produce, consume), idempotent,
# transactional (transactional, consume_committed), java, java_idempotent, latency, small (small-1, small-4,
# small-64), restart (last: it kills the broker).  ``java`` sets enable.idempotence=false (as the Kafka figures it is
# compared with were measured); ``java_idempotent`` is the Java client's own defaults (acks=all, idempotent, up to 5
# requests in flight).  Both give the broker's peak resident size during the run; restart only runs on a started broker.
# How long, at most, a run waits for a Trireme to free the blocks of the topic the run before it deleted
RELEASE_WAIT_S = 120
UNITS = ("produce", "idempotent", "transactional", "java", "java_idempotent", "latency", "small", "restart")
# The rows whose MB and broker CPU add up to the issue's "CPU per MB over the confluent-kafka and Java workloads".
THROUGHPUT = ("produce", "idempotent", "transactional", "consume", "consume_committed", "java")
# The broker's own account of a Produce request (produce_consume.py's "produce_request_ms" from its metrics): ms in
# each phase, and the mean fsync's.
BROKER_PHASES = ("receive", "handle", "wait", "respond", "fsync_mean")
# Where one request in flight (or the Java producer's 5) meets the disk: (requests in flight, request bytes when the
# broker does not count its requests: librdkafka's batch.size, the Java producer's, one 100-byte record).
FLOOR = {"idempotent": (1, 1_000_000), "java": (5, 16384), "java_idempotent": (5, 16384), "latency": (1, 100)}


def disk_floor(request_bytes: int, in_flight: int = 1, directory: str | None = None, seconds: float = 1.0) -> dict:
    """What the disk alone allows one connection with ``in_flight`` requests of ``request_bytes`` when each
    acknowledgement waits for an fdatasync: ``fsync_floor.floor`` (its ``disk`` loop) for ``seconds`` on requests of
    ``in_flight * request_bytes`` (the requests in flight written and flushed together, a group commit of them) in
    ``directory`` → its figures, with ``request_bytes`` and ``in_flight``."""
    return fsync_floor.floor(in_flight * request_bytes, seconds, directory) | {"request_bytes": request_bytes,
                                                                               "in_flight": in_flight}


# --- targets ------------------------------------------------------------------------------------

class Target:
    """One broker the workloads run on: started here (a Trireme) or running already (``--bootstrap``)."""

    def __init__(self, name: str, bootstrap: str, pid: int | None, metrics_url: str | None,
                 floor_dir: str | None, server: Server | None = None, temp: str | None = None):
        self.name, self.bootstrap, self.floor_dir = name, bootstrap, floor_dir
        self.stats = ServerStats(pid)
        self.stats.metrics_url = metrics_url
        self.server, self.temp = server, temp

    @classmethod
    def start_trireme(cls, fsync: bool, server_set: list[str]) -> Target:
        temp = tempfile.mkdtemp(prefix="trireme-side-by-side-")
        options = (os.path.join(temp, "data"), fsync, None, server_set + ["trireme.metrics.listen=127.0.0.1:0"])
        server = Server(*options)
        target = cls("trireme" if fsync else "trireme-no-fsync", server.bootstrap, server.proc.pid,
                     server.metrics_url(), temp if fsync else None, server, temp)
        target.server_options = options
        return target

    def kill_and_restart(self) -> float:
        """kill -9 the started broker, then start it again on the same data dir and settings (a new port) → the
        ``time.perf_counter()`` just before the new process was started."""
        self.server.proc.kill()
        self.server.proc.wait()
        self.server.stop()                             # closes what the dead process's Server held
        started = time.perf_counter()
        self.server = Server(*self.server_options)
        self.bootstrap = self.server.bootstrap
        self.stats.pid = self.server.proc.pid
        self.stats.metrics_url = self.server.metrics_url()
        return started

    def counters(self) -> tuple[int, int] | None:
        """(Produce requests, fsyncs) the broker has counted so far (None: it has no metrics endpoint)."""
        metrics = scrape_metrics(self.stats.metrics_url)
        return None if metrics is None else (metrics["requests"].get("Produce", 0), metrics["fsyncs"])

    def delete_topic(self, topic: str) -> None:
        """Topics go once measured, so the data of earlier rounds neither fills the disk nor the page cache.  A
        Trireme frees a deleted topic's blocks a step at a time in the background (``run_segment_release``: 1 GiB
        in about 13 s); the next run waits until that is done, so that the release's cuts do not slow its fsyncs
        (the restart row's 1 GiB made the next round's bare fdatasync loop 2.5 × slower)."""
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        for future in admin.delete_topics([topic], operation_timeout=30).values():
            future.result()
        deadline = time.monotonic() + RELEASE_WAIT_S
        while time.monotonic() < deadline:
            metrics = scrape_metrics(self.stats.metrics_url)
            if metrics is None or not metrics.get("files_to_release"):
                return
            time.sleep(0.1)

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            if self.server.proc.returncode not in (0, -signal.SIGINT):
                print(f"side-by-side: {self.name} exited with {self.server.proc.returncode}; log "
                      f"{self.server.log_path}", file=sys.stderr, flush=True)
        if self.temp is not None:
            shutil.rmtree(self.temp, ignore_errors=True)


# --- workloads ----------------------------------------------------------------------------------

def _produce_consume(target: Target, argv: list[str]) -> dict:
    """``produce_consume.py`` against the target in this process; → its JSON summary."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = produce_consume.main(argv + ["--bootstrap", target.bootstrap]
                                    + (["--server-pid", str(target.stats.pid)] if target.stats.pid else [])
                                    + (["--metrics-url", target.stats.metrics_url] if target.stats.metrics_url
                                       else []))
    if code != 0:
        raise SystemExit(f"produce_consume.py {' '.join(argv)} failed on {target.name}:\n{out.getvalue()}")
    return json.loads(out.getvalue().strip().splitlines()[-1])


def _machine(phase: dict, others_cpu_s: float | None) -> dict:
    """How busy the machine was during a run: the load average, the cores' worth of CPU the processes outside the
    run took (its clients and broker excluded), and the system (kernel) share of the broker's CPU."""
    split = phase.get("server_cpu_split_s")
    cpu = None if not split else split["user"] + split["system"]
    return {"loadavg_1m": phase["loadavg_1m"],
            "others_cores": None if others_cpu_s is None else others_cpu_s / max(phase["seconds"], 1e-9),
            "cpu_system_share": split["system"] / cpu if cpu else None}


def _row(workload: str, phase: dict) -> dict:
    mb = phase["bytes"] / 1e6
    cpu = phase["server_cpu_s"]
    return {"workload": workload, "mb_per_s": phase["mb_per_s"], "records_per_s": phase["records_per_s"],
            "mb": mb, "server_cpu_s": cpu, "cpu_ms_per_mb": None if cpu is None else cpu / mb * 1000,
            **_machine(phase, phase["other_processes_cpu_s"]),
            "broker_ms": phase.get("produce_request_ms"),
            "failed": (phase["errors"] + phase["undelivered"] if "undelivered" in phase      # produce: counts
                       else len(phase["errors"]))}                                            # consume: messages


def run_unit(unit: str, target: Target, args) -> list[dict]:
    """One unit of ``UNITS`` on one target → its rows (the Produce requests the broker counted, if it says)."""
    topic = f"side-{unit}-{os.urandom(4).hex()}"
    before = target.counters()
    confluent = ["--bytes", str(args.records * 1024), "--record-size", "1024", "--topic", topic]
    if unit == "produce":
        s = _produce_consume(target, confluent)
        rows = [_row("produce", s["produce"]), _row("consume", s["consume"])]
    elif unit == "idempotent":
        s = _produce_consume(target, confluent + ["--idempotent", "--phases", "produce"])
        rows = [_row("idempotent", s["produce"])]
    elif unit == "transactional":
        s = _produce_consume(target, confluent + ["--transactional", "1000", "--isolation", "read_committed"])
        rows = [_row("transactional", s["produce"]), _row("consume_committed", s["consume"])]
    elif unit in ("java", "java_idempotent"):
        reset = reset_peak_rss(target.stats.pid)
        s = _produce_consume(target, ["--client", "java-4.3.0", "--bytes", str(args.java_bytes), "--topic", topic,
                                      "--phases", "produce"] + (["--idempotent"] if unit == "java_idempotent" else []))
        rows = [_row(unit, s["produce"])]
        rows[0].update(others_cores=None,              # the Java client is a process of its own: in "others"
                       peak_rss_mib=s["produce"]["server_peak_rss_mib"], peak_rss_of_the_run=reset)
    elif unit == "restart":
        if target.server is None:
            return []                                  # only a broker started here can be killed and started
        rows = [_restart(target, args.restart_bytes, topic)]
    elif unit == "latency":
        rows = [_latency(target, args.latency_seconds)]
        topic = None                                   # "lat" (cleaner_isolation's) stays for the next rounds
    else:
        rows = [_small(target, entry) for entry in small_requests.MATRIX
                if entry[0] == "produce" and "--rate" not in entry and "--no-fsync" not in entry]
        topic = None                                   # small_requests names its own topics
    after = target.counters()
    if before is not None and after is not None and unit in ("produce", "idempotent", "transactional", "java",
                                                             "java_idempotent"):
        requests, fsyncs = after[0] - before[0], after[1] - before[1]
        rows[0].update(produce_requests=requests, fsyncs=fsyncs, fsyncs_per_request=fsyncs / max(1, requests),
                       mean_request_bytes=rows[0]["mb"] * 1e6 / max(1, requests))
    if topic is not None:
        target.delete_topic(topic)
    for row in rows:
        if row["workload"] in FLOOR and target.floor_dir is not None:
            in_flight, nominal = FLOOR[row["workload"]]
            size = int(row.get("mean_request_bytes") or nominal)
            row["floor"] = disk_floor(size, in_flight, directory=target.floor_dir)
    return rows


def reset_peak_rss(pid: int | None) -> bool:
    """Start the process's peak resident size (VmHWM) afresh from its current one (Linux's ``clear_refs`` 5), so
    that the next reading is the peak of what follows → False where it cannot be (no pid, another user's process:
    the reading is then the peak since the process started)."""
    if pid is None:
        return False
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _restart(target: Target, data_bytes: int, topic: str) -> dict:
    """``data_bytes`` of 1 KiB records into one partition, kill -9, start again: the seconds from the new process's
    start to its ``listening on`` line, to the end of its log loading (its own log line) and to the acknowledgement of
    an acks=all record on that partition, and whether it took the offset after the records acknowledged before."""
    s = _produce_consume(target, ["--bytes", str(data_bytes), "--record-size", "1024", "--topic", topic,
                                  "--phases", "produce"])
    records = s["produce"]["records"] + s["produce"]["warmup_records"]     # acknowledged before the kill
    partition = os.path.join(target.server.data_dir, "logs", f"{topic}-0")
    on_disk = sum(os.path.getsize(os.path.join(partition, name)) for name in os.listdir(partition))
    started = target.kill_and_restart()
    listening = time.perf_counter() - started
    offset = _first_ack(target.bootstrap, topic)
    restart = time.perf_counter() - started
    cpu = target.stats.cpu_seconds()
    with open(target.server.log_path, "rb") as f:
        loaded = re.search(rb"loaded topics=\d+ partitions=\d+ in ([\d.]+)s", f.read())
    return {"workload": "restart", "restart_s": restart, "listening_s": listening,
            "loaded_s": float(loaded.group(1)) if loaded else None, "disk_gib": on_disk / 2 ** 30,
            "records": records, "offset": offset, "server_cpu_s": cpu, "loadavg_1m": os.getloadavg()[0],
            "others_cores": None, "cpu_system_share": None,
            "failed": int(offset is None or offset < records)}          # an acknowledged record lost


def _first_ack(bootstrap: str, topic: str) -> int | None:
    """The offset a confluent-kafka producer (acks=all) gets for one record on partition 0 (None: refused)."""
    got = []
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})
    producer.produce(topic, b"after the restart", partition=0,
                     on_delivery=lambda err, msg: got.append(None if err else msg.offset()))
    producer.flush(120)
    return got[0] if got else None


def _latency(target: Target, seconds: float) -> dict:
    create_topic(target.bootstrap, "lat", 1)
    clock = PhaseClock(target.stats, sample_speed=False)
    clock.start()
    samples = sorted(latency for _, latency in latencies(target.bootstrap, seconds))
    times = clock.stop()
    cpu = times["server_cpu_s"]
    return {"workload": "latency", "messages": len(samples),
            "p50_ms": produce_consume.percentile(samples, 0.5) * 1000,
            "p99_ms": produce_consume.percentile(samples, 0.99) * 1000,
            "server_cpu_s": cpu, "cpu_us_per_message": None if cpu is None else cpu / len(samples) * 1e6,
            **_machine(times, times["other_processes_cpu_s"])}


def _small(target: Target, entry: list[str]) -> dict:
    args = small_requests.parse(entry)
    r = small_requests.run_produce(args, target.bootstrap, target.stats)
    mb = r["records"] * len(small_requests.RECORD) / 1e6
    cpu = r["server_cpu_s"]
    return {"workload": f"small-{r['producers']}", "records_per_s": r["records_per_s"], "mb_per_s": mb / r["seconds"],
            "mb": mb, "server_cpu_s": cpu, "cpu_ms_per_mb": None if cpu is None else cpu / mb * 1000,
            "cpu_us_per_request": r["broker_cpu_us_per_request"], "records_per_request": r["records_per_request"],
            **_machine(r, None if r["other_processes_cpu_s"] is None
                       else max(0.0, r["other_processes_cpu_s"] - r["workers_cpu_s"])),
            "failed": r["failed"] + r["undelivered"]}


# --- the figures --------------------------------------------------------------------------------

# The figures each row is judged by: throughput rows by MB/s, latency by its percentiles, small requests by records/s.
def figures(workload: str) -> tuple[str, ...]:
    if workload == "restart":
        return ("restart_s", "listening_s", "loaded_s")
    if workload in ("java", "java_idempotent"):
        return ("mb_per_s", "cpu_ms_per_mb", "peak_rss_mib")
    if workload == "latency":
        return ("p50_ms", "p99_ms", "cpu_us_per_message")
    if workload.startswith("small-"):
        return ("records_per_s", "cpu_ms_per_mb", "cpu_us_per_request")
    return ("mb_per_s", "cpu_ms_per_mb")


def summarize(runs: list[dict]) -> list[dict]:
    """One entry per (workload, target) in the order of WORKLOADS then of the targets' first runs: each figure's
    spread over the rounds, the load's, and the fsync floor's (MB/s, and fdatasync ms for the latency row)."""
    targets = list(dict.fromkeys(r["target"] for r in runs))
    out = []
    for workload in WORKLOADS:
        for target in targets:
            mine = [r for r in runs if r["workload"] == workload and r["target"] == target]
            if not mine:
                continue
            entry = {"workload": workload, "target": target, "rounds": len(mine),
                     **{f: spread(r.get(f) for r in mine) for f in figures(workload)},
                     **{f: spread(r.get(f) for r in mine)
                        for f in ("cpu_system_share", "mean_request_bytes", "fsyncs_per_request", "loadavg_1m",
                                  "others_cores")}}
            phases = [r["broker_ms"] for r in mine if r.get("broker_ms")]
            if phases:
                entry["broker_ms"] = {k: spread(p.get(k) for p in phases) for k in BROKER_PHASES}
            floors = [r["floor"] for r in mine if r.get("floor")]
            if floors:
                entry["floor"] = {"request_bytes": round(statistics.median(f["request_bytes"] for f in floors)),
                                  "in_flight": floors[0]["in_flight"],
                                  "mb_per_s": spread(f["mb_per_s"] for f in floors),
                                  "p50_ms": spread(f["p50_ms"] for f in floors),
                                  "cpu_ms_per_mb": spread(f["cpu_ms_per_mb"] for f in floors)}
            out.append(entry)
    return out


def serial_floors(runs: list[dict]) -> list[dict]:
    """Where the requests in flight meet the disk together (idempotent librdkafka and one message at a time: one; the
    Java producer: five), what the same client could get at best with an fdatasync before the answers: its own time
    for those requests against the same broker without fsync (the ``no-fsync`` target, same round) plus the disk's
    fdatasync of all of them (the fsync target's floor, same round), in series.  Per row and fsync target: the spread
    over the rounds of that floor and of the target's share of it (MB/s ÷ floor; for latency, floor ÷ p50)."""
    off = {(r["round"], r["workload"]): r for r in runs if r["target"] == "trireme-no-fsync"}
    out = []
    for workload, unit in (("idempotent", "mb_per_s"), ("java", "mb_per_s"), ("java_idempotent", "mb_per_s"),
                           ("latency", "p50_ms")):
        for target in dict.fromkeys(r["target"] for r in runs if r["target"] != "trireme-no-fsync"):
            floors, shares = [], []
            for r in runs:
                other = off.get((r["round"], workload))
                if r["workload"] != workload or r["target"] != target or not other or not other.get(unit) \
                        or not r.get(unit) or not (r.get("floor") or {}).get("fdatasync_p50_ms"):
                    continue
                sync_s = r["floor"]["fdatasync_p50_ms"] / 1000
                if unit == "mb_per_s":
                    size = r["floor"]["request_bytes"] * r["floor"]["in_flight"]   # what one fdatasync covers
                    floor = size / (size / (other[unit] * 1e6) + sync_s) / 1e6
                    share = r[unit] / floor
                else:
                    floor = other[unit] + sync_s * 1000
                    share = floor / r[unit]
                floors.append(floor)
                shares.append(share)
            if floors:
                out.append({"workload": workload, "target": target, "figure": unit, "floor": spread(floors),
                            "share": spread(shares)})
    return out


def overall_cpu(runs: list[dict]) -> dict:
    """Per target, broker CPU per MB over the THROUGHPUT rows of each round together (the issue's combined goal):
    the spread over the rounds that ran all of them."""
    out = {}
    for target in dict.fromkeys(r["target"] for r in runs):
        per_round = []
        for rnd in sorted({r["round"] for r in runs}):
            mine = [r for r in runs if r["target"] == target and r["round"] == rnd and r["workload"] in THROUGHPUT]
            if {r["workload"] for r in mine} == set(THROUGHPUT) and all(r["server_cpu_s"] is not None for r in mine):
                per_round.append(sum(r["server_cpu_s"] for r in mine) / sum(r["mb"] for r in mine) * 1000)
        if per_round:
            out[target] = spread(per_round)
    return out


def ratios(runs: list[dict], reference: str) -> list[dict]:
    """Each other target ÷ ``reference``, round by round (adjacent runs), per workload and figure: the spread."""
    by_key = {(r["round"], r["workload"], r["target"]): r for r in runs}
    out = []
    for s in summarize(runs):
        if s["target"] == reference:
            continue
        entry = {"workload": s["workload"], "target": s["target"], "reference": reference}
        for f in figures(s["workload"]):
            values = []
            for (rnd, workload, target), r in by_key.items():
                ref = by_key.get((rnd, workload, reference))
                if workload == s["workload"] and target == s["target"] and ref and r.get(f) and ref.get(f):
                    values.append(r[f] / ref[f])
            entry[f] = spread(values)
        out.append(entry)
    return out


def rounded(value):
    """``value`` with every float in it to 4 significant digits, for the JSON summary."""
    if isinstance(value, float):
        return float(f"{value:.4g}")
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [rounded(v) for v in value]
    return value


_LABELS = {"mb_per_s": ("MB/s", ",.0f"), "records_per_s": ("records/s", ",.0f"), "cpu_ms_per_mb": ("CPU ms/MB", ".2f"),
           "cpu_us_per_request": ("CPU us/request", ".0f"), "p50_ms": ("ack p50 ms", ".2f"),
           "p99_ms": ("p99 ms", ".2f"), "cpu_us_per_message": ("CPU us/message", ".0f"),
           "peak_rss_mib": ("broker peak RSS MiB", ",.0f"), "restart_s": ("restart to first ack s", ".2f"),
           "listening_s": ("to listening s", ".2f"), "loaded_s": ("logs loaded in s", ".2f")}


def _scaled(sp: dict | None, factor: float) -> dict | None:
    return None if sp is None else {k: v * factor if k != "n" else v for k, v in sp.items()}


def _broker_ms(text: dict) -> str:
    return (f"broker ms per Produce request: receive {text['receive']}, handle {text['handle']}, wait for the flush "
            f"{text['wait']}, respond {text['respond']}, mean fsync {text['fsync_mean']}")


def format_summary(entry: dict) -> str:
    parts = [f"{_LABELS[f][0]} {_fmt(entry[f], _LABELS[f][1])}" for f in figures(entry["workload"])]
    if entry["mean_request_bytes"]:
        parts.append(f"KiB per Produce request {_fmt(_scaled(entry['mean_request_bytes'], 1 / 1024), ',.1f')}, "
                     f"fsyncs per request "
                     f"{_fmt(entry['fsyncs_per_request'], '.2f')}")
    if entry.get("broker_ms"):
        parts.append(_broker_ms({k: _fmt(sp, ".3f") for k, sp in entry["broker_ms"].items()}))
    floor = entry.get("floor")
    if floor:
        size = floor["request_bytes"]
        what = f"{size / 1024:.0f} KiB" if size >= 1024 else f"{size} B"
        parts.append(f"fsync floor ({what} x {floor['in_flight']} in flight) "
                     + (f"fdatasync {_fmt(floor['p50_ms'], '.2f')} ms, its CPU "
                        f"{_fmt(_scaled(floor['cpu_ms_per_mb'], size * floor['in_flight'] / 1000), '.0f')} us"
                        if entry["workload"] == "latency" else
                        f"{_fmt(floor['mb_per_s'], ',.0f')} MB/s, its CPU {_fmt(floor['cpu_ms_per_mb'], '.2f')} ms/MB"))
    if entry["cpu_system_share"]:
        parts.append(f"broker CPU in the kernel {_fmt(entry['cpu_system_share'], '.0%')}")
    parts.append(f"load {_fmt(entry['loadavg_1m'], '.1f')}, others {_fmt(entry['others_cores'], '.2f')} cores")
    return f"{entry['workload']:<18} {entry['target']:<17} " + "; ".join(parts)


def format_ratio(entry: dict) -> str:
    parts = [f"{_LABELS[f][0]} {_fmt(entry[f], '.2f')}x" for f in figures(entry["workload"]) if entry[f]]
    return f"{entry['workload']:<18} {entry['target']} / {entry['reference']}: " + "; ".join(parts)


def format_run(r: dict) -> str:
    figs = "; ".join(f"{_LABELS[f][0]} {format(r[f], _LABELS[f][1])}" for f in figures(r["workload"])
                     if r.get(f) is not None)
    floor = r.get("floor")
    if floor:
        figs += (f"; fsync floor {floor['mb_per_s']:,.0f} MB/s, fdatasync p50 {floor['p50_ms']:.2f} ms, CPU "
                 f"{floor['cpu_ms_per_mb']:.2f} ms/MB ({floor['request_bytes']:,} B x {floor['in_flight']})")
    if r.get("peak_rss_of_the_run") is False:
        figs += " (VmHWM since the broker started: it could not be reset)"
    if r["workload"] == "restart":
        figs += (f"; {r['disk_gib']:.2f} GiB on disk; the first record after it took offset {r['offset']} "
                 f"({r['records']:,} acknowledged before the kill)")
    if r.get("broker_ms"):
        figs += "; " + _broker_ms({k: format(r["broker_ms"][k], ".3f") for k in BROKER_PHASES})
    if r.get("produce_requests"):
        figs += (f"; {r['produce_requests']:,} Produce requests of {r['mean_request_bytes'] / 1024:,.1f} KiB, "
                 f"{r['fsyncs']:,} fsyncs")
    failed = f"; FAILED {r['failed']}" if r.get("failed") else ""
    load = f"load {r['loadavg_1m']:.1f}"
    if r.get("others_cores") is not None:
        load += f", others {r['others_cores']:.2f} cores"
    return f"round {r['round']} {r['workload']:<18} {r['target']:<17} {figs}; {load}{failed}"


# --- main ---------------------------------------------------------------------------------------

def parse(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--records", type=int, default=200_000, help="1 KiB records per confluent-kafka produce phase")
    ap.add_argument("--java-bytes", type=parse_size, default=parse_size("256MiB"), help="bytes the Java producer sends")
    ap.add_argument("--latency-seconds", type=float, default=5, help="length of the one-message-at-a-time run")
    ap.add_argument("--restart-bytes", type=parse_size, default=parse_size("1GiB"),
                    help="data in the partition when a started broker is killed and restarted")
    ap.add_argument("--workloads", default=",".join(UNITS), help=f"comma list of {', '.join(UNITS)}")
    ap.add_argument("--trireme", default=None,
                    help="Trireme brokers to start: fsync and/or no-fsync (default fsync without --bootstrap, "
                         "none with it)")
    ap.add_argument("--server-set", action="append", default=[], metavar="NAME=VALUE",
                    help="extra --set for the started brokers")
    ap.add_argument("--bootstrap", default=None, help="a running broker (e.g. Apache Kafka) to run beside them")
    ap.add_argument("--server-pid", type=int, default=None, help="with --bootstrap: its pid, for its CPU")
    ap.add_argument("--metrics-url", default=None, help="with --bootstrap: a Trireme's metrics endpoint")
    ap.add_argument("--name", default="kafka", help="with --bootstrap: its name in the results (kafka)")
    ap.add_argument("--floor-dir", default=None,
                    help="with --bootstrap: measure fsync floors for it in this directory (on its disk)")
    args = ap.parse_args(argv)
    args.units = [u.strip() for u in args.workloads.split(",") if u.strip()]
    if not set(args.units) <= set(UNITS):
        ap.error(f"--workloads takes {', '.join(UNITS)}")
    trireme = args.trireme if args.trireme is not None else ("" if args.bootstrap else "fsync")
    args.trireme = [t.strip() for t in trireme.split(",") if t.strip()]
    if not set(args.trireme) <= {"fsync", "no-fsync"}:
        ap.error("--trireme takes fsync and/or no-fsync")
    if not args.trireme and not args.bootstrap:
        ap.error("nothing to run on: give --trireme or --bootstrap")
    return args


def main(argv=None) -> int:
    args = parse(argv)
    targets: list[Target] = []
    runs: list[dict] = []
    try:
        for mode in args.trireme:
            targets.append(Target.start_trireme(mode == "fsync", args.server_set))
        if args.bootstrap:
            targets.append(Target(args.name, args.bootstrap, args.server_pid, args.metrics_url, args.floor_dir))
        started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        print(f"side-by-side: {started}, load {os.getloadavg()}, targets "
              f"{', '.join(f'{t.name} ({t.bootstrap})' for t in targets)}; {args.rounds} rounds of "
              f"{', '.join(args.units)}", flush=True)
        for rnd in range(1, args.rounds + 1):
            order = targets if rnd % 2 else targets[::-1]
            for unit in args.units:
                for target in order:
                    os.sync()   # the run before's dirty pages (a no-fsync broker's) written back, not left to this one
                    for row in run_unit(unit, target, args):
                        row.update(round=rnd, target=target.name)
                        runs.append(row)
                        print(format_run(row), flush=True)
    finally:
        for target in targets:
            target.stop()
    summary = summarize(runs)
    print(f"\nmedian [range] over {args.rounds} rounds ({time.strftime('%H:%M:%S UTC', time.gmtime())}, "
          f"load {os.getloadavg()}):")
    for entry in summary:
        print(format_summary(entry))
    cpu = overall_cpu(runs)
    for name, sp in cpu.items():
        print(f"broker CPU per MB over {', '.join(THROUGHPUT)}: {name} {_fmt(sp, '.2f')} ms/MB")
    serial = serial_floors(runs)
    for entry in serial:
        print(f"{entry['workload']:<18} {entry['target']:<17} serial floor (no-fsync time + fdatasync): "
              f"{'MB/s' if entry['figure'] == 'mb_per_s' else 'ack p50 ms'} {_fmt(entry['floor'], '.2f')}; "
              f"reached {_fmt(entry['share'], '.2f')} of it")
    ratio = ratios(runs, args.name) if args.bootstrap and len(targets) > 1 else []
    if ratio:
        print(f"\nratio to {args.name}, round by round:")
        for entry in ratio:
            print(format_ratio(entry))
    print(json.dumps(rounded({"runs": runs, "summary": summary, "cpu_per_mb_overall": cpu, "serial_floors": serial,
                              "ratios": ratio}),
                     separators=(",", ":")), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
