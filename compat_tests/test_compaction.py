"""Log compaction seen by real clients (issue 22): confluent-kafka (librdkafka) and the Apache Kafka Java client
produce keyed records with overwrites and tombstones to ``cleanup.policy=compact`` topics with 1 KiB segments,
the broker's log cleaner runs, and consumers (read_committed and read_uncommitted) get Kafka's compacted view:
the latest value of each key at its original offset (offsets with gaps), headers and timestamps kept,
tombstones kept for delete.retention.ms and then gone, aborted transactions' records gone, the time index
right.  Producers keep working across a cleaning: transactional ones keep committing, idempotent ones continue
(also after a restart that rebuilds producer state from the compacted log) with no OUT_OF_ORDER_SEQUENCE.
Time and size retention leave a compact-only topic alone.

How a test knows the cleaner ran: a superseded record disappears from a fetch (compaction_support.py).
"""
from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Producer

from compat_tests import clients
from compat_tests.compaction_support import (
    BROKER_CONFIG,
    Sent,
    assert_view,
    compact_config,
    compacted,
    create_topic,
    filler,
    latest,
    offset_for_time,
    produce,
    read_partition,
    some_record_cleaned,
    wait_compacted,
    watched,
    watermarks,
)
from compat_tests.python_clients import unique_topic

pytestmark = [pytest.mark.server_config(BROKER_CONFIG), pytest.mark.trireme_only(
    "1 KiB segments (Kafka's least segment.bytes is 1 MiB) and a 100 ms cleaner backoff")]

KEYS = [f"key-{i:02d}".encode() for i in range(12)]
BASE_TS = int(time.time() * 1000) - 3_600_000     # an hour ago: record timestamps increase with offsets


def keyed_history(rounds: int = 4, tag: str = "") -> list[tuple]:
    """``rounds`` values for every key (a header naming the round, explicit increasing timestamps), then
    tombstones for every third key and a fresh value for every sixth after its tombstone."""
    out: list[tuple] = []
    ts = BASE_TS
    for r in range(rounds):
        for k in KEYS:
            out.append((k, f"{tag}{k.decode()}@{r}".encode() + b"." * 40, [("round", str(r).encode())], ts))
            ts += 1
    for i, k in enumerate(KEYS):
        if i % 3 == 0:
            out.append((k, None, [("round", b"tombstone")], ts))
            ts += 1
    for i, k in enumerate(KEYS):
        if i % 6 == 0:
            out.append((k, f"{tag}{k.decode()}@reborn".encode(), [("round", b"reborn")], ts))
            ts += 1
    return out


def produce_history(bootstrap: str, topic: str, history: list[tuple], per_call: int = 6) -> list[Sent]:
    """In several produce calls, so that the history spans several 1 KiB segments."""
    sent: list[Sent] = []
    for i in range(0, len(history), per_call):
        sent += produce(bootstrap, topic, history[i:i + per_call])
    return sent


def check_time_index(bootstrap: str, topic: str, view) -> None:
    """ListOffsets by timestamp over the compacted log: for the timestamp of every record, the kept or removed,
    the first kept record at or after it (timestamps increase with offsets here)."""
    kept = [(r.timestamp, r.offset) for r in view]
    for ts in sorted({r.timestamp for r in view} | {kept[0][0] - 1, kept[-1][0] + 1}):
        want = next((o for t, o in kept if t >= ts), -1)
        got = offset_for_time(bootstrap, topic, ts)
        if want == -1:
            assert got in (-1, watermarks(bootstrap, topic)[1]), (ts, got)
        else:
            assert got == want, f"offsets_for_times({ts}) = {got}, the first kept record at or after it is {want}"


# ------------------------------------------------------------------------------------- confluent-kafka

