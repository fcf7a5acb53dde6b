"""Log cleaner benchmark: cleaner throughput (MB/s) on a large dirty compacted partition, and produce / fetch
latency of a light probe load while the broker is idle vs while it cleans that partition.

    .venv/bin/python bench/compaction.py [--bytes 1GiB] [--record-size 1024] [--keys 20000]
        [--segment-bytes 64MiB] [--probe-rate 200] [--idle-seconds 15] [--rounds 1] [--server-set NAME=VALUE ...]

It starts ``python -m trireme serve`` on a fresh temporary data dir (deleted afterwards) with the cleaner's
settings at their defaults (``--server-set`` to change them), then:

1. **Load**: produces --bytes of --record-size values to a one-partition ``cleanup.policy=compact`` topic
   with keys drawn at random from --keys (so nearly all of it is superseded), in --segment-bytes
   segments, with ``min.compaction.lag.ms`` at a day so that the cleaner leaves it alone meanwhile.
2. **Idle**: for --idle-seconds a probe producer (acks=all, linger.ms=0) sends --probe-rate records/s of
   100 bytes to a second topic, and a consumer tails it.  Produce latency is librdkafka's
   ``Message.latency()`` (produce() to acknowledgement); fetch latency is from produce() to the consumer
   receiving the record (the record's CreateTime to poll() returning it): what a tailing consumer waits.
3. **Cleaning**: ``min.compaction.lag.ms`` is set to 0 (IncrementalAlterConfigs) and the same probe runs
   until the partition's segment files have shrunk and then stayed the same size for 5 s.  The window
   includes the wait for the cleaner to pick the partition up (up to ``log.cleaner.backoff.ms``, 15 s by
   default) and the quiet 5 s after, so the latencies are also given for the probe records produced
   while a cleaning ran (its interval from the broker's ``cleaned`` log line: end time and duration).  Cleaner
   throughput = the bytes of the rolled segments before / the time from the config change to the
   last change of the files' total size (so it includes the cleaner's scheduling delay, at most its
   backoff), in MB/s (10^6 bytes).  Beside it, the broker's own figures: its ``cleaned TOPIC-P: read=N
   written=N in Ss`` log lines summed (bytes read / seconds in cleanings: the cleaner's own speed),
   and its ``*clean*`` metrics lines.

4. **Idle again**: the probe runs --idle-seconds more once the files settled; "idle" is both idle windows
   together, so that it brackets the cleaning in time (the load of a shared machine drifts).  The probe
   records produced inside the cleaning are also shown by tenths of it (p99 / max), where a slowdown sits.

With ``--rounds N`` the whole run repeats on a fresh broker N times, and the last lines give the ratio of produce
and fetch p99 during a cleaning to idle: median and range over the rounds.

Prints figures for each phase and a JSON summary as the last line.  Nothing is asserted.  Needs the
log cleaner (issue 22).  See bench/README.md.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)
from produce_consume import (Server, ServerStats, create_topic, make_payloads, parse_size, percentile,
                             produce_waiting)

DAY_MS = 86_400_000


def set_topic_config(bootstrap: str, topic: str, name: str, value: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    res = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)])
    for f in admin.incremental_alter_configs([res]).values():
        f.result(30)


def load(bootstrap: str, topic: str, total: int, record_size: int, keys: int) -> dict:
    payloads = make_payloads(record_size)
    rnd = random.Random(22)
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "batch.size": 1 << 20,
                  "queue.buffering.max.kbytes": 1 << 20})
    failed = [0]

    def report(err, msg) -> None:
        if err is not None:
            failed[0] += 1

    n = total // record_size
    start = time.monotonic()
    for i in range(n):
        key = b"key-%d" % rnd.randrange(keys)
        produce_waiting(p, topic, payloads[i % len(payloads)], key, partition=0, on_delivery=report)
        if i % 1000 == 0:
            p.poll(0)
    p.flush(600)
    seconds = time.monotonic() - start
    return {"records": n, "seconds": seconds, "mb_per_s": n * record_size / seconds / 1e6, "failed": failed[0]}


class Probe:
    """--probe-rate small records/s to ``topic`` with acks=all, and a consumer tailing it."""

    def __init__(self, bootstrap: str, topic: str, rate: float):
        self.bootstrap, self.topic, self.rate = bootstrap, topic, rate
        self.produce_ms: list[tuple[int, float]] = []      # (produce() wall time in ms, latency in ms)
        self.fetch_ms: list[tuple[int, float]] = []
        self.errors = 0
        self._stop = threading.Event()
        self.history: list[tuple[list, list]] = []            # each run's (produce_ms, fetch_ms)

    def _consume(self) -> None:
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "compaction-bench-probe",
                      "enable.auto.commit": False, "fetch.wait.max.ms": 100, "fetch.queue.backoff.ms": 10})
        c.assign([TopicPartition(self.topic, 0, -1)])         # from the end
        try:
            while not self._stop.is_set():
                msg = c.poll(0.1)
                if msg is not None and msg.error() is None:
                    sent = msg.timestamp()[1]
                    self.fetch_ms.append((sent, time.time() * 1000 - sent))
        finally:
            c.close()

    def run(self, until) -> dict:
        self.produce_ms.clear()
        self.fetch_ms.clear()
        self._stop.clear()
        consumer = threading.Thread(target=self._consume, daemon=True)
        consumer.start()
        time.sleep(1.0)                                        # the consumer is assigned and fetching
        p = Producer({"bootstrap.servers": self.bootstrap, "acks": "all", "linger.ms": 0})

        def report(err, msg) -> None:
            if err is not None:
                self.errors += 1
            else:
                self.produce_ms.append((msg.timestamp()[1], msg.latency() * 1000))

        start = time.monotonic()
        i = 0
        while not until(time.monotonic() - start):
            due = start + i / self.rate
            now = time.monotonic()
            if now < due:
                p.poll(due - now)
                continue
            p.produce(self.topic, b"p" * 100, partition=0, timestamp=int(time.time() * 1000), on_delivery=report)
            p.poll(0)
            i += 1
        p.flush(30)
        time.sleep(0.5)
        self._stop.set()
        consumer.join(10)
        self.history.append((list(self.produce_ms), list(self.fetch_ms)))
        return {"seconds": time.monotonic() - start, "records": i, "errors": self.errors,
                "produce": summary(self.produce_ms), "fetch": summary(self.fetch_ms)}

    def merged(self, *runs: int) -> dict:
        """The latencies of several runs (their indexes, in order of running) together."""
        produce = [x for r in runs for x in self.history[r][0]]
        fetch = [x for r in runs for x in self.history[r][1]]
        return {"records": len(produce), "produce": summary(produce), "fetch": summary(fetch)}

    def within(self, intervals: list[tuple[float, float]]) -> dict:
        """The last run's latencies of the records produced inside any of ``intervals`` (wall ms)."""
        def inside(samples):
            return [(t, v) for t, v in samples if any(a <= t <= b for a, b in intervals)]
        out = {"produce": summary(inside(self.produce_ms)), "fetch": summary(inside(self.fetch_ms))}
        worst = max(inside(self.produce_ms), key=lambda s: s[1], default=None)
        if worst is not None:       # where in its cleaning the slowest probe record was produced
            a, b = next((a, b) for a, b in intervals if a <= worst[0] <= b)
            out["slowest_produce_at"] = {"ms_after_start": worst[0] - a, "ms_before_end": b - worst[0]}
        # The shape of the slowdown: produce p99 / max in each tenth of the (first) cleaning.
        if intervals:
            a, b = intervals[0]
            tenths = [[] for _ in range(10)]
            for t, v in self.produce_ms:
                if a <= t <= b:
                    tenths[min(9, int((t - a) * 10 / max(b - a, 1)))].append((t, v))
            out["produce_by_tenth"] = [summary(x) for x in tenths]
        return out


