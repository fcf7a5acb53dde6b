"""What the Spark tests share: the decision to run them, the PySpark
interpreter, running an example, a Spark harness, and confluent_kafka helpers.

Spark's Kafka connector (spark-sql-kafka-0-10 and its dependencies) is not in
any registry this project can reach, so the Spark tests run only when
TRIREME_SPARK_KAFKA_JARS names a directory holding it (``make test`` sets it
when ../shared/spark-connector exists, and installs PySpark into
.cache/spark/venv, named by TRIREME_SPARK_PYTHON).  That decision is made from
the environment variable alone, before anything imports pyspark.  Once the
jars are given, everything else is required: a missing PySpark (or Java)
makes the tests FAIL with a message saying what to install.

PySpark is looked up in TRIREME_SPARK_PYTHON (an interpreter path) when set,
else in the interpreter running the tests; the test process itself never
imports it.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from compat_tests import clients

JARS_ENV = "TRIREME_SPARK_KAFKA_JARS"
PYTHON_ENV = "TRIREME_SPARK_PYTHON"
SKIP_REASON = (
    "Spark's Kafka connector jar (spark-sql-kafka-0-10) is not in any registry reachable here; "
    "`make test` runs this test when ../shared/spark-connector exists, or set "
    "TRIREME_SPARK_KAFKA_JARS to a directory holding the connector (Spark's access pattern is "
    "covered by compat_tests/test_java_client.py::test_spark_access_pattern with the Java "
    "client 3.9 Spark ships)"
)

# For each Spark test module: `pytestmark = requires_connector`.  The group
# keeps them in one worker under --dist loadgroup; `make test` runs them in a
# pytest process of their own after the main run.
requires_connector = [pytest.mark.skipif(not os.environ.get(JARS_ENV, "").strip(), reason=SKIP_REASON),
                      pytest.mark.xdist_group("spark")]

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
    if os.sep in python:    # the examples run in a temporary directory: absolute paths
        python = os.path.abspath(python)
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

    env = {**os.environ, "PYTHONUNBUFFERED": "1", "SPARK_LOG_LEVEL": "WARN",
           JARS_ENV: str(jars_dir.resolve())}
    env.pop("PYSPARK_SUBMIT_ARGS", None)   # the examples configure Spark themselves
    _checked.append(SparkEnv(python=python, version=version, env=env))
    return _checked[0]


def example_argv(spark_env: SparkEnv, script: str, args: list[str]) -> list[str]:
    return [spark_env.python, str(EXAMPLES / script), *args]


def run_example(spark_env: SparkEnv, script: str, args: list[str], cwd: Path,
                expect_rc: int = 0, timeout: float = RUN_TIMEOUT) -> subprocess.CompletedProcess:
    argv = example_argv(spark_env, script, args)
    t0 = time.monotonic()
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env=spark_env.env,
                              cwd=str(cwd), timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        pytest.fail(f"{script} did not finish within {timeout}s\n--- stdout ---\n"
                    f"{out[-4000:]}\n--- stderr ---\n{err[-6000:]}")
    print(f"{script} {' '.join(args)}: exit {proc.returncode} after {time.monotonic() - t0:.1f}s")
    if proc.returncode != expect_rc:
        pytest.fail(f"{script} exited with {proc.returncode} (expected {expect_rc})\n"
                    f"--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-6000:]}")
    return proc


class RunningExample:
    """An example started in a process group of its own (the Python driver
    and its JVM), its stdout read line by line; ``kill9()`` kills the group."""

    def __init__(self, spark_env: SparkEnv, script: str, args: list[str], cwd: Path):
        self.script = script
        self.stderr_path = cwd / f"{script}.{uuid.uuid4().hex[:6]}.stderr"
        self._stderr = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen(example_argv(spark_env, script, args), stdout=subprocess.PIPE,
                                     stderr=self._stderr, env=spark_env.env, cwd=str(cwd),
                                     text=True, start_new_session=True)
        self.lines: list[str] = []
        self._cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def wait_for(self, pred, what: str, timeout: float = RUN_TIMEOUT) -> None:
        """Waits until pred(lines) holds; fails if the process ends first."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not pred(self.lines):
                if self.proc.poll() is not None:
                    pytest.fail(f"{self.script} exited ({self.proc.returncode}) before {what}\n"
                                f"{self.tail()}")
                if time.monotonic() > deadline:
                    pytest.fail(f"{self.script}: no {what} within {timeout}s\n{self.tail()}")
                self._cond.wait(0.5)

    def tail(self) -> str:
        return ("--- stdout ---\n" + "\n".join(self.lines[-40:]) + "\n--- stderr ---\n"
                + self.stderr_path.read_text(errors="replace")[-6000:])

    def kill9(self) -> None:
        """SIGKILL to the whole process group: the driver and its JVM at once."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        self._stderr.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.kill9()


@contextlib.contextmanager
def spark_harness(bootstrap: str) -> Iterator[clients.HarnessProcess]:
    """compat_tests/spark_harness.py: one SparkSession answering reads."""
    spark_env = require_spark_env()
    h = clients.HarnessProcess("spark", bootstrap, env=spark_env.env, python=spark_env.python)
    try:
        yield h
    finally:
        h.close(timeout=60)


# ------------------------------------------------- confluent_kafka helpers

def wait_for_lso(bootstrap: str, topic: str, partitions: int, timeout: float = 30.0) -> dict[int, int]:
    """Waits until no transaction is open on the topic (every partition's
    last stable offset equals its high watermark: EndTxn answers before the
    markers are written); returns the end offsets."""
    from confluent_kafka import Consumer, TopicPartition

    def ends(isolation: str) -> dict[int, int]:
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": "spark-tests-unused",
                      "isolation.level": isolation})
        try:
            return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                    for p in range(partitions)}
        finally:
            c.close()

    out: dict[int, int] = {}

    def stable() -> bool:
        out.update(ends("read_uncommitted"))
        return ends("read_committed") == out

    clients.wait_until(stable, timeout=timeout, what=f"no open transaction on {topic}")
    return out



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


