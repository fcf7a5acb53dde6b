"""The broker inside your tests (trireme.testing, trireme.pytest_plugin), used as an application's test suite would.

The fixture tests run an inner pytest in a subprocess, in a directory with no conftest.py: the plugin is found
through its entry point alone.  Its tests use confluent-kafka, kafka-python and aiokafka against function-scoped
brokers (fresh for each test: the same topic starts empty every time) and the session broker (one per process:
the same address in every test of a worker), once in one process and once under pytest-xdist with two workers.
The tests here use the context manager directly: restart() keeps acknowledged data, kill -9 in subprocess mode
keeps it too, and a failing test's report carries the broker's log.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from collections import defaultdict
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from trireme.testing import BrokerError, TriremeBroker

pytestmark = pytest.mark.timeout(300)

INNER_TESTS = '''
import asyncio, json, os, uuid

import pytest

RECORD = os.environ["TRIREME_PLUGIN_RECORD"]
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "main")


def record(kind, bootstrap, request):
    with open(RECORD, "a") as f:
        f.write(json.dumps({"worker": WORKER, "kind": kind, "bootstrap": bootstrap,
                            "test": request.node.name}) + "\\n")


def kafka_python_roundtrip(bootstrap, topic, values):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    offsets = [producer.send(topic, v, partition=0).get(timeout=30).offset for v in values]
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=5000)
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek(tp, offsets[0])
    got = [m.value for m in consumer][:len(values)]
    consumer.close()
    return offsets, got


def confluent_roundtrip(bootstrap, topic, values):
    from confluent_kafka import Consumer, Producer, TopicPartition
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    offsets = []
    for v in values:
        producer.produce(topic, v, partition=0, on_delivery=lambda err, msg: offsets.append(msg.offset()))
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "g-" + uuid.uuid4().hex,
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, offsets[0])])
    got = []
    while len(got) < len(values):
        msg = consumer.poll(10)
        assert msg is not None and msg.error() is None
        got.append(msg.value())
    consumer.close()
    return offsets, got


def aiokafka_roundtrip(bootstrap, topic, values):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    async def run():
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        await producer.start()
        try:
            offsets = [(await producer.send_and_wait(topic, v, partition=0)).offset for v in values]
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest")
        await consumer.start()
        try:
            tp = TopicPartition(topic, 0)
            consumer.assign([tp])
            consumer.seek(tp, offsets[0])
            got = []
            while len(got) < len(values):
                got.append((await asyncio.wait_for(consumer.getone(), 30)).value)
        finally:
            await consumer.stop()
        return offsets, got
    return asyncio.run(run())


ROUNDTRIPS = {"kafka-python": kafka_python_roundtrip, "confluent-kafka": confluent_roundtrip,
              "aiokafka": aiokafka_roundtrip}


@pytest.mark.trireme(topics={"orders": 2})
@pytest.mark.parametrize("client", sorted(ROUNDTRIPS))
def test_function_broker(client, trireme_bootstrap, request):
    values = [b"a", b"b", b"c"]
    offsets, got = ROUNDTRIPS[client](trireme_bootstrap, "orders", values)
    assert offsets == [0, 1, 2]          # a fresh broker: the topic starts empty in every test
    assert got == values
    record("function", trireme_bootstrap, request)


@pytest.mark.parametrize("client", sorted(ROUNDTRIPS))
def test_session_broker(client, trireme_session_bootstrap, request):
    values = [uuid.uuid4().hex.encode()]
    offsets, got = ROUNDTRIPS[client](trireme_session_bootstrap, "shared", values)
    assert got == values
    record("session", trireme_session_bootstrap, request)
'''

INNER_INI = """
[pytest]
trireme_topics =
    shared:1
trireme_config =
    log.retention.check.interval.ms=600000
