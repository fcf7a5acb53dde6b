"""The stock Apache Kafka Java client (3.9.0 and 4.3.0) against a real Trireme
process, through compat_tests/java/Harness.java.

* topic lifecycle through the AdminClient (create, describe, delete);
* 10,000 records with keys, headers and explicit timestamps over 3 partitions,
  for every codec the client has (none, gzip, snappy, lz4, zstd), acks=all,
  both with the client's default idempotent producer and with
  enable.idempotence=false; read back with assign()+seek() and compared field
  by field against the acknowledged (partition, offset);
* ListOffsets (Admin listOffsets: earliest, latest, max_timestamp, a
  timestamp, both isolation levels; consumer beginningOffsets/endOffsets);
* admin extras: describe_configs, alter_config, create_partitions,
  delete_records;
* ``test_spark_access_pattern``: what Spark 4.x (Java client 3.9) does;
  ``test_spark_access_pattern_over_transactions``: the same calls over
  control records, aborted transactions and an open one (the LSO).

One broker and one harness process per client version serve the whole module
(each test uses its own topics); the Spark test has a fresh broker of its own
so that the APIs it used can be read back from TRIREME_CAPTURE_DIR.
"""
from __future__ import annotations

import time
import uuid
from typing import Iterator

import pytest
from kafka.partitioner.default import murmur2

from compat_tests import clients
from compat_tests.broker_probe import bootstrap_addresses, broker_info
from compat_tests.matrix import not_applicable
from compat_tests.python_clients import unique_topic
from compat_tests.harness_helpers import (PARTITIONS, actual_row, assert_same_rows, expected_row,
                                          first_offset_at_or_after, harness_pool, make_records,
                                          past_base_ts, pooled_harness, wire)

VERSIONS = clients.JAVA_VERSIONS
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
# The harness closes its consumer after each command; close() waits for the
# consumer's prefetch at the end of the log, which the broker (rightly) holds
# for fetch.max.wait.ms (500 ms by default).  Shorter for the bulk reads.
FAST_FETCH = {"fetch.max.wait.ms": 50}


# ------------------------------------------------------------------ fixtures

@pytest.fixture(scope="module")
def java_pool(module_server) -> Iterator[dict[str, clients.HarnessProcess]]:
    """One harness process per Java client version for the whole module."""
    yield from harness_pool()


@pytest.fixture
def java(request, java_pool, module_server, version) -> Iterator[clients.HarnessProcess]:
    clients.require_java(version)
    yield from pooled_harness(request, java_pool, version,
                              lambda: clients.java_harness(version, module_server.bootstrap),
                              module_server, server_lines=40)


@pytest.fixture
def captured_server(request, tmp_path, monkeypatch):
    """A fresh broker started with TRIREME_CAPTURE_DIR, so a test can see which
    APIs (and versions) the client really used."""
    capture = tmp_path / "capture"
    monkeypatch.setenv("TRIREME_CAPTURE_DIR", str(capture))
    srv = request.getfixturevalue("server")
    if srv.external:
        not_applicable("reads the requests a Trireme broker captured (TRIREME_CAPTURE_DIR)")
    return srv, capture


# ------------------------------------------------------------------- helpers

def assert_topic_gone(h: clients.HarnessProcess, topic: str) -> None:
    clients.wait_until(lambda: topic not in h.ok("list_topics")["topics"], timeout=10,
                       what=f"{topic} to leave list_topics")
    broker_info(h.bootstrap).wait_gone(topic)       # a cluster: every broker has forgotten it
    r = h.call("describe_topic", topic=topic)
    assert r["ok"] is False and r["error"].startswith("UnknownTopicOrPartitionException"), r
    # (Admin listOffsets on a missing topic is no check: the 4.x admin retries
    # UNKNOWN_TOPIC_OR_PARTITION from its metadata lookup until it times out.)


