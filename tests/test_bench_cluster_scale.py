"""bench/cluster_scale.py's pure parts: its options, the order of the targets, the /proc and pg_stat readings (on a fake
/proc and a fake connection), a phase's figures from its snapshots and the spread over rounds (no timing asserted)."""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
from cluster_scale import (CLK_TCK, background_rate, database_counters, format_run, format_summary,  # noqa: E402
                           leader_counts, parse, phase_figures, process_cpu_seconds, read_stat, round_order, summarize,
                           target_names, tree_cpu_seconds)


def test_options_and_their_defaults():
    args = parse([])
    assert (args.brokers, args.local, args.rounds, args.partitions, args.bytes) == ([1, 2, 3], False, 3, 12, 256 << 20)
    args = parse(["--brokers", "1,3", "--local", "--rounds", "5", "--bytes", "1GiB", "--pg-set", "wal_level=minimal"])
    assert (args.brokers, args.local, args.rounds, args.bytes, args.pg_set) == ([1, 3], True, 5, 1 << 30,
                                                                               ["wal_level=minimal"])
    for bad in (["--brokers", "0"], ["--brokers", ""], ["--rounds", "0"], ["--partitions", "0"]):
        with pytest.raises(SystemExit):
            parse(bad)


def test_targets_run_once_a_round_in_an_order_reversed_every_other_round():
    names = target_names([1, 2, 3], local=True)
    assert names == ["postgresql-1", "postgresql-2", "postgresql-3", "local"]
    assert target_names([2], local=False) == ["postgresql-2"]
    assert round_order(names, 1) == names
    assert round_order(names, 2) == names[::-1]
    assert round_order(names, 3) == names


def test_leader_counts_per_node():
    assert leader_counts([3, 1, 1, 2, 1, 3]) == {1: 3, 2: 1, 3: 2}
    assert list(leader_counts([2, 1])) == [1, 2]


def _stat(path, pid: int, ppid: int, utime: int, stime: int, cutime: int = 0, cstime: int = 0,
          name: str = "postgres: walwriter ") -> None:
    os.makedirs(path / str(pid), exist_ok=True)
    # the command name may hold spaces and parentheses: fields are counted after its last ')'
    (path / str(pid) / "stat").write_text(
        f"{pid} ({name}) S {ppid} {pid} {pid} 0 -1 4194304 10 0 0 0 {utime} {stime} {cutime} {cstime} 20 0 1 0 5 "
        f"1000 50 18446744073709551615\n")


def test_proc_readings_of_one_process_and_of_a_process_tree(tmp_path):
    _stat(tmp_path, 100, 1, utime=300, stime=100, cutime=50, cstime=50, name="postgres")     # the postmaster
    _stat(tmp_path, 101, 100, utime=20, stime=10)                                            # its backends
    _stat(tmp_path, 102, 100, utime=5, stime=5, name="postgres: trireme trireme (idle)")
    _stat(tmp_path, 200, 1, utime=999, stime=999, name="trireme serve")                      # not its child
    (tmp_path / "self").mkdir()                                                              # not a process
    assert read_stat(101, str(tmp_path)) == {"ppid": 100, "user": 20 / CLK_TCK, "system": 10 / CLK_TCK,
                                             "children": 0.0}
    assert process_cpu_seconds(200, str(tmp_path)) == pytest.approx(1998 / CLK_TCK)
    # the postmaster's own time, its reaped children's, and its live children's
    assert tree_cpu_seconds(100, str(tmp_path)) == pytest.approx((400 + 100 + 30 + 10) / CLK_TCK)
    assert process_cpu_seconds(999, str(tmp_path)) is None
    assert tree_cpu_seconds(999, str(tmp_path)) is None


class FakeConnection:
    """Answers the bench's two queries; the second fails until the brokers have created their tables."""

    def __init__(self, counters, rows=None):
        self.counters, self.rows, self.rolled_back = counters, rows, False

    def execute(self, statement):
        conn = self

        class Result:
            def fetchone(self):
                if "pg_stat_database" in statement:
                    return conn.counters
                if conn.rows is None:
                    raise RuntimeError('relation "trireme_batch" does not exist')
                return conn.rows
        return Result()

    def rollback(self):
        self.rolled_back = True


def test_database_counters_read_pg_stat_the_wal_and_the_batch_rows():
    conn = FakeConnection((120, 4000, 16_000_000, 750), rows=(40, 41_000_000))
    assert database_counters(conn) == {"xact_commit": 120, "tup_inserted": 4000, "wal_bytes": 16_000_000,
                                       "next_xid": 750, "batch_rows": 40, "batch_bytes": 41_000_000}
    empty = FakeConnection((3, 0, 100, 740))
    assert database_counters(empty)["batch_rows"] == 0 and empty.rolled_back


def snapshot(t, brokers, postgres, machine, rounds=None, db=None):
    return {"t": t, "machine": machine, "brokers": brokers, "postgres": postgres, "rounds": rounds,
            "round_seconds": None if rounds is None else rounds * 0.05,
            "produce_requests": None if rounds is None else rounds * 3, "database": db}


