"""How fast this machine's cores run Python during a benchmark phase: a fixed loop timed 20 times a second.

This VM's cores run the loop in ~250 µs or, for stretches from milliseconds to minutes (most often just
after a core has slept), in ~470 µs.  Per-request CPU figures of runs whose medians differ are not
comparable: interleave A/B runs.  ``docs/performance.md`` (issue 11's fifth round) has the measurements.

    python bench/speed_sampler.py      # prints "ready", samples until stdin closes, then prints the µs of each
"""
from __future__ import annotations

import os
import select
import statistics
import struct
import subprocess
import sys
import time

INTERVAL = 0.05          # seconds between samples
_HEADER = struct.Struct(">ihhi")
_BUF = bytes(range(48))


def reference_rounds_us(rounds: int = 1000) -> float:
    """µs this process takes for ``rounds`` of a fixed pure-Python loop (struct, slices, a dict)."""
    t = time.perf_counter()
    table: dict = {}
    for i in range(rounds):
        size, key, version, correlation = _HEADER.unpack_from(_BUF, i & 31)
        table[i & 63] = (size + key + version + correlation, _BUF[i & 15:(i & 15) + 8])
    return (time.perf_counter() - t) * 1e6


def sample_until_stdin_closes() -> None:
    """The sampler process: "ready", then one sample every INTERVAL (the second of two loops in a row: the
    first after a sleep runs on cold caches); once stdin closes, the µs of each, one per line."""
    print("ready", flush=True)
    samples = []
    while not select.select([sys.stdin], [], [], INTERVAL)[0]:
        reference_rounds_us()
        samples.append(reference_rounds_us())
    try:
        print("\n".join(f"{x:.1f}" for x in samples), flush=True)
    except BrokenPipeError:         # the bench exited without collecting: nothing to report to
        pass


class SpeedSampler:
    """The sampler process for one phase (about 2 % of a core): `start` before it, `stop` after it."""

    def start(self) -> None:
        """Start the sampler and wait until it samples, so its start-up is not in the phase."""
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        if self.proc.stdout.readline() != "ready\n":
            print("speed sampler did not start: no reference loop figures", file=sys.stderr, flush=True)

    def stop(self) -> dict | None:
        """Median and p90 of the samples (µs per 1,000 rounds), or None if there were none."""
        try:
            out, _ = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            return None
        samples = [float(x) for x in out.split()]
        if not samples:
            return None
        p90 = statistics.quantiles(samples, n=10)[-1] if len(samples) > 1 else samples[0]
        return {"samples": len(samples), "p50": round(statistics.median(samples), 1), "p90": round(p90, 1)}


def format_reference(speed: dict | None) -> str:
    """The printed form of `SpeedSampler.stop`'s figures ("" without any)."""
    if not speed:
        return ""
    return f"; reference loop p50 {speed['p50']:g} us, p90 {speed['p90']:g} us"


if __name__ == "__main__":
    sample_until_stdin_closes()