def summary(samples: list[tuple[int, float]]) -> dict:
    v = sorted(x for _, x in samples)
    return {"count": len(v), "p50_ms": percentile(v, 0.50), "p99_ms": percentile(v, 0.99),
            "max_ms": v[-1] if v else None}


def segments_bytes(directory: Path) -> int:
    total = 0
    for f in directory.glob("*.log"):
        try:
            total += f.stat().st_size
        except OSError:             # swapped by the cleaner meanwhile
            pass
    return total


def cleaner_metrics(url: str | None) -> list[str]:
    if not url:
        return []
    try:
        text = urllib.request.urlopen(url, timeout=10).read().decode()
    except OSError:
        return []
    return [line for line in text.splitlines() if "clean" in line.lower() and not line.startswith("#")]


def cleaned_lines(log_path: str, name: str) -> dict:
    """The broker's ``cleaned NAME: read=N written=N in S s`` log lines, summed."""
    out = {"cleanings": 0, "read": 0, "written": 0, "seconds": 0.0, "intervals": []}
    with open(log_path, errors="replace") as f:
        for line in f:
            m = re.search(rf"cleaned {re.escape(name)}: read=(\d+) written=(\d+) in ([\d.]+)s", line)
            if m:
                out["cleanings"] += 1
                out["read"] += int(m.group(1))
                out["written"] += int(m.group(2))
                out["seconds"] += float(m.group(3))
                # the line is logged as the cleaning ends: it ran the "in S s" before (wall ms; local time)
                end = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp() * 1000
                out["intervals"].append((end - float(m.group(3)) * 1000, end))
    out["mb_per_s"] = out["read"] / out["seconds"] / 1e6 if out["seconds"] else None
    return out


