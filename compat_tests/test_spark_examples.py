"""The PySpark examples in spark_examples/ against a real Trireme broker.

Each example runs as a subprocess (a user's ``python spark_examples/...``);
its input is produced, and its output checked, with confluent_kafka.  When
they run and where PySpark comes from: compat_tests/spark_support.py.
"""
from __future__ import annotations

import json
import re
import uuid
from collections import Counter

import pytest

from compat_tests.python_clients import create_topics
from compat_tests.spark_support import (RunningExample, consume_all, produce, require_spark_env,
                                        requires_connector, run_example)

pytestmark = requires_connector


# ------------------------------------------------------------------- tests

def test_batch_write_read(server, tmp_path):
    """df.write.format("kafka") with key/value/headers/partition columns, then
    spark.read.format("kafka") (read_committed, earliest..latest and a JSON
    offset range) inside the example; the written records checked here.  Run
    as docs/spark.md shows, on a broker without the topic: the example creates
    it with --partitions partitions (an auto-created topic has one, and Spark's
    sink waited 60 s for partitions 1 and 2 and failed)."""
    spark_env = require_spark_env()
    topic, partitions, count = "spark-batch", 3, 300
    run_id = f"run{uuid.uuid4().hex[:8]}"

    proc = run_example(spark_env, "batch_write_read.py",
                       ["--bootstrap", server.bootstrap, "--topic", topic,
                        "--partitions", str(partitions), "--count", str(count), "--run-id", run_id],
                       tmp_path)
    assert proc.stdout.splitlines()[0] == "topics: created spark-batch (3 partitions)", proc.stdout
    assert "OK" in proc.stdout.splitlines(), proc.stdout
    assert f"{count} from run {run_id}" in proc.stdout
    assert "bounded read of partition 0" in proc.stdout and "skipped" not in proc.stdout

    records = consume_all(server.bootstrap, topic)
    assert len(records) == count
    seen = set()
    for rec in records:
        prefix, _, index = rec["key"].decode().rpartition(":")
        i = int(index)
        assert prefix == run_id
        assert rec["value"] == f"value-{i}".encode()
        assert rec["partition"] == i % partitions
        assert rec["headers"] == [("run", run_id.encode()), ("index", str(i).encode())]
        seen.add(i)
    assert seen == set(range(count))
    for p in range(partitions):
        offsets = sorted(r["offset"] for r in records if r["partition"] == p)
        assert offsets == list(range(len(offsets))), f"partition {p}: {offsets}"

    # The example exits non-zero when what it reads does not match.
    proc = run_example(spark_env, "batch_write_read.py",
                       ["--bootstrap", server.bootstrap, "--topic", topic,
                        "--partitions", str(partitions), "--count", str(count),
                        "--run-id", "never-written", "--skip-write"],
                       tmp_path, expect_rc=1)
    assert "FAILED" in proc.stdout and "MISMATCH" in proc.stderr
    assert proc.stdout.splitlines()[0] == "topics: found spark-batch (3 partitions)", proc.stdout


