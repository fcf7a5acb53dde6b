"""kcat 1.7.1 (librdkafka 2.0.2) against a real Trireme process.

kcat has no admin API (client lacks admin): topics are created and deleted
with confluent_kafka's AdminClient (librdkafka as well) and everything else is
done with kcat itself:

* 10,000 records with keys and headers over 3 partitions (-p per partition,
  several runs with different -H headers) for every codec -z takes (none,
  gzip, snappy, lz4, zstd: kcat -V lists them as builtin features), acks=all;
* consume by partition and offset (-C -p -o -c: absolute, relative to the
  end, beginning/end, s@timestamp; both isolation levels) and compare key,
  value, headers, partition, offset (dense) and timestamp;
* ListOffsets with -Q (earliest -2, latest -1, by timestamp) and metadata
  with -L;
* delete (through confluent_kafka) and check with -L that the topic is gone.

What kcat lacks, so it is not tested: admin operations, explicit record
timestamps (librdkafka stamps CreateTime at produce(); checked against the
wall clock instead), per-record headers (-H applies to a whole run), empty
non-null keys/values (-Z makes them NULL), delivery reports with offsets
(acknowledged offsets are derived from -Q latest and the consumed log),
isolation level for -Q (it runs on a producer handle) and ListOffsets
max_timestamp.
"""
from __future__ import annotations

import json
import re
import subprocess
import time
from typing import Iterator

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from compat_tests import clients
from compat_tests.broker_probe import bootstrap_addresses, broker_info
from compat_tests.python_clients import unique_topic

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
N_RECORDS = 10_000
PARTITIONS = 3
CHUNKS = 2          # kcat runs per partition (each with its own headers)


@pytest.fixture
def kcat_env(request, kcat, module_server) -> Iterator[str]:
    """The shared broker's bootstrap; dumps the server log tail on failure."""
    yield module_server.bootstrap
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        print(f"\n----- server stderr tail -----\n{module_server.stderr_tail(60)}")


# ------------------------------------------------------------------- helpers

def admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap})


def create_topic_client_lacks_admin(bootstrap: str, topic: str, partitions: int) -> None:
    a = admin(bootstrap)   # keep the handle alive until the future resolves
    fs = a.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)],
                         operation_timeout=10)
    assert fs[topic].result(timeout=20) is None


def delete_topic_client_lacks_admin(bootstrap: str, topic: str) -> None:
    a = admin(bootstrap)
    fs = a.delete_topics([topic], operation_timeout=10)
    assert fs[topic].result(timeout=20) is None


def kcat_run(argv: list[str], timeout: float = 30.0) -> subprocess.CompletedProcess:
    return subprocess.run([clients.require_kcat(), *argv], capture_output=True, timeout=timeout)


def kcat_metadata(bootstrap: str, topic: str | None = None) -> dict:
    """kcat -L -J; with a topic, without auto-creating it (librdkafka's
    producer handle would otherwise ask the broker to create it)."""
    argv = ["-L", "-J", "-b", bootstrap, "-X", "allow.auto.create.topics=false"]
    if topic:
        argv += ["-t", topic]
    p = kcat_run(argv)
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    return json.loads(p.stdout)


def kcat_query(bootstrap: str, topic: str, partitions: list[int], ts: int) -> dict[int, int]:
    """kcat -Q -t topic:p:ts for several partitions -> {partition: offset}."""
    argv = ["-Q", "-J", "-b", bootstrap]
    for p in partitions:
        argv += ["-t", f"{topic}:{p}:{ts}"]
    proc = kcat_run(argv)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    res = json.loads(proc.stdout)[topic]
    out = {}
    for p in partitions:
        entry = res[str(p)]
        assert "error" not in entry, entry
        out[p] = entry["offset"]
    return out


def make_chunk(tag: str, p: int, c: int, start: int, count: int) -> tuple[list, list]:
    """Values and keys of one kcat run; index i is the record's global number.
    Binary bytes (but not kcat's delimiters 0x1e/0x1f), some NULL keys and
    values (kcat -Z: b"" and None are both NULL)."""
    keys: list[bytes | None] = []
    values: list[bytes | None] = []
    for j in range(start, start + count):
        i = p + PARTITIONS * j
        m = i % 1000
        keys.append(None if m == 997 else f"{tag}/key/{i:05d}".encode() + bytes([0, 255, 10]))
        values.append(None if m == 999 else
                      f"{tag} value {i} ".encode() * (1 + i % 4) + bytes([0, 1, 10, 13, 255, i % 29]))
    return keys, values


def first_offset_at_or_after(ts_by_offset: list[int], target: int) -> int:
    for o, t in enumerate(ts_by_offset):
        if t >= target:
            return o
    return -1


# --------------------------------------------------------------------- tests

def test_kcat_codecs_available(kcat):
    out = subprocess.run([kcat, "-V"], capture_output=True, text=True, timeout=30).stdout
    features = re.search(r"builtin\.features=([\w,]+)", out)
    assert features, out
    assert {"gzip", "snappy", "lz4", "zstd"} <= set(features.group(1).split(","))


