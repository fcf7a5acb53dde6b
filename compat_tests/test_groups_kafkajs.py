"""Consumer groups with kafkajs 2.2.4 against a real Trireme process (the
classic JoinGroup/SyncGroup/Heartbeat protocol; kafkajs has no other).

* ``test_group_shares_partitions[kafkajs]``: three members, six partitions,
  disjoint complete shares, every record consumed exactly once.
* ``test_group_close_hands_over_partitions[kafkajs]``: disconnect() sends
  LeaveGroup; the others take over well within the session timeout and resume
  from the leaver's committed offsets.
* ``test_group_killed_member_expires_after_session_timeout[kafkajs]``: a
  SIGKILLed member's partitions move only after the session timeout.
* ``test_committed_offsets_resume_after_close[kafkajs]`` and
  ``test_committed_offsets_survive_server_restart[kafkajs-restart|kafkajs-kill9]``.
* ``test_default_assignor_round_robin[kafkajs]``: kafkajs' default (and only
  built-in) assignor, RoundRobinAssigner, gives the exact expected shares.
* ``test_admin_consumer_groups[kafkajs]``: admin listGroups, describeGroups,
  fetchOffsets, deleteGroups.

Not covered because kafkajs cannot do it: static membership (kafkajs has no
group.instance.id: its JoinGroup requests never carry one), other assignors
(it ships only RoundRobinAssigner), deleting group offsets (its admin has no
OffsetDelete / deleteConsumerGroupOffsets).

Harness notes: the kafkajs consumer runs in the background (joins, heartbeats
and rebalances without a poll); the harness hands records over only while a
``poll`` waits, so members living in one harness process are polled round
robin.  The member killed with SIGKILL lives in a harness process of its own.
"""
from __future__ import annotations

import time
from collections import Counter
from typing import Any, Callable, Iterable, Iterator

import pytest

from compat_tests import clients

SESSION_MS = 6000
HEARTBEAT_MS = 500
GROUP_CONFIG = {"session.timeout.ms": SESSION_MS, "heartbeat.interval.ms": HEARTBEAT_MS,
                "fetch.max.wait.ms": 100}
POLL_MS = 200
KJS = pytest.mark.parametrize("client", ["kafkajs"])

TP = tuple[str, int]


# ------------------------------------------------------------------ fixtures

@pytest.fixture(scope="module")
def js_pool(module_server) -> Iterator[list[clients.HarnessProcess]]:
    pool: list[clients.HarnessProcess] = []
    yield pool
    for h in pool:
        h.close()


@pytest.fixture
def js(request, js_pool, module_server) -> Iterator[clients.HarnessProcess]:
    """One kafkajs harness process shared by the module's tests."""
    clients.require_kafkajs()
    if not js_pool or js_pool[0].proc.poll() is not None:
        js_pool[:] = [clients.kafkajs_harness(module_server.bootstrap)]
    h = js_pool[0]
    yield h
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        print(f"\n----- kafkajs harness stderr tail ({h.stderr_path}) -----\n{h.stderr_tail(60)}")
        print(f"\n----- server stderr tail ({module_server.stderr_path}) -----\n"
              f"{module_server.stderr_tail(60)}")


# ------------------------------------------------------------------- helpers

class Member:
    """One kafkajs consumer (a harness handle) in ``group``."""

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
    owned = [tp for m in members for tp in m.assignment]
    return all(m.assignment for m in members) and len(owned) == len(set(owned)) and set(owned) == tps


def poll_until(members: list[Member], cond: Callable[[], bool], timeout: float, what: str) -> float:
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


def produce(h: clients.HarnessProcess, topic: str, partitions: int, per_partition: int,
            tag: str) -> dict[tuple[str, int, int], bytes]:
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


def describe(h: clients.HarnessProcess, group: str) -> dict:
    d = h.ok("describe_group", group=group)
    for m in d["members"]:
        m["assignment"] = sorted(tuple(tp) for tp in m["assignment"])
    return d


# ---------------------------------------------------------------------- tests

