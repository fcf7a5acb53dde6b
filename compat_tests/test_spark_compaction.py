"""PySpark's ``kafka`` batch source over a compacted topic (issue 22): offsets with gaps where the cleaner
removed superseded records, aborted transactions and (past delete.retention.ms) tombstones.  Spark's consumer
skips an offset that is missing while the partition's earliest offset is at or below it (invisible, not lost),
so with ``failOnDataLoss`` true and false alike it must read exactly the records a Kafka consumer reads: the
compacted view, whichever way the range is split (minPartitions) or bounded (offset ranges starting and ending
inside gaps), at both isolation levels.

One broker and one PySpark session (compat_tests/spark_harness.py) for the module; when it runs: see
compat_tests/spark_support.py (the serial Spark phase of `make test`).
"""
from __future__ import annotations

import json
import uuid

import pytest
from confluent_kafka import Producer

from compat_tests.compaction_support import (
    BROKER_CONFIG,
    Sent,
    assert_view,
    compact_config,
    compacted,
    create_topic,
    filler,
    produce,
    read_partition,
    wait_compacted,
)
from compat_tests.python_clients import unique_topic
from compat_tests.spark_support import (
    require_spark_env,
    requires_connector,
    spark_harness,
    wait_for_lso,
)

pytestmark = [*requires_connector, pytest.mark.server_config(BROKER_CONFIG),
              pytest.mark.trireme_only("1 KiB segments (Kafka's least segment.bytes is 1 MiB)")]

READ_TIMEOUT = 300
KEYS = [f"sk-{i:02d}".encode() for i in range(10)]


class Data:
    def __init__(self, topic: str, committed: list[Sent], aborted: set[bytes]):
        self.topic, self.committed, self.aborted = topic, committed, aborted


@pytest.fixture(scope="module")
def data(module_server) -> Data:
    """Overwrites, tombstones, a committed and an aborted transaction, then filler: compacted by the cleaner
    before any test reads it."""
    bootstrap = module_server.bootstrap
    topic = unique_topic("spark-compact")
    create_topic(bootstrap, topic, compact_config())
    sent: list[Sent] = []
    for r in range(3):
        sent += produce(bootstrap, topic, [(k, f"{k.decode()}@{r}".encode() + b"." * 80) for k in KEYS])
    sent += produce(bootstrap, topic, [(k, None) for k in KEYS[::4]])
    txp = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"spark-compact-{uuid.uuid4().hex[:6]}"})
    txp.init_transactions(30)
    txp.begin_transaction()
    sent += produce(bootstrap, topic, [(k, f"{k.decode()}@txn".encode()) for k in KEYS[1::3]], producer=txp)
    txp.commit_transaction(30)
    txp.begin_transaction()
    aborted = produce(bootstrap, topic, [(k, f"{k.decode()}@aborted".encode()) for k in KEYS[2::3]], producer=txp)
    txp.abort_transaction(30)
    sent += filler(bootstrap, topic)
    wait_for_lso(bootstrap, topic, 1)
    wait_compacted(bootstrap, topic, set(KEYS), also_gone={s.value for s in aborted})
    return Data(topic, sent, {s.value for s in aborted})


@pytest.fixture(scope="module")
def spark(module_server):
    require_spark_env()
    with spark_harness(module_server.bootstrap) as h:
        yield h


def read(spark, **options) -> list[tuple]:
    r = spark.call("read", options={k: v if isinstance(v, str) else json.dumps(v) for k, v in options.items()},
                   timeout=READ_TIMEOUT)
    assert r["ok"], f"{options}: {r['error']}"
    return sorted((row["offset"], row["key"], row["value"]) for row in r["rows"])


def kafka_rows(bootstrap: str, topic: str, isolation: str, start: int = 0, end: int | None = None) -> list[tuple]:
    """What a Kafka consumer reads, as Spark's rows (key and value as text)."""
    return [(r.offset, r.key.decode(), None if r.value is None else r.value.decode())
            for r in read_partition(bootstrap, topic, isolation)
            if r.offset >= start and (end is None or r.offset < end)]


def test_the_topic_is_compacted_with_gaps(module_server, data):
    keys = set(KEYS)
    view = read_partition(module_server.bootstrap, data.topic, "read_committed")
    assert_view(view, [s for s in compacted(data.committed, tombstones=True) if s.key in keys], keys,
                check_headers=False, check_timestamps=False)
    offsets = [r.offset for r in view]
    assert offsets[-1] + 1 - offsets[0] > len(offsets), "no gap in the offsets"


@pytest.mark.parametrize("fail_on_data_loss", ["true", "false"])
@pytest.mark.parametrize("isolation", ["read_committed", "read_uncommitted"])
def test_batch_read_of_a_compacted_topic(module_server, data, spark, fail_on_data_loss, isolation):
    """earliest..latest, also split into 5 Spark partitions (split boundaries fall inside gaps)."""
    want = kafka_rows(module_server.bootstrap, data.topic, isolation)
    assert not any(v is not None and v.encode() in data.aborted for _, _, v in want)
    for extra in ({}, {"minPartitions": "5"}):
        got = read(spark, subscribe=data.topic, startingOffsets="earliest", endingOffsets="latest",
                   failOnDataLoss=fail_on_data_loss, **{"kafka.isolation.level": isolation}, **extra)
        assert got == want, f"failOnDataLoss={fail_on_data_loss} {isolation} {extra}: Spark read {len(got)} " \
                            f"rows, a Kafka consumer {len(want)}"


@pytest.mark.parametrize("fail_on_data_loss", ["true", "false"])
def test_offset_ranges_starting_and_ending_inside_gaps(module_server, data, spark, fail_on_data_loss):
    """startingOffsets/endingOffsets as JSON, at offsets the cleaner removed: Spark reads the records in the
    range that remain, as a Kafka consumer seeking there would."""
    view = read_partition(module_server.bootstrap, data.topic, "read_committed")
    present = {r.offset for r in view}
    gaps = [o for o in range(view[0].offset, view[-1].offset) if o not in present]
    assert len(gaps) >= 2, gaps
    start, end = gaps[0], gaps[-1]
    got = read(spark, assign={data.topic: [0]}, startingOffsets={data.topic: {"0": start}},
               endingOffsets={data.topic: {"0": end}}, failOnDataLoss=fail_on_data_loss,
               **{"kafka.isolation.level": "read_committed"})
    assert got == kafka_rows(module_server.bootstrap, data.topic, "read_committed", start, end)
