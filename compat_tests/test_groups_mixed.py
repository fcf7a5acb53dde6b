"""One consumer group, two client implementations: a confluent-kafka
(librdkafka) consumer and a stock Java consumer (3.9.0 and 4.3.0, through the
harness ``subscribe``/``poll``/``commit``/``committed`` ops) in the SAME group
on a 6-partition topic, against a real Trireme process.

Both are configured with the "roundrobin" assignor explicitly: Java's default
list is [range, cooperative-sticky] and librdkafka's is range,roundrobin, so
the group's protocol is pinned rather than left to the defaults' overlap.

``test_mixed_group_shares_partitions_and_offsets``:
* the two members get disjoint shares covering all partitions (the broker's
  DescribeGroups agrees) and consume every record exactly once between them;
* both commit; each reads the other's committed offsets;
* the confluent consumer leaves: Java takes over all partitions and resumes
  the confluent one's partitions at its committed offsets (nothing re-read,
  nothing skipped); Java commits and leaves; a new confluent consumer resumes
  at Java's committed offsets.
"""
from __future__ import annotations

import base64
import time

import pytest
from confluent_kafka import ConsumerGroupState, ConsumerGroupTopicPartitions
from confluent_kafka.admin import AdminClient

from compat_tests.test_groups_python import (ALL, HEARTBEAT_MS, OP_TIMEOUT_S, PARTITIONS,
                                             SESSION_MS, SETTLE_S, STABLE_TIMEOUT_S, Member,
                                             check_exactly_once, common, create_topic, ends,
                                             produce, unique, valid_cover, wait_consumed,
                                             wait_stable)

pytestmark = pytest.mark.timeout(150)

JAVA_ROUNDROBIN = "org.apache.kafka.clients.consumer.RoundRobinAssignor"


class JavaMember:
    """The harness's subscribed consumer ``handle``, polled from the test
    thread (a Java consumer only takes part in a rebalance while polled)."""

    def __init__(self, harness, handle: str, topic: str, group: str, client_id: str):
        self.h, self.handle, self.name = harness, handle, client_id
        self.records: list[tuple[int, int, bytes | None]] = []
        self.events: list[dict] = []
        self.assigned: frozenset[int] = frozenset()
        self.h.ok("subscribe", topic=topic, group=group, handle=handle,
                  config={"partition.assignment.strategy": JAVA_ROUNDROBIN,
                          "session.timeout.ms": str(SESSION_MS),
                          "heartbeat.interval.ms": str(HEARTBEAT_MS),
                          "client.id": client_id, "fetch.max.wait.ms": "100"})

    def poll(self, timeout_ms: int = 200) -> None:
        r = self.h.ok("poll", handle=self.handle, timeout_ms=timeout_ms)
        for rec in r["records"]:
            value = None if rec["value_b64"] is None else base64.b64decode(rec["value_b64"])
            self.records.append((rec["partition"], rec["offset"], value))
        self.events.extend(r["events"])
        self.assigned = frozenset(p for _, p in r["assignment"])

    # The interface check_exactly_once / wait_consumed use.
    def snapshot(self):
        return list(self.records), list(self.events)

    def check(self) -> None:
        pass

    def commit(self) -> None:
        self.h.ok("commit", handle=self.handle)

    def committed(self, topic: str, partitions) -> dict[int, int | None]:
        r = self.h.ok("committed", handle=self.handle, topic=topic, partitions=sorted(partitions))
        return {p: off for p, off, _ in r["committed"]}

    def close(self) -> None:
        self.h.ok("close_consumer", handle=self.handle)


def wait_mixed_stable(java: JavaMember, others: list[Member],
                      timeout: float = STABLE_TIMEOUT_S) -> list[frozenset[int]]:
    """Poll Java until its assignment and the others' are non-empty, disjoint,
    cover all partitions and stay so for SETTLE_S."""
    deadline = time.monotonic() + timeout
    seen, since = None, None
    while True:
        java.poll(200)
        for m in others:
            m.check()
        asg = [java.assigned] + [m.assigned for m in others]
        now = time.monotonic()
        if valid_cover(asg):
            if asg != seen:
                seen, since = asg, now
            elif now - since >= SETTLE_S:
                return asg
        else:
            seen = since = None
        if now > deadline:
            raise AssertionError(f"no stable disjoint cover within {timeout}s: java "
                                 f"{sorted(java.assigned)}, others {[sorted(m.assigned) for m in others]}")


