"""What the compaction tests share: settings that make the log cleaner run within seconds, a model of the
compacted view Kafka gives (latest value per key at its original offset), and confluent-kafka helpers that
read a partition whole.

The cleaner's progress is seen the way a client sees it: a superseded record disappears from a fetch.  A
test waits (a hang guard, never a timing assertion) until every key it watches appears at most once, then
checks the whole view against the model: nothing acknowledged and still the latest is lost, offsets are the
acknowledged ones (with gaps), headers and timestamps are kept.
"""
from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from compat_tests import clients

# Broker settings (Kafka's names): the cleaner looks for work every 100 ms, retention every 200 ms.
BROKER_CONFIG = {"log.cleaner.backoff.ms": 100, "log.retention.check.interval.ms": 200}

# How long a test waits for the cleaner: a hang guard for two busy shared cores.
CLEAN_TIMEOUT = 60.0


def compact_config(**over: object) -> dict[str, str]:
    """Topic configs of a compacted topic the cleaner reaches quickly: 1 KiB segments (a produce of a few
    records rolls one), any dirty ratio, no compaction lag; tombstones kept an hour unless overridden."""
    base = {"cleanup.policy": "compact", "segment.bytes": 1024, "min.cleanable.dirty.ratio": 0.01,
            "min.compaction.lag.ms": 0, "delete.retention.ms": 3_600_000}
    base.update(over)
    return {k.replace("_", "."): str(v) for k, v in base.items()}


# ------------------------------------------------------------------------------------------- the model

@dataclass(frozen=True)
class Sent:
    """One acknowledged record: where the broker said it is."""
    offset: int
    key: bytes
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp: int | None = None


@dataclass(frozen=True)
class Stored:
    """One record as a consumer reads it back."""
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp: int


def latest(sent: Iterable[Sent]) -> dict[bytes, Sent]:
    """The latest acknowledged record of each key (by offset)."""
    out: dict[bytes, Sent] = {}
    for s in sorted(sent, key=lambda s: s.offset):
        out[s.key] = s
    return out


def compacted(sent: Iterable[Sent], *, tombstones: bool) -> list[Sent]:
    """What Kafka's compacted view holds of ``sent`` once cleaned: the latest record per key, at its offset;
    tombstones while delete.retention.ms keeps them (``tombstones=True``), else none."""
    keep = [s for s in latest(sent).values() if tombstones or s.value is not None]
    return sorted(keep, key=lambda s: s.offset)


def watched(view: Sequence[Stored], keys: set[bytes]) -> list[Stored]:
    return [r for r in view if r.key in keys]


def assert_view(view: Sequence[Stored], expected: Sequence[Sent], keys: set[bytes], *,
                check_headers: bool = True, check_timestamps: bool = True) -> None:
    """The records of ``keys`` in ``view`` are exactly ``expected`` (offset, key, value; headers and timestamps
    when asked), offsets strictly increasing over the whole view."""
    offsets = [r.offset for r in view]
    assert offsets == sorted(set(offsets)), f"offsets not strictly increasing: {offsets[:50]}"
    got = [(r.offset, r.key, r.value) for r in watched(view, keys)]
    want = [(s.offset, s.key, s.value) for s in expected]
    if got != want:
        def short(rows):
            return [(o, k, v if v is None else v[:24]) for o, k, v in sorted(rows)[:5]]
        missing, extra = short(set(want) - set(got)), short(set(got) - set(want))
        raise AssertionError(f"compacted view differs from the model: {len(got)} records, {len(want)} expected; "
                             f"missing {missing}; not expected {extra}")
    by_offset = {r.offset: r for r in view}
    for s in expected:
        r = by_offset[s.offset]
        if check_headers:
            assert r.headers == s.headers, (s, r)
        if check_timestamps and s.timestamp is not None:
            assert r.timestamp == s.timestamp, (s, r)


# ----------------------------------------------------------------------------------------- the clients

def create_topic(bootstrap: str, topic: str, config: dict[str, str], partitions: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1, config=config)], operation_timeout=30)[topic].result(30)


