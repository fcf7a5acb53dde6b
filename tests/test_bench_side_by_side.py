"""bench/kafka_side_by_side.py's pure parts: the spread over rounds, ratios from the same round's runs, the combined CPU
per MB, its options, and the fsync floor it takes from bench/fsync_floor.py (its figures only: no timing asserted)."""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
from kafka_side_by_side import (BROKER_PHASES, THROUGHPUT, Target, disk_floor, format_ratio,  # noqa: E402
                                format_summary, overall_cpu, parse, ratios, reset_peak_rss, run_unit,
                                serial_floors, spread, summarize)


def run(rnd: int, target: str, workload: str, mb_per_s: float, cpu_s: float | None = 1.0, mb: float = 100.0,
        **extra) -> dict:
    return {"round": rnd, "target": target, "workload": workload, "mb_per_s": mb_per_s, "mb": mb,
            "server_cpu_s": cpu_s, "cpu_ms_per_mb": None if cpu_s is None else cpu_s / mb * 1000,
            "loadavg_1m": 2.0 + rnd, "others_cores": 0.1 * rnd, "cpu_system_share": 0.25, **extra}


def test_spread_is_median_and_range_of_the_values_present():
    assert spread([3.0, None, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}
    assert spread([1.0, 4.0])["median"] == 2.5
    assert spread([None]) is None
    assert spread([]) is None


def test_summary_follows_the_issues_rows_and_keeps_the_floor_of_the_rounds():
    floor = {"request_bytes": 1_000_000, "in_flight": 1, "mb_per_s": 300.0, "p50_ms": 3.0, "p99_ms": 9.0,
             "cpu_ms_per_mb": 0.5, "requests": 50}
    runs = [run(1, "trireme", "idempotent", 150.0, floor=floor), run(1, "trireme", "produce", 400.0),
            run(2, "trireme", "produce", 600.0), run(2, "trireme", "idempotent", 170.0,
                                                     floor=dict(floor, mb_per_s=500.0)),
            run(3, "trireme", "produce", 500.0, cpu_s=None)]
    summary = summarize(runs)
    assert [(s["workload"], s["target"], s["rounds"]) for s in summary] == [("produce", "trireme", 3),
                                                                          ("idempotent", "trireme", 2)]
    produce, idempotent = summary
    assert produce["mb_per_s"] == {"median": 500.0, "min": 400.0, "max": 600.0, "n": 3}
    assert produce["cpu_ms_per_mb"]["n"] == 2                  # the round without the broker's CPU does not count
    assert produce["loadavg_1m"] == {"median": 4.0, "min": 3.0, "max": 5.0, "n": 3}
    assert "floor" not in produce
    assert idempotent["floor"]["mb_per_s"] == {"median": 400.0, "min": 300.0, "max": 500.0, "n": 2}
    assert format_summary(produce) == ("produce            trireme           MB/s 500 [400-600]; "
                                       "CPU ms/MB 10.00 [10.00-10.00]; broker CPU in the kernel 25% [25%-25%]; "
                                       "load 4.0 [3.0-5.0], others 0.20 [0.10-0.30] cores")
    assert "fsync floor (977 KiB x 1 in flight) 400 [300-500] MB/s, its CPU 0.50 [0.50-0.50] ms/MB" \
        in format_summary(idempotent)


def test_ratios_pair_runs_of_the_same_round():
    runs = [run(1, "kafka", "produce", 400.0), run(1, "trireme", "produce", 600.0),
            run(2, "kafka", "produce", 200.0), run(2, "trireme", "produce", 400.0),
            run(3, "trireme", "produce", 1000.0),                       # no Kafka run in round 3: no ratio
            run(1, "kafka", "latency", None, p50_ms=0.2, p99_ms=1.0, cpu_us_per_message=None),
            run(1, "trireme", "latency", None, p50_ms=0.5, p99_ms=4.0, cpu_us_per_message=300.0)]
    got = {r["workload"]: r for r in ratios(runs, "kafka")}
    assert set(got) == {"produce", "latency"}
    assert got["produce"]["target"] == "trireme" and got["produce"]["reference"] == "kafka"
    assert got["produce"]["mb_per_s"] == {"median": 1.75, "min": 1.5, "max": 2.0, "n": 2}
    assert got["latency"]["p50_ms"]["median"] == 2.5
    assert got["latency"]["p99_ms"]["median"] == 4.0
    assert got["latency"]["cpu_us_per_message"] is None          # Kafka's CPU unknown (no --server-pid)
    assert format_ratio(got["latency"]) == "latency            trireme / kafka: ack p50 ms 2.50x; p99 ms 4.00x"


def test_combined_cpu_per_mb_counts_only_rounds_with_every_throughput_workload():
    runs = [run(1, "trireme", w, 100.0, cpu_s=0.5) for w in THROUGHPUT]
    runs += [run(1, "trireme", "small-4", 10.0, cpu_s=5.0)]                   # not a throughput row
    runs += [run(2, "trireme", w, 100.0, cpu_s=1.0) for w in THROUGHPUT if w != "java"]
    assert overall_cpu(runs) == {"trireme": {"median": 5.0, "min": 5.0, "max": 5.0, "n": 1}}


def test_targets_default_to_a_started_trireme_and_none_beside_a_bootstrap():
    assert parse([]).trireme == ["fsync"]
    assert parse(["--bootstrap", "h:9092"]).trireme == []
    args = parse(["--bootstrap", "h:9092", "--trireme", "fsync,no-fsync", "--workloads", "java,latency"])
    assert args.trireme == ["fsync", "no-fsync"] and args.units == ["java", "latency"]
    for bad in (["--trireme", "fast"], ["--workloads", "everything"], ["--trireme", ""]):
        with pytest.raises(SystemExit):
            parse(bad)


def test_fsync_floor_is_fsync_floor_py_s_loop_on_the_requests_in_flight_together(tmp_path):
    floor = disk_floor(4096, in_flight=3, directory=str(tmp_path), seconds=0.05)
    assert (floor["request_bytes"], floor["in_flight"], floor["size"]) == (4096, 3, 3 * 4096)
    assert floor["requests"] > 0
    assert floor["mb_per_s"] == floor["requests"] * 3 * 4096 / 1e6 / floor["seconds"]
    assert 0 < floor["p50_ms"] <= floor["p99_ms"] and floor["fdatasync_p50_ms"] is not None
    assert list(tmp_path.iterdir()) == []


def test_summary_keeps_the_brokers_account_of_a_produce_request():
    phases = {"receive": 0.05, "handle": 0.2, "wait": 1.0, "respond": 0.01, "fsync_mean": 0.8, "requests": 10}
    runs = [run(1, "trireme", "idempotent", 150.0, broker_ms=phases),
            run(2, "trireme", "idempotent", 170.0, broker_ms=dict(phases, wait=3.0)),
            run(3, "trireme", "idempotent", 160.0, broker_ms=None)]           # a broker without metrics
    entry, = summarize(runs)
    assert entry["broker_ms"]["wait"] == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 2}
    assert ("broker ms per Produce request: receive 0.050 [0.050-0.050], handle 0.200 [0.200-0.200], wait for the "
            "flush 2.000 [1.000-3.000]") in format_summary(entry)