@KJS
def test_group_shares_partitions(js, client):
    topic, group = "share-kafkajs", "share-group-kafkajs"
    js.ok("create_topic", topic=topic, partitions=6)
    tps = all_tps({topic: 6})
    members = [Member(js, f"share-{i}", group, [topic]) for i in range(3)]
    try:
        for m in members:
            m.subscribe()
        poll_until(members, lambda: balanced(members, tps), 30, "a balanced 3-way assignment")
        assert all(len(m.assignment) == 2 for m in members), members
        sent = produce(js, topic, 6, 40, "share")
        poll_until(members, lambda: sum(len(m.records) for m in members) >= len(sent), 30,
                   "all records to be consumed")
        for _ in range(3):
            for m in members:
                m.poll()
        assert_exactly_once(members, sent)
        for m in members:
            assert {(r["topic"], r["partition"]) for r in m.records} == set(m.assignment), m
        d = describe(js, group)
        assert d["state"] == "Stable" and d["protocol"] == "RoundRobinAssigner", d
        assert sorted(x["assignment"] for x in d["members"]) == sorted(sorted(m.assignment) for m in members)
    finally:
        close_all(members)


@KJS
def test_group_close_hands_over_partitions(js, client):
    topic, group = "close-kafkajs", "close-group-kafkajs"
    js.ok("create_topic", topic=topic, partitions=6)
    tps = all_tps({topic: 6})
    members = [Member(js, f"close-{i}", group, [topic]) for i in range(3)]
    try:
        for m in members:
            m.subscribe()
        poll_until(members, lambda: balanced(members, tps), 30, "a balanced 3-way assignment")
        first = produce(js, topic, 6, 20, "close-1")
        poll_until(members, lambda: sum(len(m.records) for m in members) >= len(first), 30,
                   "the first batch")
        assert_exactly_once(members, first)
        for m in members:
            m.commit()
        leaver, survivors = members[2], members[:2]
        before = set().union(*(set(m.assignment) for m in survivors))
        leaver_tps = set(leaver.assignment)
        for m in survivors:
            m.records.clear()
            m.take_events()

        t0 = time.monotonic()
        leaver.close()
        poll_until(survivors, lambda: balanced(survivors, tps), SESSION_MS / 1000 + 10,
                   "the survivors to take over")
        took = time.monotonic() - t0
        assert took < SESSION_MS / 1000, \
            f"takeover after a LeaveGroup took {took:.1f}s, not less than the session timeout"
        assert set().union(*(set(m.assignment) for m in survivors)) - before == leaver_tps

        second = produce(js, topic, 6, 20, "close-2")
        poll_until(survivors, lambda: sum(len(m.records) for m in survivors) >= len(second), 30,
                   "the second batch")
        for m in survivors:
            m.poll()
        assert_exactly_once(survivors, second)
        d = describe(js, group)
        assert d["state"] == "Stable" and len(d["members"]) == 2, d
    finally:
        close_all(members)


@KJS
def test_group_killed_member_expires_after_session_timeout(js, client, kafkajs_harness):
    topic, group = "kill-kafkajs", "kill-group-kafkajs"
    js.ok("create_topic", topic=topic, partitions=6)
    tps = all_tps({topic: 6})
    victim_h = kafkajs_harness()
    survivors = [Member(js, f"kill-{i}", group, [topic]) for i in range(2)]
    victim = Member(victim_h, "victim", group, [topic])
    members = survivors + [victim]
    try:
        for m in members:
            m.subscribe()
        poll_until(members, lambda: balanced(members, tps), 30, "a balanced 3-way assignment")
        victim_tps = set(victim.assignment)
        t0 = time.monotonic()
        victim_h.kill()
        victim.open = False
        poll_until(survivors, lambda: balanced(survivors, tps), SESSION_MS / 1000 + 15,
                   "the survivors to take over")
        took = time.monotonic() - t0
        assert took >= (SESSION_MS - HEARTBEAT_MS) / 1000 - 0.5, \
            f"partitions moved {took:.1f}s after the kill, before the session timeout"
        assert took < SESSION_MS / 1000 + 5, f"takeover took {took:.1f}s"
        assert victim_tps <= {tp for m in survivors for tp in m.assignment}
        d = describe(js, group)
        assert d["state"] == "Stable" and len(d["members"]) == 2, d
    finally:
        close_all(survivors)