def db(xact, tuples, wal, xid, rows, t=0.0):
    return {"t": t, "xact_commit": xact, "tup_inserted": tuples, "wal_bytes": wal, "next_xid": xid,
            "batch_rows": rows, "batch_bytes": rows * 1_000_000}


def test_phase_figures_per_mb_and_per_second_with_the_idle_background_taken_off():
    before = snapshot(10.0, [5.0, 7.0], 20.0, 100.0, rounds=10, db=db(100, 10, 1_000_000, 500, 0))
    after = snapshot(12.0, [5.5, 7.5], 21.0, 104.0, rounds=30, db=db(100, 10, 109_000_000, 525, 100))
    # pg_stat_database read settled 11 s after the phase: 2 s of phase + 11 s idle at 2 commits/s
    settled = (db(100, 10, 0, 0, 0, t=9.0), db(150, 50_010, 0, 0, 0, t=22.0), 2.0)
    f = phase_figures(before, after, mb=100.0, client_cpu_s=1.0, seconds=2.0, settled=settled)
    assert f["mb_per_s"] == 50.0
    assert f["broker_cpu_ms_per_mb"] == [pytest.approx(5.0), pytest.approx(5.0)]
    assert f["brokers_cpu_ms_per_mb"] == pytest.approx(10.0)
    assert f["postgres_cpu_ms_per_mb"] == pytest.approx(10.0)
    assert f["others_cores"] == pytest.approx((4.0 - 1.0 - 1.0 - 1.0) / 2.0)
    assert (f["rounds"], f["rounds_per_s"], f["rounds_per_mb"]) == (20, 10.0, 0.2)
    assert f["round_ms"] == pytest.approx(50.0) and f["produce_requests"] == 60
    assert (f["write_txns"], f["write_txns_per_mb"]) == (25, 0.25)
    assert (f["wal_bytes_per_mb"], f["batch_rows"]) == (1_080_000, 100)
    # 50 commits in 13 s, of which 11 s idle at 2/s: 28 for the phase
    assert f["commits"] == pytest.approx(28.0) and f["commits_per_mb"] == pytest.approx(0.28)
    assert f["tup_inserted"] == 50_000
    assert background_rate(db(100, 0, 0, 0, 0, t=0.0), db(122, 0, 0, 0, 0, t=11.0)) == 2.0
    line = format_run({"round": 1, "target": "postgresql-2", "leaders": {1: 7, 2: 5}, "produce": f}, "produce")
    assert "50.0 MB/s  leaders 7/5" in line


def test_phase_figures_without_a_database_or_readings():
    before = snapshot(0.0, [None], None, None)
    after = snapshot(1.0, [None], None, None)
    f = phase_figures(before, after, mb=10.0, client_cpu_s=None)
    assert f["mb_per_s"] == 10.0 and f["broker_cpu_ms_per_mb"] == [None] and f["brokers_cpu_ms_per_mb"] is None
    assert f["postgres_cpu_ms_per_mb"] is None and "others_cores" not in f and "commits" not in f
    assert "wal_bytes" not in f and "rounds" not in f


def run(rnd, target, mb_per_s, brokers_cpu, failed=False):
    phase = {"mb_per_s": mb_per_s, "broker_cpu_ms_per_mb": brokers_cpu, "brokers_cpu_ms_per_mb": sum(brokers_cpu),
             "postgres_cpu_ms_per_mb": None, "loadavg_1m": 1.0}
    r = {"round": rnd, "target": target, "produce": phase, "consume": dict(phase, mb_per_s=mb_per_s * 4)}
    if failed:
        r = {"round": rnd, "target": target, "failed": "topic absent"}
    return r


def test_summary_is_median_and_range_per_target_and_phase_each_broker_apart_failed_runs_counted():
    runs = [run(1, "postgresql-2", 100.0, [2.0, 4.0]), run(1, "local", 300.0, [1.0]),
            run(2, "local", 200.0, [3.0]), run(2, "postgresql-2", 140.0, [2.0, 6.0]),
            run(3, "postgresql-2", 0, [], failed=True), run(3, "local", 250.0, [2.0])]
    summary = summarize(runs)
    assert [(s["target"], s["phase"], s["rounds"], s["failed"]) for s in summary] == [
        ("postgresql-2", "produce", 2, 1), ("postgresql-2", "consume", 2, 1),
        ("local", "produce", 3, 0), ("local", "consume", 3, 0)]
    pg, local = summary[0], summary[2]
    assert pg["mb_per_s"] == {"median": 120.0, "min": 100.0, "max": 140.0, "n": 2}
    assert [s["median"] for s in pg["broker_cpu_ms_per_mb"]] == [2.0, 5.0]
    assert pg["commits_per_s"] is None and pg["postgres_cpu_ms_per_mb"] is None
    assert local["mb_per_s"]["median"] == 250.0 and summary[3]["mb_per_s"]["median"] == 1000.0
    assert "250.0 [200.0-300.0] MB/s" in format_summary(local)
