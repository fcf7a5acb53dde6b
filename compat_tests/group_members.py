"""Harness-backed consumer-group members and checks, shared by the Java
(test_groups_java.py) and kafkajs (test_groups_kafkajs.py) group tests.

A ``Member`` is one consumer living in a harness process (a ``handle`` of its
``subscribe``/``poll``/``commit``/``committed``/``close_consumer`` ops); it
accumulates what its polls return (records, rebalance events, the current
assignment).  Both harnesses answer these ops in the same shape, so nothing
here depends on the client; what does (assignor names, error classes, which
ops a client has) stays in the test modules.
"""
from __future__ import annotations

import time
from collections import Counter
from typing import Any, Callable, Iterable

from compat_tests import clients

SESSION_MS = 6000
HEARTBEAT_MS = 500
# Short fetch waits keep the round-robin polls below quick.
GROUP_CONFIG = {"session.timeout.ms": SESSION_MS, "heartbeat.interval.ms": HEARTBEAT_MS,
                "fetch.max.wait.ms": 100}
POLL_MS = 200

TP = tuple[str, int]


class Member:
    """One consumer (a harness handle) subscribed to ``topics`` in ``group``;
    accumulates what its polls return."""

    def __init__(self, h: clients.HarnessProcess, handle: str, group: str, topics: list[str],
                 config: dict[str, Any] | None = None):
        self.h, self.handle, self.group, self.topics = h, handle, group, topics
        self.config = dict(GROUP_CONFIG, **(config or {}))
        self.records: list[dict] = []
        self.events: list[dict] = []
        self.assignment: list[TP] = []
        self.open = False

    def __repr__(self) -> str:
        return f"<Member {self.handle} assignment={self.assignment}>"

    def subscribe(self) -> "Member":
        self.h.ok("subscribe", topics=self.topics, group=self.group, config=self.config,
                  handle=self.handle)
        self.open = True
        return self

    def poll(self, timeout_ms: int = POLL_MS) -> dict:
        r = self.h.ok("poll", handle=self.handle, timeout_ms=timeout_ms)
        self.records.extend(r["records"])
        self.events.extend(r["events"])
        self.assignment = [tuple(tp) for tp in r["assignment"]]
        return r

    def commit(self, offsets: list[list] | None = None) -> None:
        if offsets is None:
            self.h.ok("commit", handle=self.handle)
        else:
            self.h.ok("commit", handle=self.handle, offsets=offsets)

    def committed(self, topic: str, partitions: int) -> list[list]:
        return self.h.ok("committed", handle=self.handle, topic=topic, partitions=partitions)["committed"]

    def close(self) -> None:
        if self.open:
            self.open = False
            self.h.ok("close_consumer", handle=self.handle)

    def take_events(self) -> list[dict]:
        ev, self.events = self.events, []
        return ev

    def keys(self) -> list[tuple[str, int, int]]:
        return [(r["topic"], r["partition"], r["offset"]) for r in self.records]


def close_all(members: Iterable[Member]) -> None:
    for m in members:
        if m.open and m.h.proc.poll() is None:
            try:
                m.close()
            except (AssertionError, clients.HarnessError):
                pass


def all_tps(topics: dict[str, int]) -> set[TP]:
    return {(t, p) for t, n in topics.items() for p in range(n)}


def balanced(members: list[Member], tps: set[TP]) -> bool:
    """Every member owns something, no partition twice, all partitions owned."""
    owned = [tp for m in members for tp in m.assignment]
    return all(m.assignment for m in members) and len(owned) == len(set(owned)) and set(owned) == tps


def poll_until(members: list[Member], cond: Callable[[], bool], timeout: float, what: str) -> float:
    """Round-robin poll ``members`` until ``cond()``; returns the seconds it took."""
    start = time.monotonic()
    while True:
        for m in members:
            m.poll()
        if cond():
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            state = "\n".join(f"  {m.handle}: assignment={m.assignment} events={m.events[-6:]} "
                              f"records={len(m.records)}" for m in members)
            raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{state}")


def subscribe_balanced(members: list[Member], tps: set[TP], what: str) -> None:
    """Subscribe every member, then poll them until they own ``tps`` between
    them (``balanced``)."""
    for m in members:
        m.subscribe()
    poll_until(members, lambda: balanced(members, tps), 30, what)


def poll_rounds(members: list[Member], rounds: int = 3) -> None:
    """A few more polls of every member (anything delivered twice, or any
    rebalance still coming, would show up now)."""
    for _ in range(rounds):
        for m in members:
            m.poll()


def produce(h: clients.HarnessProcess, topic: str, partitions: int, per_partition: int,
            tag: str) -> dict[tuple[str, int, int], bytes]:
    """``per_partition`` records into each partition; returns {(topic, p, offset): value}."""
    recs = [clients.record(f"{tag}/{p}/{i}", key=f"k{i}", partition=p)
            for i in range(per_partition) for p in range(partitions)]
    r = h.produce(topic, recs)
    assert r["ok"], f"produce failed: {r.get('error')}\n{h.stderr_tail(30)}"
    return {(topic, p, off): clients.unb64(rec["value_b64"]) for rec, (p, off) in zip(recs, r["offsets"])}


def assert_exactly_once(members: list[Member], expected: dict[tuple[str, int, int], bytes]) -> None:
    got = Counter(k for m in members for k in m.keys())
    dups = {k: n for k, n in got.items() if n > 1}
    assert not dups, f"records consumed more than once: {sorted(dups)[:10]}"
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    assert not missing and not extra, f"missing {missing[:10]} extra {extra[:10]}"
    for m in members:
        for r in m.records:
            assert clients.unb64(r["value_b64"]) == expected[(r["topic"], r["partition"], r["offset"])]


def events_of(member: Member, kind: str) -> list[list[TP]]:
    return [[tuple(tp) for tp in e["partitions"]] for e in member.events if e["type"] == kind]


def describe(h: clients.HarnessProcess, group: str) -> dict:
    """The harness ``describe_group``, each member's assignment as a sorted
    list of (topic, partition) tuples."""
    d = h.ok("describe_group", group=group)
    for m in d["members"]:
        m["assignment"] = sorted(tuple(tp) for tp in m["assignment"])
    return d
