"""The benchmarks' broker-measured latency: percentile bounds from the difference of two scrapes of a histogram."""
from __future__ import annotations

import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
from produce_consume import broker_latency, format_broker_latency  # noqa: E402

BOUNDS = (0.001, 0.0025, 0.005, 0.01, 0.025, math.inf)


def scrape(*cumulative: int) -> dict:
    return {"produce_latency": list(zip(BOUNDS, cumulative))}


def test_only_requests_between_the_scrapes_count():
    # before: 1,000 slow requests (all over 10 ms) from an earlier run must not move this run's figures
    before = scrape(0, 0, 0, 0, 1000, 1000)
    after = scrape(100, 900, 985, 995, 1995, 2000)          # this run: 1,000 requests, 98.5 % within 5 ms
    b = broker_latency(before, after)
    assert b["requests"] == 1000
    assert b["within_5ms"] == 0.985
    assert b["p50_le_ms"] == 2.5
    assert b["p99_le_ms"] == 10.0
    assert format_broker_latency(b) == "; broker-measured latency p50 <= 2.5 ms, p99 <= 10 ms, 98.50 % within 5ms"


def test_a_tail_beyond_the_last_finite_bucket_reads_as_unbounded():
    b = broker_latency(scrape(0, 0, 0, 0, 0, 0), scrape(0, 0, 0, 0, 50, 100))
    assert b["p50_le_ms"] == 25.0
    assert b["p99_le_ms"] == math.inf
    assert b["within_5ms"] == 0.0


def test_nothing_to_report_without_metrics_or_requests():
    assert broker_latency(None, scrape(1, 1, 1, 1, 1, 1)) is None
    assert broker_latency(scrape(1, 1, 1, 1, 1, 1), scrape(1, 1, 1, 1, 1, 1)) is None
    assert format_broker_latency(None) == ""