def java_consume(java: JavaMember, group: list, total: int, timeout: float = 30.0) -> None:
    """Poll Java until the group (Java + threaded members) read ``total``."""
    deadline = time.monotonic() + timeout
    while sum(len(m.snapshot()[0]) for m in group) < total:
        assert time.monotonic() < deadline, (
            f"read {[(m.name, len(m.snapshot()[0])) for m in group]} of {total} records")
        java.poll(200)
    java.poll(500)                    # duplicates, if any, would show up now


@pytest.mark.parametrize("version", ["3.9.0", "4.3.0"])
def test_mixed_group_shares_partitions_and_offsets(module_server, java_harness, version):
    bs = module_server.bootstrap
    topic, group = unique("mixed-t"), unique("mixed-g")
    create_topic(bs, topic)
    admin = AdminClient(common(bs))
    h = java_harness(version)
    made: list[Member] = []
    try:
        java = JavaMember(h, "j", topic, group, client_id=f"{group}-java")
        conf = Member("confluent-kafka", bs, group, topic, assignor="roundrobin",
                      name=f"{group}-librdkafka")
        made.append(conf)
        asg_java, asg_conf = wait_mixed_stable(java, [conf])
        assert sorted([len(asg_java), len(asg_conf)]) == [3, 3]

        d = admin.describe_consumer_groups([group], request_timeout=OP_TIMEOUT_S)[group].result(
            timeout=OP_TIMEOUT_S)
        assert (d.state, d.partition_assignor) == (ConsumerGroupState.STABLE, "roundrobin")
        assert {m.client_id: frozenset(tp.partition for tp in m.assignment.topic_partitions)
                for m in d.members} == {java.name: asg_java, conf.name: asg_conf}
        # The Java AdminClient sees the same group.
        jd = h.ok("describe_group", group=group)
        assert (jd["state"], jd["protocol"]) == ("Stable", "roundrobin")
        assert {m["client_id"]: frozenset(p for _, p in m["assignment"]) for m in jd["members"]} == \
            {java.name: asg_java, conf.name: asg_conf}

        batch1 = produce(bs, topic, {p: 12 + 5 * p for p in range(PARTITIONS)}, "mix1")
        java_consume(java, [java, conf], len(batch1))
        check_exactly_once([java, conf], batch1)
        assert [java.assigned, conf.assigned] == [asg_java, asg_conf], "assignment changed"

        java.commit()
        conf.commit()
        want = ends(batch1)
        # Each reads what the OTHER committed (and its own).
        assert java.committed(topic, asg_conf) == {p: want[p] for p in asg_conf}
        assert conf.committed(asg_java) == {p: want[p] for p in asg_java}
        assert java.committed(topic, ALL) == want
        assert conf.committed(ALL) == want

        # The confluent member leaves; Java takes over its partitions and
        # starts them where librdkafka committed.
        conf.close()
        wait_mixed_stable(java, [])
        assert java.assigned == ALL
        seen_before = len(java.records)
        batch2 = produce(bs, topic, {p: 4 + p for p in range(PARTITIONS)}, "mix2")
        java_consume(java, [java], seen_before + len(batch2))
        new = java.records[seen_before:]
        got = {(p, o): v for p, o, v in new}
        assert len(new) == len(got), "Java read records twice"
        assert got == batch2, (f"Java did not resume at the committed offsets: read "
                               f"{sorted(set(got) - set(batch2))[:10]} beyond / missed "
                               f"{sorted(set(batch2) - set(got))[:10]}")
        java.commit()
        assert java.committed(topic, ALL) == ends(batch1, batch2)
        java.close()

        # And librdkafka resumes where Java committed.
        res = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)],
                                                request_timeout=OP_TIMEOUT_S)[group].result(
            timeout=OP_TIMEOUT_S)
        assert {tp.partition: tp.offset for tp in res.topic_partitions} == ends(batch1, batch2)
        batch3 = produce(bs, topic, {p: 2 for p in range(PARTITIONS)}, "mix3")
        again = Member("confluent-kafka", bs, group, topic, assignor="roundrobin",
                       name=f"{group}-librdkafka-2")
        made.append(again)
        assert again.committed() == ends(batch1, batch2)
        wait_stable([again])
        wait_consumed([again], len(batch3))
        check_exactly_once([again], batch3)
    finally:
        for m in made:
            if not m.closed:
                try:
                    m.close(timeout=15)
                except Exception:  # noqa: BLE001 - teardown of a failed test
                    pass
