"""The PySpark examples in spark_examples/ against a real Trireme broker.

Each example runs as a subprocess (a user's ``python spark_examples/...``);
its input is produced, and its output checked, with confluent_kafka.

Spark's Kafka connector (spark-sql-kafka-0-10 and its dependencies) is not in
any registry this project can reach, so these tests run only when
TRIREME_SPARK_KAFKA_JARS names a directory holding it.  That decision is made
from the environment variable alone, before anything imports pyspark.  Once
the jars are given, everything else is required: a missing PySpark (or Java)
makes the tests FAIL with a message saying what to install.

PySpark is looked up in TRIREME_SPARK_PYTHON (an interpreter path) when set,
else in the interpreter running the tests.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

JARS_ENV = "TRIREME_SPARK_KAFKA_JARS"
PYTHON_ENV = "TRIREME_SPARK_PYTHON"
SKIP_REASON = (
    "Spark's Kafka connector jar (spark-sql-kafka-0-10) is not in any registry reachable here; "
    "set TRIREME_SPARK_KAFKA_JARS to a directory holding it to run this test (Spark's access "
    "pattern is covered by compat_tests/test_java_client.py::test_spark_access_pattern with "
    "the Java client 3.9 Spark ships)"
)

pytestmark = pytest.mark.skipif(not os.environ.get(JARS_ENV, "").strip(), reason=SKIP_REASON)

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "spark_examples"
RUN_TIMEOUT = 420          # one example run: JVM start + job
PYSPARK_VERSION = "4.3.0"  # the version the README tells users to install


# ------------------------------------------------------------------ set-up

@dataclass
class SparkEnv:
    python: str
    version: str
    env: dict[str, str]


def _connector_jar_versions(directory: Path) -> list[str]:
    versions = []
    for jar in directory.glob("spark-sql-kafka-0-10_*.jar"):
        m = re.fullmatch(r"spark-sql-kafka-0-10_[0-9.]+-(.+)\.jar", jar.name)
        if m:
            versions.append(m.group(1))
    return versions


_checked: list[SparkEnv] = []


def require_spark_env() -> SparkEnv:
    """Checks everything the examples need.  Called from each test's body so
    that a missing piece FAILS the test (not an error in set-up, never a
    skip): the connector jars were provided, so Spark is expected to run."""
    if _checked:
        return _checked[0]
    jars_dir = Path(os.environ[JARS_ENV].strip()).expanduser()
    if not jars_dir.is_dir():
        pytest.fail(f"{JARS_ENV}={str(jars_dir)!r} is not a directory")
    if not list(jars_dir.glob("*.jar")):
        pytest.fail(f"{JARS_ENV}={str(jars_dir)!r} holds no *.jar file")
    connector_versions = _connector_jar_versions(jars_dir)
    if not connector_versions:
        pytest.fail(f"{JARS_ENV}={str(jars_dir)!r} has no spark-sql-kafka-0-10_<scala>-<version>.jar "
                    "(it needs the connector and its dependencies: kafka-clients, commons-pool2, "
                    "spark-token-provider-kafka)")

    python = os.environ.get(PYTHON_ENV, "").strip() or sys.executable
    # Import pyspark in a child interpreter: this process never imports it.
    probe = subprocess.run([python, "-c", "import pyspark; print(pyspark.__version__)"],
                           capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:
        pytest.fail(f"{JARS_ENV} is set, but pyspark is not importable by {python}:\n"
                    f"{probe.stderr.strip()[-1500:]}\n"
                    f"Install it with `{python} -m pip install pyspark=={PYSPARK_VERSION}` "
                    f"(or point {PYTHON_ENV} at an interpreter that has it).")
    version = probe.stdout.strip().splitlines()[-1]
    if version not in connector_versions:
        pytest.fail(f"pyspark {version} (in {python}) does not match the connector jar(s) in "
                    f"{jars_dir} (versions {connector_versions}); use the same Spark version")
    if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
        pytest.fail("PySpark needs Java 17+: put `java` on PATH or set JAVA_HOME")

    env = {**os.environ, "PYTHONUNBUFFERED": "1", "SPARK_LOG_LEVEL": "WARN"}
    env.pop("PYSPARK_SUBMIT_ARGS", None)   # the examples configure Spark themselves
    _checked.append(SparkEnv(python=python, version=version, env=env))
    return _checked[0]


def run_example(spark_env: SparkEnv, script: str, args: list[str], cwd: Path,
                expect_rc: int = 0) -> subprocess.CompletedProcess:
    argv = [spark_env.python, str(EXAMPLES / script), *args]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env=spark_env.env,
                              cwd=str(cwd), timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        pytest.fail(f"{script} did not finish within {RUN_TIMEOUT}s\n--- stdout ---\n"
                    f"{out[-4000:]}\n--- stderr ---\n{err[-6000:]}")
    print(f"{script} {' '.join(args)}: exit {proc.returncode} after {time.monotonic() - t0:.1f}s")
    if proc.returncode != expect_rc:
        pytest.fail(f"{script} exited with {proc.returncode} (expected {expect_rc})\n"
                    f"--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-6000:]}")
    return proc


# ------------------------------------------------- confluent_kafka helpers

def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)],
                                  operation_timeout=30)
    futures[topic].result(timeout=60)


def produce(bootstrap: str, topic: str, records: list[tuple]) -> None:
    """records: (key, value, headers) or (key, value, headers, partition)."""
    from confluent_kafka import Producer

    errors: list[str] = []

    def on_delivery(err, msg) -> None:
        if err is not None:
            errors.append(str(err))

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    for rec in records:
        key, value, headers = rec[:3]
        kw = {"partition": rec[3]} if len(rec) > 3 else {}
        if headers:
            kw["headers"] = headers
        producer.produce(topic, key=key, value=value, on_delivery=on_delivery, **kw)
        producer.poll(0)
    left = producer.flush(60)
    assert left == 0, f"{left} records not delivered"
    assert not errors, errors[:5]


def consume_all(bootstrap: str, topic: str, timeout: float = 60.0) -> list[dict]:
    """Every committed record of a topic (read_committed), via assign +
    partition EOF: {partition, offset, key, value, headers}."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": f"spark-examples-check-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "isolation.level": "read_committed",
    })
    try:
        meta = consumer.list_topics(topic, timeout=30).topics[topic]
        assert meta.error is None, meta.error
        partitions = sorted(meta.partitions)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        at_end: set[int] = set()
        records: list[dict] = []
        deadline = time.monotonic() + timeout
        while len(at_end) < len(partitions):
            assert time.monotonic() < deadline, \
                f"consuming {topic}: partitions {sorted(set(partitions) - at_end)} never reached their end"
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    at_end.add(msg.partition())
                    continue
                raise AssertionError(f"consuming {topic}: {msg.error()}")
            records.append({"partition": msg.partition(), "offset": msg.offset(),
                            "key": msg.key(), "value": msg.value(),
                            "headers": [(k, v) for k, v in (msg.headers() or [])]})
        return records
    finally:
        consumer.close()