def test_confluent_compacted_view_both_isolation_levels(server):
    """Overwrites and tombstones in rolled segments: once cleaned, read_committed and read_uncommitted both get
    the latest value of each key at its acknowledged offset (tombstones included: delete.retention.ms keeps
    them an hour), headers and timestamps kept, the earliest offset still 0, the time index right."""
    topic = unique_topic("compact-ck")
    create_topic(server.bootstrap, topic, compact_config())
    sent = produce_history(server.bootstrap, topic, keyed_history())
    fill = filler(server.bootstrap, topic, ts=BASE_TS + 10_000)
    keys = set(KEYS)

    wait_compacted(server.bootstrap, topic, keys)
    expected = compacted(sent, tombstones=True)
    assert any(s.value is None for s in expected)
    for iso in ("read_committed", "read_uncommitted"):
        view = read_partition(server.bootstrap, topic, iso)
        assert_view(view, expected, keys)
        assert {r.offset for r in view} >= {s.offset for s in fill}, "a record of a unique key was removed"
        assert len(view) < watermarks(server.bootstrap, topic, iso)[1], "no offset gap after cleaning"
    assert watermarks(server.bootstrap, topic)[0] == 0, "cleaning moved the log start offset"
    check_time_index(server.bootstrap, topic, read_partition(server.bootstrap, topic))


def test_confluent_tombstones_go_after_delete_retention_ms(server):
    """delete.retention.ms=500: the cleaning that first sees a tombstone keeps it and stamps its batch with a
    delete horizon (now + delete.retention.ms, Kafka's KIP-534: a later change of the setting does not move
    it); a cleaning after the horizon removes it.  The keys' latest values stay, the reborn keys' included."""
    topic = unique_topic("compact-tomb")
    create_topic(server.bootstrap, topic, compact_config(delete_retention_ms=500))
    sent = produce_history(server.bootstrap, topic, keyed_history())
    filler(server.bootstrap, topic, ts=BASE_TS + 10_000)
    keys = set(KEYS)
    wait_compacted(server.bootstrap, topic, keys)
    time.sleep(0.6)                 # past the delete horizon of that cleaning
    filler(server.bootstrap, topic, ts=BASE_TS + 20_000)      # dirty again: another cleaning
    wait_compacted(server.bootstrap, topic, keys, tombstones_gone=True)
    expected = compacted(sent, tombstones=False)
    assert len(expected) < len(KEYS)
    for iso in ("read_committed", "read_uncommitted"):
        assert_view(read_partition(server.bootstrap, topic, iso), expected, keys)


def test_confluent_transactional_producer_across_a_cleaning(server):
    """A transactional producer commits (and every third time aborts) transactions of overwrites while the
    cleaner works on the partition; it keeps going past the first cleaning with no error.  Afterwards both
    isolation levels see the latest committed value per key: aborted records are removed from cleaned
    segments, so read_uncommitted no longer sees them either."""
    topic = unique_topic("compact-txn")
    create_topic(server.bootstrap, topic, compact_config())
    p = Producer({"bootstrap.servers": server.bootstrap, "transactional.id": f"ctx-{uuid.uuid4().hex[:8]}",
                  "linger.ms": 5})
    p.init_transactions(30)
    committed: list[Sent] = []
    aborted_values: set[bytes] = set()
    n = 0
    after_cleaning = None
    deadline = time.monotonic() + 90
    while after_cleaning is None or n < after_cleaning + 5:
        assert time.monotonic() < deadline, "no cleaning seen while the transactional producer ran"
        p.begin_transaction()
        recs = [(k, f"t{n}-{k.decode()}".encode() + b"." * 60) for k in KEYS[n % 3::3]]
        sent = produce(server.bootstrap, topic, recs, producer=p)
        if n % 3 == 2:
            p.abort_transaction(30)
            aborted_values |= {s.value for s in sent}
        else:
            p.commit_transaction(30)
            committed += sent
        n += 1
        if after_cleaning is None and n % 4 == 0 and some_record_cleaned(server.bootstrap, topic, committed):
            after_cleaning = n
    p.flush(10)
    filler(server.bootstrap, topic)
    keys = set(KEYS)
    wait_compacted(server.bootstrap, topic, keys, also_gone=aborted_values)
    expected = compacted(committed, tombstones=True)
    for iso in ("read_committed", "read_uncommitted"):
        assert_view(read_partition(server.bootstrap, topic, iso), expected, keys, check_headers=False,
                    check_timestamps=False)