def released_lines(log_path: str) -> list[tuple[float, float]]:
    """The intervals (wall ms) of the broker's ``released segments: ... bytes=N in S s`` lines of 1 MiB or more: the
    old segments' blocks being freed after a swap, off the event loop."""
    out = []
    with open(log_path, errors="replace") as f:
        for line in f:
            m = re.search(r"released segments: files=\d+ bytes=(\d+) in ([\d.]+)s", line)
            if m and int(m.group(1)) >= 1 << 20:
                end = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp() * 1000
                out.append((end - float(m.group(2)) * 1000, end))
    return out


def fmt(d: dict) -> str:
    def f(x):
        return "-" if x is None else f"{x:.1f}"
    return f"p50 {f(d['p50_ms'])} ms  p99 {f(d['p99_ms'])} ms  max {f(d['max_ms'])} ms  ({d['count']} records)"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bytes", type=parse_size, default=parse_size("1GiB"), help="dirty bytes (record values)")
    ap.add_argument("--record-size", type=parse_size, default=1024)
    ap.add_argument("--keys", type=int, default=20000, help="distinct keys (the clean size is about keys x size)")
    ap.add_argument("--segment-bytes", type=parse_size, default=parse_size("64MiB"))
    ap.add_argument("--probe-rate", type=float, default=200, help="probe records/s")
    ap.add_argument("--idle-seconds", type=float, default=15)
    ap.add_argument("--max-clean-seconds", type=float, default=3600, help="give up waiting for the cleaner")
    ap.add_argument("--server-set", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--rounds", type=int, default=1,
                    help="repeat the whole run (a fresh broker each time) and print the median of the ratios")
    args = ap.parse_args(argv)
    rounds = []
    for r in range(args.rounds):
        if args.rounds > 1:
            print(f"--- round {r + 1} of {args.rounds} (load average {os.getloadavg()[0]:.1f})")
        rounds.append(one_round(args))
    ratios = []
    for out in rounds:
        during, idle = out["during_cleanings"], out["idle"]
        if during and during["produce"]["count"] and idle["produce"]["p99_ms"]:
            ratios.append((during["produce"]["p99_ms"] / idle["produce"]["p99_ms"],
                           during["fetch"]["p99_ms"] / idle["fetch"]["p99_ms"]))
    if len(rounds) > 1 and ratios:
        produce, fetch = sorted(r[0] for r in ratios), sorted(r[1] for r in ratios)
        print(f"p99 during a cleaning / idle over {len(ratios)} rounds: produce median {statistics.median(produce):.2f} "
              f"(range {produce[0]:.2f}-{produce[-1]:.2f}), fetch median {statistics.median(fetch):.2f} "
              f"(range {fetch[0]:.2f}-{fetch[-1]:.2f})")
        print(json.dumps({"rounds": len(ratios), "produce_p99_ratio": produce, "fetch_p99_ratio": fetch}))
    return 0