@KJS
def test_committed_offsets_resume_after_close(js, client):
    topic, group = "resume-kafkajs", "resume-group-kafkajs"
    js.ok("create_topic", topic=topic, partitions=3)
    first = produce(js, topic, 3, 10, "resume-1")
    a = Member(js, "resume-a", group, [topic]).subscribe()
    b = Member(js, "resume-b", group, [topic])
    c = Member(js, "resume-c", group, [topic])
    try:
        poll_until([a], lambda: len(a.records) >= len(first), 30, "the first batch")
        a.poll()
        assert_exactly_once([a], first)
        a.commit()     # what poll returned: offset 10 in each partition
        assert js.ok("committed", group=group, topic=topic, partitions=3)["committed"] == \
            [[p, 10, ""] for p in range(3)]
        a.close()

        second = produce(js, topic, 3, 5, "resume-2")
        b.subscribe()
        poll_until([b], lambda: len(b.records) >= len(second), 30, "the second batch")
        b.poll()
        assert_exactly_once([b], second)
        b.commit([[topic, 0, 3, "m0"], [topic, 1, 7, "m1"], [topic, 2, 12, None]])
        assert js.ok("committed", group=group, topic=topic, partitions=3)["committed"] == \
            [[0, 3, "m0"], [1, 7, "m1"], [2, 12, ""]]
        b.close()

        c.subscribe()
        everything = {**first, **second}
        want = {k: val for k, val in everything.items() if k[2] >= {0: 3, 1: 7, 2: 12}[k[1]]}
        poll_until([c], lambda: len(c.records) >= len(want), 30, "the records after the commit")
        c.poll()
        assert_exactly_once([c], want)
    finally:
        close_all([a, b, c])


@pytest.mark.parametrize("how", ["restart", "kill9"])
@KJS
def test_committed_offsets_survive_server_restart(server, kafkajs_harness, client, how):
    topic, group = f"durable-{how}", f"durable-group-{how}"
    h = kafkajs_harness()
    h.ok("create_topic", topic=topic, partitions=3)
    sent = produce(h, topic, 3, 20, "durable")
    m = Member(h, "durable-a", group, [topic]).subscribe()
    expected = [[0, 5, "a"], [1, 11, "b"], [2, 6, "first"]]
    try:
        poll_until([m], lambda: len(m.records) >= len(sent), 30, "all records")
        m.commit([[topic, 0, 2, "x"], [topic, 1, 4, "y"], [topic, 2, 6, "first"]])
        m.commit([[topic, 0, 5, "a"], [topic, 1, 11, "b"]])
        assert h.ok("committed", group=group, topic=topic, partitions=3)["committed"] == expected
        m.close()
        other = Member(h, "durable-other", group + "-other", [topic]).subscribe()
        poll_until([other], lambda: len(other.records) >= len(sent), 30, "all records")
        other.commit()
        other.close()

        server.restart() if how == "restart" else server.kill9()
        # A fresh client: nothing cached from before the restart.
        h = kafkajs_harness(bootstrap=server.bootstrap)
        assert h.ok("committed", group=group, topic=topic, partitions=3)["committed"] == expected
        assert h.ok("group_offsets", group=group)["offsets"] == [[topic] + row for row in expected]
        # (kafkajs' fetchOffsets turns the empty metadata into null:
        # `metadata: metadata || null`, src/admin/index.js.)
        assert h.ok("group_offsets", group=group + "-other")["offsets"] == \
            [[topic, p, 20, None] for p in range(3)]
        after = Member(h, "durable-b", group, [topic]).subscribe()
        try:
            want = {k: val for k, val in sent.items() if k[2] >= {0: 5, 1: 11, 2: 6}[k[1]]}
            poll_until([after], lambda: len(after.records) >= len(want), 30, "the rest")
            after.poll()
            assert_exactly_once([after], want)
        finally:
            after.close()
    except BaseException:
        print(f"\n----- server stderr ({server.stderr_path}) -----\n{server.stderr_tail(60)}")
        raise