def test_confluent_idempotent_producer_continues_after_its_batches_are_cleaned(server):
    """An idempotent producer's every record is superseded by another producer and cleaned away; the broker
    then restarts (producer state rebuilt from the compacted log and its snapshots); the idempotent producer
    continues on the same connection settings with no error (no OUT_OF_ORDER_SEQUENCE, no fatal error) and
    its new records land once each."""
    topic = unique_topic("compact-idem")
    create_topic(server.bootstrap, topic, compact_config())
    fatal: list[str] = []
    idem = Producer({"bootstrap.servers": server.bootstrap, "enable.idempotence": True, "linger.ms": 5,
                     "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 500,
                     "error_cb": lambda e: fatal.append(str(e)) if e.fatal() else None})
    first = produce(server.bootstrap, topic, [(k, b"idempotent-1") for k in KEYS], producer=idem)
    other = produce(server.bootstrap, topic, [(k, b"other") for k in KEYS])
    filler(server.bootstrap, topic)
    view = wait_compacted(server.bootstrap, topic, set(KEYS))
    assert not {s.offset for s in first} & {r.offset for r in view}
    server.restart()
    second = produce(server.bootstrap, topic, [(k, b"idempotent-2") for k in KEYS], producer=idem)
    third = produce(server.bootstrap, topic, [(k, b"idempotent-3") for k in KEYS], producer=idem)
    assert not fatal, fatal
    view = read_partition(server.bootstrap, topic)
    values = [r.value for r in view]
    assert values.count(b"idempotent-2") == len(KEYS) and values.count(b"idempotent-3") == len(KEYS), values
    by_offset = {r.offset: r.value for r in view}
    for s in second + third:
        assert by_offset.get(s.offset) == s.value, f"{s} not where it was acknowledged"
    for key, s in latest(first + other + second + third).items():
        assert [r.value for r in view if r.key == key][-1] == s.value, key


def test_segment_ms_rolls_a_quiet_segment_for_the_cleaner(server):
    """segment.ms: with 1 GiB segments nothing rolls on size; once segment.ms has passed, the next append
    rolls the segment holding the overwrites and the cleaner compacts it."""
    topic = unique_topic("compact-segms")
    create_topic(server.bootstrap, topic, compact_config(segment_bytes=1 << 30, segment_ms=500))
    sent = produce_history(server.bootstrap, topic, keyed_history(rounds=3))
    time.sleep(0.6)
    sent += produce(server.bootstrap, topic, [(b"roll-trigger", b"x")])
    keys = set(KEYS)
    wait_compacted(server.bootstrap, topic, keys)
    assert_view(read_partition(server.bootstrap, topic), compacted(sent, tombstones=True), keys | {b"roll-trigger"})


