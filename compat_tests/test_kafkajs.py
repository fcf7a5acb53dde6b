"""kafkajs 2.2.4 against a real Trireme process, through compat_tests/js/harness.js.

* topic lifecycle through kafkajs' admin (createTopics, fetchTopicMetadata,
  deleteTopics);
* 10,000 records with keys, headers and explicit timestamps over 3
  partitions, for the codecs kafkajs ships (none, gzip), acks=all, with the
  plain and the idempotent producer; read back partition by partition from
  offset 0 and from the middle (the harness' assign+seek equivalent built from
  kafkajs' Fetch and Batch classes) and compared field by field against the
  acknowledged (partition, offset);
* ListOffsets as kafkajs issues it (admin.fetchTopicOffsets /
  fetchTopicOffsetsByTimestamp go through the same cluster.listOffsets):
  earliest, latest and by timestamp, both isolation levels.

What kafkajs lacks (so it is not tested here): snappy/lz4/zstd codecs (it
ships gzip only), null header values, ListOffsets max_timestamp (its
ListOffsets stops at v3), IncrementalAlterConfigs, assign() (no group-less
consumer of its own).
"""
from __future__ import annotations

from typing import Iterator

import pytest

from compat_tests import clients
from compat_tests.broker_probe import broker_info
from compat_tests.python_clients import unique_topic
from compat_tests.harness_helpers import (PARTITIONS, actual_row, assert_same_rows, expected_row,
                                          first_offset_at_or_after, harness_pool, make_records,
                                          past_base_ts, pooled_harness, wire)

CODECS = ("none", "gzip")


@pytest.fixture(scope="module")
def js_pool(module_server) -> Iterator[dict[str, clients.HarnessProcess]]:
    """One kafkajs harness process for the whole module."""
    yield from harness_pool()


@pytest.fixture
def js(request, js_pool, module_server) -> Iterator[clients.HarnessProcess]:
    clients.require_kafkajs()
    yield from pooled_harness(request, js_pool, "kafkajs",
                              lambda: clients.kafkajs_harness(module_server.bootstrap),
                              module_server, server_lines=40)


# ------------------------------------------------------------------- helpers

def assert_topic_gone(h: clients.HarnessProcess, topic: str) -> None:
    clients.wait_until(lambda: topic not in h.ok("list_topics")["topics"], timeout=10,
                       what=f"{topic} to leave list_topics")
    broker_info(h.bootstrap).wait_gone(topic)       # a cluster: every broker has forgotten it
    r = h.call("describe_topic", topic=topic)
    assert r["ok"] is False and r.get("error_type") == "UNKNOWN_TOPIC_OR_PARTITION", r
    assert topic not in h.ok("list_topics")["topics"]   # the metadata lookup did not re-create it


def assert_describe(h: clients.HarnessProcess, topic: str, partitions: int) -> None:
    """Each partition's leader as the broker's own Metadata gives it (one broker, or a cluster's); replication
    factor 1: the leader is the only replica."""
    leaders = broker_info(h.bootstrap).leaders(topic)
    d = h.ok("describe_topic", topic=topic)
    assert d["partitions"] == [{"partition": p, "leader": leaders[p], "replicas": [leaders[p]],
                                "isr": [leaders[p]]} for p in range(partitions)]


# --------------------------------------------------------------------- tests

def test_create_and_delete_topic_via_admin(js):
    topic = unique_topic("kafkajs-admin-lifecycle")
    js.ok("create_topic", topic=topic, partitions=PARTITIONS, configs={"retention.ms": 86_400_000})
    assert topic in js.ok("list_topics")["topics"]
    assert_describe(js, topic, PARTITIONS)
    d = js.ok("describe_configs", topic=topic)
    assert (d["configs"]["retention.ms"], d["sources"]["retention.ms"]) == ("86400000", "DYNAMIC_TOPIC_CONFIG")

    again = js.call("create_topic", topic=topic, partitions=PARTITIONS)
    assert again["ok"] is False and again.get("error_type") == "TOPIC_ALREADY_EXISTS", again

    dry = "kafkajs-admin-validate-only"
    js.ok("create_topic", topic=dry, partitions=2, validate_only=True)
    assert dry not in js.ok("list_topics")["topics"]

    js.ok("create_partitions", topic=topic, count=4)
    assert_describe(js, topic, 4)

    cl = js.ok("describe_cluster")
    probe = broker_info(js.bootstrap)
    assert cl["controller"] == probe.controller_id and [n["id"] for n in cl["nodes"]] == list(probe.brokers)
    assert isinstance(cl["cluster_id"], str) and len(cl["cluster_id"]) == 22

    js.ok("delete_topic", topic=topic)
    assert_topic_gone(js, topic)


ROUNDTRIP_CASES = [(c, idem) for c in CODECS for idem in (False, True)]


@pytest.mark.parametrize("codec,idempotent", ROUNDTRIP_CASES,
                         ids=[f"{c}-idempotent" if i else c for c, i in ROUNDTRIP_CASES])