def test_topics_checked_before_spark_starts(server, tmp_path):
    """Each example creates the topics it needs, or checks the partition count
    of existing ones, before Spark starts, and says which in one line; an
    existing topic with too few partitions ends it with one line on stderr
    (it used to be a 60 s wait in Spark's sink and a Java stack).  No JVM
    starts here: the bound is a hang guard."""
    spark_env = require_spark_env()
    bound = 60

    # orders_pipeline.py produce on a broker without its topics (produce needs no Spark).
    args = ["produce", "--bootstrap", server.bootstrap, "--transactions", "2"]
    proc = run_example(spark_env, "orders_pipeline.py", args, tmp_path, timeout=bound)
    assert proc.stdout.splitlines()[0] == \
        "topics: created orders (3 partitions), created order-totals (3 partitions)", proc.stdout
    proc = run_example(spark_env, "orders_pipeline.py", args, tmp_path, timeout=bound)
    assert proc.stdout.splitlines()[0] == \
        "topics: found orders (3 partitions), found order-totals (3 partitions)", proc.stdout
    assert sorted({r["partition"] for r in consume_all(server.bootstrap, "orders")}) == [0, 1, 2]

    create_topics(server.bootstrap, ["narrow"], 1)
    create_topics(server.bootstrap, ["wide"], 2)
    proc = run_example(spark_env, "batch_write_read.py",
                       ["--bootstrap", server.bootstrap, "--topic", "narrow", "--partitions", "3"],
                       tmp_path, expect_rc=1, timeout=bound)
    assert proc.stderr.splitlines() == [
        "batch_write_read.py: topic narrow exists with 1 partition, fewer than the 3 this example "
        "needs (rows go to partitions 0..2; see --partitions); delete it or name another topic"], proc.stderr
    assert proc.stdout == ""

    proc = run_example(spark_env, "streaming_copy.py",
                       ["--bootstrap", server.bootstrap, "--source", "wide", "--sink", "narrow"],
                       tmp_path, expect_rc=1, timeout=bound)
    assert proc.stderr.splitlines() == [
        "streaming_copy.py: topic narrow exists with 1 partition, fewer than the 2 this example "
        "needs (each record keeps its partition: as many as wide); delete it or name another "
        "topic"], proc.stderr
    assert consume_all(server.bootstrap, "narrow") == []


def checkpoint_batches(checkpoint) -> tuple[dict[int, dict[int, int]], set[int]]:
    """A streaming checkpoint's offsets log ({batch id: {partition: end
    offset}}, the single kafka source's) and the ids in its commits log."""
    offsets = {}
    for f in (checkpoint / "offsets").iterdir():
        if f.name.isdigit():
            lines = f.read_text().splitlines()   # "v1", the batch metadata, one line per source
            offsets[int(f.name)] = {int(p): o for p, o in next(iter(json.loads(lines[2]).values())).items()}
    commits = {int(f.name) for f in (checkpoint / "commits").iterdir() if f.name.isdigit()}
    return offsets, commits


@pytest.mark.timeout(1200)
def test_streaming_copy(server, tmp_path):
    """Kafka to Kafka: readStream -> upper(value) -> writeStream (key, value,
    headers, partition) with a checkpoint.  A run with trigger(availableNow)
    copies the source record by record; then, with more input, a running
    query's driver is killed -9 mid-stream and a restart from the checkpoint
    finishes: nothing is lost, and the only duplicates are records of the
    micro-batch that was in the offsets log but not committed (the one Spark
    replays)."""
    spark_env = require_spark_env()
    source, sink = "spark-copy-in", "spark-copy-out"
    create_topics(server.bootstrap, [source], 2)     # the example creates the sink
    checkpoint = tmp_path / "checkpoint"
    args = ["--bootstrap", server.bootstrap, "--source", source, "--sink", sink,
            "--checkpoint", str(checkpoint), "--max-offsets-per-trigger", "25"]

    def batch(start: int, n: int) -> list[tuple]:
        return [(f"k{i}".encode(), f"hello trireme {i}".encode(), [("n", str(i).encode())], i % 2)
                for i in range(start, start + n)]

    def by_partition(records) -> dict[int, list[tuple]]:
        out: dict[int, list[tuple]] = {0: [], 1: []}
        for r in sorted(records, key=lambda r: (r["partition"], r["offset"])):
            out[r["partition"]].append((r["key"], r["value"], tuple(r["headers"])))
        return out

    def expected(n: int) -> dict[int, list[tuple]]:
        return {p: [(k, v.upper(), tuple(h)) for k, v, h, q in batch(0, n) if q == p] for p in (0, 1)}

    produce(server.bootstrap, source, batch(0, 40))
    proc = run_example(spark_env, "streaming_copy.py", args, tmp_path)
    assert proc.stdout.splitlines()[0] == \
        f"topics: found {source} (2 partitions), created {sink} (2 partitions)", proc.stdout
    assert "OK" in proc.stdout.splitlines(), proc.stdout
    assert "copied 40 records" in proc.stdout
    batches = [json.loads(line.split(" ", 1)[1]) for line in proc.stdout.splitlines()
               if line.startswith("PROGRESS ")]
    assert len([b for b in batches if b["rows"]]) >= 2 and all(b["rows"] <= 25 for b in batches), batches
    assert by_partition(consume_all(server.bootstrap, sink)) == expected(40)

    # A running query (a micro-batch a second, at most 25 offsets each) is
    # killed with its JVM while the copy is under way.
    produce(server.bootstrap, source, batch(40, 160))
    running = RunningExample(spark_env, "streaming_copy.py", [*args, "--trigger-seconds", "1"], tmp_path)
    try:
        running.wait_for(lambda lines: sum(1 for line in lines if line.startswith("PROGRESS ")
                                           and json.loads(line.split(" ", 1)[1])["rows"]) >= 2,
                         "two micro-batches with input")
    finally:
        running.stop()
    offsets, commits = checkpoint_batches(checkpoint)
    last = max(offsets)
    assert last - 1 in commits, (sorted(offsets), sorted(commits))
    replayed = set() if last in commits else {
        (p, o) for p, end in offsets[last].items() for o in range(offsets[last - 1][p], end)}

    proc = run_example(spark_env, "streaming_copy.py", [*args, "--no-verify"], tmp_path)
    source_records = consume_all(server.bootstrap, source)
    sink_records = consume_all(server.bootstrap, sink)
    where = {r["key"]: (r["partition"], r["offset"]) for r in source_records}
    counts = Counter(r["key"] for r in sink_records)
    assert set(counts) == set(where), "records lost or invented"
    doubled = {k for k, n in counts.items() if n > 1}
    assert all(counts[k] == 2 and where[k] in replayed for k in doubled), \
        (sorted(doubled)[:10], last, sorted(commits)[-3:])
    # Apart from the replayed batch's second copies, record by record.
    got = by_partition(sink_records)
    for p, rows in got.items():
        seen: set[bytes] = set()
        got[p] = [r for r in rows if not (r[0] in seen or seen.add(r[0]))]
    assert got == expected(200)
    print(f"kill -9 after batch {last} ({'committed' if last in commits else 'not committed'}): "
          f"{len(doubled)} records written twice")