@pytest.mark.server_config({"log.retention.check.interval.ms": 100})
def test_compact_only_topic_keeps_every_key_past_retention_ms(server):
    """retention.ms applies only where cleanup.policy includes delete: a compact topic and a delete topic
    with retention.ms=1000 get the same records in rolled segments; once retention has removed the delete
    topic's old segments (retention ran), the compact topic still starts at offset 0 and holds the latest
    value of every key."""
    compact, delete = unique_topic("retain-compact"), unique_topic("retain-delete")
    create_topic(server.bootstrap, compact, compact_config(retention_ms=1000, min_cleanable_dirty_ratio=0.99))
    create_topic(server.bootstrap, delete, {"cleanup.policy": "delete", "retention.ms": "1000",
                                            "segment.bytes": "1024"})
    history = [(k, f"{k.decode()}@{r}".encode() + b"." * 100) for r in range(2) for k in KEYS]
    sent = produce_history(server.bootstrap, compact, history)
    produce_history(server.bootstrap, delete, history)
    filler(server.bootstrap, compact)
    filler(server.bootstrap, delete)
    clients.wait_until(lambda: watermarks(server.bootstrap, delete)[0] > 0, timeout=60, interval=0.3,
                       what="retention to delete the delete topic's old segments")
    assert watermarks(server.bootstrap, compact)[0] == 0, "retention deleted a compact-only topic's segments"
    view = read_partition(server.bootstrap, compact)
    kept = {r.key: r.value for r in view}
    for key, s in latest(sent).items():
        assert kept.get(key) == s.value, f"{key!r}: the latest value was lost past retention.ms"


# ------------------------------------------------------------------------------------------ Java client

def java_records(history: list[tuple]) -> list[dict]:
    return [clients.record(v, key=k, partition=0, headers=h or (), timestamp=ts) for k, v, h, ts in history]


def java_sent(history: list[tuple], res: dict) -> list[Sent]:
    assert res["ok"], res
    return [Sent(off[1], h[0], h[1], tuple(h[2] or ()), ts)
            for h, off, ts in zip(history, res["offsets"], res["timestamps"])]


def java_view(h: clients.HarnessProcess, topic: str, isolation: str) -> list:
    from compat_tests.compaction_support import Stored
    r = h.ok("consume", topic=topic, partition=0, offset="earliest", until_end=True, count=100_000,
             config={"isolation.level": isolation}, timeout_ms=30_000, timeout=60)
    assert not r["timed_out"], r
    out = []
    for rec in r["records"]:
        d = clients.decoded(rec)
        out.append(Stored(d["offset"], d["key"], d["value"], tuple(d["headers_raw"]), d["timestamp"]))
    return out


@pytest.mark.parametrize("version", clients.JAVA_VERSIONS)
def test_java_compacted_view_and_transactions_across_a_cleaning(server, java_harness, version):
    """The Java client produces the keyed history (idempotent, its default) and then transactions of
    overwrites (every third aborted) on a kept transactional producer while the cleaner runs; its consumers at
    both isolation levels read the compacted view: latest committed value per key at its acknowledged offset,
    headers and timestamps kept, aborted records gone."""
    h = java_harness(version)
    topic = unique_topic(f"compact-java-{version}")
    create_topic(server.bootstrap, topic, compact_config())
    history = keyed_history(tag="j")
    sent: list[Sent] = []
    for i in range(0, len(history), 6):
        chunk = history[i:i + 6]
        sent += java_sent(chunk, h.produce(topic, java_records(chunk), config={"acks": "all"}))
    filler(server.bootstrap, topic)
    keys = set(KEYS)
    wait_compacted(server.bootstrap, topic, keys)
    for iso in ("read_committed", "read_uncommitted"):
        assert_view(java_view(h, topic, iso), compacted(sent, tombstones=True), keys)

    txn_conf = {"transactional.id": f"jtx-{uuid.uuid4().hex[:8]}", "acks": "all"}
    aborted: set[bytes] = set()
    after_cleaning = None
    n = 0
    deadline = time.monotonic() + 90
    while after_cleaning is None or n < after_cleaning + 5:
        assert time.monotonic() < deadline, "no cleaning seen while the transactional producer ran"
        chunk = [(k, f"jt{n}-{k.decode()}".encode() + b"." * 60, (), None) for k in KEYS[n % 3::3]]
        outcome = "abort" if n % 3 == 2 else "commit"
        res = h.produce(topic, java_records(chunk), config=txn_conf, handle="txn", txn=outcome)
        got = java_sent(chunk, res)
        if outcome == "abort":
            aborted |= {s.value for s in got}
        else:
            sent += [Sent(s.offset, s.key, s.value, (), None) for s in got]
        n += 1
        if after_cleaning is None and n % 4 == 0 and some_record_cleaned(server.bootstrap, topic, sent):
            after_cleaning = n
    h.ok("close_producer", handle="txn")
    filler(server.bootstrap, topic)
    wait_compacted(server.bootstrap, topic, keys, also_gone=aborted)
    expected = compacted(sent, tombstones=True)
    for iso in ("read_committed", "read_uncommitted"):
        assert_view(java_view(h, topic, iso), expected, keys, check_headers=False, check_timestamps=False)


