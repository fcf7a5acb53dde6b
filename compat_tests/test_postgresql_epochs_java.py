"""The Java 4.3 consumer across leader epochs with the PostgreSQL engine: the broker restarted takes its partition
at a new epoch; the consumer, which validates its position against the new leader (OffsetsForLeaderEpoch with
the epoch of its last record), keeps consuming where it was: no truncation detected, no reset, no record twice."""
from __future__ import annotations

import time

import pytest

from compat_tests import clients
from compat_tests.group_members import Member
from compat_tests.python_clients import unique_topic
from trireme.testing import TriremeBroker

pytestmark = pytest.mark.trireme_only("starts a broker of its own on a PostgreSQL of its own")

VERSION = "4.3.0"


def _poll_until(member: Member, count: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while len(member.records) < count and time.monotonic() < deadline:
        member.poll()
    assert len(member.records) >= count, member.records


def test_the_java_consumer_keeps_its_position_across_new_leader_epochs(tmp_path, postgres_database):
    clients.require_java(VERSION)
    topic = unique_topic("pg-epochs")
    broker = TriremeBroker(topics={topic: 1}, mode="thread", data_dir=tmp_path / "broker",
                           config={"trireme.storage": "postgresql",
                                   "trireme.storage.postgresql.dsn": postgres_database})
    broker.start()
    h = None
    try:
        h = clients.java_harness(VERSION, broker.bootstrap)
        h.produce(topic, [clients.record(b"v%d" % i) for i in range(3)])
        member = Member(h, "epochs", f"group-{topic}", [topic],
                        config={"auto.offset.reset": "earliest", "metadata.max.age.ms": 500}).subscribe()
        _poll_until(member, 3)
        member.commit()
        for start in (3, 5):
            broker.restart()                # a new leader epoch; the consumer validates its position against it
            h.produce(topic, [clients.record(b"v%d" % i) for i in range(start, start + 2)])
            _poll_until(member, start + 2)
            member.commit()
        for _ in range(5):                  # nothing more comes (a reset would re-deliver from 0)
            member.poll()
        assert [(r["offset"], clients.decoded(r)["value"]) for r in member.records] == \
            [(i, b"v%d" % i) for i in range(7)]
        member.close()
    finally:
        if h is not None:
            h.close()
        broker.close()
