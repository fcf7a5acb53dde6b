"""Crash safety with a real client: SIGKILL (and SIGTERM) the broker while a
confluent-kafka (librdkafka) producer streams records, restart it on the same
data directory, and check that nothing acknowledged was lost, offsets are
dense, every stored batch is intact, and idempotent producers stay exactly-once.

Kill points are random but seeded (TRIREME_CRASH_SEED to vary them).
"""
from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from compat_tests.clients import segment_batches
from compat_tests.python_clients import unique_topic
from trireme.wire import records

SEED = int(os.environ.get("TRIREME_CRASH_SEED", "7331"))
PARTITIONS = 3

FAST_RECONNECT = {"reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 500,
                  "retry.backoff.ms": 50, "retry.backoff.max.ms": 500}


def rng(name: str) -> random.Random:
    return random.Random(f"{SEED}:{name}")


def create_topic(server, name: str, partitions: int = PARTITIONS) -> None:
    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    fut = admin.create_topics([NewTopic(name, partitions, 1)], operation_timeout=10)[name]
    fut.result(timeout=30)


# --------------------------------------------------------------------------- the producer

class Stream:
    """A producer thread sending ``total`` records ``<tag>:<seq>:<padding>`` round-robin over the
    partitions at about ``rate`` records/s, then flushing.  Delivery reports are collected."""

    def __init__(self, server, topic: str, total: int, *, rate: float, idempotent: bool = False,
                 pad: int = 16, extra: dict | None = None):
        self.topic = topic
        self.total = total
        self.rate = rate
        self.pad = b"p" * pad
        self.acked: dict[int, tuple[int, int]] = {}      # seq -> (partition, offset)
        self.failed: dict[int, KafkaError] = {}
        self.sent = 0
        self.flushed_left: int | None = None
        self.error: BaseException | None = None
        conf = {"bootstrap.servers": server.bootstrap, "acks": "all", "linger.ms": 5,
                "enable.idempotence": idempotent, "message.timeout.ms": 60000,
                "socket.connection.setup.timeout.ms": 5000, **FAST_RECONNECT, **(extra or {})}
        self.producer = Producer(conf)
        self.thread = threading.Thread(target=self._run, name=f"producer-{topic}", daemon=True)

    @staticmethod
    def seq_of(value: bytes) -> int:
        return int(value.split(b":", 2)[1])

    def value(self, seq: int) -> bytes:
        return b"%s:%d:%s" % (self.topic.encode(), seq, self.pad)

    def _report(self, err, msg) -> None:
        seq = self.seq_of(msg.value())
        if err is None:
            assert seq not in self.acked, f"two delivery reports for {seq}"
            self.acked[seq] = (msg.partition(), msg.offset())
        else:
            self.failed[seq] = err

    def _run(self) -> None:
        try:
            start = time.monotonic()
            for seq in range(self.total):
                due = start + seq / self.rate
                while True:
                    now = time.monotonic()
                    self.producer.poll(0 if now >= due else min(due - now, 0.01))
                    if now >= due:
                        break
                while True:
                    try:
                        self.producer.produce(self.topic, self.value(seq), partition=seq % PARTITIONS,
                                              on_delivery=self._report)
                        break
                    except BufferError:
                        self.producer.poll(0.05)
                self.sent = seq + 1
            self.flushed_left = self.producer.flush(90)
        except BaseException as e:            # reported by join()
            self.error = e

    def start(self) -> "Stream":
        self.thread.start()
        return self

    def wait_acked(self, n: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while len(self.acked) < n:
            assert self.thread.is_alive() or len(self.acked) >= n, "producer ended early"
            assert time.monotonic() < deadline, f"only {len(self.acked)} of {n} acknowledged in {timeout}s"
            time.sleep(0.005)

    def join(self, timeout: float = 120) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "producer did not finish"
        if self.error is not None:
            raise self.error
        assert self.flushed_left == 0, f"{self.flushed_left} records still queued after flush"
        assert len(self.acked) + len(self.failed) == self.total


# --------------------------------------------------------------------------- the checks

def consume_all(server, topic: str, partitions: int = PARTITIONS) -> dict[int, list[tuple[int, bytes]]]:
    """Every stored record of every partition, as (offset, value), read with CRC checks on;
    also checks that ListOffsets' latest equals the number consumed (log start is 0)."""
    consumer = Consumer({"bootstrap.servers": server.bootstrap, "group.id": f"check-{topic}",
                         "enable.auto.commit": False, "check.crcs": True, "fetch.max.bytes": 8 << 20,
                         **FAST_RECONNECT})
    try:
        ends = {}
        for p in range(partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=15)
            assert low == 0, f"{topic}-{p}: log start offset {low}"
            ends[p] = high
        out: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(partitions)}
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions) if ends[p] > 0])
        deadline = time.monotonic() + 30
        while any((out[p][-1][0] + 1 if out[p] else 0) < ends[p] for p in range(partitions)):
            assert time.monotonic() < deadline, (
                f"could not consume to the end: {[(p, len(out[p]), ends[p]) for p in out]}")
            for msg in consumer.consume(10000, timeout=0.5):
                assert msg.error() is None, msg.error()
                assert msg.topic() == topic
                out[msg.partition()].append((msg.offset(), msg.value()))
        for p in range(partitions):
            assert len(out[p]) == ends[p], (
                f"{topic}-{p}: ListOffsets latest is {ends[p]} but {len(out[p])} records were consumed")
        return out
    finally:
        consumer.close()