@pytest.mark.parametrize("version", clients.JAVA_VERSIONS)
def test_java_idempotent_producer_continues_after_its_batches_are_cleaned(server, java_harness, version):
    """The Java client's idempotent producer (kept across the test) writes every key; another producer
    supersedes them all and the cleaner removes its batches; the broker restarts; the same producer goes on
    with no error (no OUT_OF_ORDER_SEQUENCE) and its new records land once each, where acknowledged."""
    h = java_harness(version)
    topic = unique_topic(f"compact-jidem-{version}")
    create_topic(server.bootstrap, topic, compact_config())
    conf = {"enable.idempotence": "true", "acks": "all"}

    def idem(value: bytes) -> list[Sent]:
        chunk = [(k, value, (), None) for k in KEYS]
        return java_sent(chunk, h.produce(topic, java_records(chunk), config=conf, handle="idem"))

    first = idem(b"idempotent-1")
    other = produce(server.bootstrap, topic, [(k, b"other") for k in KEYS])
    filler(server.bootstrap, topic)
    view = wait_compacted(server.bootstrap, topic, set(KEYS))
    assert not {s.offset for s in first} & {r.offset for r in view}
    server.restart()
    later = idem(b"idempotent-2") + idem(b"idempotent-3")
    h.ok("close_producer", handle="idem")
    view = java_view(h, topic, "read_uncommitted")
    values = [r.value for r in view]
    assert values.count(b"idempotent-2") == len(KEYS) and values.count(b"idempotent-3") == len(KEYS)
    by_offset = {r.offset: r.value for r in view}
    for s in later:
        assert by_offset.get(s.offset) == s.value, f"{s} not where it was acknowledged"
    for key, s in latest(first + other + later).items():
        assert [r.value for r in view if r.key == key][-1] == s.value, key


def roll(bootstrap: str, topic: str) -> list[Sent]:
    """One record of a unique key larger than a 1 KiB segment: the active segment is rolled (becomes cleanable)
    and the next append rolls this one's, so what is produced next starts a segment of its own."""
    return produce(bootstrap, topic, [(f"roll-{uuid.uuid4().hex[:8]}".encode(), b"r" * 1500)])


def java_produce_chunks(h: clients.HarnessProcess, topic: str, history: list[tuple], per_call: int = 6) -> list[Sent]:
    sent: list[Sent] = []
    for i in range(0, len(history), per_call):
        chunk = history[i:i + per_call]
        sent += java_sent(chunk, h.produce(topic, java_records(chunk), config={"acks": "all"}))
    return sent