def parse_console_batches(stdout: str) -> list[dict[str, int]]:
    """The word|count tables the console sink printed, one per batch."""
    batches: list[dict[str, int]] = []
    current: dict[str, int] | None = None
    for line in stdout.splitlines():
        if re.fullmatch(r"Batch: \d+", line.strip()):
            current = {}
            batches.append(current)
            continue
        if current is None or not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells == ["word", "count"] or len(cells) != 2:
            continue
        current[cells[0]] = int(cells[1])
    return batches


def test_word_count(server, tmp_path):
    """Streaming aggregation (complete mode, console sink, availableNow).  First
    as docs/spark.md shows, on a broker without the topic: the example creates
    it and counts nothing (Spark's source used to fail on the missing topic)."""
    spark_env = require_spark_env()
    topic = "lines"
    proc = run_example(spark_env, "word_count.py", ["--bootstrap", server.bootstrap, "--topic", topic],
                       tmp_path)
    assert proc.stdout.splitlines()[0] == "topics: created lines (2 partitions)", proc.stdout
    assert f"0 lines read from {topic}" in proc.stdout, proc.stdout

    lines = [
        "the quick brown fox",
        "jumps over the lazy dog",
        "The dog sleeps",
        "  fox   and dog  ",
        "trireme rows the kafka sea",
    ] * 3
    produce(server.bootstrap, topic, [(None, line.encode(), None) for line in lines])
    want = Counter(w for line in lines for w in line.lower().split())

    proc = run_example(spark_env, "word_count.py",
                       ["--bootstrap", server.bootstrap, "--topic", topic], tmp_path)
    assert proc.stdout.splitlines()[0] == "topics: found lines (2 partitions)", proc.stdout
    assert f"{len(lines)} lines read from {topic}" in proc.stdout, proc.stdout
    batches = parse_console_batches(proc.stdout)
    assert batches, f"no console output batch:\n{proc.stdout[-4000:]}"
    assert batches[-1] == dict(want), proc.stdout[-4000:]
