#!/usr/bin/env python3
"""Start-up time of trireme.testing.TriremeBroker: from start() to a bootstrap address that serves, median of N.

Each start also answers one kafka-python Metadata round trip (so "started" means "a client can use it"); that
round trip is timed separately and not included.  Modes: thread/memory (the fixture's default), thread/disk,
subprocess (``python -m trireme serve`` on a temporary directory).  The first in-process start of a Python
process also pays for importing the broker; it is reported on its own, measured in a fresh interpreter.

Usage: .venv/bin/python bench/broker_startup.py [--runs 20] [--topics 1]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

FIRST_START = """
import time
t = time.perf_counter()
from trireme.testing import TriremeBroker
b = TriremeBroker(topics={"t0": 1}).start()
print(time.perf_counter() - t)
b.close()
"""


def ping(bootstrap: str) -> None:
    from kafka import KafkaAdminClient
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)
    try:
        assert admin.list_topics()
    finally:
        admin.close()


def measure(mode: str, storage: str, runs: int, topics: int) -> tuple[list[float], list[float]]:
    from trireme.testing import TriremeBroker
    starts, stops = [], []
    for _ in range(runs):
        broker = TriremeBroker(topics={f"t{i}": 3 for i in range(topics)}, mode=mode, storage=storage)
        t = time.perf_counter()
        broker.start()
        starts.append(time.perf_counter() - t)
        ping(broker.bootstrap)
        t = time.perf_counter()
        broker.close()
        stops.append(time.perf_counter() - t)
    return starts, stops


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--topics", type=int, default=1, help="topics of 3 partitions created up front")
    args = parser.parse_args(argv)
    first = [float(subprocess.run([sys.executable, "-c", FIRST_START], capture_output=True, text=True,
                                  check=True).stdout) for _ in range(5)]
    print(f"first in-process start in a fresh interpreter (imports included), median of 5: "
          f"{statistics.median(first) * 1000:.0f} ms")
    for mode, storage in (("thread", "memory"), ("thread", "disk"), ("subprocess", "disk")):
        starts, stops = measure(mode, storage, args.runs, args.topics)
        print(f"{mode}/{storage}: start median {statistics.median(starts) * 1000:.1f} ms "
              f"(min {min(starts) * 1000:.1f}, max {max(starts) * 1000:.1f}), "
              f"close median {statistics.median(stops) * 1000:.1f} ms, {args.runs} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
