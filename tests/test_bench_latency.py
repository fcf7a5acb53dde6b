"""The benchmarks' broker-measured figures: percentile bounds from the difference of two scrapes of a histogram,
and the machine's reference speed."""
from __future__ import annotations

import math
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
from produce_consume import (_buckets, broker_latency, format_broker_latency, format_fsync_latency,  # noqa: E402
                             fsync_latency)
from speed_sampler import SpeedSampler, format_reference  # noqa: E402

BOUNDS = (0.001, 0.0025, 0.005, 0.01, 0.025, math.inf)


def scrape(*cumulative: int) -> dict:
    return {"produce_latency": list(zip(BOUNDS, cumulative)), "fsync_duration": [], "fsync_worker": []}


def test_only_requests_between_the_scrapes_count():
    # before: 1,000 slow requests (all over 10 ms) from an earlier run must not move this run's figures
    before = scrape(0, 0, 0, 0, 1000, 1000)
    after = scrape(100, 900, 985, 995, 1995, 2000)          # this run: 1,000 requests, 98.5 % within 5 ms
    b = broker_latency(before, after)
    assert b["count"] == 1000
    assert b["within_5ms"] == 0.985
    assert b["p50_le_ms"] == 2.5
    assert b["p99_le_ms"] == 10.0
    assert b["max_le_ms"] == math.inf
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


def test_flush_rounds_and_the_fsync_threads_share_come_from_their_own_histograms():
    before = {"produce_latency": [], "fsync_duration": list(zip(BOUNDS, (50, 50, 50, 50, 60, 60))),
              "fsync_worker": list(zip(BOUNDS, (60, 60, 60, 60, 60, 60)))}
    after = {"produce_latency": [], "fsync_duration": list(zip(BOUNDS, (1040, 1048, 1049, 1050, 1060, 1060))),
             "fsync_worker": list(zip(BOUNDS, (1060, 1060, 1060, 1060, 1060, 1060)))}
    f = fsync_latency(before, after)        # this run: 1,000 rounds, one of 5-10 ms; the fsync thread all within 1 ms
    assert (f["count"], f["p50_le_ms"], f["p99_le_ms"], f["max_le_ms"]) == (1000, 1.0, 1.0, 10.0)
    assert (f["worker"]["count"], f["worker"]["max_le_ms"]) == (1000, 1.0)
    assert format_fsync_latency(f) == \
        "; flush rounds p99 <= 1 ms, max <= 10 ms (in the fsync thread p99 <= 1 ms, max <= 1 ms)"
    assert fsync_latency(before, before) is None
    assert broker_latency(before, after) is None    # no Produce histogram in these scrapes
    older_broker = {k: v for k, v in after.items() if k != "fsync_worker"} | {"fsync_worker": []}
    assert format_fsync_latency(fsync_latency(before, older_broker)) == "; flush rounds p99 <= 1 ms, max <= 10 ms"


def test_the_speed_sampler_reports_the_reference_loop_over_a_phase():
    sampler = SpeedSampler()
    sampler.start()
    time.sleep(0.5)
    speed = sampler.stop()
    assert speed["samples"] >= 3
    assert 0 < speed["p50"] <= speed["p90"]
    assert format_reference({"samples": 9, "p50": 262.5, "p90": 471.0}) == "; reference loop p50 262.5 us, p90 471 us"
    assert format_reference(None) == ""


def test_buckets_are_read_from_the_prometheus_text_by_name_and_labels():
    text = "\n".join([
        '# TYPE trireme_fsync_duration_seconds histogram',
        'trireme_fsync_duration_seconds_bucket{le="0.001"} 7',
        'trireme_fsync_duration_seconds_bucket{le="+Inf"} 9',
        'trireme_fsync_duration_seconds_count 9',
        'trireme_request_duration_seconds_bucket{api="Fetch",le="0.001"} 1',
        'trireme_request_duration_seconds_bucket{api="Produce",le="0.001"} 3',
        'trireme_request_duration_seconds_bucket{api="Produce",le="+Inf"} 4',
    ])
    assert _buckets(text, "trireme_fsync_duration_seconds") == [(0.001, 7), (math.inf, 9)]
    assert _buckets(text, "trireme_request_duration_seconds", 'api="Produce",') == [(0.001, 3), (math.inf, 4)]
    assert _buckets(text, "trireme_fsync_worker_seconds") == []
