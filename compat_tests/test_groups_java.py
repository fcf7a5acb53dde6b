"""Consumer groups (classic protocol) with the stock Apache Kafka Java client
3.9.0 and 4.3.0 against a real Trireme process.

Java 4.x still defaults to ``group.protocol=classic`` (ConsumerConfig's
DEFAULT_GROUP_PROTOCOL is GroupProtocol.CLASSIC in the 4.3.0 jar), so both
versions run the JoinGroup/SyncGroup/Heartbeat protocol here with their
default configuration; Trireme does not advertise ConsumerGroupHeartbeat.

* ``test_group_shares_partitions``: three members of one group on a
  6-partition topic get disjoint, complete shares; every record is consumed
  exactly once across the group.
* ``test_group_close_hands_over_partitions``: a member that closes
  (LeaveGroup) hands its partitions to the others well within the session
  timeout, and they resume from its committed offsets.
* ``test_group_killed_member_expires_after_session_timeout``: a member whose
  process is SIGKILLed (no LeaveGroup, no heartbeats) keeps its partitions
  until the session timeout, then loses them.
* ``test_committed_offsets_resume_after_close``: commitSync() (positions) and
  commitSync(offsets, metadata); new members resume exactly there.
* ``test_committed_offsets_survive_server_restart[restart|kill9]``:
  committed offsets/metadata survive a graceful restart and a SIGKILL.
* ``test_static_member_rejoins_without_rebalance``: group.instance.id.  The
  Java client does not send LeaveGroup when a static member closes (3.9:
  AbstractCoordinator.maybeLeaveGroup sends it only if isDynamicMember(); 4.3:
  shouldSendLeaveGroupRequest() is true only for a dynamic member with
  CloseOptions DEFAULT or for LEAVE_GROUP, and KafkaConsumer.close(Duration)
  uses DEFAULT).  Rejoining with the same instance id within the session
  timeout (as leader and as follower) gets the same assignment in the same
  generation, and the other member sees no revocation; a static member that
  does not come back is expired after the session timeout.
* ``test_assignor[range|roundrobin|cooperative-sticky]``: the exact
  assignments the client-side assignors compute, and incremental cooperative
  rebalancing when a second member joins.
* ``test_admin_consumer_groups``: AdminClient listConsumerGroups,
  describeConsumerGroups, listConsumerGroupOffsets, deleteConsumerGroups and
  deleteConsumerGroupOffsets.  The harness has no op for
  deleteConsumerGroupOffsets, so this module runs a small Java program of its
  own (``DELETE_OFFSETS_JAVA`` below, java's source-file launcher on the
  harness classpath).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest

from compat_tests import clients
from compat_tests.python_clients import unique_topic
from compat_tests.group_members import (HEARTBEAT_MS, SESSION_MS, TP, Member, all_tps,
                                        assert_exactly_once, balanced, close_all, describe,
                                        events_of, poll_rounds, poll_until, produce,
                                        subscribe_balanced)
from compat_tests.harness_helpers import harness_pool, pooled_harness

VERSIONS = clients.JAVA_VERSIONS
ASSIGNORS = {
    "range": "org.apache.kafka.clients.consumer.RangeAssignor",
    "roundrobin": "org.apache.kafka.clients.consumer.RoundRobinAssignor",
    "cooperative-sticky": "org.apache.kafka.clients.consumer.CooperativeStickyAssignor",
}


# ------------------------------------------------------------------ fixtures

@pytest.fixture(scope="module")
def java_pool(module_server) -> Iterator[dict[str, clients.HarnessProcess]]:
    """One long-lived harness process per Java client version for the module
    (every test uses its own topics, groups and consumer handles)."""
    yield from harness_pool()


@pytest.fixture
def java(request, java_pool, module_server, java_version) -> Iterator[clients.HarnessProcess]:
    clients.require_java(java_version)
    yield from pooled_harness(request, java_pool, java_version,
                              lambda: clients.java_harness(java_version, module_server.bootstrap),
                              module_server)


# ------------------------------------------------ deleteConsumerGroupOffsets

DELETE_OFFSETS_JAVA = r"""
import java.util.*;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.*;
import org.apache.kafka.common.TopicPartition;

