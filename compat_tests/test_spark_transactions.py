"""Spark's kafka source over transactional data, against a real Trireme broker.

The data: two transactional confluent-kafka producers write orders
(spark_examples/orders_pipeline.produce_orders) to the same 3 partitions at
once, so aborted records and control records sit between the other
producer's committed ones; every order's key is its id, and what each
producer acknowledged (partition, offset, committed or aborted) is the truth
the Spark results are checked against, key by key.

* batch reads (one PySpark session for the module, compat_tests/spark_harness.py):
  read_committed and read_uncommitted, includeHeaders, JSON offset ranges,
  ranges that start or end on a control record or inside an aborted
  transaction (failOnDataLoss true and false), minPartitions splits (one split
  boundary inside an aborted transaction), and a transaction left open: the
  read stops at the last stable offset, startingOffsetsByTimestamp inside the
  open transaction finds no offset, and after the commit everything is there;
* the orders pipeline (spark_examples/orders_pipeline.py): a streaming query
  reading while the producers write, restarted from its checkpoint, stalled
  at an open transaction until it commits, killed -9 with its JVM, restarted
  to the end; its Parquet totals hold every committed order exactly once.
"""
from __future__ import annotations

import json
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass

import pytest

from compat_tests.broker_probe import broker_info
from compat_tests.cluster_support import Cluster
from compat_tests.python_clients import create_topics, unique_topic
from compat_tests.spark_support import (EXAMPLES, RunningExample, require_spark_env, requires_connector,
                                        run_example, spark_harness, wait_for_lso)

sys.path.insert(0, str(EXAMPLES))
from orders_pipeline import Order, latest_per_window, order_value, produce_orders  # noqa: E402

# The coordinator looks for timed-out transactions often (one test leaves one to time out).
pytestmark = [*requires_connector,
              pytest.mark.server_config({"transaction.abort.timed.out.transaction.cleanup.interval.ms": 300})]

PARTITIONS = 3
BASE_MS = 1_767_225_600_000         # 2026-01-01T00:00:00Z: event times of the orders
READ_TIMEOUT = 300


@dataclass
class Data:
    topic: str
    orders: list[Order]
    ends: dict[int, int]             # end offset (high watermark) per partition

    def committed(self, pred=lambda o: True) -> dict[str, Order]:
        return {o.order_id: o for o in self.orders if o.committed and pred(o)}

    def every(self, pred=lambda o: True) -> dict[str, Order]:
        return {o.order_id: o for o in self.orders if pred(o)}

    def markers(self, p: int) -> list[int]:
        """Offsets of control records: every offset no order took (nothing else writes the topic)."""
        taken = {o.offset for o in self.orders if o.partition == p}
        return [off for off in range(self.ends[p]) if off not in taken]


def concurrently(*jobs) -> list:
    """Runs each job (a no-argument function) in a thread of its own; their results in order."""
    results: list = [None] * len(jobs)
    errors: list[BaseException] = []

    def run(i, job):
        try:
            results[i] = job()
        except BaseException as e:     # re-raised below, in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i, job)) for i, job in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    if errors:
        raise errors[0]
    return results


class Lockstep:
    """Interleaves two producers' transactions: "b" writes transaction t
    after "a" has written its transaction t and before "a" ends it, so b's
    records sit inside a's transaction in every partition."""

    def __init__(self):
        self.cond = threading.Condition()
        self.done: set[tuple[str, int, str]] = set()

    def _wait(self, key) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: key in self.done, timeout=120), f"lockstep: no {key}"

    def step(self, producer: str):
        def step(t: int, stage: str) -> None:
            if (producer, stage) == ("b", "begin"):
                self._wait(("a", t, "written"))
            if (producer, stage) == ("a", "written"):
                with self.cond:
                    self.done.add(("a", t, "written"))
                    self.cond.notify_all()
                self._wait(("b", t, "ended"))
            if (producer, stage) == ("b", "ended"):
                with self.cond:
                    self.done.add(("b", t, "ended"))
                    self.cond.notify_all()
        return step