@KJS
def test_default_assignor_round_robin(js, client):
    topics = {"rr-kafkajs-x": 3, "rr-kafkajs-y": 4}
    group = "rr-group-kafkajs"
    for t, n in topics.items():
        js.ok("create_topic", topic=t, partitions=n)
    tps = all_tps(topics)
    members = [Member(js, f"rr-{i}", group, sorted(topics)) for i in range(3)]
    try:
        for m in members:
            m.subscribe()
        poll_until(members, lambda: balanced(members, tps), 30, "a complete assignment")
        d = describe(js, group)
        assert d["state"] == "Stable" and d["protocol"] == "RoundRobinAssigner", d
        got = {x["member_id"]: x["assignment"] for x in d["members"]}
        # RoundRobinAssigner: member ids sorted, topic-partitions in
        # subscription order dealt out one by one.
        ms = sorted(got)
        want: dict[str, list[TP]] = {mid: [] for mid in ms}
        order = [(t, p) for t in sorted(topics) for p in range(topics[t])]
        for i, tp in enumerate(order):
            want[ms[i % len(ms)]].append(tp)
        assert got == {mid: sorted(v) for mid, v in want.items()}
        assert sorted(sorted(m.assignment) for m in members) == sorted(got.values())
    finally:
        close_all(members)


@KJS
def test_admin_consumer_groups(js, client):
    topic, group = "admin-kafkajs", "admin-group-kafkajs"
    js.ok("create_topic", topic=topic, partitions=3)
    sent = produce(js, topic, 3, 10, "admin")
    members = [Member(js, f"admin-{i}", group, [topic]) for i in range(2)]
    try:
        for m in members:
            m.subscribe()
        poll_until(members, lambda: balanced(members, all_tps({topic: 3})), 30, "a balanced assignment")
        poll_until(members, lambda: sum(len(m.records) for m in members) >= len(sent), 30, "the records")
        owner = {tp: m for m in members for tp in m.assignment}
        for p, off in ((0, 4), (1, 10), (2, 7)):
            owner[(topic, p)].commit([[topic, p, off, f"meta-{p}"]])

        assert group in js.ok("list_groups")["groups"]
        d = describe(js, group)
        assert d["group"] == group and d["state"] == "Stable" and d["protocol"] == "RoundRobinAssigner", d
        assert len(d["members"]) == 2
        for x in d["members"]:
            assert x["client_id"] == "trireme-harness", x
            assert x["member_id"].startswith("trireme-harness-"), x
            assert x["host"].lstrip("/") == "127.0.0.1", x
        assert sorted(x["assignment"] for x in d["members"]) == sorted(sorted(m.assignment) for m in members)
        expected_offsets = [[topic, 0, 4, "meta-0"], [topic, 1, 10, "meta-1"], [topic, 2, 7, "meta-2"]]
        assert js.ok("group_offsets", group=group)["offsets"] == expected_offsets

        # The harness reports only kafkajs' wrapper error (the per-group
        # GROUP_NOT_EMPTY sits in err.groups[].error, which it drops); the
        # group and its offsets must be untouched.
        r = js.call("delete_group", group=group)
        assert not r["ok"] and r["error_class"] == "KafkaJSDeleteGroupsError", r
        assert group in js.ok("list_groups")["groups"]
        assert js.ok("group_offsets", group=group)["offsets"] == expected_offsets

        close_all(members)
        d = describe(js, group)
        assert d["state"] == "Empty" and d["members"] == [], d
        assert group in js.ok("list_groups")["groups"]
        assert js.ok("group_offsets", group=group)["offsets"] == expected_offsets

        js.ok("delete_group", group=group)
        assert group not in js.ok("list_groups")["groups"]
        assert js.ok("group_offsets", group=group)["offsets"] == []
        d = describe(js, group)
        assert d["state"] == "Dead" and d["members"] == [], d
        r = js.call("delete_group", group=group)
        assert not r["ok"] and r["error_class"] == "KafkaJSDeleteGroupsError", r
    finally:
        close_all(members)
