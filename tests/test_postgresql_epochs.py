"""Leader epochs with the PostgreSQL engine, on a real broker (in-process) and a real PostgreSQL: each start takes
the partition at a new epoch, what it appends carries that epoch, OffsetsForLeaderEpoch answers per epoch as Kafka
would, and a librdkafka consumer that validates its position after the leader epoch changed keeps its place."""
from __future__ import annotations

import psycopg
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from trireme.server.admin.client import Client, request, request_class
from trireme.testing import TriremeBroker
from trireme.wire import error_codes as E
from trireme.wire.records import iter_batch_headers

TOPIC = "epochs"


def _produce(broker, count: int, start: int) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0, "acks": "all"})
    for i in range(start, start + count):
        producer.produce(TOPIC, value=b"v%d" % i, partition=0)
        producer.poll(0)
        producer.flush(15)                      # one batch a record: every batch stamped on its own
    assert producer.flush(15) == 0


def _stored_epochs(dsn: str, topic_id) -> list[tuple[int, int]]:
    """(base offset, partition_leader_epoch) of every batch of the topic's partition 0, as the database keeps them."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT data FROM trireme_batch WHERE topic_id = %s AND partition = 0 ORDER BY base_offset",
                            (topic_id,)).fetchall()
    return [(h.base_offset, h.partition_leader_epoch) for (data,) in rows for _, h in iter_batch_headers(data)]


def _row_epoch(dsn: str, topic_id) -> int:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT leader_epoch FROM trireme_partition WHERE topic_id = %s AND partition = 0",
                            (topic_id,)).fetchone()[0]


def _end_offsets(broker, asked: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """OffsetsForLeaderEpoch for partition 0: (error, leader_epoch, end_offset) for each (current, requested)."""
    cls = request_class("OffsetForLeaderEpoch")
    topic = cls.OffsetForLeaderTopic
    with Client(broker.bootstrap) as client:
        answers = []
        for current, wanted in asked:
            r = client.call("OffsetForLeaderEpoch", request("OffsetForLeaderEpoch", replica_id=-1, topics=[topic(
                topic=TOPIC, partitions=[topic.OffsetForLeaderPartition(
                    partition=0, current_leader_epoch=current, leader_epoch=wanted)])]), (2, 4))
            p = r.topics[0].partitions[0]
            answers.append((p.error_code, p.leader_epoch, p.end_offset))
        return answers


def test_epochs_rise_per_start_and_offsets_for_leader_epoch_answers_each(tmp_path, postgres_database):
    broker = TriremeBroker(topics={TOPIC: 1}, mode="thread", data_dir=tmp_path / "broker",
                           config={"trireme.storage": "postgresql",
                                   "trireme.storage.postgresql.dsn": postgres_database})
    consumer = None
    try:
        broker.start()
        _produce(broker, 3, 0)
        consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "epochs-reader",
                             "enable.auto.commit": False, "auto.offset.reset": "earliest",
                             "topic.metadata.refresh.interval.ms": 500, "reconnect.backoff.max.ms": 200})
        consumer.assign([TopicPartition(TOPIC, 0, 0)])
        seen = _consume(consumer, 3)
        with Client(broker.bootstrap) as client:
            topic_id = client.metadata([TOPIC]).topics[0].topic_id
        first = _row_epoch(postgres_database, topic_id)

        broker.restart()                         # taken again: a new epoch, starting at offset 3
        second = _row_epoch(postgres_database, topic_id)
        assert second > first
        _produce(broker, 2, 3)
        seen += _consume(consumer, 2)            # librdkafka validates its position (epoch `first`, offset 3)
        broker.restart()
        third = _row_epoch(postgres_database, topic_id)
        assert third > second
        _produce(broker, 4, 5)
        seen += _consume(consumer, 4)
        assert [offset for offset, _ in seen] == list(range(9))     # no truncation, no reset: each once, in order
        assert [value for _, value in seen] == [b"v%d" % i for i in range(9)]

        assert _stored_epochs(postgres_database, topic_id) == [(o, first) for o in range(3)] + \
            [(o, second) for o in range(3, 5)] + [(o, third) for o in range(5, 9)]
        assert _end_offsets(broker, [(-1, first), (-1, second), (-1, third), (-1, third + 1), (-1, -1),
                                     (third, second), (third, first - 1 if first else 0)]) == [
            (0, first, 3), (0, second, 5), (0, third, 9), (0, -1, -1), (0, -1, -1),
            (0, second, 5), (0, first - 1, 0) if first else (0, first, 3)]
        assert _diverging(broker, first, 4) == (0, first, 3)     # epoch `first` ended at 3: this log diverged
        assert _diverging(broker, second, 4) == (0, -1, -1)      # within epoch `second`: no divergence
        assert _list_offsets(broker, [-2, -1]) == [(0, first), (9, third)]      # earliest's own epoch, as Kafka
        if second + 1 < third:                   # an epoch nobody led in: the largest one before it, ending at 5
            assert _end_offsets(broker, [(-1, second + 1)]) == [(0, second, 5)]
        assert _end_offsets(broker, [(third + 1, third), (second, third)]) == [
            (E.UNKNOWN_LEADER_EPOCH.code, -1, -1), (E.FENCED_LEADER_EPOCH.code, -1, -1)]
    finally:
        if consumer is not None:
            consumer.close()
        broker.close()


def _diverging(broker, last_fetched_epoch: int, offset: int) -> tuple[int, int, int]:
    """A Fetch (v12+) of partition 0 at ``offset`` with LastFetchedEpoch → (error, diverging epoch, its end)."""
    cls = request_class("Fetch")
    with Client(broker.bootstrap) as client:
        topic_id = client.metadata([TOPIC]).topics[0].topic_id
        r = client.call("Fetch", cls(replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, isolation_level=0,
                                     session_id=0, session_epoch=-1, forgotten_topics_data=[], rack_id="",
                                     topics=[cls.FetchTopic(topic=TOPIC, topic_id=topic_id, partitions=[
                                         cls.FetchTopic.FetchPartition(
                                             partition=0, current_leader_epoch=-1, fetch_offset=offset,
                                             last_fetched_epoch=last_fetched_epoch, log_start_offset=-1,
                                             partition_max_bytes=1 << 20)])]), (12, 17))
    p = r.responses[0].partitions[0]
    return p.error_code, p.diverging_epoch.epoch, p.diverging_epoch.end_offset


def _list_offsets(broker, timestamps: list[int]) -> list[tuple[int, int]]:
    """ListOffsets for partition 0: (offset, leader_epoch) for each timestamp."""
    cls = request_class("ListOffsets")
    with Client(broker.bootstrap) as client:
        r = client.call("ListOffsets", cls(replica_id=-1, isolation_level=0, topics=[cls.ListOffsetsTopic(
            name=TOPIC, partitions=[cls.ListOffsetsTopic.ListOffsetsPartition(
                partition_index=0, current_leader_epoch=-1, timestamp=ts) for ts in timestamps])]), (4, 11))
    return [(p.offset, p.leader_epoch) for p in r.topics[0].partitions]


def _consume(consumer, count: int, timeout_s: float = 30.0) -> list[tuple[int, bytes]]:
    import time
    out = []
    deadline = time.monotonic() + timeout_s
    while len(out) < count and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is None:
            continue
        assert message.error() is None, message.error()
        out.append((message.offset(), message.value()))
    assert len(out) == count, out
    return out