def check_dense(topic: str, stored: dict[int, list[tuple[int, bytes]]]) -> None:
    for p, recs in stored.items():
        offsets = [o for o, _ in recs]
        assert offsets == list(range(len(offsets))), (
            f"{topic}-{p}: offsets are not dense: first gaps "
            f"{[(a, b) for a, b in zip(offsets, offsets[1:]) if b != a + 1][:5]}")


def check_acked_present(stream: Stream, stored: dict[int, list[tuple[int, bytes]]], what: str = "") -> None:
    """Every acknowledged record is stored at the offset its delivery report gave."""
    lost = []
    for seq, (p, offset) in sorted(stream.acked.items()):
        recs = stored[p]
        if offset >= len(recs) or recs[offset][1] != stream.value(seq):
            lost.append((seq, p, offset, recs[offset][1] if offset < len(recs) else None))
    assert not lost, (f"{what}{len(lost)} acknowledged records are missing from where their delivery reports "
                      f"put them (seq, partition, offset, found there), e.g. {lost[:5]} (seed {SEED})")


def check_segments(server, topic: str, stored: dict[int, list[tuple[int, bytes]]],
                   segment_bytes: int | None = None) -> int:
    """Read the segment files: whole batches only, every CRC valid, offsets contiguous from the first
    segment's base to the end of the log; with ``segment_bytes``, no segment is bigger unless it
    holds a single batch.  Returns the number of segment files."""
    nfiles = 0
    for p, recs in stored.items():
        directory = Path(server.data_dir) / "logs" / f"{topic}-{p}"
        segments = sorted(directory.glob("*.log"))
        assert segments, f"no segment files in {directory}"
        nfiles += len(segments)
        expected = 0
        for path in segments:
            data = path.read_bytes()
            base = int(path.stem)
            assert base == expected, f"{path.name}: segment starts at {base}, previous ended at {expected}"
            batches, zeros = segment_batches(data, active=path == segments[-1])
            for pos, header in batches:
                assert records.crc_ok(data, pos, header), f"{path}: bad CRC in the batch at byte {pos}"
                assert header.base_offset == expected, (
                    f"{path}: batch at byte {pos} has base offset {header.base_offset}, expected {expected}")
                expected = header.next_offset
            sizes = [h.size for _, h in batches]
            assert sum(sizes) + zeros == len(data), (
                f"{path}: {len(data) - sum(sizes)} trailing bytes after the last batch")
            if segment_bytes is not None:
                assert sum(sizes) <= segment_bytes or len(sizes) == 1, (
                    f"{path}: {sum(sizes)} bytes in {len(sizes)} batches, over segment.bytes={segment_bytes}")
        assert expected == len(recs), f"{topic}-{p}: segments end at offset {expected}, consumed {len(recs)}"
    return nfiles


