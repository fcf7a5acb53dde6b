"""Shared pieces of the harness-driven compat tests (the Java client and
kafkajs: test_java_client.py, test_kafkajs.py, test_groups_java.py,
test_groups_kafkajs.py).

* ``harness_pool`` / ``pooled_harness``: the bodies of a module's pool
  fixture (one long-lived harness process per client, closed at the end of
  the module) and of its per-test fixture (the pool's process, restarted if
  it died; the harness' and the server's log tails printed when the test
  failed).
* ``make_records`` and the row helpers: the 10,000-record set the round-trip
  tests produce, and its comparison against what the harness consumed.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Iterator

from compat_tests import clients

N_RECORDS = 10_000
PARTITIONS = 3


# ------------------------------------------------------------------ fixtures

def harness_pool() -> Iterator[dict[str, clients.HarnessProcess]]:
    """Body of a module-scoped fixture: ``yield from harness_pool()``."""
    pool: dict[str, clients.HarnessProcess] = {}
    yield pool
    for h in pool.values():
        h.close()


def pooled_harness(request, pool: dict[str, clients.HarnessProcess], key: str,
                   start: Callable[[], clients.HarnessProcess], server, *,
                   server_lines: int = 60) -> Iterator[clients.HarnessProcess]:
    """Body of a per-test fixture: ``yield from pooled_harness(...)``.  Yields
    ``pool[key]``, started with ``start()`` first if it is missing or its
    process exited (a crash or a kill); after a failed test prints the tails
    of the harness' and the server's stderr."""
    h = pool.get(key)
    if h is None or h.proc.poll() is not None:
        h = pool[key] = start()
    yield h
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        print(f"\n----- {h.name} harness stderr tail ({h.stderr_path}) -----\n{h.stderr_tail(60)}")
        print(f"\n----- server stderr tail ({server.stderr_path}) -----\n"
              f"{server.stderr_tail(server_lines)}")


# ------------------------------------------------------------------- records

def make_records(tag: str, base_ts: int, n: int = N_RECORDS, *,
                 null_header_values: bool = True) -> list[dict[str, Any]]:
    """Records spread round-robin over the partitions.  Keys (some null, some
    empty), values (some null = tombstones, some empty, binary tails),
    headers (repeated keys, kept adjacent because kafkajs groups header keys;
    some records without headers; with ``null_header_values`` a null value on
    every tenth record, which kafkajs cannot send) and explicit CreateTime
    timestamps: unique, not monotonic (blocks of ten go backwards) and all in
    the past three hours (Kafka 4's message.timestamp.after.max.ms default is
    one hour)."""
    out = []
    for i in range(n):
        m = i % 1000
        key = None if m == 997 else b"" if m == 996 else f"{tag}/key/{i:05d}".encode()
        if m == 999:
            value = None
        elif m == 998:
            value = b""
        else:
            value = f"{tag} value {i} ".encode() * (1 + i % 4) + bytes(range(i % 250, i % 250 + 6))
        if i % 100 == 0:
            headers: list[tuple[str, bytes | None]] = []
        else:
            headers = [("idx", str(i).encode()), ("bin", bytes([i % 256, 0, 255 - i % 256])),
                       ("dup", b"first"), ("dup", b"second")]
            if null_header_values and i % 10 == 0:
                headers.append(("nullvalue", None))
        ts = base_ts + 1000 * ((i // 10) * 10 + 9 - i % 10)
        out.append({"i": i, "partition": i % PARTITIONS, "key": key, "value": value,
                    "headers": headers, "timestamp": ts})
    return out


def wire(recs: list[dict[str, Any]]) -> list[dict]:
    """``make_records`` records as harness ``produce`` records."""
    return [clients.record(r["value"], key=r["key"], partition=r["partition"], headers=r["headers"],
                           timestamp=r["timestamp"]) for r in recs]


def past_base_ts() -> int:
    return int(time.time() * 1000) - 3 * 3600 * 1000


def assert_same_rows(expected: list, actual: list, what: str) -> None:
    """Compare long lists without a 10,000-line diff: the first differing
    row, then the length."""
    for idx, (e, a) in enumerate(zip(expected, actual)):
        assert a == e, f"{what}: first difference at row {idx}"
    assert len(actual) == len(expected), f"{what}: {len(actual)} rows, expected {len(expected)}"


def expected_row(r: dict[str, Any], p: int, o: int) -> tuple:
    return (p, o, r["key"], r["value"], [(k, v) for k, v in r["headers"]], r["timestamp"], "CreateTime")


def actual_row(rec: dict) -> tuple:
    d = clients.decoded(rec)
    return (rec["partition"], rec["offset"], d["key"], d["value"], d["headers_raw"], rec["timestamp"],
            rec["timestamp_type"])


def first_offset_at_or_after(ts_by_offset: list[int], target: int) -> tuple[int, int]:
    """Kafka's ListOffsets by timestamp: the first offset (in log order) whose
    timestamp is >= target, with that timestamp; (-1, -1) if none."""
    for o, t in enumerate(ts_by_offset):
        if t >= target:
            return o, t
    return -1, -1