def one_round(args) -> dict:
    """Load, idle, clean, idle again on a fresh broker → the round's figures (also printed)."""
    temp = tempfile.mkdtemp(prefix="trireme-compaction-bench-")
    server = Server(os.path.join(temp, "data"), True, None, args.server_set + ["trireme.metrics.listen=127.0.0.1:0"])
    try:
        stats = ServerStats(server.proc.pid)
        metrics_url = server.metrics_url()
        bootstrap = server.bootstrap
        create_topic(bootstrap, "dirty", 1, configs={"cleanup.policy": "compact",
                                                     "segment.bytes": str(args.segment_bytes),
                                                     "min.compaction.lag.ms": str(DAY_MS)})
        create_topic(bootstrap, "probe", 1)
        loaded = load(bootstrap, "dirty", args.bytes, args.record_size, args.keys)
        print(f"load: {loaded['records']} records, {args.bytes / 2**20:.0f} MiB in {loaded['seconds']:.1f} s "
              f"({loaded['mb_per_s']:.1f} MB/s), {loaded['failed']} failed")
        partition = Path(server.data_dir) / "logs" / "dirty-0"
        before = segments_bytes(partition)
        active = max(partition.glob("*.log"), key=lambda f: int(f.stem)).stat().st_size
        dirty = before - active
        print(f"partition: {before / 2**20:.1f} MiB in {len(list(partition.glob('*.log')))} segments, "
              f"{dirty / 2**20:.1f} MiB rolled (cleanable)")

        probe = Probe(bootstrap, "probe", args.probe_rate)
        cpu0 = stats.cpu_seconds()
        idle = probe.run(lambda t: t >= args.idle_seconds)
        print(f"idle      produce {fmt(idle['produce'])}\n          fetch   {fmt(idle['fetch'])}")

        state = {"last_size": before, "last_change": None, "shrunk": False}
        set_topic_config(bootstrap, "dirty", "min.compaction.lag.ms", "0")
        started = time.monotonic()
        cpu1 = stats.cpu_seconds()

        def cleaned(t: float) -> bool:
            size = segments_bytes(partition)
            now = time.monotonic()
            if size != state["last_size"]:
                state["last_size"], state["last_change"] = size, now
                state["shrunk"] = state["shrunk"] or size < before * 0.9
            # ... and the old segments' blocks freed (the broker's "released segments" line, after the swap)
            return (state["shrunk"] and now - state["last_change"] >= 5 and released_lines(server.log_path)) \
                or t > args.max_clean_seconds

        cleaning = probe.run(cleaned)
        cpu2 = stats.cpu_seconds()
        clean_s = (state["last_change"] or time.monotonic()) - started
        mbps = dirty / clean_s / 1e6 if state["shrunk"] else None
        print(f"cleaning  produce {fmt(cleaning['produce'])}\n          fetch   {fmt(cleaning['fetch'])}")
        print(f"cleaner: {dirty / 2**20:.1f} MiB dirty -> {state['last_size'] / 2**20:.1f} MiB in {clean_s:.1f} s: "
              + (f"{mbps:.1f} MB/s" if mbps else "did not finish"))
        if cpu0 is not None and cpu2 is not None:
            print(f"server CPU: idle phase {cpu1 - cpu0:.1f} s, cleaning phase {cpu2 - cpu1:.1f} s")
        own = cleaned_lines(server.log_path, "dirty-0")
        freed = released_lines(server.log_path)
        own["released"] = freed
        if own["cleanings"]:
            own["intervals"] = own["intervals"] + freed
            print(f"broker log: {own['cleanings']} cleanings of dirty-0 read {own['read'] / 2**20:.1f} MiB, wrote "
                  f"{own['written'] / 2**20:.1f} MiB in {own['seconds']:.1f} s ({own['mb_per_s']:.1f} MB/s)")
            during = probe.within(own["intervals"])
            if freed:
                print(f"old segments freed afterwards in {', '.join(f'{(b - a) / 1000:.1f}' for a, b in freed)} s")
            print(f"while the cleaner ran or freed the old segments (probe records produced in those intervals):\n"
                  f"          produce {fmt(during['produce'])}\n          fetch   {fmt(during['fetch'])}")
            if "slowest_produce_at" in during:
                at = during["slowest_produce_at"]
                print(f"          the slowest was produced {at['ms_after_start']:.0f} ms into its cleaning, "
                      f"{at['ms_before_end']:.0f} ms before its end")
            if "produce_by_tenth" in during:
                print("          produce p99 / max (ms) in each tenth of the first cleaning: " + ", ".join(
                    f"{t['p99_ms']:.1f}/{t['max_ms']:.1f}" if t["count"] else "-" for t in during["produce_by_tenth"]))
        else:
            during = None
        # A second idle window after the cleaning, so that "idle" brackets it in time: on a shared machine the
        # load drifts, and a window on one side only would charge the drift to (or against) the cleaner.
        probe.run(lambda t: t >= args.idle_seconds)
        idle = probe.merged(0, 2)
        for line in cleaner_metrics(metrics_url):
            print(f"  metric {line}")
        out = {"bytes": args.bytes, "record_size": args.record_size, "keys": args.keys, "load": loaded,
               "dirty_bytes": dirty, "clean_bytes": state["last_size"], "clean_seconds": clean_s,
               "cleaner_mb_per_s": mbps, "broker_log": own, "during_cleanings": during, "idle": idle, "cleaning": cleaning,
               "server_cpu": {"idle": None if cpu0 is None else cpu1 - cpu0,
                              "cleaning": None if cpu2 is None else cpu2 - cpu1}}
        print(json.dumps(out))
        print(f"idle (before and after the cleaning) produce {fmt(idle['produce'])}")
        return out
    finally:
        server.stop()
        shutil.rmtree(temp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
