"""The Prometheus endpoint reports what the broker did, read from a real server process."""
import re
import time
import urllib.error
import urllib.request

import pytest
from confluent_kafka import Producer


def _metrics_url(server) -> str:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        m = re.search(r"metrics on (http://\S+/metrics)", server.stderr_path.read_text(errors="replace"))
        if m:
            return m.group(1)
        time.sleep(0.05)
    raise AssertionError("the server never logged its metrics address")


@pytest.mark.server_config({"trireme.metrics.listen": "127.0.0.1:0", "num.partitions": 2})
def test_metrics_endpoint_counts_requests_and_offsets(server):
    url = _metrics_url(server)
    producer = Producer({"bootstrap.servers": server.bootstrap, "log_level": 0})
    for i in range(10):
        producer.produce("metered", value=b"x", partition=i % 2)
    assert producer.flush(10) == 0
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    requests = dict(re.findall(r'trireme_requests_total\{api="(\w+)"\} (\d+)', text))
    assert int(requests["Produce"]) >= 1 and int(requests["Metadata"]) >= 1
    ends = {int(p): int(v) for p, v in
            re.findall(r'trireme_partition_high_watermark\{topic="metered",partition="(\d)"\} (\d+)', text)}
    assert ends == {0: 5, 1: 5}
    assert int(re.search(r"trireme_fsyncs_total (\d+)", text).group(1)) >= 1
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(url.replace("/metrics", "/other"), timeout=5)
    assert err.value.code == 404


SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)",?')


def parse_exposition(text: str) -> dict[str, dict]:
    """Prometheus text format, checked as a scraper reads it: every family declared once with HELP and TYPE
    before its samples, counters named ``*_total``, histogram buckets cumulative up to ``+Inf`` = ``_count``.
    → family → {"type": ..., "samples": {(sample name, frozenset(labels)): value}}."""
    families: dict[str, dict] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name = line.split()[2]
            assert name not in families, f"{name} declared twice"
            assert re.fullmatch(r"trireme_[a-z0-9_]+", name), name
            families[name] = current = {"type": None, "samples": {}}
            current["name"] = name
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            assert current is not None and current["name"] == name, f"TYPE of {name} without its HELP"
            assert kind in ("counter", "gauge", "histogram"), line
            assert (kind == "counter") == name.endswith("_total"), f"{kind} {name}: only counters end in _total"
            current["type"] = kind
            continue
        m = SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        name, labels, value = m.group(1), m.group(2) or "", m.group(3)
        assert "".join(x.group(0) for x in LABEL.finditer(labels)) == labels, f"bad labels in {line!r}"
        assert current is not None, f"{line!r} before any family"
        family = current["name"]
        allowed = {family} | ({family + s for s in ("_bucket", "_sum", "_count")} if current["type"] == "histogram"
                              else set())
        assert name in allowed, f"{name} under the family {family}"
        current["samples"][(name, frozenset(LABEL.findall(labels)))] = float(value)
    for name, f in families.items():
        if f["type"] != "histogram":
            continue
        series: dict[frozenset, list] = {}
        for (sample, labels), value in f["samples"].items():
            if sample.endswith("_bucket"):
                le = dict(labels)["le"]
                series.setdefault(labels - {("le", le)}, []).append((float(le), value))
        for labels, buckets in series.items():
            buckets.sort()
            counts = [v for _, v in buckets]
            assert counts == sorted(counts), f"{name}{dict(labels)} buckets are not cumulative"
            assert buckets[-1][0] == float("inf")
            assert counts[-1] == f["samples"][(name + "_count", labels)], f"{name}{dict(labels)} +Inf != _count"
    return families


def value(families, family: str, sample: str | None = None, **labels) -> float | None:
    return families[family]["samples"].get((sample or family, frozenset(labels.items())))


def scrape(url: str) -> dict[str, dict]:
    return parse_exposition(urllib.request.urlopen(url, timeout=5).read().decode())


