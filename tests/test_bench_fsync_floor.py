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