"""

FAILING_TEST = '''
import pytest
from kafka import KafkaProducer


def use(bootstrap, client_id):
    producer = KafkaProducer(bootstrap_servers=bootstrap, client_id=client_id)
    producer.send("orders", b"x").get(timeout=30)
    producer.close()


@pytest.mark.trireme(topics={"orders": 1})
def test_fails_in_process(trireme_bootstrap):
    use(trireme_bootstrap, "failing-in-process")
    assert False, "deliberately"


@pytest.mark.trireme(topics={"orders": 1}, mode="subprocess")
def test_fails_with_a_subprocess(trireme_bootstrap):
    use(trireme_bootstrap, "failing-with-a-subprocess")
    assert False, "deliberately"
'''


def _inner_pytest(directory: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
                          cwd=directory, capture_output=True, text=True, timeout=240,
                          env={**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")},
                               **(env or {})})      # an outer xdist worker's id must not leak into the inner run


@pytest.mark.parametrize("workers", ["0", "2"])
def test_fixtures_in_an_applications_suite(tmp_path, workers):
    (tmp_path / "pytest.ini").write_text(INNER_INI)
    (tmp_path / "test_app.py").write_text(INNER_TESTS)
    record = tmp_path / "record.jsonl"
    out = _inner_pytest(tmp_path, "-n", workers, env={"TRIREME_PLUGIN_RECORD": str(record)})
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "6 passed" in out.stdout
    rows = [json.loads(line) for line in record.read_text().splitlines()]
    function = [r["bootstrap"] for r in rows if r["kind"] == "function"]
    assert len(function) == len(set(function)) == 3               # a broker of its own for every test
    session = defaultdict(set)
    for r in rows:
        if r["kind"] == "session":
            session[r["worker"]].add(r["bootstrap"])
    assert sum(len(s) for s in session.values()) == len(session)   # one session broker per process
    assert set(session) <= ({"main"} if workers == "0" else {"gw0", "gw1"})
    assert len({b for s in session.values() for b in s}) == len(session)


def test_failing_test_report_carries_the_broker_log(tmp_path):
    (tmp_path / "test_fails.py").write_text(FAILING_TEST)
    out = _inner_pytest(tmp_path, "-n", "0")
    assert out.returncode == 1 and "2 failed" in out.stdout
    in_process, subprocess_ = out.stdout.split("test_fails_with_a_subprocess", 1)
    # The broker's own log lines about each test's client: pytest's captured log for the in-process broker,
    # the plugin's section (the broker's stderr) for the subprocess.
    assert "Captured log call" in in_process and "client_id='failing-in-process'" in in_process
    assert "trireme broker log" in subprocess_ and "client_id='failing-with-a-subprocess'" in subprocess_


def _produce(bootstrap: str, topic: str, count: int) -> list[int]:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    offsets = [producer.send(topic, b"v%d" % i, partition=0).get(timeout=30).offset for i in range(count)]
    producer.close()
    return offsets


def _read_all(bootstrap: str, topic: str) -> list[bytes]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=5000)
    consumer.assign([TopicPartition(topic, 0)])
    values = [m.value for m in consumer]
    consumer.close()
    return values


@pytest.mark.parametrize("storage", ["memory", "disk"])
def test_restart_keeps_acknowledged_data(storage):
    with TriremeBroker(topics={"orders": 1}, storage=storage) as broker:
        address = broker.bootstrap
        assert _produce(address, "orders", 50) == list(range(50))
        broker.restart()
        assert broker.bootstrap == address                          # same port: clients reconnect by themselves
        assert _read_all(address, "orders") == [b"v%d" % i for i in range(50)]
        assert "listening host=127.0.0.1" in broker.log_text()
    assert not broker.running


def test_subprocess_kill_9_keeps_acknowledged_data():
    with TriremeBroker(topics={"orders": {"partitions": 1, "configs": {"segment.bytes": "4096"}}},
                       mode="subprocess") as broker:
        data_dir = broker.data_dir
        assert _produce(broker.bootstrap, "orders", 200) == list(range(200))
        broker.kill()
        assert not broker.running
        broker.start()
        assert _read_all(broker.bootstrap, "orders") == [b"v%d" % i for i in range(200)]
        assert len([f for f in os.listdir(os.path.join(data_dir, "logs", "orders-0")) if f.endswith(".log")]) > 1
        assert broker.log_text().count("listening host=") == 2
    assert not os.path.exists(data_dir)                              # close() removed the temporary data


def test_config_overrides_and_bad_config():
    with TriremeBroker(config={"num.partitions": 4}) as broker:
        topic = "auto-" + uuid.uuid4().hex[:8]
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
        producer.send(topic, b"x").get(timeout=30)                  # auto-created with num.partitions
        assert producer.partitions_for(topic) == {0, 1, 2, 3}
        producer.close()
    with pytest.raises(Exception, match="no.such.property"):
        TriremeBroker(config={"no.such.property": 1}).start()
    with pytest.raises(BrokerError, match="kill"):
        TriremeBroker().kill()
