"""The benchmarks' --server-cpus / --client-cpus: parsing a CPU list, and pinning every thread of the bench (and what
it starts afterwards) to it."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
sys.path.insert(0, BENCH)
from produce_consume import cpu_affinity_note, format_placement, parse_cpus  # noqa: E402


def test_cpu_lists_are_read_as_taskset_writes_them():
    assert parse_cpus("0") == {0}
    assert parse_cpus("1,3") == {1, 3}
    assert parse_cpus("0-2,5") == {0, 1, 2, 5}
    with pytest.raises(ValueError):
        parse_cpus("one")


def test_the_placement_is_printed_only_when_asked_for():
    asked = argparse.Namespace(server_cpus={0}, client_cpus={1, 2})
    assert cpu_affinity_note(asked) == "server on CPUs 0; client on CPUs 1,2"
    assert format_placement(cpu_affinity_note(asked)) == "; server on CPUs 0; client on CPUs 1,2"
    assert cpu_affinity_note(argparse.Namespace(server_cpus=None, client_cpus=None)) == ""
    assert format_placement("") == ""


# Runs in a child process (pinning the test's own process would outlast the test): a thread already running, then
# pin_this_process, then a thread and a process started afterwards; prints each one's CPUs.
_PIN = """
import json, os, subprocess, sys, threading
sys.path.insert(0, sys.argv[1])
from produce_consume import pin_this_process
cpu = int(sys.argv[2])
go, seen = threading.Event(), {}
def earlier():
    go.wait()
    seen["thread started before"] = sorted(os.sched_getaffinity(0))
t = threading.Thread(target=earlier); t.start()
pin_this_process({cpu})
go.set(); t.join()
later = threading.Thread(target=lambda: seen.__setitem__("thread started after", sorted(os.sched_getaffinity(0))))
later.start(); later.join()
seen["main thread"] = sorted(os.sched_getaffinity(0))
seen["child process"] = json.loads(subprocess.check_output(
    [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"]))
print(json.dumps(seen))
"""


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs Linux CPU affinity (os.sched_setaffinity)")
def test_every_thread_and_what_starts_later_run_on_the_given_cpus():
    cpu = max(os.sched_getaffinity(0))
    out = subprocess.run([sys.executable, "-c", _PIN, BENCH, str(cpu)], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == {"thread started before": [cpu], "thread started after": [cpu],
                                      "main thread": [cpu], "child process": [cpu]}
