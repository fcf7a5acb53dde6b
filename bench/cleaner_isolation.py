#!/usr/bin/env python3
"""Produce latency while the log cleaner cleans a large dirty partition, with the cleaning in a worker thread against
in a child process (what the broker does): why server/log_cleaner.py cleans in a child process.

Fills a compacted topic (segments of 8 MiB, MB-sized, keys from a set of 50,000) once, then per mode copies that data
directory, starts ``trireme serve`` on it (the cleaner begins at once), and sends acks=all produce requests of 100
bytes one at a time to another topic for --seconds, each timed.  Reports p50/p99/max during the cleaning (its start
and end read from the broker's log line) and outside it; ``idle`` runs with log.cleaner.enable=false.

Usage: .venv/bin/python bench/cleaner_isolation.py [--mb 300] [--seconds 15] [--modes idle,thread,process]
"""
from __future__ import annotations

import argparse
import datetime
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from confluent_kafka import Producer
from produce_consume import create_topic, produce_waiting

# trireme serve with the cleaner's isolation from $TRIREME_BENCH_ISOLATION (the broker itself picks "process").
LAUNCH = """
import os, sys
import trireme.server.broker as broker_mod
from trireme.server.log_cleaner import LogCleaner
broker_mod.LogCleaner = lambda b: LogCleaner(b, isolation=os.environ["TRIREME_BENCH_ISOLATION"])
from trireme.server.cli import main
if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(work: str, data: str, port: int, isolation: str, enable: bool):
    launcher = os.path.join(work, "launch.py")
    with open(launcher, "w") as f:
        f.write(LAUNCH)
    log_path = os.path.join(work, f"broker-{isolation}-{enable}.log")
    proc = subprocess.Popen([sys.executable, launcher, "serve", "--data-dir", data, "--listen", f"127.0.0.1:{port}",
                             "--set", f"log.cleaner.enable={str(enable).lower()}"],
                            env={**os.environ, "TRIREME_BENCH_ISOLATION": isolation},
                            stdout=open(log_path, "w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return proc, log_path
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("the broker did not start")


def fill(bootstrap: str, mb: int) -> None:
    create_topic(bootstrap, "big", 1, configs={"cleanup.policy": "compact", "segment.bytes": str(8 << 20)})
    create_topic(bootstrap, "lat", 1)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "acks": 1, "batch.size": 1 << 20,
                         "queue.buffering.max.kbytes": 1 << 20})
    value = os.urandom(200)
    for i in range(mb * 1024 * 1024 // 220):
        produce_waiting(producer, "big", key=b"k%d" % (i % 50000), value=value)
        if i % 10000 == 0:
            producer.poll(0)
    producer.flush(300)


def latencies(bootstrap: str, seconds: float) -> list[tuple[float, float]]:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": "all"})
    producer.produce("lat", value=b"warm")
    producer.flush(10)
    out = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        wall, started = time.time(), time.perf_counter()
        producer.produce("lat", value=b"x" * 100)
        producer.flush(10)
        out.append((wall, time.perf_counter() - started))
        time.sleep(0.002)
    return out


def summary(samples) -> str:
    values = sorted(latency for _, latency in samples)
    if not values:
        return "no samples"
    return (f"n={len(values)} p50={values[len(values) // 2] * 1000:.2f} ms "
            f"p99={values[int(len(values) * 0.99)] * 1000:.2f} ms max={values[-1] * 1000:.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=300)
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--modes", default="idle,thread,process")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="trireme-cleaner-bench-")
    master, data = os.path.join(work, "master"), os.path.join(work, "data")
    try:
        port = free_port()
        proc, _ = start(work, master, port, "process", enable=False)
        try:
            fill(f"127.0.0.1:{port}", args.mb)
        finally:
            proc.terminate()
            proc.wait(60)
        for mode in args.modes.split(","):
            shutil.rmtree(data, ignore_errors=True)
            shutil.copytree(master, data)
            isolation, enable = ("process", False) if mode == "idle" else (mode, True)
            port = free_port()
            proc, log_path = start(work, data, port, isolation, enable)
            try:
                time.sleep(1)
                samples = latencies(f"127.0.0.1:{port}", args.seconds)
            finally:
                proc.terminate()
                proc.wait(60)
            m = re.search(r"^(\S+ \S+),(\d+) INFO trireme.log_cleaner cleaned big-0: (.*) in ([0-9.]+)s",
                          open(log_path).read(), re.M)
            if m is None:
                print(f"{mode}: {summary(samples)}" + ("" if mode == "idle" else " (no cleaning finished)"))
                continue
            end = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").timestamp() + int(m.group(2)) / 1000
            begin = end - float(m.group(4))
            during = [s for s in samples if begin <= s[0] <= end]
            outside = [s for s in samples if not begin <= s[0] <= end]
            print(f"{mode}: cleaning {m.group(3)} in {m.group(4)} s; during it {summary(during)}; "
                  f"outside {summary(outside)}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