def alter_topic(bootstrap: str, topic: str, config: dict[str, str]) -> None:
    """IncrementalAlterConfigs SET of topic configs."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    res = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in config.items()])
    for f in admin.incremental_alter_configs([res]).values():
        f.result(30)


def produce(bootstrap: str, topic: str, records: Sequence[tuple], *, extra: dict | None = None,
            producer: Producer | None = None) -> list[Sent]:
    """Produce (key, value[, headers[, timestamp]]) records to partition 0, acks=all, and wait for every
    acknowledgement; returns them as Sent in send order.  A delivery error fails the test."""
    own = producer is None
    if own:
        producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, **(extra or {})})
    acked: dict[int, Sent] = {}
    errors: list[str] = []

    def report(i: int, rec: tuple):
        def cb(err, msg) -> None:
            if err is not None:
                errors.append(f"{i}: {err}")
            else:
                headers = tuple(rec[2]) if len(rec) > 2 and rec[2] else ()
                acked[i] = Sent(msg.offset(), rec[0], rec[1], headers, msg.timestamp()[1])
        return cb

    for i, rec in enumerate(records):
        kw = {}
        if len(rec) > 2 and rec[2]:
            kw["headers"] = list(rec[2])
        if len(rec) > 3 and rec[3] is not None:
            kw["timestamp"] = rec[3]
        while True:
            try:
                producer.produce(topic, key=rec[0], value=rec[1], partition=0, on_delivery=report(i, rec), **kw)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    left = producer.flush(60)
    assert left == 0, f"{left} records not acknowledged within 60 s"
    assert not errors, f"delivery errors: {errors[:5]}"
    return [acked[i] for i in range(len(records))]


def filler(bootstrap: str, topic: str, rounds: int = 2, *, size: int = 700, ts: int | None = None) -> list[Sent]:
    """Records of unique keys, each produce call larger than a 1 KiB segment, so that whatever was produced
    before sits in rolled (cleanable) segments; a unique key is never superseded, so Kafka keeps every one."""
    out: list[Sent] = []
    for r in range(rounds):
        tag = uuid.uuid4().hex[:8]
        out += produce(bootstrap, topic, [(f"filler-{tag}-{i}".encode(), b"f" * size, None, ts) for i in range(2)])
    return out


def consumer(bootstrap: str, isolation: str, **extra: object) -> Consumer:
    return Consumer({"bootstrap.servers": bootstrap, "group.id": f"compaction-{uuid.uuid4().hex[:8]}",
                     "enable.auto.commit": False, "enable.partition.eof": True, "isolation.level": isolation,
                     "fetch.wait.max.ms": 50, **extra})


def read_partition(bootstrap: str, topic: str, isolation: str = "read_committed", partition: int = 0,
                   timeout: float = 60.0) -> list[Stored]:
    """Every record of the partition from the beginning to its end (partition EOF)."""
    c = consumer(bootstrap, isolation)
    try:
        c.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
        out: list[Stored] = []
        deadline = time.monotonic() + timeout
        while True:
            assert time.monotonic() < deadline, f"{topic}-{partition} never reached its end ({len(out)} read)"
            msg = c.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    return out
                raise AssertionError(f"consuming {topic}: {msg.error()}")
            out.append(Stored(msg.offset(), msg.key(), msg.value(), tuple(msg.headers() or ()),
                              msg.timestamp()[1]))
    finally:
        c.close()


def watermarks(bootstrap: str, topic: str, isolation: str = "read_uncommitted", partition: int = 0) -> tuple[int, int]:
    c = consumer(bootstrap, isolation)
    try:
        return c.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
    finally:
        c.close()


def offset_for_time(bootstrap: str, topic: str, ts: int, isolation: str = "read_uncommitted") -> int:
    """ListOffsets by timestamp: the first offset whose record's timestamp is >= ts (-1: none)."""
    c = consumer(bootstrap, isolation)
    try:
        return c.offsets_for_times([TopicPartition(topic, 0, ts)], timeout=10)[0].offset
    finally:
        c.close()


def wait_compacted(bootstrap: str, topic: str, keys: set[bytes], *, tombstones_gone: bool = False,
                   also_gone: set[bytes] = frozenset(), isolation: str = "read_uncommitted",
                   timeout: float = CLEAN_TIMEOUT) -> list[Stored]:
    """Waits until the cleaner has been over the watched keys: each appears at most once in the partition
    (and, with ``tombstones_gone``, none as a tombstone; no record whose value is in ``also_gone``, e.g. the
    values of aborted transactions); returns the view.  A hang guard only: the caller checks the view."""
    view: list[Stored] = []

    def done() -> bool:
        view[:] = read_partition(bootstrap, topic, isolation)
        seen: set[bytes] = set()
        for r in watched(view, keys):
            if r.key in seen or (tombstones_gone and r.value is None) or r.value in also_gone:
                return False
            seen.add(r.key)
        return True

    clients.wait_until(done, timeout=timeout, interval=0.5, what=f"the log cleaner to compact {topic}")
    return view


def some_record_cleaned(bootstrap: str, topic: str, sent: Sequence[Sent]) -> bool:
    """Whether at least one acknowledged record that a later one of its key supersedes is gone."""
    last = latest(sent)
    superseded = {s.offset for s in sent if last[s.key].offset != s.offset}
    if not superseded:
        return False
    present = {r.offset for r in read_partition(bootstrap, topic, "read_uncommitted")}
    return bool(superseded - present)