@pytest.mark.parametrize("version", clients.JAVA_VERSIONS)
def test_java_tombstones_seen_before_the_delete_horizon_and_gone_after(server, java_harness, version):
    """delete.retention.ms=1000.  The Java client writes values for every key, then (in a segment of their own)
    tombstones and some reborn values.  The cleaning that first sees the tombstones keeps them and stamps a delete
    horizon; nothing is dirty after it, so no other cleaning runs and the Java consumers (both isolation levels)
    reading from the start see each tombstone at its acknowledged offset.  Past the horizon, new data makes the
    log dirty again; that cleaning removes the tombstones, and the Java consumers then read the latest values
    without them, the reborn keys' included."""
    h = java_harness(version)
    topic = unique_topic(f"compact-jtomb-{version}")
    create_topic(server.bootstrap, topic, compact_config(delete_retention_ms=1000))
    history = keyed_history(tag="j")
    values_end = next(i for i, (_, v, *_rest) in enumerate(history) if v is None)
    keys = set(KEYS)
    sent = java_produce_chunks(h, topic, history[:values_end])
    filler(server.bootstrap, topic)
    wait_compacted(server.bootstrap, topic, keys)

    roll(server.bootstrap, topic)
    sent += java_produce_chunks(h, topic, history[values_end:], per_call=len(history))
    roll(server.bootstrap, topic)
    wait_compacted(server.bootstrap, topic, keys)        # each key once: the cleaning saw the tombstones
    before = compacted(sent, tombstones=True)
    tombstoned = {s.key for s in before if s.value is None}
    assert tombstoned
    for iso in ("read_committed", "read_uncommitted"):
        view = java_view(h, topic, iso)
        assert_view(view, before, keys)
        assert {r.key for r in view if r.value is None} == tombstoned

    time.sleep(1.2)                  # past the delete horizon (the cleaning ran before wait_compacted returned)
    filler(server.bootstrap, topic)  # dirty again: another cleaning
    wait_compacted(server.bootstrap, topic, keys, tombstones_gone=True)
    after = compacted(sent, tombstones=False)
    assert {s.key for s in after} == keys - tombstoned
    for iso in ("read_committed", "read_uncommitted"):
        view = java_view(h, topic, iso)
        assert_view(view, after, keys)
        assert not [r for r in watched(view, keys) if r.value is None]


@pytest.mark.parametrize("version", clients.JAVA_VERSIONS)
@pytest.mark.server_config({"log.retention.check.interval.ms": 100})
def test_java_compact_only_topic_keeps_every_key_past_retention_ms(server, java_harness, version):
    """The Java client writes the same keyed records to a compact topic and a delete topic, both with
    retention.ms=1000 and 1 KiB segments; once retention has removed the delete topic's old segments (so
    retention ran past retention.ms), the Java client's ListOffsets gives the compact topic's earliest offset as
    0 and its consumer reads the latest value of every key there, at its acknowledged offset (whether or not the
    cleaner has been over the topic yet: min.cleanable.dirty.ratio=0.99)."""
    h = java_harness(version)
    compact, delete = unique_topic(f"jretain-compact-{version}"), unique_topic(f"jretain-delete-{version}")
    create_topic(server.bootstrap, compact, compact_config(retention_ms=1000, min_cleanable_dirty_ratio=0.99))
    create_topic(server.bootstrap, delete, {"cleanup.policy": "delete", "retention.ms": "1000",
                                            "segment.bytes": "1024"})
    history = [(k, f"j{k.decode()}@{r}".encode() + b"." * 100, (), None) for r in range(2) for k in KEYS]
    sent = java_produce_chunks(h, compact, history)
    java_produce_chunks(h, delete, history)
    filler(server.bootstrap, compact)
    filler(server.bootstrap, delete)

    def earliest(topic: str) -> int:
        return h.ok("list_offsets", topic=topic, partition=0, spec="earliest")["offset"]
    clients.wait_until(lambda: earliest(delete) > 0, timeout=60, interval=0.3,
                       what="retention to delete the delete topic's old segments")
    assert earliest(compact) == 0, "retention deleted a compact-only topic's segments"
    view = java_view(h, compact, "read_uncommitted")
    by_offset = {r.offset: (r.key, r.value) for r in view}
    for key, s in latest(sent).items():                  # cleaned or not yet: the latest is there, and last
        assert by_offset.get(s.offset) == (key, s.value), f"{key!r}: the latest value was lost past retention.ms"
        assert [r.offset for r in view if r.key == key][-1] == s.offset, key
