"""bench/fsync_floor.py: every mode keeps one request in flight and counts what it sent, and leaves no file behind."""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
from fsync_floor import floor, main  # noqa: E402


def test_floor_writes_and_syncs_each_request_and_removes_its_file(tmp_path):
    r = floor(4096, 0.2, str(tmp_path))
    assert r["requests"] > 0
    assert r["mb_per_s"] == r["requests"] * 4096 / 1e6 / r["seconds"]
    assert r["fdatasync_p50_ms"] is not None and 0 < r["fdatasync_p50_ms"] <= r["max_ms"]
    assert os.listdir(tmp_path) == []


def test_every_mode_against_the_started_broker(tmp_path, capsys):
    assert main(["--modes", "disk,server,broker,librdkafka", "--sizes", "100,2KiB", "--seconds", "0.3",
                 "--rounds", "1", "--dir", str(tmp_path)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    got = {(r["mode"], r["size"]): r for r in summary["floor"]}
    assert set(got) == {(m, s) for m in ("disk", "server", "broker", "librdkafka") for s in (100, 2048)}
    for (mode, size), r in got.items():
        assert r["requests_per_s"]["median"] > 0, (mode, size)
        if mode in ("broker", "librdkafka"):
            assert r["cpu_us_per_request"] is not None, (mode, size)   # the started broker's CPU was read
    assert os.listdir(tmp_path) == []               # the bare server's file and the broker's data dir are gone


def test_broker_phases_count_only_the_requests_between_the_scrapes():
    from fsync_floor import broker_phases
    before = {"requests": {"Produce": 100}, "fsyncs": 90,
              "phases": {("Produce", "receive"): 1.0, ("Produce", "handle"): 2.0, ("Produce", "wait"): 3.0}}
    after = {"requests": {"Produce": 300}, "fsyncs": 290,
             "phases": {("Produce", "receive"): 1.002, ("Produce", "handle"): 2.01, ("Produce", "wait"): 3.1,
                        ("Produce", "respond"): 0.004}}
    assert broker_phases(before, after) == {
        "broker_us": {"receive": 10.0, "handle": 50.0, "wait": 500.0, "respond": 20.0}, "fsyncs_per_request": 1.0}
    assert broker_phases(None, after) == {} and broker_phases(after, after) == {}


def test_disk_loops_on_reserved_and_written_files_with_a_busy_process(tmp_path, capsys, monkeypatch):
    """The disk loop through the broker's append file and over blocks written beforehand (whose preparation is not
    timed: the loop still ran its seconds), beside a spinning process that is gone afterwards; no file is left."""
    import fsync_floor
    monkeypatch.setattr(fsync_floor, "WRITTEN_BYTES", 1 << 20)      # a new prepared file every 16 requests
    r = floor(65536, 0.2, str(tmp_path), kind="written")
    assert r["requests"] > 16 and 0.2 <= r["seconds"] < 1
    assert 0 < r["fdatasync_p50_ms"] <= r["fdatasync_p90_ms"] <= r["max_ms"] and r["fdatasync_mean_ms"] > 0
    assert main(["--modes", "disk,disk-reserved,disk-written", "--sizes", "4KiB", "--seconds", "0.2", "--rounds", "1",
                 "--dir", str(tmp_path), "--busy", "1"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["config"]["busy"] == 1
    assert {r["mode"] for r in summary["floor"]} == {"disk", "disk-reserved", "disk-written"}
    assert all(r["requests_per_s"]["median"] > 0 for r in summary["floor"])
    assert os.listdir(tmp_path) == []