@pytest.mark.server_config({"trireme.metrics.listen": "127.0.0.1:0", "trireme.metrics.group.lag.max.groups": 2})
def test_latency_fsync_bytes_and_group_lag_after_client_traffic(server):
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient

    from compat_tests.python_clients import create_topics, poll_values
    url = _metrics_url(server)
    bootstrap = server.bootstrap
    (topic,) = create_topics(bootstrap, ["scraped"], 1)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for i in range(20):
        producer.produce(topic, value=b"v" * 100)
        producer.poll(0)
    assert producer.flush(10) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    poll_values(consumer, 20, "the reader")
    consumer.commit(offsets=[TopicPartition(topic, 0, 16)], asynchronous=False)      # lag 4
    consumer.close()
    for group, offset in (("far-behind", 10), ("behind", 13)):                       # lag 10, 7
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
        c.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
        c.close()

    m = scrape(url)
    # Every Produce request was answered, so each one has its latency observed.
    produce = value(m, "trireme_requests_total", api="Produce")
    assert produce >= 1
    assert value(m, "trireme_request_duration_seconds", "trireme_request_duration_seconds_count", api="Produce") \
        == produce
    assert value(m, "trireme_request_duration_seconds", "trireme_request_duration_seconds_sum", api="Produce") > 0
    assert value(m, "trireme_request_duration_seconds", "trireme_request_duration_seconds_count", api="Fetch") >= 1
    # The fsync histogram and today's fsync counters are the same observations.
    assert value(m, "trireme_fsync_duration_seconds", "trireme_fsync_duration_seconds_count") \
        == value(m, "trireme_fsyncs_total") >= 1
    assert value(m, "trireme_fsync_duration_seconds", "trireme_fsync_duration_seconds_sum") \
        == pytest.approx(value(m, "trireme_fsync_seconds_total"))
    # The disk's share of each group commit: one observation per fsync round, never longer than the round.
    assert value(m, "trireme_fsync_worker_seconds", "trireme_fsync_worker_seconds_count") \
        == value(m, "trireme_fsyncs_total")
    assert 0 < value(m, "trireme_fsync_worker_seconds", "trireme_fsync_worker_seconds_sum") \
        <= value(m, "trireme_fsync_seconds_total")
    # Some of them may have run on the event loop (Broker._flush_inline): never more than there were.
    assert 0 <= value(m, "trireme_fsyncs_inline_total") <= value(m, "trireme_fsyncs_total")
    # The cycle collector: `trireme serve` froze what start-up made once serving, and times the collector's pauses.
    assert value(m, "trireme_gc_frozen_objects") > 1000
    assert value(m, "trireme_gc_collections_total", generation="0") > 0
    assert value(m, "trireme_gc_pause_seconds_total", generation="0") > 0
    # Bytes per topic: only this topic was produced to and fetched from.
    bytes_in = value(m, "trireme_topic_bytes_in_total", topic=topic)
    assert bytes_in == value(m, "trireme_bytes_in_total") > 20 * 100
    bytes_out = value(m, "trireme_topic_bytes_out_total", topic=topic)
    assert bytes_out == value(m, "trireme_bytes_out_total") >= bytes_in
    # Group lag: the two groups furthest behind, and no more (trireme.metrics.group.lag.max.groups=2).
    lags = {dict(labels)["group"]: v for (_, labels), v in m["trireme_group_lag"]["samples"].items()}
    assert lags == {"far-behind": 10, "behind": 7}
    assert value(m, "trireme_partition_last_stable_offset", topic=topic, partition="0") == 20
    assert value(m, "trireme_hanging_transactions") == 0

    # A deleted topic's label values go away; the totals keep counting.
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic], operation_timeout=30)[topic].result(timeout=30)
    m = scrape(url)
    assert value(m, "trireme_topic_bytes_in_total", topic=topic) is None
    assert value(m, "trireme_topic_bytes_out_total", topic=topic) is None
    assert value(m, "trireme_bytes_in_total") == bytes_in and value(m, "trireme_bytes_out_total") >= bytes_out
    assert sorted(m["trireme_group_lag"]["samples"].values()) == [0, 0]      # nothing left to lag behind


def test_metrics_of_an_in_memory_broker():
    """trireme.testing's default broker keeps its logs in memory (no descriptors): /metrics still answers, with
    trireme_log_open_files 0 (it answered 500: MemoryStorage had no open_descriptors)."""
    from trireme.testing import TriremeBroker
    with TriremeBroker(config={"trireme.metrics.listen": "127.0.0.1:0"}) as broker:
        deadline = time.monotonic() + 10
        while not (m := re.search(r"metrics on (http://\S+/metrics)", broker.log_text())):
            assert time.monotonic() < deadline, "the broker never logged its metrics address"
            time.sleep(0.05)
        text = urllib.request.urlopen(m.group(1), timeout=10).read().decode()
        assert re.search(r"^trireme_log_open_files 0$", text, re.M)