def test_a_started_trireme_gives_its_produce_requests_and_their_breakdown():
    target = Target.start_trireme(True, [])
    try:
        rows = run_unit("idempotent", target, parse(["--records", "2000"]))
    finally:
        target.stop()
    row, = rows
    assert row["workload"] == "idempotent" and row["failed"] == 0
    assert row["produce_requests"] > 0 and row["broker_ms"]["requests"] == row["produce_requests"]
    assert set(BROKER_PHASES) <= set(row["broker_ms"])
    assert row["floor"]["in_flight"] == 1 and row["floor"]["requests"] > 0


def test_the_java_rows_differ_only_in_the_clients_idempotence_and_give_the_brokers_peak_rss(monkeypatch):
    import kafka_side_by_side
    phase = {"bytes": 1e6, "mb_per_s": 10.0, "records_per_s": 1e4, "server_cpu_s": None, "seconds": 0.1,
             "loadavg_1m": 1.0, "other_processes_cpu_s": None, "errors": 0, "undelivered": 0,
             "server_peak_rss_mib": 1300.0}
    argvs = []
    monkeypatch.setattr(kafka_side_by_side, "_produce_consume",
                        lambda target, argv: argvs.append(argv) or {"produce": phase})
    target = Target("kafka", "h:9092", None, None, None)
    monkeypatch.setattr(target, "delete_topic", lambda topic: None)
    args = parse(["--bootstrap", "h:9092", "--java-bytes", "1MiB"])
    plain, = run_unit("java", target, args)
    idempotent, = run_unit("java_idempotent", target, args)
    assert (plain["workload"], idempotent["workload"]) == ("java", "java_idempotent")
    without_topic = [[a for a in argv if not a.startswith("side-java")] for argv in argvs]
    assert without_topic[1] == without_topic[0] + ["--idempotent"]
    assert without_topic[0][:2] == ["--client", "java-4.3.0"]
    assert (plain["peak_rss_mib"], plain["peak_rss_of_the_run"]) == (1300.0, False)   # no pid: peak since start


