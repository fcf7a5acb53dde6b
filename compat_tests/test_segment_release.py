"""Segments that go below the log start (DeleteRecords, retention) or with their topic, against a real Trireme
process: their files are gone from the data directory at once, and the broker lets go of them (their blocks freed
off the event loop) soon after."""
from __future__ import annotations

import os
import sys

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic

from compat_tests.clients import wait_until
from compat_tests.python_clients import OP_TIMEOUT_S, unique_topic

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/PID/fd (Linux)")]


def _deleted_files_held(server) -> list[str]:
    """The data directory's files the broker holds open though they were unlinked."""
    data = os.path.realpath(server.data_dir)
    held = []
    for fd in os.listdir(f"/proc/{server.proc.pid}/fd"):
        try:
            target = os.readlink(f"/proc/{server.proc.pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith(data) and target.endswith(" (deleted)"):
            held.append(target)
    return held


@pytest.mark.server_config({"log.retention.check.interval.ms": 200})
@pytest.mark.parametrize("how", ["delete_records", "retention", "delete_topic"])
def test_segments_below_the_log_start_are_removed_and_let_go(server, how):
    topic = unique_topic("release")
    configs = {"segment.bytes": str(1 << 20)}
    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1, config=configs)])[topic].result(timeout=OP_TIMEOUT_S)
    producer = Producer({"bootstrap.servers": server.bootstrap, "linger.ms": 5, "acks": "all"})
    for i in range(10_000):                   # ~10 MB: ten segments of 1 MiB
        producer.produce(topic, value=os.urandom(1000))
        producer.poll(0)
    assert producer.flush(OP_TIMEOUT_S) == 0
    directory = os.path.join(server.data_dir, "logs", f"{topic}-0")
    before = sorted(n for n in os.listdir(directory) if n.endswith(".log"))
    assert len(before) >= 8
    if how == "delete_records":
        (fut,) = admin.delete_records([TopicPartition(topic, 0, 9900)], request_timeout=OP_TIMEOUT_S,
                                      operation_timeout=OP_TIMEOUT_S).values()
        assert fut.result(timeout=OP_TIMEOUT_S).low_watermark == 9900
        after = sorted(n for n in os.listdir(directory) if n.endswith(".log"))    # gone at once
        assert len(after) <= 2 and after[-1] == before[-1]
    elif how == "delete_topic":
        admin.delete_topics([topic])[topic].result(timeout=OP_TIMEOUT_S)
        assert not os.path.exists(directory)                                      # gone at once
    else:       # retention.bytes set only now: set from the start, it races the producer on a slow machine
        resource = ConfigResource("topic", topic, incremental_configs=[
            ConfigEntry("retention.bytes", str(1 << 20), incremental_operation=AlterConfigOpType.SET)])
        admin.incremental_alter_configs([resource])[resource].result(timeout=OP_TIMEOUT_S)
        wait_until(lambda: len([n for n in os.listdir(directory) if n.endswith(".log")]) <= 2, timeout=60,
                   what="retention.bytes removing the old segments")
    wait_until(lambda: not _deleted_files_held(server), timeout=30,
               what="the broker letting go of the removed segments' files")
    assert "Traceback" not in server.log_text()
