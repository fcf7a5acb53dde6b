"""Exactly-once consume-transform-produce (confluent-kafka) across worker kills and broker kill -9.

100,000 input records go through a worker that runs one transaction per polled batch: the output
records and the consumer's offsets (send_offsets_to_transaction, KIP-447).  While it runs, the worker
is killed (SIGKILL) and restarted three times and the broker is killed with -9 three times.  Checked
by key: every input key appears in the committed output exactly once — none missing, none extra.
"""
from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from compat_tests.clients import wait_until

N = 100_000
PARTITIONS = 3
WORKER = Path(__file__).with_name("eos_worker.py")


def _topics(bootstrap: str, *names: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(n, PARTITIONS, 1) for n in names], operation_timeout=30).values():
        f.result(timeout=30)


def _read_keys(bootstrap: str, topic: str) -> dict[bytes, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "check-" + uuid.uuid4().hex,
                  "isolation.level": "read_committed", "enable.auto.commit": False})
    tps = [TopicPartition(topic, p, 0) for p in range(PARTITIONS)]
    ends = {tp.partition: c.get_watermark_offsets(tp, timeout=20)[1] for tp in tps}
    c.assign(tps)
    counts: dict[bytes, int] = {}
    deadline = time.time() + 120
    while time.time() < deadline:
        msgs = c.consume(1000, timeout=0.5)
        for m in msgs:
            if not m.error():
                counts[m.key()] = counts.get(m.key(), 0) + 1
        if not msgs and all(tp.offset >= ends[tp.partition] for tp in c.position(tps)):
            break
    c.close()
    return counts


def test_exactly_once_across_worker_and_broker_kills(server, tmp_path):
    bootstrap = server.bootstrap
    tag = uuid.uuid4().hex[:8]
    source, sink, group, txn_id = f"eos-in-{tag}", f"eos-out-{tag}", f"eos-g-{tag}", f"eos-worker-{tag}"
    _topics(bootstrap, source, sink)
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20})
    for i in range(N):
        p.produce(source, key=b"k%06d" % i, value=b"v%d" % i, partition=i % PARTITIONS)
        if i % 10000 == 0:
            p.poll(0)
    assert p.flush(60) == 0

    log = open(tmp_path / "worker.log", "ab")

    def start_worker() -> subprocess.Popen:
        return subprocess.Popen([sys.executable, str(WORKER), server.bootstrap, source, sink, group, txn_id,
                                 str(PARTITIONS)], stdout=subprocess.PIPE, stderr=log, text=True)

    worker = start_worker()
    restarts = {"worker": 0, "broker": 0}
    for round_ in range(6):
        time.sleep(1.5)
        if worker.poll() is not None:          # exited on an error (or done): start it again
            worker = start_worker()
        if round_ % 2 == 0:
            worker.kill()
            worker.wait(10)
            restarts["worker"] += 1
            worker = start_worker()
        else:
            server.kill9()
            restarts["broker"] += 1
    deadline = time.time() + 300
    while True:
        code = worker.wait(timeout=max(1, deadline - time.time()))
        if code == 0:
            break
        assert time.time() < deadline, "the worker did not finish"
        worker = start_worker()              # an error after a broker kill: the next one carries on
    assert restarts == {"worker": 3, "broker": 3}
    counts = _read_keys(server.bootstrap, sink)
    missing = N - len(counts)
    extra = {k: n for k, n in counts.items() if n != 1}
    assert missing == 0 and not extra, f"{missing} keys missing, {len(extra)} duplicated: {list(extra.items())[:5]}"
    assert set(counts) == {b"k%06d" % i for i in range(N)}
    # The group's committed offsets are the input's end: the offsets went with the output.
    c = Consumer({"bootstrap.servers": server.bootstrap, "group.id": group})
    committed = c.committed([TopicPartition(source, q) for q in range(PARTITIONS)], timeout=20)
    c.close()
    assert sum(tp.offset for tp in committed) == N