def _vm(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def test_peak_rss_starts_afresh_from_the_current_size():
    block = bytearray(128 << 20)                   # 128 MiB touched, then freed: the peak stays up
    block[::4096] = b"x" * len(block[::4096])
    del block
    assert _vm("VmHWM") - _vm("VmRSS") > 100 << 10
    assert reset_peak_rss(os.getpid())
    assert _vm("VmHWM") - _vm("VmRSS") < 100 << 10
    assert not reset_peak_rss(None)


def test_restart_kills_a_started_trireme_and_times_its_start_on_the_same_data():
    target = Target.start_trireme(True, [])
    first = (target.bootstrap, target.stats.pid)
    try:
        row, = run_unit("restart", target, parse(["--restart-bytes", "2MiB"]))
        assert (target.bootstrap, target.stats.pid) != first
        assert target.server.proc.poll() is None
    finally:
        target.stop()
    assert target.server.proc.returncode == 0      # the restarted broker stopped cleanly
    # 2 MiB of 1 KiB records and the warm-up record before the clock, all acknowledged before the kill
    assert row["workload"] == "restart" and row["records"] == 2049 and row["offset"] == 2049 and row["failed"] == 0
    assert 0 < row["listening_s"] <= row["restart_s"] and row["loaded_s"] is not None and row["disk_gib"] > 0
    assert not os.path.exists(target.temp)
    assert run_unit("restart", Target("kafka", "h:9092", None, None, None), parse([])) == []   # not ours to kill


def test_serial_floor_adds_one_fdatasync_to_the_round_trip_without_fsync_of_the_same_round():
    floor = {"request_bytes": 1_000_000, "in_flight": 1, "mb_per_s": 900.0, "p50_ms": 1.0, "fdatasync_p50_ms": 1.0,
             "cpu_ms_per_mb": 0.5}
    runs = [run(1, "trireme", "idempotent", 200.0, floor=floor), run(1, "trireme-no-fsync", "idempotent", 500.0),
            run(2, "trireme", "idempotent", 300.0, floor=floor), run(2, "trireme-no-fsync", "idempotent", 250.0),
            run(3, "trireme", "idempotent", 999.0, floor=floor),             # no no-fsync run in round 3: no floor
            {"round": 1, "target": "trireme", "workload": "latency", "p50_ms": 0.5,
             "floor": dict(floor, request_bytes=100, fdatasync_p50_ms=0.15)},
            {"round": 1, "target": "trireme-no-fsync", "workload": "latency", "p50_ms": 0.2}]
    idempotent, latency = serial_floors(runs)
    # 1 MB at 500 MB/s is 2 ms, plus 1 ms of fdatasync: 3 ms a request, 333 MB/s; at 250 MB/s, 4 + 1 ms: 200 MB/s
    assert idempotent["workload"] == "idempotent" and idempotent["target"] == "trireme"
    assert idempotent["floor"]["n"] == 2
    assert idempotent["floor"]["max"] == pytest.approx(1000 / 3) and idempotent["floor"]["min"] == pytest.approx(200)
    assert idempotent["share"]["min"] == pytest.approx(200 / (1000 / 3)) and idempotent["share"]["max"] == 1.5
    assert latency["floor"]["median"] == pytest.approx(0.35) and latency["share"]["median"] == pytest.approx(0.7)
    assert serial_floors([r for r in runs if r["target"] == "trireme"]) == []


def test_serial_floor_of_requests_in_flight_together_adds_one_fdatasync_of_them_all():
    floor = {"request_bytes": 15_000, "in_flight": 5, "mb_per_s": 300.0, "p50_ms": 0.3, "fdatasync_p50_ms": 0.25,
             "cpu_ms_per_mb": 1.0}
    runs = [run(1, "trireme", "java", 100.0, floor=floor), run(1, "trireme-no-fsync", "java", 150.0)]
    [java] = serial_floors(runs)
    # five requests of 15 kB at 150 MB/s take 0.5 ms, plus 0.25 ms for one fdatasync of all five: 100 MB/s
    assert java["workload"] == "java" and java["floor"]["median"] == pytest.approx(100.0)
    assert java["share"]["median"] == pytest.approx(1.0)