def test_produce_consume_roundtrip(js, codec, idempotent):
    topic = unique_topic(f"kafkajs-roundtrip-{codec}-{'idempotent' if idempotent else 'plain'}")
    js.ok("create_topic", topic=topic, partitions=PARTITIONS)
    assert_describe(js, topic, PARTITIONS)

    # (kafkajs cannot send null header values)
    recs = make_records(f"{codec}-{idempotent}", past_base_ts(), null_header_values=False)
    res = js.produce(topic, wire(recs), config={"compression.type": codec, "acks": "all",
                                          "enable.idempotence": idempotent})
    assert res["ok"], f"produce failed: {res.get('error')}\n{js.stderr_tail(30)}"

    # one send(): per partition the records are acknowledged from offset 0 in order
    assert [o[0] for o in res["offsets"]] == [r["partition"] for r in recs]
    by_part: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
    for (p, o) in res["offsets"]:
        by_part[p].append(o)
    for p, offs in by_part.items():
        assert offs == list(range(len(offs))), f"partition {p}: acknowledged offsets not dense"
    at = {(p, o): r for r, (p, o) in zip(recs, res["offsets"])}
    ts_by_part = {p: [at[(p, o)]["timestamp"] for o in range(len(by_part[p]))] for p in range(PARTITIONS)}

    for p in range(PARTITIONS):
        n = len(by_part[p])
        got = js.consume(topic, partition=p, offset=0, count=n, timeout_ms=30_000,
                         config={"isolation.level": "read_uncommitted"})
        assert got["ok"], got.get("error")
        assert got["timed_out"] is False and got["position"] == n
        assert {rec["topic"] for rec in got["records"]} == {topic}
        assert_same_rows([expected_row(at[(p, o)], p, o) for o in range(n)],
                         [actual_row(rec) for rec in got["records"]], f"{topic}-{p}")
        assert {rec["leader_epoch"] for rec in got["records"]} == {0}

        mid = n - 137   # default kafkajs isolation: read_committed
        tail = js.consume(topic, partition=p, offset=mid, count=137, timeout_ms=10_000)
        assert tail["ok"], tail.get("error")
        assert tail["position"] == n
        assert_same_rows([expected_row(at[(p, o)], p, o) for o in range(mid, n)],
                         [actual_row(rec) for rec in tail["records"]], f"{topic}-{p} from {mid}")

    # at the end of the log: nothing, position stays at the end
    end = js.consume(topic, partition=0, offset="latest", count=1, timeout_ms=400)
    assert end["ok"] and end["records"] == [] and end["position"] == len(by_part[0]), end

    # ListOffsets (what admin.fetchTopicOffsets / fetchTopicOffsetsByTimestamp send)
    for p, ts in ts_by_part.items():
        n = len(ts)
        for iso in ("read_uncommitted", "read_committed"):
            e = js.ok("list_offsets", topic=topic, partition=p, spec="earliest", isolation=iso)
            assert (e["offset"], e["timestamp"]) == (0, -1), (p, iso, e)
            l_ = js.ok("list_offsets", topic=topic, partition=p, spec="latest", isolation=iso)
            assert (l_["offset"], l_["timestamp"]) == (n, -1), (p, iso, l_)
            for target in (0, min(ts), ts[n // 2], ts[n // 3] + 1, max(ts), max(ts) + 1):
                r = js.ok("list_offsets", topic=topic, partition=p, spec=target, isolation=iso)
                assert (r["offset"], r["timestamp"]) == first_offset_at_or_after(ts, target), \
                    (p, iso, target, r)
    for iso in ("read_uncommitted", "read_committed"):
        r = js.ok("consumer_offsets", topic=topic, partitions=PARTITIONS, config={"isolation.level": iso})
        assert r["offsets"] == [{"partition": p, "beginning": 0, "end": len(by_part[p])}
                                for p in range(PARTITIONS)]

    js.ok("delete_topic", topic=topic)
    assert_topic_gone(js, topic)


def test_delete_records(js):
    topic = unique_topic("kafkajs-delete-records")
    js.ok("create_topic", topic=topic, partitions=1)
    base = past_base_ts()
    res = js.produce(topic, [clients.record(f"v{i}", key=f"k{i}", partition=0, timestamp=base + i)
                             for i in range(50)])
    assert res["ok"], res.get("error")
    js.ok("delete_records", topic=topic, partition=0, before_offset=20)
    e = js.ok("list_offsets", topic=topic, partition=0, spec="earliest")
    assert e["offset"] == 20
    t = js.ok("list_offsets", topic=topic, partition=0, spec=base)
    assert (t["offset"], t["timestamp"]) == (20, base + 20)
    got = js.consume(topic, partition=0, offset="earliest", count=30)
    assert got["ok"] and [r["offset"] for r in got["records"]] == list(range(20, 50))
    assert clients.decoded(got["records"][0])["value"] == b"v20"
    js.ok("delete_topic", topic=topic)