@pytest.mark.parametrize("codec", CODECS)
def test_produce_consume_roundtrip(kcat_env, codec):
    """Create (client lacks admin: confluent_kafka), produce, consume, list
    offsets, delete (confluent_kafka) and check it is gone."""
    bootstrap = kcat_env
    topic = unique_topic(f"kcat-roundtrip-{codec}")
    create_topic_client_lacks_admin(bootstrap, topic, PARTITIONS)

    # The brokers (one, or a cluster's: those of the bootstrap list), the controller and each partition's leader as
    # the broker's own Metadata gives them; replication factor 1: the leader is the only replica.
    probe = broker_info(bootstrap)
    leaders = probe.leaders(topic)
    md = kcat_metadata(bootstrap, topic)
    assert md["controllerid"] == probe.controller_id
    assert sorted((b["id"], b["name"]) for b in md["brokers"]) == [(n, f"{h}:{p}") for n, (h, p) in probe.brokers.items()]
    assert sorted(probe.addresses()) == sorted(bootstrap_addresses(bootstrap))
    (t,) = md["topics"]
    assert t["topic"] == topic and "error" not in t, t
    assert t["partitions"] == [{"partition": p, "leader": leaders[p], "replicas": [{"id": leaders[p]}],
                                "isrs": [{"id": leaders[p]}]} for p in range(PARTITIONS)]

    # -- produce: per partition CHUNKS runs of kcat -P -p <p> -z <codec>
    counts = {p: len(range(p, N_RECORDS, PARTITIONS)) for p in range(PARTITIONS)}
    expected: dict[int, list[tuple]] = {p: [] for p in range(PARTITIONS)}
    windows: dict[int, list[tuple[int, int]]] = {p: [] for p in range(PARTITIONS)}
    for p in range(PARTITIONS):
        step = -(-counts[p] // CHUNKS)
        for c, start in enumerate(range(0, counts[p], step)):
            n = min(step, counts[p] - start)
            keys, values = make_chunk(codec, p, c, start, n)
            headers = [("part", str(p)), ("chunk", str(c)), ("dup", "a"), ("dup", "b"), ("codec", codec)]
            t0 = int(time.time() * 1000)
            clients.kcat_produce(bootstrap, topic, values, keys=keys, partition=p, headers=headers,
                                 codec=None if codec == "none" else codec, config={"acks": "all"})
            t1 = int(time.time() * 1000)
            for k, v in zip(keys, values):
                expected[p].append((k, v, headers))
            windows[p].extend([(t0, t1)] * n)
    assert sum(len(v) for v in expected.values()) == N_RECORDS

    # acknowledged: the log ends exactly after what was produced
    assert kcat_query(bootstrap, topic, list(range(PARTITIONS)), -1) == counts
    assert kcat_query(bootstrap, topic, list(range(PARTITIONS)), -2) == {p: 0 for p in range(PARTITIONS)}

    # -- consume every partition from offset 0
    ts_by_part: dict[int, list[int]] = {}
    for p in range(PARTITIONS):
        recs = clients.kcat_consume(bootstrap, topic, partition=p, offset=0, count=counts[p], timeout=60)
        assert len(recs) == counts[p]
        rows = [(r.partition, r.offset, r.key, r.value, r.headers) for r in recs]
        want = [(p, o, k, v, h) for o, (k, v, h) in enumerate(expected[p])]
        for idx, (w, g) in enumerate(zip(want, rows)):
            assert g == w, f"{topic}-{p}: first difference at offset {idx}"
        ts = [r.timestamp for r in recs]
        for o, (t, (t0, t1)) in enumerate(zip(ts, windows[p])):
            assert t is not None and t0 - 1 <= t <= t1 + 1, (p, o, t, t0, t1)
        assert ts == sorted(ts), f"{topic}-{p}: CreateTime of one producer went backwards"
        ts_by_part[p] = ts

        # seek into the middle, relative to the end (both isolation levels), beginning, end
        mid = counts[p] - 137
        tail = clients.kcat_consume(bootstrap, topic, partition=p, offset=mid, count=137)
        assert [(r.offset, r.key, r.value) for r in tail] == \
            [(o, *expected[p][o][:2]) for o in range(mid, counts[p])]
        for iso in ("read_committed", "read_uncommitted"):
            last = clients.kcat_consume(bootstrap, topic, partition=p, offset=-5, count=5,
                                        config={"isolation.level": iso})
            assert [r.offset for r in last] == list(range(counts[p] - 5, counts[p])), iso
        first = clients.kcat_consume(bootstrap, topic, partition=p, offset="beginning", count=2)
        assert [(r.offset, r.value) for r in first] == [(0, expected[p][0][1]), (1, expected[p][1][1])]
        assert clients.kcat_consume(bootstrap, topic, partition=p, offset="end") == []

    # -- ListOffsets by timestamp: -Q and the consumer's -o s@<ts>
    for p, ts in ts_by_part.items():
        n = len(ts)
        for target in (0, ts[0], ts[n // 2], ts[-1], ts[-1] + 1):
            want = first_offset_at_or_after(ts, target)
            assert kcat_query(bootstrap, topic, [p], target) == {p: want}, (p, target)
        target = ts[n // 2]
        from_ts = clients.kcat_consume(bootstrap, topic, partition=p, offset=f"s@{target}", count=3)
        start = first_offset_at_or_after(ts, target)
        assert [r.offset for r in from_ts] == list(range(start, start + 3))

    # -- delete (client lacks admin) and check it is gone
    delete_topic_client_lacks_admin(bootstrap, topic)
    for one in bootstrap.split(","):        # a cluster: every broker's Metadata, each replaying the deletion
        clients.wait_until(lambda: topic not in {t["topic"] for t in kcat_metadata(one)["topics"]},
                           timeout=10, what=f"{topic} to leave the metadata of {one}")
    (t,) = kcat_metadata(bootstrap, topic)["topics"]
    assert t["topic"] == topic and t.get("error") == "Broker: Unknown topic or partition", t
    assert topic not in {t["topic"] for t in kcat_metadata(bootstrap)["topics"]}   # not re-created
