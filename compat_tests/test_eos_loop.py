"""Exactly-once consume-transform-produce (confluent-kafka, and the Java client 3.9.0/4.3.0) across worker kills and broker kill -9.

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

from compat_tests.python_clients import create_topics


N = 100_000
PARTITIONS = 3
WORKER = Path(__file__).with_name("eos_worker.py")


def read_committed_keys(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> dict[bytes, int]:
    """key → how many times a read_committed consumer reads it, from the start to the end of every partition
    (stopping short of an end, as behind a transaction left open, fails)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "check-" + uuid.uuid4().hex,
                  "isolation.level": "read_committed", "enable.auto.commit": False})
    tps = [TopicPartition(topic, p, 0) for p in range(partitions)]
    ends = {tp.partition: c.get_watermark_offsets(tp, timeout=30)[1] for tp in tps}
    c.assign(tps)
    counts: dict[bytes, int] = {}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        msgs = c.consume(1000, timeout=0.5)
        for m in msgs:
            if not m.error():
                counts[m.key()] = counts.get(m.key(), 0) + 1
        if not msgs and all(tp.offset >= ends[tp.partition] for tp in c.position(tps)):
            break
    short = {tp.partition: (tp.offset, ends[tp.partition]) for tp in c.position(tps) if tp.offset < ends[tp.partition]}
    c.close()
    assert not short, f"read_committed stopped short of the end (position, end) (a transaction left open?): {short}"
    return counts


def _setup(bootstrap: str, prefix: str, n: int) -> tuple[str, str, str, str]:
    """Input and output topics, n keyed input records → (input, output, group, transactional id)."""
    tag = uuid.uuid4().hex[:8]
    source, sink, group, txn_id = f"{prefix}-in-{tag}", f"{prefix}-out-{tag}", f"{prefix}-g-{tag}", f"{prefix}-w-{tag}"
    create_topics(bootstrap, [source, sink], PARTITIONS)
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20})
    for i in range(n):
        p.produce(source, key=b"k%06d" % i, value=b"v%d" % i, partition=i % PARTITIONS)
        if i % 10000 == 0:
            p.poll(0)
    assert p.flush(60) == 0
    return source, sink, group, txn_id


def _check_exactly_once(bootstrap: str, source: str, sink: str, group: str, n: int) -> None:
    """Every input key exactly once in the committed output; the group's offsets at the input's end (they went
    with the output)."""
    counts = read_committed_keys(bootstrap, sink)
    missing = n - len(counts)
    extra = {k: c for k, c in counts.items() if c != 1}
    assert missing == 0 and not extra, f"{missing} keys missing, {len(extra)} duplicated: {list(extra.items())[:5]}"
    assert set(counts) == {b"k%06d" % i for i in range(n)}
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    committed = c.committed([TopicPartition(source, q) for q in range(PARTITIONS)], timeout=20)
    c.close()
    assert sum(tp.offset for tp in committed) == n


def test_exactly_once_across_worker_and_broker_kills(server, tmp_path):
    source, sink, group, txn_id = _setup(server.bootstrap, "eos", N)

    log = open(tmp_path / "worker.log", "ab")

    def start_worker() -> subprocess.Popen:
        return subprocess.Popen([sys.executable, str(WORKER), server.bootstrap, source, sink, group, txn_id,
                                 str(PARTITIONS)], stdout=subprocess.PIPE, stderr=log, text=True)

    worker = start_worker()
    try:
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
    finally:
        worker.kill()                        # never leave a worker behind a failed run
    assert restarts == {"worker": 3, "broker": 3}
    _check_exactly_once(server.bootstrap, source, sink, group, N)


JAVA_N = 100_000
JAVA_ROUND = 2_000


def test_exactly_once_java_across_worker_and_broker_kills(server, java_version):
    """The Java client (3.9.0, 4.3.0) as the worker, through its harness: poll up to 2,000 records, write them
    transformed in one transaction with sendOffsetsToTransaction, commit.  The worker's JVM is SIGKILLed
    mid-transaction 3 times and the broker killed with -9 3 times (between a transaction's records and its
    commit); a failed command restarts the worker, as a supervisor would.  Every key exactly once."""
    from compat_tests import clients
    clients.require_java(java_version)
    source, sink, group, txn_id = _setup(server.bootstrap, "jeos", JAVA_N)

    consumer_config = {"isolation.level": "read_committed", "session.timeout.ms": 2000,
                       "heartbeat.interval.ms": 300, "max.poll.records": JAVA_ROUND, "fetch.max.wait.ms": 100}
    producer_config = {"transactional.id": txn_id, "acks": "all", "linger.ms": 5,
                       "reconnect.backoff.max.ms": 500, "delivery.timeout.ms": 30000,
                       "request.timeout.ms": 10000, "transaction.timeout.ms": 10000}

    def start_worker() -> clients.HarnessProcess:
        h = clients.java_harness(java_version, server.bootstrap)
        h.ok("init_producer", handle="w", config=producer_config)
        h.ok("subscribe", topic=source, group=group, config=consumer_config, handle="c")
        return h

    worker = start_worker()
    kills = {"worker": 0, "broker": 0}
    rounds = restarts = 0
    done = 0
    deadline = time.monotonic() + 420
    try:
        while done < JAVA_N:
            assert time.monotonic() < deadline, f"only {done} of {JAVA_N} input records done"
            rounds += 1
            try:
                polled = worker.call("poll", handle="c", timeout_ms=2000, max=JAVA_ROUND)
                if not polled["ok"]:
                    raise clients.HarnessError(polled)
                recs = polled["records"]
                if not recs:
                    positions = worker.ok("positions", handle="c")["positions"]
                    done = sum(pos for _, _, pos in positions) if len(positions) == PARTITIONS else done
                    continue
                worker.ok("begin_txn", handle="w")
                out = [clients.record(b"out:" + clients.decoded(r)["value"], key=clients.decoded(r)["key"],
                                      partition=r["partition"]) for r in recs]
                sent = worker.call("produce", topic=sink, records=out, handle="w")
                if not sent["ok"]:
                    raise clients.HarnessError(sent)
                if rounds in (4, 14, 24) and kills["worker"] < 3:       # the worker dies mid-transaction
                    worker.proc.kill()
                    worker.proc.wait(10)
                    kills["worker"] += 1
                    raise clients.HarnessError("killed")
                if rounds in (9, 19, 29) and kills["broker"] < 3:       # the broker dies before the commit
                    server.kill9()
                    kills["broker"] += 1
                worker.ok("send_offsets_to_txn", handle="w", consumer="c")
                worker.ok("commit_txn", handle="w")
            except (clients.HarnessError, AssertionError):
                restarts += 1
                assert restarts <= 20, "the worker keeps failing"
                try:
                    worker.close()
                except Exception:
                    pass
                worker = start_worker()
    finally:
        worker.close()
    assert kills == {"worker": 3, "broker": 3}
    _check_exactly_once(server.bootstrap, source, sink, group, JAVA_N)
