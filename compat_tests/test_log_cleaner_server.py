"""The log cleaner's runtime against a real Trireme process: retention by cleanup.policy, segment.ms rolling,
cleaning of compacted topics, dump-log."""
from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from compat_tests.clients import wait_until
from compat_tests.python_clients import OP_TIMEOUT_S, unique_topic

pytestmark = pytest.mark.timeout(120)

HOUR_MS = 3_600_000


def _create(server, name: str, configs: dict[str, str]) -> None:
    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    admin.create_topics([NewTopic(name, 1, 1, config=configs)])[name].result(timeout=OP_TIMEOUT_S)


def _produce(server, topic: str, items, timestamp_ms: int | None = None) -> None:
    producer = Producer({"bootstrap.servers": server.bootstrap, "linger.ms": 0, "batch.num.messages": 1})
    for key, value in items:
        kwargs = {"timestamp": timestamp_ms} if timestamp_ms is not None else {}
        producer.produce(topic, key=key, value=value, **kwargs)
        producer.flush(OP_TIMEOUT_S)     # one batch per record: many segments
    assert producer.flush(OP_TIMEOUT_S) == 0


def _watermarks(server, topic: str) -> tuple[int, int]:
    consumer = Consumer({"bootstrap.servers": server.bootstrap, "group.id": "wm"})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=OP_TIMEOUT_S, cached=False)
    finally:
        consumer.close()


@pytest.mark.server_config({"log.retention.check.interval.ms": 100})
def test_time_and_size_retention_only_where_the_policy_includes_delete(server):
    """Kafka's UnifiedLog.deleteOldSegments: retention.ms / retention.bytes delete segments only when
    cleanup.policy includes delete; a compact-only topic keeps everything for the cleaner."""
    old = int(time.time() * 1000) - HOUR_MS          # past retention.ms below
    topics = {policy: unique_topic(f"retention-{policy.replace(',', '-')}") for policy in
              ("compact", "delete", "compact,delete")}
    for policy, name in topics.items():
        _create(server, name, {"cleanup.policy": policy, "segment.bytes": "200", "retention.ms": "1000",
                               "retention.bytes": "300"})
        _produce(server, name, [(f"k{i}".encode(), b"v" * 50) for i in range(20)], timestamp_ms=old)
    for policy in ("delete", "compact,delete"):
        wait_until(lambda: _watermarks(server, topics[policy])[0] > 0, timeout=30,
                   what=f"retention of the {policy} topic")
    time.sleep(0.5)                                   # several more retention rounds
    assert _watermarks(server, topics["compact"]) == (0, 20)


def _segment_files(server, topic: str) -> list[str]:
    return sorted(p.name for p in (server.data_dir / "logs" / f"{topic}-0").glob("*.log"))


def test_segment_ms_rolls_the_active_segment_on_the_next_append(server):
    """Kafka rolls on append: a segment whose first batch is more than segment.ms older than the appended one rolls,
    whatever its size (here far below segment.bytes)."""
    name = unique_topic("segment-ms")
    _create(server, name, {"cleanup.policy": "compact", "segment.ms": "60000"})
    now = int(time.time() * 1000)
    _produce(server, name, [(b"a", b"1"), (b"b", b"2")], timestamp_ms=now - 10 * 60_000)
    assert len(_segment_files(server, name)) == 1
    _produce(server, name, [(b"a", b"3")], timestamp_ms=now - 9 * 60_000)    # within segment.ms: no roll
    assert len(_segment_files(server, name)) == 1
    _produce(server, name, [(b"c", b"4")], timestamp_ms=now)                  # 10 minutes on
    assert _segment_files(server, name) == ["00000000000000000000.log", "00000000000000000003.log"]
    assert _watermarks(server, name) == (0, 4)
