"""bench/request_floor.py: its frame splitting, and each bare server answering every request of a short run."""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
from request_floor import SERVERS, main, whole_frames  # noqa: E402


def test_whole_frames_drops_complete_frames_and_keeps_a_partial_one():
    buf = bytearray(b"\x00\x00\x00\x02ab" + b"\x00\x00\x00\x00" + b"\x00\x00\x00\x05abc")
    assert whole_frames(buf) == 2
    assert buf == bytearray(b"\x00\x00\x00\x05abc")
    buf += b"de"
    assert whole_frames(buf) == 1
    assert buf == bytearray()


def test_every_server_answers_every_request(capsys):
    assert main(["--seconds", "0.5", "--rate", "400", "--connections", "4"]) == 0
    results = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [r["server"] for r in results] == list(SERVERS)
    for r in results:
        assert r["requests"] == 200, r          # 4 connections x 100 requests/s x 0.5 s: all sent were answered
        assert r["cpu_us_per_request"] is not None and r["latency_ms"]["p50"] > 0, r


def test_closed_loop_of_large_requests_is_answered_whole(capsys):
    assert main(["--servers", "trio-group-commit,trio", "--connections", "2", "--in-flight", "5", "--requests", "60",
                 "--records", "15", "--record-size", "1024"]) == 0
    results = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for r in results:
        assert (r["requests"], r["in_flight"], r["rate"]) == (60, 5, None), r
        assert r["request_bytes"] > 15 * 1024 and r["cpu_s_per_256mib"] is not None, r


def test_cpu_split_parts_add_up():
    from produce_consume import ServerStats
    stats = ServerStats(os.getpid())
    sum(i * i for i in range(300_000))              # some user time on the main thread
    split = stats.cpu_split()
    assert set(split) == {"user", "system", "main_thread_user", "main_thread_system"}
    assert 0 < split["main_thread_user"] <= split["user"]
    assert 0 <= split["main_thread_system"] <= split["system"]
    assert stats.cpu_seconds() >= split["user"] + split["system"]
    assert ServerStats(None).cpu_split() is None