/** args: bootstrap group topic partition... -> one JSON line: per-partition errors. */
public class DeleteGroupOffsets {
    public static void main(String[] a) throws Exception {
        Properties p = new Properties();
        p.put("bootstrap.servers", a[0]);
        p.put("request.timeout.ms", "10000");
        p.put("default.api.timeout.ms", "10000");
        String secured = System.getenv("CLIENT_PROPERTIES");   // a secured listener's settings (a properties file)
        if (secured != null) try (java.io.FileReader r = new java.io.FileReader(secured)) { p.load(r); }
        Set<TopicPartition> tps = new LinkedHashSet<>();
        for (int i = 3; i < a.length; i++) tps.add(new TopicPartition(a[2], Integer.parseInt(a[i])));
        StringBuilder out = new StringBuilder("{\"ok\":true,\"partitions\":{");
        try (Admin admin = Admin.create(p)) {
            DeleteConsumerGroupOffsetsResult r = admin.deleteConsumerGroupOffsets(a[1], tps);
            boolean first = true;
            for (TopicPartition tp : tps) {
                String err = "null";
                try {
                    r.partitionResult(tp).get(15, TimeUnit.SECONDS);
                } catch (java.util.concurrent.ExecutionException e) {
                    err = "\"" + e.getCause().getClass().getSimpleName() + "\"";
                }
                if (!first) out.append(',');
                first = false;
                out.append('"').append(tp.partition()).append("\":").append(err);
            }
            String all = "null";
            try {
                r.all().get(15, TimeUnit.SECONDS);
            } catch (java.util.concurrent.ExecutionException e) {
                all = "\"" + e.getCause().getClass().getSimpleName() + "\"";
            }
            out.append("},\"all\":").append(all).append('}');
        }
        System.out.println(out);
    }
}
"""


def delete_group_offsets(version: str, bootstrap: str, group: str, topic: str,
                         partitions: list[int], workdir: Path) -> dict:
    """Admin.deleteConsumerGroupOffsets through DELETE_OFFSETS_JAVA -> {"partitions":
    {"<p>": null | "<ExceptionClass>"}, "all": null | "<ExceptionClass>"}."""
    cp = clients.java_classpath(version)
    assert cp, f"Java client {version} not built"
    src = workdir / "DeleteGroupOffsets.java"
    src.write_text(DELETE_OFFSETS_JAVA)
    env = dict(os.environ)
    if clients.DEFAULT_SECURITY is not None:        # a run against a secured listener (--command-config)
        props = workdir / "client.properties"
        props.write_text("".join(f"{k}={v}\n" for k, v in clients.DEFAULT_SECURITY.java().items()))
        env["CLIENT_PROPERTIES"] = str(props)
    proc = subprocess.run(["java", "-XX:TieredStopAtLevel=1", "-cp", cp, str(src), bootstrap, group, topic,
                           *map(str, partitions)], capture_output=True, timeout=90, env=env)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-3000:]
    return json.loads(proc.stdout.decode().strip().splitlines()[-1])


# ---------------------------------------------------------------------- tests

def test_group_shares_partitions(java, java_version):
    v = java_version
    topic, group = unique_topic(f"share-{v}"), unique_topic(f"share-group-{v}")
    java.ok("create_topic", topic=topic, partitions=6)
    tps = all_tps({topic: 6})
    members = [Member(java, f"share-{v}-{i}", group, [topic]) for i in range(3)]
    try:
        subscribe_balanced(members, tps, "a balanced 3-way assignment")
        assert all(len(m.assignment) == 2 for m in members), members
        sent = produce(java, topic, 6, 40, "share")
        poll_until(members, lambda: sum(len(m.records) for m in members) >= len(sent), 30,
                   "all records to be consumed")
        poll_rounds(members)      # anything delivered twice would show up now
        assert_exactly_once(members, sent)
        for m in members:
            assert {(r["topic"], r["partition"]) for r in m.records} == set(m.assignment), m
            assert not events_of(m, "lost")
        d = describe(java, group)
        assert d["state"] == "Stable" and d["protocol"] == "range", d
        assert sorted(x["assignment"] for x in d["members"]) == sorted(sorted(m.assignment) for m in members)
    finally:
        close_all(members)


def test_group_close_hands_over_partitions(java, java_version):
    v = java_version
    topic, group = unique_topic(f"close-{v}"), unique_topic(f"close-group-{v}")
    java.ok("create_topic", topic=topic, partitions=6)
    tps = all_tps({topic: 6})
    members = [Member(java, f"close-{v}-{i}", group, [topic]) for i in range(3)]
    try:
        subscribe_balanced(members, tps, "a balanced 3-way assignment")
        first = produce(java, topic, 6, 20, "close-1")
        poll_until(members, lambda: sum(len(m.records) for m in members) >= len(first), 30,
                   "the first batch")
        assert_exactly_once(members, first)
        for m in members:
            m.commit()
        leaver, survivors = members[2], members[:2]
        before = {m.handle: set(m.assignment) for m in survivors}
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
        gained = set().union(*(set(m.assignment) for m in survivors)) - set().union(*before.values())
        assert gained == leaver_tps

        second = produce(java, topic, 6, 20, "close-2")
        poll_until(survivors, lambda: sum(len(m.records) for m in survivors) >= len(second), 30,
                   "the second batch")
        for m in survivors:
            m.poll()
        # Nothing of the first batch again: the new owners start at the
        # committed offsets, including the ones the leaver committed.
        assert_exactly_once(survivors, second)
        d = describe(java, group)
        assert d["state"] == "Stable" and len(d["members"]) == 2, d
    finally:
        close_all(members)


def test_group_killed_member_expires_after_session_timeout(java, java_version, java_harness):
    v = java_version
    topic, group = unique_topic(f"kill-{v}"), unique_topic(f"kill-group-{v}")
    java.ok("create_topic", topic=topic, partitions=6)
    tps = all_tps({topic: 6})
    victim_h = java_harness(v)
    survivors = [Member(java, f"kill-{v}-{i}", group, [topic]) for i in range(2)]
    victim = Member(victim_h, "victim", group, [topic])
    members = survivors + [victim]
    try:
        subscribe_balanced(members, tps, "a balanced 3-way assignment")
        victim_tps = set(victim.assignment)
        for m in survivors:
            m.take_events()
        t0 = time.monotonic()
        victim_h.kill()            # SIGKILL: no LeaveGroup, heartbeats just stop
        victim.open = False
        poll_until(survivors, lambda: balanced(survivors, tps), SESSION_MS / 1000 + 15,
                   "the survivors to take over")
        took = time.monotonic() - t0
        # Expired at (last heartbeat + session timeout); the last heartbeat was
        # at most one heartbeat interval before the kill.
        assert took >= (SESSION_MS - HEARTBEAT_MS) / 1000 - 0.5, \
            f"partitions moved {took:.1f}s after the kill, before the session timeout"
        assert took < SESSION_MS / 1000 + 5, f"takeover took {took:.1f}s"
        assert victim_tps <= {tp for m in survivors for tp in m.assignment}
        d = describe(java, group)
        assert d["state"] == "Stable" and len(d["members"]) == 2, d
    finally:
        close_all(survivors)


def test_committed_offsets_resume_after_close(java, java_version):
    v = java_version
    topic, group = unique_topic(f"resume-{v}"), unique_topic(f"resume-group-{v}")
    java.ok("create_topic", topic=topic, partitions=3)
    first = produce(java, topic, 3, 10, "resume-1")
    a = Member(java, f"resume-{v}-a", group, [topic]).subscribe()
    b = Member(java, f"resume-{v}-b", group, [topic])
    c = Member(java, f"resume-{v}-c", group, [topic])
    try:
        poll_until([a], lambda: len(a.records) >= len(first), 30, "the first batch")
        a.poll()
        assert_exactly_once([a], first)
        a.commit()     # commitSync(): the positions, 10 in each partition
        assert a.committed(topic, 3) == [[p, 10, ""] for p in range(3)]
        a.close()

        second = produce(java, topic, 3, 5, "resume-2")
        b.subscribe()
        poll_until([b], lambda: len(b.records) >= len(second), 30, "the second batch")
        b.poll()
        assert_exactly_once([b], second)      # from offset 10 on, nothing before
        b.commit([[topic, 0, 3, "m0"], [topic, 1, 7, "m1"], [topic, 2, 12, ""]])
        assert b.committed(topic, 3) == [[0, 3, "m0"], [1, 7, "m1"], [2, 12, ""]]
        b.close()

        c.subscribe()
        everything = {**first, **second}
        want = {k: val for k, val in everything.items() if k[2] >= {0: 3, 1: 7, 2: 12}[k[1]]}
        poll_until([c], lambda: len(c.records) >= len(want), 30, "the records after the commit")
        c.poll()
        assert_exactly_once([c], want)
        assert c.committed(topic, 3) == [[0, 3, "m0"], [1, 7, "m1"], [2, 12, ""]]
    finally:
        close_all([a, b, c])


@pytest.mark.parametrize("how", ["restart", "kill9"])
def test_committed_offsets_survive_server_restart(server, java_harness, java_version, how, request):
    v = java_version
    topic, group = unique_topic(f"durable-{how}"), unique_topic(f"durable-group-{how}")
    h = java_harness(v)
    h.ok("create_topic", topic=topic, partitions=3)
    sent = produce(h, topic, 3, 20, "durable")
    m = Member(h, "durable-a", group, [topic]).subscribe()
    expected = [[0, 5, "a"], [1, 11, "b"], [2, 6, "first"]]
    try:
        poll_until([m], lambda: len(m.records) >= len(sent), 30, "all records")
        m.commit([[topic, 0, 2, "x"], [topic, 1, 4, "y"], [topic, 2, 6, "first"]])
        m.commit([[topic, 0, 5, "a"], [topic, 1, 11, "b"]])   # later commits win
        assert m.committed(topic, 3) == expected
        m.close()
        # Another group commits through commitSync() after consuming everything.
        other = Member(h, "durable-other", group + "-other", [topic]).subscribe()
        poll_until([other], lambda: len(other.records) >= len(sent), 30, "all records")
        other.commit()
        other.close()

        server.restart() if how == "restart" else server.kill9()
        if server.bootstrap != h.bootstrap:      # the old port could not be bound again
            h = java_harness(v, bootstrap=server.bootstrap)

        assert h.ok("committed", topic=topic, partitions=3, group=group)["committed"] == expected
        assert h.ok("group_offsets", group=group)["offsets"] == [[topic] + row for row in expected]
        assert h.ok("group_offsets", group=group + "-other")["offsets"] == \
            [[topic, p, 20, ""] for p in range(3)]
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


JOINED = re.compile(r"Successfully joined group with generation Generation\{generationId=(-?\d+), "
                    r"memberId='([^']*)'")


def joined_generations(h: clients.HarnessProcess) -> list[tuple[int, str]]:
    """(generation, member id) of every 'Successfully joined group' the client logged."""
    return [(int(g), mid) for g, mid in JOINED.findall(h.stderr_path.read_text(errors="replace"))]


def logged_instances(h: clients.HarnessProcess, message: str) -> list[str]:
    """Instance ids of the static consumers that logged ``message``."""
    pat = re.compile(r"\[Consumer instanceId=([^,]+),[^\]]*\] " + re.escape(message))
    return pat.findall(h.stderr_path.read_text(errors="replace"))


def test_static_member_rejoins_without_rebalance(java_version, module_server, java_harness):
    v = java_version
    topic, group = unique_topic(f"static-{v}"), unique_topic(f"static-group-{v}")
    h = java_harness(v, log_level="INFO")   # the client logs its generations at INFO
    h.ok("create_topic", topic=topic, partitions=4)
    tps = all_tps({topic: 4})
    ids = {"a": f"static-{v}-a", "b": f"static-{v}-b"}

    def static(name: str, n: int) -> Member:
        return Member(h, f"static-{name}{n}", group, [topic], config={"group.instance.id": ids[name]})

    members = {"a": static("a", 0).subscribe(), "b": static("b", 0).subscribe()}
    opened = list(members.values())
    try:
        poll_until(list(members.values()), lambda: balanced(list(members.values()), tps), 30,
                   "a balanced assignment")
        assignment = {k: sorted(m.assignment) for k, m in members.items()}
        d0 = describe(h, group)
        assert d0["state"] == "Stable", d0
        assert {x["group_instance_id"]: x["assignment"] for x in d0["members"]} == \
            {ids[k]: a for k, a in assignment.items()}
        generation = max(g for g, _ in joined_generations(h))
        leaders = logged_instances(h, f"Finished assignment for group at generation {generation}:")
        assert len(leaders) == 1, leaders
        returned_leaders: list[str] = []
        member_ids = {x["group_instance_id"]: x["member_id"] for x in d0["members"]}

        # Restart each member in turn within the session timeout: one of them
        # is the leader (read from the client log above), the other a follower.
        for n, (name, other) in enumerate((("a", "b"), ("b", "a")), start=1):
            members[other].take_events()
            members[name].close()                 # static: no LeaveGroup
            d = describe(h, group)
            assert ids[name] in {x["group_instance_id"] for x in d["members"]}, \
                f"the closed static member left the group: {d}"
            t0 = time.monotonic()
            fresh = members[name] = static(name, n).subscribe()
            opened.append(fresh)
            poll_until([fresh, members[other]], lambda: bool(fresh.assignment), SESSION_MS / 1000,
                       f"static member {name} to get its partitions back")
            took = time.monotonic() - t0
            assert took < SESSION_MS / 1000
            poll_rounds([fresh, members[other]])
            assert sorted(fresh.assignment) == assignment[name]
            assert events_of(fresh, "assigned") == [assignment[name]] and not events_of(fresh, "revoked")
            assert members[other].events == [], \
                f"member {other} saw a rebalance when static member {name} came back"
            assert sorted(members[other].assignment) == assignment[other]
            d = describe(h, group)
            assert d["state"] == "Stable" and len(d["members"]) == 2, d
            by_instance = {x["group_instance_id"]: x for x in d["members"]}
            assert by_instance[ids[name]]["member_id"] != member_ids[ids[name]], \
                "the rejoined static member kept its old member id"
            member_ids[ids[name]] = by_instance[ids[name]]["member_id"]
            assert {i: x["assignment"] for i, x in by_instance.items()} == \
                {ids[k]: a for k, a in assignment.items()}
            rejoined = [g for g, mid in joined_generations(h) if mid == member_ids[ids[name]]]
            assert rejoined == [generation], \
                f"static rejoin of {name}: joined generations {rejoined}, group generation {generation}"
            # KIP-814: a returning static leader is told to skip the assignment.
            skipped = logged_instances(h, "Skipped assignment for returning static leader at generation "
                                          f"{generation}.")
            if ids[name] in leaders:
                returned_leaders.append(ids[name])
            assert skipped == returned_leaders, (skipped, leaders)

        assert returned_leaders == leaders     # the leader was restarted, and skipped the assignment
        # A static member that does not come back is removed only by the
        # session timeout.
        gone, stay = members["b"], members["a"]
        stay.take_events()
        gone.close()
        t0 = time.monotonic()
        poll_until([stay], lambda: set(stay.assignment) == tps, SESSION_MS / 1000 + 15,
                   "the remaining member to take everything")
        took = time.monotonic() - t0
        assert took >= (SESSION_MS - HEARTBEAT_MS) / 1000 - 0.5, \
            f"a closed static member's partitions moved after {took:.1f}s, before the session timeout"
        d = describe(h, group)
        assert [x["group_instance_id"] for x in d["members"]] == [ids["a"]], d
        assert max(g for g, _ in joined_generations(h)) > generation
    except BaseException:
        print(f"\n----- server stderr tail -----\n{module_server.stderr_tail(60)}")
        raise
    finally:
        close_all(opened)


def range_expected(member_ids: list[str], topics: dict[str, int]) -> dict[str, list[TP]]:
    ms = sorted(member_ids)
    out: dict[str, list[TP]] = {m: [] for m in ms}
    for t, n in sorted(topics.items()):
        per, extra = divmod(n, len(ms))
        start = 0
        for i, m in enumerate(ms):
            k = per + (1 if i < extra else 0)
            out[m] += [(t, p) for p in range(start, start + k)]
            start += k
    return {m: sorted(v) for m, v in out.items()}


def roundrobin_expected(member_ids: list[str], topics: dict[str, int]) -> dict[str, list[TP]]:
    ms = sorted(member_ids)
    out: dict[str, list[TP]] = {m: [] for m in ms}
    for i, tp in enumerate(sorted(all_tps(topics))):
        out[ms[i % len(ms)]].append(tp)
    return {m: sorted(v) for m, v in out.items()}


@pytest.mark.parametrize("assignor", list(ASSIGNORS))
def test_assignor(java, java_version, assignor):
    v = java_version
    topics = {f"asg-{assignor}-{v}-x": 3, f"asg-{assignor}-{v}-y": 3}
    group = unique_topic(f"asg-group-{assignor}-{v}")
    for t, n in topics.items():
        java.ok("create_topic", topic=t, partitions=n)
    tps = all_tps(topics)
    cfg = {"partition.assignment.strategy": ASSIGNORS[assignor]}
    members = [Member(java, f"asg-{assignor}-{v}-{i}", group, sorted(topics), cfg) for i in range(2)]
    try:
        if assignor != "cooperative-sticky":
            subscribe_balanced(members, tps, "a complete assignment")
            d = describe(java, group)
            assert d["state"] == "Stable" and d["protocol"] == assignor, d
            got = {x["member_id"]: x["assignment"] for x in d["members"]}
            fn = range_expected if assignor == "range" else roundrobin_expected
            assert got == fn(list(got), topics)
            assert sorted(sorted(m.assignment) for m in members) == sorted(got.values())
            return

        # Incremental cooperative rebalancing: the first member owns all six;
        # when the second joins, the first gives up only what moves (first
        # rebalance: revoke, second: assign to the newcomer) and keeps the rest
        # without interruption.
        first, second = members
        first.subscribe()
        poll_until([first], lambda: set(first.assignment) == tps, 30, "the first member to own all")
        sent = produce(java, sorted(topics)[0], 3, 10, "coop")
        poll_until([first], lambda: len(first.records) >= len(sent), 30, "the records")
        first.commit()
        first.take_events()
        second.subscribe()
        poll_until(members, lambda: balanced(members, tps), 30, "the cooperative rebalance")
        poll_rounds(members)
        assert len(first.assignment) == 3 and len(second.assignment) == 3, members
        revoked = [tp for ps in events_of(first, "revoked") for tp in ps]
        assert sorted(revoked) == sorted(second.assignment), \
            f"first member revoked {revoked}, newcomer owns {second.assignment}"
        assert set(revoked).isdisjoint(first.assignment)
        assert not events_of(first, "lost")
        assigned_to_first = [tp for ps in events_of(first, "assigned") for tp in ps]
        assert assigned_to_first == [], "cooperative: nothing is (re)assigned to the member that keeps its partitions"
        assert sorted(tp for ps in events_of(second, "assigned") for tp in ps) == sorted(second.assignment)
        assert not second.records, "the commit covered everything; the newcomer re-read records"
        d = describe(java, group)
        assert d["state"] == "Stable" and d["protocol"] == "cooperative-sticky", d
        assert sorted(x["assignment"] for x in d["members"]) == sorted(sorted(m.assignment) for m in members)
    finally:
        close_all(members)


def test_admin_consumer_groups(java, java_version, module_server, tmp_path, broker):
    v = java_version
    topic, group = unique_topic(f"admin-{v}"), unique_topic(f"admin-group-{v}")
    java.ok("create_topic", topic=topic, partitions=3)
    sent = produce(java, topic, 3, 10, "admin")
    members = [Member(java, f"admin-{v}-{i}", group, [topic]) for i in range(2)]
    try:
        subscribe_balanced(members, all_tps({topic: 3}), "a balanced assignment")
        poll_until(members, lambda: sum(len(m.records) for m in members) >= len(sent), 30, "the records")
        owner = {tp: m for m in members for tp in m.assignment}
        for p, off in ((0, 4), (1, 10), (2, 7)):
            owner[(topic, p)].commit([[topic, p, off, f"meta-{p}"]])

        assert group in java.ok("list_groups")["groups"]
        d = describe(java, group)
        assert d["group"] == group and d["state"] == "Stable" and d["protocol"] == "range", d
        assert d["coordinator"] == 1
        assert len(d["members"]) == 2
        for x in d["members"]:
            assert x["client_id"].startswith(f"consumer-{group}-"), x
            assert x["member_id"].startswith(x["client_id"] + "-"), x
            assert x["host"].lstrip("/") == "127.0.0.1", x
            assert x["group_instance_id"] is None
        assert sorted(x["assignment"] for x in d["members"]) == sorted(sorted(m.assignment) for m in members)
        expected_offsets = [[topic, 0, 4, "meta-0"], [topic, 1, 10, "meta-1"], [topic, 2, 7, "meta-2"]]
        assert java.ok("group_offsets", group=group)["offsets"] == expected_offsets

        r = java.call("delete_group", group=group)
        assert not r["ok"] and r["error"].startswith("GroupNotEmptyException"), r
        r = delete_group_offsets(v, module_server.bootstrap, group, topic, [1], tmp_path)
        assert r["all"] == "GroupSubscribedToTopicException", r
        assert java.ok("group_offsets", group=group)["offsets"] == expected_offsets

        close_all(members)
        d = describe(java, group)
        assert d["state"] == "Empty" and d["members"] == [], d
        assert group in java.ok("list_groups")["groups"]

        r = delete_group_offsets(v, module_server.bootstrap, group, topic, [1], tmp_path)
        assert r == {"ok": True, "partitions": {"1": None}, "all": None}, r
        assert java.ok("group_offsets", group=group)["offsets"] == [expected_offsets[0], expected_offsets[2]]

        java.ok("delete_group", group=group)
        assert group not in java.ok("list_groups")["groups"]
        assert java.ok("group_offsets", group=group)["offsets"] == []
        r = java.call("describe_group", group=group)
        if v == "3.9.0" or broker.api_versions[15][1] < 6:  # DescribeGroups v5: a missing group is Dead
            assert r["ok"] and r["state"] == "Dead" and r["members"] == [], r
        else:               # v6 (KIP-1043, Kafka 4.0): GROUP_ID_NOT_FOUND
            assert not r["ok"] and r["error"].startswith("GroupIdNotFoundException"), r
        r = java.call("delete_group", group=group)
        assert not r["ok"] and r["error"].startswith("GroupIdNotFoundException"), r
    finally:
        close_all(members)