def two_producers(bootstrap: str, topic: str, transactions: int, first: int = 0, **kw) -> list[Order]:
    """Producers "a" (aborting every 4th transaction) and "b" (every 3rd) at once, in lockstep."""
    lockstep = Lockstep()
    a, b = concurrently(*(
        lambda name=name, abort_every=abort_every: produce_orders(
            bootstrap, topic, name, transactions, abort_every=abort_every, first_transaction=first,
            start_ms=BASE_MS, step=lockstep.step(name), **kw)
        for name, abort_every in (("a", 4), ("b", 3))))
    return a + b


def interleaved(orders: list[Order]) -> bool:
    """Whether, in every partition, the other producer committed records
    between the first record of an aborted transaction and the next records
    of its producer (so before its abort marker)."""
    def found(p: int) -> bool:
        mine = sorted((o for o in orders if o.partition == p), key=lambda o: o.offset)
        for o in mine:
            if o.committed:
                continue
            producer, txn = o.order_id.split("-")[:2]
            later_own = [x.offset for x in mine if x.offset > o.offset and x.order_id.split("-")[:2] != [producer, txn]
                         and x.order_id.startswith(producer + "-")]
            until = min(later_own, default=1 << 62)
            if any(x.committed and not x.order_id.startswith(producer + "-") and o.offset < x.offset < until
                   for x in mine):
                return True
        return False
    return all(found(p) for p in range(PARTITIONS))


@pytest.fixture(scope="module")
def data(module_server) -> Data:
    topic = unique_topic("spark-txn")
    create_topics(module_server.bootstrap, [topic], PARTITIONS)
    orders = two_producers(module_server.bootstrap, topic, 16)
    ends = wait_for_lso(module_server.bootstrap, topic, PARTITIONS)
    return Data(topic, orders, ends)


@pytest.fixture(scope="module")
def spark(module_server):
    require_spark_env()
    with spark_harness(module_server.bootstrap) as h:
        yield h


def read_call(spark, **options) -> dict:
    """spark.read.format("kafka") with these options (JSON for those that are not strings)."""
    return spark.call("read", options={k: v if isinstance(v, str) else json.dumps(v) for k, v in options.items()},
                      timeout=READ_TIMEOUT)


def read(spark, **options) -> dict:
    r = read_call(spark, **options)
    assert r["ok"], f"{options}: {r['error']}"
    return r


def by_key(rows: list[dict]) -> dict[str, dict]:
    counts = Counter(r["key"] for r in rows)
    doubled = [k for k, n in counts.items() if n > 1]
    assert not doubled, f"read twice: {doubled[:10]}"
    return {r["key"]: r for r in rows}


def assert_rows(rows: list[dict], want: dict[str, Order], what: str) -> None:
    got = by_key(rows)
    missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    assert not missing and not extra, f"{what}: missing {missing[:10]}, unexpected {extra[:10]}"
    wrong = [(k, (r["partition"], r["offset"], r["timestamp"]))
             for k, r in got.items() if (r["partition"], r["offset"], r["timestamp"])
             != (want[k].partition, want[k].offset, want[k].order_time_ms)]
    assert not wrong, f"{what}: (partition, offset, timestamp) differ: {wrong[:5]}"


# ------------------------------------------------------------ batch reads

def test_the_data_interleaves(data):
    assert interleaved(data.orders), "no aborted record between two committed ones of the other producer"
    assert all(data.markers(p) for p in range(PARTITIONS))
    assert {o.committed for o in data.orders} == {True, False}