def assert_describe(h: clients.HarnessProcess, topic: str, partitions: int) -> dict:
    d = h.ok("describe_topic", topic=topic)
    assert d["topic"] == topic and d["internal"] is False
    assert d["topic_id"] and d["topic_id"] != "AAAAAAAAAAAAAAAAAAAAAA"
    leaders = broker_info(h.bootstrap).leaders(topic)   # one broker, or a cluster's: as its Metadata gives them
    assert sorted(d["partitions"], key=lambda p: p["partition"]) == [
        {"partition": p, "leader": leaders[p], "replicas": [leaders[p]], "isr": [leaders[p]]}
        for p in range(partitions)]
    return d


def produce_ok(h: clients.HarnessProcess, topic: str, records: list[dict], config: dict) -> dict:
    r = h.produce(topic, records, config=config)
    assert r["ok"], f"produce failed: {r.get('error')}\n{h.stderr_tail(30)}"
    return r


def check_list_offsets(h: clients.HarnessProcess, topic: str, ts_by_part: dict[int, list[int]],
                       leader_epoch: int | None) -> None:
    """Admin listOffsets (earliest, latest, max_timestamp, several timestamps;
    both isolation levels) and consumer beginningOffsets/endOffsets."""
    for p, ts in ts_by_part.items():
        n = len(ts)
        imax = max(range(n), key=ts.__getitem__)
        targets = [0, min(ts), ts[n // 2], ts[n // 3] + 1, ts[n - 1], max(ts), max(ts) + 1]
        for iso in ("read_uncommitted", "read_committed"):
            got = {spec: h.ok("list_offsets", topic=topic, partition=p, spec=spec, isolation=iso)
                   for spec in ("earliest", "latest", "max_timestamp")}
            assert (got["earliest"]["offset"], got["earliest"]["timestamp"]) == (0, -1), (p, iso, got)
            assert (got["latest"]["offset"], got["latest"]["timestamp"]) == (n, -1), (p, iso, got)
            assert (got["max_timestamp"]["offset"], got["max_timestamp"]["timestamp"]) == (imax, ts[imax]), \
                (p, iso, got)
            for g in got.values():
                assert g["leader_epoch"] == leader_epoch, (p, iso, got)
            for target in targets:
                r = h.ok("list_offsets", topic=topic, partition=p, spec=target, isolation=iso)
                assert (r["offset"], r["timestamp"]) == first_offset_at_or_after(ts, target), \
                    (p, iso, target, r)
    parts = sorted(ts_by_part)
    for iso in ("read_uncommitted", "read_committed"):
        r = h.ok("consumer_offsets", topic=topic, partitions=parts, config={"isolation.level": iso})
        assert r["offsets"] == [{"partition": p, "beginning": 0, "end": len(ts_by_part[p])} for p in parts]


# --------------------------------------------------------------------- tests

@pytest.mark.parametrize("version", VERSIONS)
def test_create_and_delete_topic_via_admin(java, version):
    topic = unique_topic(f"admin-lifecycle-{version}")
    r = java.ok("create_topic", topic=topic, partitions=PARTITIONS, configs={"retention.ms": 86_400_000})
    assert r["partitions"] == PARTITIONS
    assert topic in java.ok("list_topics")["topics"]
    assert_describe(java, topic, PARTITIONS)

    again = java.call("create_topic", topic=topic, partitions=PARTITIONS)
    assert again["ok"] is False and again["error"].startswith("TopicExistsException"), again

    dry = f"admin-validate-only-{version}"
    r = java.ok("create_topic", topic=dry, partitions=2, validate_only=True)
    assert r["partitions"] == 2
    assert dry not in java.ok("list_topics")["topics"]

    bad = java.call("create_topic", topic=f"admin-zero-partitions-{version}", partitions=0)
    assert bad["ok"] is False and bad["error"].startswith("InvalidPartitionsException"), bad

    java.ok("delete_topic", topic=topic)
    assert_topic_gone(java, topic)
    again = java.call("delete_topic", topic=topic)
    assert again["ok"] is False and again["error"].startswith("UnknownTopicOrPartitionException"), again


# Every codec with acks=all and the client's default producer (idempotent by
# default since 3.0), plus the classic non-idempotent producer once.
ROUNDTRIP_CASES = ([(v, c, "default_idempotent") for v in VERSIONS for c in CODECS]
                   + [(v, "none", "non_idempotent") for v in VERSIONS])


@pytest.mark.parametrize("version,codec,producer", ROUNDTRIP_CASES,
                         ids=[f"{v}-{c}" if m == "default_idempotent" else f"{v}-{c}-{m}"
                              for v, c, m in ROUNDTRIP_CASES])
def test_produce_consume_roundtrip(java, version, codec, producer):
    topic = unique_topic(f"roundtrip-{version}-{codec}-{producer}")
    assert java.ok("create_topic", topic=topic, partitions=PARTITIONS)["partitions"] == PARTITIONS

    recs = make_records(f"{codec}-{producer}", past_base_ts())
    config = {"compression.type": codec, "acks": "all"}
    if producer == "non_idempotent":
        config["enable.idempotence"] = "false"
    # default_idempotent: enable.idempotence left unset (true by default since 3.0)
    res = produce_ok(java, topic, wire(recs), config)

    # Acknowledged offsets: per partition dense from 0.  With idempotence the
    # client also guarantees send order; without it (5 in flight, retries)
    # Kafka only promises the set.
    assert [o[0] for o in res["offsets"]] == [r["partition"] for r in recs]
    by_part: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
    for (p, o) in res["offsets"]:
        by_part[p].append(o)
    for p, offs in by_part.items():
        if producer == "default_idempotent":
            assert offs == list(range(len(offs))), f"partition {p}: acknowledged offsets not in send order"
        else:
            assert sorted(offs) == list(range(len(offs))), f"partition {p}: offsets not dense"
    assert res["timestamps"] == [r["timestamp"] for r in recs]   # CreateTime echoed back

    at: dict[tuple[int, int], dict] = {(p, o): r for r, (p, o) in zip(recs, res["offsets"])}
    ts_by_part = {p: [at[(p, o)]["timestamp"] for o in range(len(by_part[p]))] for p in range(PARTITIONS)}

    # Consume back: assign + seek per partition, from 0 and from the middle.
    epochs = set()
    for p in range(PARTITIONS):
        n = len(by_part[p])
        got = java.consume(topic, partition=p, offset=0, count=n, config=FAST_FETCH, timeout_ms=30_000)
        assert got["ok"], got.get("error")
        assert got["timed_out"] is False and got["position"] == n
        assert {rec["topic"] for rec in got["records"]} == {topic}
        assert_same_rows([expected_row(at[(p, o)], p, o) for o in range(n)],
                         [actual_row(rec) for rec in got["records"]], f"{topic}-{p}")
        epochs |= {rec["leader_epoch"] for rec in got["records"]}

        mid = n - 137
        tail = java.consume(topic, partition=p, offset=mid, count=137, config=FAST_FETCH, timeout_ms=10_000)
        assert tail["ok"], tail.get("error")
        assert tail["position"] == n
        assert_same_rows([expected_row(at[(p, o)], p, o) for o in range(mid, n)],
                         [actual_row(rec) for rec in tail["records"]], f"{topic}-{p} from {mid}")
    assert len(epochs) == 1 and isinstance(next(iter(epochs)), int) and next(iter(epochs)) >= 0, epochs

    check_list_offsets(java, topic, ts_by_part, leader_epoch=next(iter(epochs)))

    java.ok("delete_topic", topic=topic)
    assert_topic_gone(java, topic)


@pytest.mark.parametrize("version", VERSIONS)
def test_describe_configs(java, version, module_server):
    external = module_server.external
    topic = unique_topic(f"configs-describe-{version}")
    java.ok("create_topic", topic=topic, partitions=1,
            configs={"retention.ms": 86_400_000, "cleanup.policy": "compact", "max.message.bytes": 2_000_000})
    d = java.ok("describe_configs", topic=topic)
    cfg, src = d["configs"], d["sources"]
    assert (cfg["retention.ms"], src["retention.ms"]) == ("86400000", "DYNAMIC_TOPIC_CONFIG")
    assert (cfg["cleanup.policy"], src["cleanup.policy"]) == ("compact", "DYNAMIC_TOPIC_CONFIG")
    assert (cfg["max.message.bytes"], src["max.message.bytes"]) == ("2000000", "DYNAMIC_TOPIC_CONFIG")
    # Kafka's defaults for what the test broker leaves alone.  (Kafka's sample server.properties sets
    # log.segment.bytes to that same value, which Kafka then reports as STATIC_BROKER_CONFIG.)
    for name, value in {"segment.bytes": "1073741824", "retention.bytes": "-1",
                        "compression.type": "producer", "message.timestamp.type": "CreateTime",
                        "min.insync.replicas": "1"}.items():
        sources = ("DEFAULT_CONFIG", "STATIC_BROKER_CONFIG") if external else ("DEFAULT_CONFIG",)
        assert cfg.get(name) == value and src.get(name) in sources, (name, cfg.get(name), src.get(name))

    missing = java.call("describe_configs", topic=f"configs-no-such-topic-{version}")
    assert missing["ok"] is False and missing["error"].startswith("UnknownTopicOrPartitionException"), missing
    java.ok("delete_topic", topic=topic)


@pytest.mark.parametrize("version", VERSIONS)
def test_alter_config(java, version):
    topic = unique_topic(f"configs-alter-{version}")
    java.ok("create_topic", topic=topic, partitions=1)

    def current(name: str) -> tuple[str, str]:
        d = java.ok("describe_configs", topic=topic)
        return d["configs"][name], d["sources"][name]

    assert current("retention.ms") == ("604800000", "DEFAULT_CONFIG")
    java.ok("alter_config", topic=topic, key="retention.ms", value="3600000")
    assert current("retention.ms") == ("3600000", "DYNAMIC_TOPIC_CONFIG")
    java.ok("alter_config", topic=topic, key="cleanup.policy", value="compact", operation="APPEND")
    assert current("cleanup.policy") == ("delete,compact", "DYNAMIC_TOPIC_CONFIG")
    java.ok("alter_config", topic=topic, key="cleanup.policy", value="delete", operation="SUBTRACT")
    assert current("cleanup.policy") == ("compact", "DYNAMIC_TOPIC_CONFIG")
    java.ok("alter_config", topic=topic, key="retention.ms", value=None)       # DELETE
    assert current("retention.ms") == ("604800000", "DEFAULT_CONFIG")
    assert current("cleanup.policy") == ("compact", "DYNAMIC_TOPIC_CONFIG")     # untouched

    bad = java.call("alter_config", topic=topic, key="retention.ms", value="not-a-number")
    assert bad["ok"] is False and bad["error"].startswith("InvalidConfigurationException"), bad
    unknown = java.call("alter_config", topic=topic, key="no.such.config", value="1")
    assert unknown["ok"] is False and unknown["error"].startswith("InvalidConfigurationException"), unknown
    assert current("retention.ms") == ("604800000", "DEFAULT_CONFIG")
    java.ok("delete_topic", topic=topic)


@pytest.mark.parametrize("version", VERSIONS)
def test_create_partitions(java, version):
    topic = unique_topic(f"partitions-add-{version}")
    java.ok("create_topic", topic=topic, partitions=PARTITIONS)
    java.ok("create_partitions", topic=topic, count=5)
    assert_describe(java, topic, 5)
    for p in (3, 4):
        assert java.ok("list_offsets", topic=topic, partition=p, spec="latest")["offset"] == 0
    recs = [clients.record(f"v{p}", key=f"k{p}", partition=p, timestamp=past_base_ts() + p) for p in range(5)]
    res = produce_ok(java, topic, recs, {})
    assert res["offsets"] == [[p, 0] for p in range(5)]
    got = java.consume(topic, partition=4, offset=0, count=1)
    assert got["ok"] and clients.decoded(got["records"][0])["value"] == b"v4"

    lower = java.call("create_partitions", topic=topic, count=2)
    assert lower["ok"] is False and lower["error"].startswith("InvalidPartitionsException"), lower
    same = java.call("create_partitions", topic=topic, count=5)
    assert same["ok"] is False and same["error"].startswith("InvalidPartitionsException"), same
    assert len(java.ok("describe_topic", topic=topic)["partitions"]) == 5
    java.ok("delete_topic", topic=topic)


@pytest.mark.parametrize("version", VERSIONS)
def test_delete_records(java, version):
    topic = unique_topic(f"records-delete-{version}")
    java.ok("create_topic", topic=topic, partitions=2)
    base = past_base_ts()
    recs = [clients.record(f"v{i}", key=f"k{i}", partition=0, timestamp=base + i) for i in range(100)]
    produce_ok(java, topic, recs, {})

    assert java.ok("delete_records", topic=topic, partition=0, before_offset=40)["low_watermark"] == 40
    for iso in ("read_uncommitted", "read_committed"):
        e = java.ok("list_offsets", topic=topic, partition=0, spec="earliest", isolation=iso)
        assert e["offset"] == 40
        assert java.ok("list_offsets", topic=topic, partition=0, spec="latest", isolation=iso)["offset"] == 100
        # a timestamp before the new log start resolves to the log start
        t = java.ok("list_offsets", topic=topic, partition=0, spec=base, isolation=iso)
        assert (t["offset"], t["timestamp"]) == (40, base + 40)
    r = java.ok("consumer_offsets", topic=topic, partitions=[0, 1])
    assert r["offsets"] == [{"partition": 0, "beginning": 40, "end": 100},
                            {"partition": 1, "beginning": 0, "end": 0}]
    got = java.consume(topic, partition=0, offset=40, count=60)
    assert got["ok"] and [x["offset"] for x in got["records"]] == list(range(40, 100))
    assert clients.decoded(got["records"][0])["value"] == b"v40"
    earliest = java.consume(topic, partition=0, offset="earliest", count=1)
    assert earliest["ok"] and earliest["records"][0]["offset"] == 40
    gone = java.consume(topic, partition=0, offset=10, count=1, timeout_ms=5000)
    assert gone["ok"] is False and gone["error"].startswith("OffsetOutOfRangeException"), gone

    # going backwards is a no-op, -1 means "up to the high watermark"
    assert java.ok("delete_records", topic=topic, partition=0, before_offset=20)["low_watermark"] == 40
    assert java.ok("delete_records", topic=topic, partition=0, before_offset=-1)["low_watermark"] == 100
    beyond = java.call("delete_records", topic=topic, partition=0, before_offset=1000)
    assert beyond["ok"] is False and beyond["error"].startswith("OffsetOutOfRangeException"), beyond
    assert java.ok("list_offsets", topic=topic, partition=0, spec="earliest")["offset"] == 100
    # the log stays appendable at the old end
    res = produce_ok(java, topic, [clients.record("after", partition=0)], {})
    assert res["offsets"] == [[0, 100]]
    java.ok("delete_topic", topic=topic)


# ------------------------------------------------------------------- Spark

def spark_partition(key: bytes, partitions: int) -> int:
    """The Java client's BuiltInPartitioner.partitionForKey."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


SPARK_CHUNK = 60    # records per executor poll: several polls (and seeks) per partition


def spark_executor_read(h: clients.HarnessProcess, topic: str, p: int, start: int, until: int,
                        config: dict, end_now: int) -> list[dict]:
    """One Spark task: a consumer assigned to one partition; per poll it
    checks the available range (beginning/endOffsets), seeks, polls and reads
    position().  Spark keeps one KafkaConsumer per partition across these
    calls; the harness opens one per command (``consumer_offsets``, then
    ``consume`` = assign+seek+poll+position), with Spark's executor config.
    Trireme offers no fetch sessions, so the requests the broker sees are the
    same apart from the connection they arrive on."""
    out: list[dict] = []
    off = start
    while off < until:
        rng = h.ok("consumer_offsets", topic=topic, partitions=[p], config=config)["offsets"]
        assert rng == [{"partition": p, "beginning": 0, "end": end_now}]
        want = min(SPARK_CHUNK, until - off)
        got = h.consume(topic, partition=p, offset=off, count=want, config=config, timeout_ms=10_000)
        assert got["ok"], got.get("error")
        offs = [r["offset"] for r in got["records"]]
        assert offs == list(range(off, off + want)), (p, off, offs[:5])
        assert got["position"] == off + want
        out += got["records"]
        off += want
    return out


@pytest.mark.parametrize("version", VERSIONS)
def test_spark_access_pattern(version, captured_server, java_harness):
    srv, capture = captured_server
    h = java_harness(version, bootstrap=srv.bootstrap)
    topic = unique_topic(f"spark-{version}")
    h.ok("create_topic", topic=topic, partitions=PARTITIONS)

    # -- sink: default idempotent producer, acks=all, 5 in flight, partitioner
    #    picks the partition from the key, producer-assigned timestamps.
    sink_cfg = {"acks": "all", "max.in.flight.requests.per.connection": 5}
    sent: dict[tuple[int, int], tuple[bytes, bytes, list, int]] = {}

    def sink_batch(batch: int, n: int) -> None:
        rows = []
        for j in range(n):
            key = f"spark-{batch}-{j}".encode()
            value = f'{{"batch": {batch}, "row": {j}, "payload": "{"x" * (j % 50)}"}}'.encode()
            rows.append((key, value, [("batch", str(batch).encode()), ("row", str(j).encode())]))
        t0 = int(time.time() * 1000)
        res = produce_ok(h, topic, [clients.record(v, key=k, partition=None, headers=hd, timestamp=None)
                                    for k, v, hd in rows], sink_cfg)
        t1 = int(time.time() * 1000)
        for (k, v, hd), (p, o), ts in zip(rows, res["offsets"], res["timestamps"]):
            assert p == spark_partition(k, PARTITIONS), (k, p)
            assert t0 - 1 <= ts <= t1 + 1
            sent[(p, o)] = (k, v, hd, ts)

    sink_batch(1, 300)
    per_part_1 = {p: sum(1 for (q, _) in sent if q == p) for p in range(PARTITIONS)}
    assert all(per_part_1.values()), per_part_1   # 300 keys hash onto every partition
    for p, n in per_part_1.items():
        assert sorted(o for (q, o) in sent if q == p) == list(range(n))

    # -- driver: describeCluster, describeTopics, listOffsets with isolation
    cl = h.ok("describe_cluster")
    assert isinstance(cl["cluster_id"], str) and len(cl["cluster_id"]) == 22
    probe = broker_info(srv.bootstrap)
    assert cl["nodes"] == [{"id": n, "host": host, "port": port, "rack": None} for n, (host, port) in probe.brokers.items()]
    assert sorted(probe.addresses()) == sorted(bootstrap_addresses(srv.bootstrap))
    assert cl["controller"] == probe.controller_id
    assert_describe(h, topic, PARTITIONS)

    def driver_offsets(iso: str) -> dict[int, tuple[int, int]]:
        out = {}
        for p in range(PARTITIONS):
            e = h.ok("list_offsets", topic=topic, partition=p, spec="earliest", isolation=iso)
            l_ = h.ok("list_offsets", topic=topic, partition=p, spec="latest", isolation=iso)
            out[p] = (e["offset"], l_["offset"])
        return out

    for iso in ("read_uncommitted", "read_committed"):
        assert driver_offsets(iso) == {p: (0, per_part_1[p]) for p in range(PARTITIONS)}

    # -- executors: one consumer per partition (Spark's executor consumer config)
    group = f"spark-kafka-source-{uuid.uuid4()}-executor"
    exec_cfg = {"group.id": group, "auto.offset.reset": "none", "enable.auto.commit": "false",
                "receive.buffer.bytes": 65536, "isolation.level": "read_uncommitted"}

    def check_read(p: int, start: int, until: int, end_now: int, iso: str) -> None:
        recs = spark_executor_read(h, topic, p, start, until, {**exec_cfg, "isolation.level": iso}, end_now)
        assert_same_rows([(p, o, *sent[(p, o)][:2], [(k, v) for k, v in sent[(p, o)][2]], sent[(p, o)][3],
                           "CreateTime") for o in range(start, until)],
                         [actual_row(r) for r in recs], f"spark read {topic}-{p} [{start}, {until})")

    for p in range(PARTITIONS):
        check_read(p, 0, per_part_1[p], per_part_1[p], "read_uncommitted")

    # -- micro-batch 2: more rows, new latest offsets, read only the new range
    sink_batch(2, 150)
    per_part_2 = {p: sum(1 for (q, _) in sent if q == p) for p in range(PARTITIONS)}
    for iso in ("read_uncommitted", "read_committed"):
        assert driver_offsets(iso) == {p: (0, per_part_2[p]) for p in range(PARTITIONS)}
    for p in range(PARTITIONS):
        check_read(p, per_part_1[p], per_part_2[p], per_part_2[p], "read_committed")

    # startingOffsetsByTimestamp: listOffsets(forTimestamp) on the driver
    for p in range(PARTITIONS):
        ts = [sent[(p, o)][3] for o in range(per_part_2[p])]
        target = ts[per_part_1[p]]
        r = h.ok("list_offsets", topic=topic, partition=p, spec=target, isolation="read_committed")
        assert (r["offset"], r["timestamp"]) == first_offset_at_or_after(ts, target)

    # -- the executor's poll at the end of the log: nothing, position unchanged
    #    (Spark raises its "Cannot fetch record ... TimeoutException" there)
    for p in range(PARTITIONS):
        end = per_part_2[p]
        r = h.consume(topic, partition=p, offset=end, count=1, config=exec_cfg, timeout_ms=700)
        assert r["ok"], r.get("error")
        assert (r["records"], r["timed_out"], r["position"]) == ([], True, end)
    # ... and past the end: auto.offset.reset=none -> OffsetOutOfRange (Spark's
    #    data-loss detection)
    r = h.consume(topic, partition=0, offset=per_part_2[0] + 10, count=1, config=exec_cfg, timeout_ms=5000)
    assert r["ok"] is False and r["error"].startswith("OffsetOutOfRangeException"), r

    # -- which APIs the client really used against this fresh broker
    used = {d.name for d in capture.iterdir()}
    assert {"DescribeCluster", "ListOffsets", "Fetch", "Produce", "InitProducerId"} <= used, sorted(used)
    # The 3.9/4.x admin client uses DescribeTopicPartitions when the broker
    # advertises it (Trireme does).
    assert "DescribeTopicPartitions" in used, sorted(used)


def test_spark_access_pattern_over_transactions(captured_server, java_harness):
    """Spark's executor reads (assign + seek + poll + position, read_committed,
    auto.offset.reset=none) and driver ListOffsets with the Java client 3.9
    over transactional data: ranges that start on a control record or inside
    an aborted transaction, a poll that finds only a control record (the
    position moves past it: Spark's "offsetAfterPoll" skip), and, with a
    transaction open, ListOffsets latest and by timestamp at read_committed
    bounded by the last stable offset, not the high watermark."""
    srv, _ = captured_server
    h = java_harness("3.9.0", bootstrap=srv.bootstrap)
    topic = f"spark-txn-{uuid.uuid4().hex[:6]}"
    h.ok("create_topic", topic=topic, partitions=1)
    base_ts = past_base_ts()
    ts: dict[int, int] = {}

    def write(handle: str, tag: str, n: int, first_ts: int, end: str | None) -> list[int]:
        """One transaction of ``handle``: n records; ended with end ("commit"/"abort") or left open."""
        h.ok("begin_txn", handle=handle)
        recs = [clients.record(f"{tag}-{i}", key=f"{tag}-{i}", partition=0, timestamp=first_ts + i) for i in range(n)]
        offsets = [o for _, o in h.ok("produce", topic=topic, records=recs, handle=handle)["offsets"]]
        ts.update({o: first_ts + i for i, o in enumerate(offsets)})
        if end is not None:
            h.ok(f"{end}_txn", handle=handle)
        return offsets

    for handle in ("x", "y"):
        h.ok("init_producer", handle=handle, config={"transactional.id": f"spark-{handle}-{topic}", "acks": "all"})
    assert write("x", "t1", 3, base_ts, "commit") == [0, 1, 2]          # commit marker at 3
    assert write("x", "t2", 3, base_ts + 10, "abort") == [4, 5, 6]      # abort marker at 7
    assert write("x", "t3", 3, base_ts + 20, "commit") == [8, 9, 10]    # commit marker at 11
    clients.wait_until(lambda: h.ok("list_offsets", topic=topic, partition=0, spec="latest",
                                    isolation="read_committed")["offset"] == 12, what="the last marker")

    cfg = {"group.id": f"spark-kafka-source-{uuid.uuid4()}-executor", "auto.offset.reset": "none",
           "enable.auto.commit": "false", "isolation.level": "read_committed", **FAST_FETCH}

    def offsets_from(start: int, count: int, config: dict = cfg, **kw) -> tuple[list[int], int]:
        r = h.consume(topic, partition=0, offset=start, count=count, config=config, **kw)
        assert r["ok"], r.get("error")
        return [rec["offset"] for rec in r["records"]], r["position"]

    for start in (3, 4, 7):      # a commit marker, an aborted record, an abort marker
        assert offsets_from(start, 3)[0] == [8, 9, 10], start
    assert offsets_from(3, 6, {**cfg, "isolation.level": "read_uncommitted"})[0] == [4, 5, 6, 8, 9, 10]
    # Nothing but a control record left: no record, and the position moves past it.
    assert offsets_from(11, 1, timeout_ms=1500) == ([], 12)

    # A transaction left open (12, 13) while "x" commits another (14-16, marker 17).
    assert write("y", "open", 2, base_ts + 30, None) == [12, 13]
    assert write("x", "t4", 3, base_ts + 40, "commit") == [14, 15, 16]
    clients.wait_until(lambda: h.ok("list_offsets", topic=topic, partition=0, spec="latest",
                                    isolation="read_uncommitted")["offset"] == 18, what="t4's marker")
    for iso, end in (("read_committed", 12), ("read_uncommitted", 18)):
        assert h.ok("list_offsets", topic=topic, partition=0, spec="latest", isolation=iso)["offset"] == end, iso
        r = h.ok("consumer_offsets", topic=topic, partitions=[0], config={"isolation.level": iso})
        assert r["offsets"] == [{"partition": 0, "beginning": 0, "end": end}], iso
    by_ts = {iso: h.ok("list_offsets", topic=topic, partition=0, spec=base_ts + 30, isolation=iso)
             for iso in ("read_committed", "read_uncommitted")}
    assert (by_ts["read_uncommitted"]["offset"], by_ts["read_uncommitted"]["timestamp"]) == (12, ts[12])
    assert (by_ts["read_committed"]["offset"], by_ts["read_committed"]["timestamp"]) == (-1, -1), by_ts
    r = h.ok("list_offsets", topic=topic, partition=0, spec=base_ts + 21, isolation="read_committed")
    assert (r["offset"], r["timestamp"]) == (9, ts[9])
    r = h.consume(topic, partition=0, offset=8, count=10, config=cfg, until_end=True, timeout_ms=10_000)
    assert ([rec["offset"] for rec in r["records"]], r["end_offsets"], r["position"]) == ([8, 9, 10], [[0, 12]], 12)

    h.ok("commit_txn", handle="y")                                     # commit marker at 18
    clients.wait_until(lambda: h.ok("list_offsets", topic=topic, partition=0, spec="latest",
                                    isolation="read_committed")["offset"] == 19, what="the LSO to move")
    assert offsets_from(12, 5)[0] == [12, 13, 14, 15, 16]
    r = h.ok("list_offsets", topic=topic, partition=0, spec=base_ts + 30, isolation="read_committed")
    assert (r["offset"], r["timestamp"]) == (12, ts[12])
    for handle in ("x", "y"):
        h.call("close_producer", handle=handle)