def check_all(server, stream: Stream, what: str = "") -> dict[int, list[tuple[int, bytes]]]:
    stored = consume_all(server, stream.topic)
    print(f"{stream.topic}: {len(stream.acked)} acknowledged, {len(stream.failed)} failed, "
          f"{sum(map(len, stored.values()))} stored")
    check_dense(stream.topic, stored)
    check_acked_present(stream, stored, what)
    check_segments(server, stream.topic, stored)
    return stored


def kill_mid_stream(server, stream: Stream, at_acked: int) -> tuple[int, dict]:
    """Wait for ``at_acked`` delivery reports, SIGKILL the broker and start it again on the same
    data dir.  Returns (records handed to the producer, acknowledged records) at the kill."""
    stream.wait_acked(at_acked)
    assert len(stream.acked) < stream.total, "the stream ended before the kill point"
    sent = stream.sent
    before = dict(stream.acked)
    server.kill9()
    print(f"{stream.topic}: SIGKILL with {len(before)} acknowledged of {sent} handed to the producer (seed {SEED})")
    return sent, before


# --------------------------------------------------------------------------- tests

FLUSH_POLICY = {"log.flush.interval.messages": 5000, "log.flush.interval.ms": 1000}
NO_FSYNC = {"trireme.fsync.enable": False}


# The three ways an acknowledgement relates to the disk, for tests that kill -9 under each.
FLUSH_MODES = [
    pytest.param({}, id="fsync-per-ack"),
    # Kafka's flush policy acknowledges after the write: a process crash keeps the page cache, so nothing
    # acknowledged is lost either (a machine crash may lose up to the interval: docs/operations.md).
    pytest.param(FLUSH_POLICY, id="flush-interval", marks=pytest.mark.server_config(FLUSH_POLICY)),
    # fsync off: every append is written at once (never kept in memory for a flush), so the same holds.
    pytest.param(NO_FSYNC, id="no-fsync", marks=pytest.mark.server_config(NO_FSYNC)),
]


@pytest.mark.parametrize("policy", FLUSH_MODES)
def test_kill9_acks_all_stream(server, policy):
    """Three SIGKILLs at seeded random points of three streams; after each restart every
    acknowledged record of every stream so far is still there."""
    r = rng("acks-all")
    streams: list[Stream] = []
    for i in range(3):
        topic = unique_topic(f"crash-{i}")
        create_topic(server, topic)
        stream = Stream(server, topic, total=12000, rate=8000).start()
        streams.append(stream)
        at = r.randrange(1500, 7000)
        sent, before = kill_mid_stream(server, stream, at)
        stream.join()
        assert len(stream.acked) > len(before), "nothing was acknowledged after the restart"
        for s in streams:
            stored = check_all(server, s, f"kill #{i} at {at} acked/{sent} sent: ")
        # Records acknowledged before the kill are a subset of the checked ones; say so explicitly.
        assert set(before) <= set(stream.acked)
        assert sum(len(v) for v in stored.values()) >= len(stream.acked)


def test_kill9_idempotent_producer_exactly_once(server):
    r = rng("idempotent")
    for i in range(2):
        topic = unique_topic(f"idem-{i}")
        create_topic(server, topic)
        stream = Stream(server, topic, total=12000, rate=8000, idempotent=True).start()
        at = r.randrange(1500, 7000)
        kill_mid_stream(server, stream, at)
        stream.join()
        stored = consume_all(server, topic)
        check_dense(topic, stored)
        check_acked_present(stream, stored, f"kill at {at}: ")
        check_segments(server, topic, stored)
        seqs = {p: [Stream.seq_of(v) for _, v in recs] for p, recs in stored.items()}
        everything = [s for lst in seqs.values() for s in lst]
        dupes = sorted(s for s, n in Counter(everything).items() if n > 1)
        assert not dupes, f"kill at {at}: records stored twice by an idempotent producer: {dupes[:10]} (seed {SEED})"
        missing = sorted(set(stream.acked) - set(everything))
        assert not missing, f"kill at {at}: acknowledged but not stored: {missing[:10]}"
        unknown = set(everything) - set(stream.acked) - set(stream.failed)
        assert not unknown, f"stored records that were never sent: {sorted(unknown)[:10]}"
        for p, lst in seqs.items():
            assert all(s % PARTITIONS == p for s in lst), f"partition {p} holds records of another partition"
            assert lst == sorted(lst), (
                f"kill at {at}: partition {p} out of order near "
                f"{[(a, b) for a, b in zip(lst, lst[1:]) if b < a][:5]} (seed {SEED})")
        # Records may fail only by timing out (then they are stored at most once, checked above);
        # a fatal idempotence error (e.g. OUT_OF_ORDER_SEQUENCE_NUMBER after the restart) is a broker bug.
        other = {seq: err for seq, err in stream.failed.items() if err.code() != KafkaError._MSG_TIMED_OUT}
        assert not other, f"kill at {at}: {len(other)} records failed, e.g. {list(other.items())[:3]}"
        assert len(stream.acked) > at, "nothing was acknowledged after the restart"