def test_batch_read_committed_and_uncommitted(data, spark):
    common = {"subscribe": data.topic, "startingOffsets": "earliest", "endingOffsets": "latest"}
    r = read(spark, **common, **{"kafka.isolation.level": "read_committed", "includeHeaders": "true"})
    assert_rows(r["rows"], data.committed(), "read_committed")
    for row in r["rows"]:
        producer, txn, _ = row["key"].split("-")
        assert row["headers"] == [{"key": "producer", "value": producer},
                                  {"key": "transaction", "value": txn}], row
        assert json.loads(row["value"])["order_id"] == row["key"]

    r = read(spark, **common, **{"kafka.isolation.level": "read_uncommitted"})
    assert_rows(r["rows"], data.every(), "read_uncommitted")

    # Per-partition JSON offsets: -2 earliest, -1 latest, numbers as given.
    mid = {p: data.ends[p] // 2 for p in range(PARTITIONS)}
    r = read(spark, **{"subscribe": data.topic, "kafka.isolation.level": "read_committed",
                       "startingOffsets": {data.topic: {"0": mid[0], "1": -2, "2": mid[2]}},
                       "endingOffsets": {data.topic: {"0": -1, "1": mid[1], "2": mid[2] + 7}}})
    bounds = {0: (mid[0], data.ends[0]), 1: (0, mid[1]), 2: (mid[2], mid[2] + 7)}
    assert_rows(r["rows"], data.committed(lambda o: bounds[o.partition][0] <= o.offset < bounds[o.partition][1]),
                "JSON offset ranges")


def aborted_inside(data: Data, p: int) -> list[int]:
    """Offsets in partition p of aborted records that are not their transaction's first there."""
    firsts: dict[str, int] = {}
    out = []
    for o in sorted((o for o in data.orders if o.partition == p and not o.committed), key=lambda o: o.offset):
        txn = o.order_id.rsplit("-", 1)[0]
        if txn in firsts:
            out.append(o.offset)
        firsts.setdefault(txn, o.offset)
    return out


def test_ranges_on_control_records_and_aborted_transactions(data, spark):
    """startingOffsets/endingOffsets on a control record or inside an aborted
    transaction: exactly the records of the range, at both isolation levels,
    with failOnDataLoss true and false (the gaps are no data loss)."""
    markers = {p: data.markers(p) for p in range(PARTITIONS)}
    inside = {p: aborted_inside(data, p) for p in range(PARTITIONS)}
    assert all(len(inside[p]) >= 2 and len(markers[p]) >= 4 for p in range(PARTITIONS)), (inside, markers)
    m0 = next(m for m in markers[0] if m < inside[0][-1])
    m1 = next(m for m in markers[1] if m > inside[1][0])
    only_aborted = (inside[2][0] - 1, inside[2][0] + 1)       # the two aborted records of one transaction
    range_sets = [
        {0: (m0, inside[0][-1]),                               # control record .. inside an aborted txn
         1: (inside[1][0], m1),                                # inside an aborted txn .. control record
         2: (markers[2][1], markers[2][-2])},                  # control record .. control record
        {0: (markers[0][2], markers[0][2] + 1),                # nothing but a control record
         2: only_aborted if all(o.offset not in range(*only_aborted) or not o.committed
                                for o in data.orders if o.partition == 2) else (inside[2][0], inside[2][0] + 1)},
    ]
    for ranges in range_sets:
        for iso in ("read_committed", "read_uncommitted"):
            for fail_on_data_loss in ("true", "false"):
                r = read(spark, **{"assign": {data.topic: sorted(ranges)}, "kafka.isolation.level": iso,
                                   "failOnDataLoss": fail_on_data_loss,
                                   "startingOffsets": {data.topic: {str(p): s for p, (s, _) in ranges.items()}},
                                   "endingOffsets": {data.topic: {str(p): e for p, (_, e) in ranges.items()}}})

                def in_range(o, ranges=ranges):
                    return o.partition in ranges and ranges[o.partition][0] <= o.offset < ranges[o.partition][1]
                want = data.committed(in_range) if iso == "read_committed" else data.every(in_range)
                assert_rows(r["rows"], want, f"{ranges} {iso} failOnDataLoss={fail_on_data_loss}")


def test_min_partitions_splits_inside_an_aborted_transaction(data, spark):
    """minPartitions splits the offset ranges; a split boundary on an aborted
    record in the middle of its transaction loses nothing and doubles nothing."""
    r = read(spark, **{"subscribe": data.topic, "startingOffsets": "earliest", "endingOffsets": "latest",
                       "kafka.isolation.level": "read_committed", "minPartitions": "9"})
    assert r["splits"] >= 9
    assert_rows(r["rows"], data.committed(), "minPartitions=9")

    # One partition's range [a - k, a + k) in two splits: the boundary is a,
    # an aborted record after its transaction's first one in that partition.
    a = aborted_inside(data, 0)[0]
    k = min(a, data.ends[0] - a)
    start, end = a - k, a + k
    r = read(spark, **{"assign": {data.topic: [0]}, "kafka.isolation.level": "read_committed",
                       "minPartitions": "2", "startingOffsets": {data.topic: {"0": start}},
                       "endingOffsets": {data.topic: {"0": end}}})
    assert r["splits"] == 2
    assert_rows(r["rows"], data.committed(lambda o: o.partition == 0 and start <= o.offset < end),
                f"[{start}, {end}) in 2 splits")
    assert {(row["offset"] >= a, row["split"]) for row in r["rows"]} == {(False, 0), (True, 1)}, \
        (a, sorted((row["offset"], row["split"]) for row in r["rows"]))


def test_open_transaction_bounds_reads_until_it_commits(module_server, spark):
    """A transaction left open: read_committed stops at the last stable
    offset though later transactions of another producer committed;
    startingOffsetsByTimestamp at a timestamp inside the open transaction
    finds no offset below the LSO; after the commit everything is read.
    Another one left until the coordinator's timeout abort: never read at
    read_committed."""
    bootstrap = module_server.bootstrap
    topic = unique_topic("spark-open")
    create_topics(bootstrap, [topic], PARTITIONS)
    before = produce_orders(bootstrap, topic, "a", 2, abort_every=0, start_ms=BASE_MS)
    held = produce_held(bootstrap, topic)
    after = produce_orders(bootstrap, topic, "a", 2, first_transaction=50, abort_every=0, start_ms=BASE_MS)
    lso = {o.partition: o.offset for o in held.orders}
    assert all(o.offset > lso[o.partition] for o in after)
    data = Data(topic, before + after, {})
    open_ts = min(o.order_time_ms for o in held.orders)

    bounded = {"subscribe": topic, "startingOffsets": "earliest", "endingOffsets": "latest",
               "kafka.isolation.level": "read_committed"}
    assert_rows(read(spark, **bounded)["rows"], {o.order_id: o for o in before},
                "read_committed with a transaction open")
    rows = read(spark, **{**bounded, "kafka.isolation.level": "read_uncommitted"})["rows"]
    assert_rows(rows, {o.order_id: o for o in data.orders + held.orders}, "read_uncommitted")

    # A timestamp inside the open transaction: the first offset at or after
    # it is the open transaction's, not below the LSO: no offset (Spark's
    # default strategy fails the query; "latest" starts at the LSO).
    by_ts = {**bounded, "startingOffsetsByTimestamp": {topic: {str(p): open_ts for p in range(PARTITIONS)}}}
    del by_ts["startingOffsets"]
    r = read_call(spark, **by_ts)
    assert r["ok"] is False and "No offset matched" in r["error"], r
    r = read(spark, **by_ts, startingOffsetsByTimestampStrategy="latest")
    assert r["rows"] == []
    # ... and one before it: from there up to the LSO.
    first_ts = BASE_MS + 6_000                                 # transaction 1's first order
    r = read(spark, **{**by_ts, "startingOffsetsByTimestamp": {topic: {str(p): first_ts
                                                                       for p in range(PARTITIONS)}}})
    assert_rows(r["rows"], data.committed(lambda o: o.order_id.split("-")[1] == "1"), "by timestamp, before")

    held.commit()
    wait_for_lso(bootstrap, topic, PARTITIONS)
    assert_rows(read(spark, **bounded)["rows"], {o.order_id: o for o in data.orders + held.orders},
                "read_committed after the commit")
    assert_rows(read(spark, **by_ts)["rows"], {o.order_id: o for o in after + held.orders},
                "by timestamp after the commit")

    # One left open until the coordinator aborts it (transaction.timeout.ms):
    # the LSO moves past it then, and it never shows at read_committed.
    abandoned = produce_held(bootstrap, topic, "abandoned", timeout_ms=2000)
    later = produce_orders(bootstrap, topic, "a", 1, first_transaction=60, abort_every=0, start_ms=BASE_MS)
    wait_for_lso(bootstrap, topic, PARTITIONS)
    committed = {o.order_id: o for o in data.orders + held.orders + later}
    assert_rows(read(spark, **bounded)["rows"], committed, "read_committed after the timeout abort")
    assert_rows(read(spark, **{**bounded, "kafka.isolation.level": "read_uncommitted"})["rows"],
                {**committed, **{o.order_id: o for o in abandoned.orders}}, "read_uncommitted after the timeout abort")


# ---------------------------------------------------------- the pipeline

def progress(lines: list[str]) -> list[dict]:
    return [json.loads(line.split(" ", 1)[1]) for line in lines if line.startswith("PROGRESS ")]


@pytest.mark.timeout(1200)
def test_orders_pipeline_exactly_once_across_restarts_and_kill(module_server, spark, tmp_path):
    spark_env = require_spark_env()
    bootstrap = module_server.bootstrap
    topic, results = unique_topic("orders"), unique_topic("order-totals")
    create_topics(bootstrap, [topic, results], PARTITIONS)
    work = tmp_path / "work"
    args = ["--bootstrap", bootstrap, "--orders-topic", topic, "--results-topic", results,
            "--work-dir", str(work), "--max-offsets-per-trigger", "30", "--min-partitions", "4"]
    orders = two_producers(bootstrap, topic, 8)

    job = RunningExample(spark_env, "orders_pipeline.py",
                         ["run", *args, "--trigger-seconds", "1", "--restarts", "2", "--batches-per-run", "2"],
                         tmp_path)
    try:
        job.wait_for(lambda lines: "RUNNING" in lines, "the restarts")
        assert sum(line.startswith("STOPPED") for line in job.lines) == 2

        # A transaction left open while both producers go on committing.
        held = produce_held(bootstrap, topic)
        more = two_producers(bootstrap, topic, 6, first=8, pause_s=0.2)
        orders += more
        lso = {p: min(o.offset for o in held.orders if o.partition == p) for p in range(PARTITIONS)}
        assert all(any(o.offset > lso[o.partition] and o.committed for o in more if o.partition == p)
                   for p in range(PARTITIONS))
        job.wait_for(lambda lines: any(b["end"] == {str(p): lso[p] for p in range(PARTITIONS)}
                                       for b in progress(lines)), "the stream at the last stable offset")
        time.sleep(3)                                          # a few more triggers: still there
        assert all(b["end"].get(str(p), 0) <= lso[p] for b in progress(job.lines) for p in range(PARTITIONS))
        held.commit()
        orders += held.orders
        job.wait_for(lambda lines: any(b["end"].get("0", 0) > lso[0] for b in progress(lines)),
                     "the stream past the committed transaction")
        job.kill9()
    finally:
        job.stop()
    for b in progress(job.lines):
        assert b["rows"] <= 30 and sum(b["end"].values()) - sum(b["start"].values()) <= 30, b

    offsets = {int(f.name) for f in (work / "checkpoint" / "offsets").iterdir() if f.name.isdigit()}
    commits = {int(f.name) for f in (work / "checkpoint" / "commits").iterdir() if f.name.isdigit()}
    print(f"killed after {len(progress(job.lines))} micro-batches; batch {max(offsets)} "
          f"{'committed' if max(offsets) in commits else 'not committed: replayed by the restart'}")

    proc = run_example(spark_env, "orders_pipeline.py", ["run", *args, "--available-now", "--check"], tmp_path)
    assert "OK" in proc.stdout.splitlines(), proc.stdout[-3000:]

    # The Parquet table, read back here: per window the row of the highest
    # batch id; its order ids are exactly the committed orders.
    rows = spark.ok("read_parquet", path=str(work / "totals"), timeout=READ_TIMEOUT)["rows"]
    latest = latest_per_window([{"key": row["window_start"], **row} for row in rows])
    counted = Counter(i for _, _, ids in latest.values() for i in ids)
    committed = {o.order_id: o for o in orders if o.committed}
    assert set(counted) == set(committed) and set(counted.values()) == {1}, \
        (sorted(set(committed) - set(counted))[:10], sorted(set(counted) - set(committed))[:10],
         [k for k, n in counted.items() if n > 1][:10])
    for start, (count, amount, ids) in latest.items():
        mine = [committed[i] for i in ids]
        assert all(start <= o.order_time_ms < start + 60_000 for o in mine), start
        assert (count, amount) == (len(mine), sum(o.amount for o in mine)), start


@dataclass
class Held:
    producer: object
    orders: list[Order]

    def commit(self) -> None:
        self.producer.commit_transaction(30)


def produce_held(bootstrap: str, topic: str, name: str = "held", timeout_ms: int = 300_000) -> Held:
    """A transaction with one order per partition (ids <name>-0-<partition>,
    event time 30 s after BASE_MS), left open."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{name}-{uuid.uuid4().hex[:6]}",
                  "transaction.timeout.ms": timeout_ms})
    p.init_transactions(30)
    p.begin_transaction()
    acked: dict[str, tuple[int, int]] = {}
    rows = []
    for part in range(PARTITIONS):
        order_id = f"{name}-0-{part}"
        ts = BASE_MS + 30_000 + part
        p.produce(topic, key=order_id.encode(), value=order_value(order_id, "customer-h", 500, ts),
                  partition=part, timestamp=ts,
                  on_delivery=lambda err, msg: acked.setdefault(msg.key().decode(), (msg.partition(), msg.offset())))
        rows.append((order_id, ts))
    assert p.flush(30) == 0 and len(acked) == PARTITIONS
    return Held(p, [Order(i, "customer-h", 500, ts, *acked[i], True) for i, ts in rows])


def spread_orders_topic(bootstrap: str) -> str:
    """A new orders topic whose partitions are led by more than one broker.  Leaders follow rendezvous hashing of the
    topic's random id, so with 3 partitions on 3 brokers one topic in 9 is led by a single broker: the next name is
    taken then (20 such topics in a row: one time in 10^19)."""
    info = broker_info(bootstrap)
    for _ in range(20):
        topic = unique_topic("orders")
        create_topics(bootstrap, [topic], PARTITIONS)
        if len(set(info.leaders(topic).values())) > 1:
            return topic
    raise AssertionError("20 orders topics in a row, each led by a single broker")


def test_orders_pipeline_exactly_once_on_a_cluster(tmp_path, postgres_database):
    """The orders pipeline against three brokers on one PostgreSQL (compat_tests/cluster_support.py): the orders'
    partitions led by several brokers, two transactional producers committing and aborting; one run to the end
    (--available-now) reads exactly the committed orders (read_committed) and its transactional sink and Parquet
    table hold each once (the example's check)."""
    spark_env = require_spark_env()
    with Cluster(tmp_path / "cluster", postgres_database, size=3) as cluster:
        bootstrap = cluster.bootstrap
        topic, results = spread_orders_topic(bootstrap), unique_topic("order-totals")
        create_topics(bootstrap, [results], PARTITIONS)
        broker_info(bootstrap).leaders(results)                 # every broker lists both topics
        orders = two_producers(bootstrap, topic, 6)
        committed = [o for o in orders if o.committed]
        assert committed and len(committed) < len(orders)
        proc = run_example(spark_env, "orders_pipeline.py", [
            "run", "--bootstrap", bootstrap, "--orders-topic", topic, "--results-topic", results,
            "--work-dir", str(tmp_path / "work"), "--available-now", "--check"], tmp_path)
    lines = proc.stdout.splitlines()
    assert "OK" in lines, proc.stdout[-3000:]
    assert any(line.startswith(f"committed input: {len(committed)} orders ") for line in lines), proc.stdout[-3000:]
