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
from typing import Iterator

import pytest

from compat_tests import clients
from compat_tests.python_clients import unique_topic
from compat_tests.group_members import (HEARTBEAT_MS, SESSION_MS, TP, Member, all_tps,
                                        assert_exactly_once, balanced, close_all, describe,
                                        poll_rounds, poll_until, produce, subscribe_balanced)
from compat_tests.harness_helpers import harness_pool, pooled_harness

KJS = pytest.mark.parametrize("client", ["kafkajs"])


# ------------------------------------------------------------------ fixtures

@pytest.fixture(scope="module")
def js_pool(module_server) -> Iterator[dict[str, clients.HarnessProcess]]:
    yield from harness_pool()


@pytest.fixture
def js(request, js_pool, module_server) -> Iterator[clients.HarnessProcess]:
    """One kafkajs harness process shared by the module's tests."""
    clients.require_kafkajs()
    yield from pooled_harness(request, js_pool, "kafkajs",
                              lambda: clients.kafkajs_harness(module_server.bootstrap),
                              module_server)


# ---------------------------------------------------------------------- tests

@KJS
def test_group_shares_partitions(js, client):
    topic, group = unique_topic("share-kafkajs"), unique_topic("share-group-kafkajs")
    js.ok("create_topic", topic=topic, partitions=6)
    tps = all_tps({topic: 6})
    members = [Member(js, f"share-{i}", group, [topic]) for i in range(3)]
    try:
        subscribe_balanced(members, tps, "a balanced 3-way assignment")
        assert all(len(m.assignment) == 2 for m in members), members
        sent = produce(js, topic, 6, 40, "share")
        poll_until(members, lambda: sum(len(m.records) for m in members) >= len(sent), 30,
                   "all records to be consumed")
        poll_rounds(members)
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
    topic, group = unique_topic("close-kafkajs"), unique_topic("close-group-kafkajs")
    js.ok("create_topic", topic=topic, partitions=6)
    tps = all_tps({topic: 6})
    members = [Member(js, f"close-{i}", group, [topic]) for i in range(3)]
    try:
        subscribe_balanced(members, tps, "a balanced 3-way assignment")
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
    topic, group = unique_topic("kill-kafkajs"), unique_topic("kill-group-kafkajs")
    js.ok("create_topic", topic=topic, partitions=6)
    tps = all_tps({topic: 6})
    victim_h = kafkajs_harness()
    survivors = [Member(js, f"kill-{i}", group, [topic]) for i in range(2)]
    victim = Member(victim_h, "victim", group, [topic])
    members = survivors + [victim]
    try:
        subscribe_balanced(members, tps, "a balanced 3-way assignment")
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
    topic, group = unique_topic("resume-kafkajs"), unique_topic("resume-group-kafkajs")
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
    topic, group = unique_topic(f"durable-{how}"), unique_topic(f"durable-group-{how}")
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
def test_default_assignor_round_robin(js, client, broker):
    topics = {unique_topic("rr-kafkajs-x"): 3, unique_topic("rr-kafkajs-y"): 4}
    group = unique_topic("rr-group-kafkajs")
    for t, n in topics.items():
        js.ok("create_topic", topic=t, partitions=n)
    tps = all_tps(topics)
    members = [Member(js, f"rr-{i}", group, sorted(topics)) for i in range(3)]
    try:
        subscribe_balanced(members, tps, "a complete assignment")
        d = describe(js, group)
        assert d["state"] == "Stable" and d["protocol"] == "RoundRobinAssigner", d
        got = {x["member_id"]: x["assignment"] for x in d["members"]}
        # RoundRobinAssigner: member ids sorted, topic-partitions in
        # subscription order (partitions in the broker's Metadata order) dealt out one by one.
        ms = sorted(got)
        want: dict[str, list[TP]] = {mid: [] for mid in ms}
        order = [(t, p) for t in sorted(topics) for p in broker.partitions(t)]
        for i, tp in enumerate(order):
            want[ms[i % len(ms)]].append(tp)
        assert got == {mid: sorted(v) for mid, v in want.items()}
        assert sorted(sorted(m.assignment) for m in members) == sorted(got.values())
    finally:
        close_all(members)


@KJS
def test_admin_consumer_groups(js, client):
    topic, group = unique_topic("admin-kafkajs"), unique_topic("admin-group-kafkajs")
    js.ok("create_topic", topic=topic, partitions=3)
    sent = produce(js, topic, 3, 10, "admin")
    members = [Member(js, f"admin-{i}", group, [topic]) for i in range(2)]
    try:
        subscribe_balanced(members, all_tps({topic: 3}), "a balanced assignment")
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