SEGMENT_BYTES = 64 * 1024


@pytest.mark.server_config({"log.segment.bytes": SEGMENT_BYTES})
def test_kill9_during_segment_rolls(server):
    r = rng("segments")
    streams: list[Stream] = []
    for i in range(2):
        topic = unique_topic(f"roll-{i}")
        create_topic(server, topic)
        # ~420-byte records: a segment fills every ~150 records of a partition.
        stream = Stream(server, topic, total=10000, rate=6000, pad=400).start()
        streams.append(stream)
        at = r.randrange(1500, 6000)
        sent, _ = kill_mid_stream(server, stream, at)
        stream.join()
        for s in streams:
            stored = check_all(server, s, f"kill #{i} at {at} acked/{sent} sent: ")
            nfiles = check_segments(server, s.topic, stored, segment_bytes=SEGMENT_BYTES)
            assert nfiles >= PARTITIONS * 4, f"{s.topic}: only {nfiles} segments"
        print(f"{topic}: {nfiles} segment files")


@pytest.mark.server_config({"trireme.shutdown.grace.ms": 3000})
def test_sigterm_while_producing(server):
    grace = 3.0
    topic = unique_topic("graceful")
    create_topic(server, topic)
    stream = Stream(server, topic, total=10000, rate=8000).start()
    stream.wait_acked(rng("sigterm").randrange(1500, 5000))
    before = dict(stream.acked)
    t0 = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    try:
        code = server.proc.wait(timeout=grace + 10)
    except Exception:
        code = None
    elapsed = time.monotonic() - t0
    assert code == 0, f"exit code {code} after SIGTERM\n{server.stderr_tail()}"
    assert elapsed <= grace + 1.5, f"took {elapsed:.1f}s to stop after SIGTERM (grace {grace}s)"
    tail = server.stderr_tail(200)
    assert "shutting down on signal 15" in tail and "stopped" in tail
    server.restart()
    stream.join()
    stored = check_all(server, stream, "after SIGTERM: ")
    assert set(before) <= set(stream.acked)
    assert sum(len(v) for v in stored.values()) >= stream.total - len(stream.failed)


def test_kill9_right_after_topic_changes_are_answered_keeps_them(server):
    """CreateTopics, CreatePartitions, IncrementalAlterConfigs and DeleteTopics answer once their records are durable
    in __cluster_metadata: a SIGKILL right after the answers loses none of them."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, NewPartitions

    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    kept, gone = unique_topic("kept"), unique_topic("gone")
    for name in (kept, gone):
        admin.create_topics([NewTopic(name, 2, 1, config={"retention.ms": "123456"})])[name].result(timeout=30)
    admin.create_partitions([NewPartitions(kept, 3)])[kept].result(timeout=30)
    resource = ConfigResource(ConfigResource.Type.TOPIC, kept, incremental_configs=[
        ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([resource])[resource].result(timeout=30)
    admin.delete_topics([gone])[gone].result(timeout=30)
    server.kill9()

    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    topics = admin.list_topics(timeout=30).topics
    assert kept in topics and gone not in topics
    assert topics[kept].error is None and len(topics[kept].partitions) == 3
    configs = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, kept)])
    described = next(iter(configs.values())).result(timeout=30)
    assert (described["retention.ms"].value, described["cleanup.policy"].value) == ("123456", "compact")
    assert not [name for name in ("topics.json", "producer_ids", "features.json")
                if (Path(server.data_dir) / name).exists()]