# ------------------------------------------------------------------- tests

def test_batch_write_read(server, tmp_path):
    """df.write.format("kafka") with key/value/headers/partition columns, then
    spark.read.format("kafka") (read_committed, earliest..latest and a JSON
    offset range) inside the example; the written records checked here."""
    spark_env = require_spark_env()
    topic, partitions, count = "spark-batch", 3, 90
    create_topic(server.bootstrap, topic, partitions)
    run_id = f"run{uuid.uuid4().hex[:8]}"

    proc = run_example(spark_env, "batch_write_read.py",
                       ["--bootstrap", server.bootstrap, "--topic", topic,
                        "--partitions", str(partitions), "--count", str(count), "--run-id", run_id],
                       tmp_path)
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


@pytest.mark.timeout(1200)
def test_streaming_copy(server, tmp_path):
    """readStream -> upper(value) -> writeStream to another topic with a
    checkpoint and trigger(availableNow); a second run resumes from the
    checkpoint and copies only the new records."""
    spark_env = require_spark_env()
    source, sink = "spark-copy-in", "spark-copy-out"
    create_topic(server.bootstrap, source, 2)
    create_topic(server.bootstrap, sink, 2)
    checkpoint = tmp_path / "checkpoint"
    args = ["--bootstrap", server.bootstrap, "--source", source, "--sink", sink,
            "--checkpoint", str(checkpoint)]

    def batch(start: int, n: int) -> list[tuple]:
        return [(f"k{i}".encode(), f"hello trireme {i}".encode(), [("n", str(i).encode())])
                for i in range(start, start + n)]

    def expected(n: int) -> Counter:
        return Counter((k, v.upper(), tuple(h)) for k, v, h in batch(0, n))

    def sink_contents() -> Counter:
        return Counter((r["key"], r["value"], tuple(r["headers"]))
                       for r in consume_all(server.bootstrap, sink))

    produce(server.bootstrap, source, batch(0, 40))
    proc = run_example(spark_env, "streaming_copy.py", args, tmp_path)
    assert "OK" in proc.stdout.splitlines(), proc.stdout
    assert "copied 40 records" in proc.stdout
    assert sink_contents() == expected(40)
    assert checkpoint.is_dir() and (checkpoint / "offsets").is_dir()

    # Resume: only the 20 new records are copied, nothing twice.
    produce(server.bootstrap, source, batch(40, 20))
    proc = run_example(spark_env, "streaming_copy.py", args, tmp_path)
    assert "OK" in proc.stdout.splitlines(), proc.stdout
    assert "copied 20 records" in proc.stdout
    assert sink_contents() == expected(60)


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
    """Streaming aggregation (complete mode, console sink, availableNow)."""
    spark_env = require_spark_env()
    topic = "spark-lines"
    create_topic(server.bootstrap, topic, 2)
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
    assert f"{len(lines)} lines read from {topic}" in proc.stdout, proc.stdout
    batches = parse_console_batches(proc.stdout)
    assert batches, f"no console output batch:\n{proc.stdout[-4000:]}"
    assert batches[-1] == dict(want), proc.stdout[-4000:]
