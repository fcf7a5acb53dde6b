"""A full disk under a real broker: clients get retriable errors, and once space returns everything recovers without a
restart (issue 20 item 8).

The data directory is a small tmpfs (needs root and mount).  A filler file takes every free page; a plain producer,
a transactional producer and new transactional clients then write into the full disk: their writes fail with
retriable errors (no crash, no traceback).  Once the filler is deleted, without a restart: new transactional clients
get a coordinator, the prepared transaction's markers are written, read_committed consumers see every committed
record, and every record acknowledged before, during or after the full disk is there.
"""
from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from compat_tests.conftest import ServerProcess
from compat_tests.python_clients import create_topics

TMPFS_SIZE = "8m"
BIG = b"x" * 20000          # a record that no partially filled tmpfs page can take


@pytest.fixture
def full_disk_server():
    """A broker whose data directory is an 8 MiB tmpfs; → (server, filler path)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs for the data directory needs root")
    workdir = Path(tempfile.mkdtemp(prefix="trireme-diskfull-"))
    data = workdir / "data"
    data.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "tmpfs", str(data)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        shutil.rmtree(workdir, ignore_errors=True)
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip() or mounted.returncode}")
    srv = ServerProcess(workdir)
    try:
        srv.start()
        yield srv
    finally:
        srv.stop()
        subprocess.run(["umount", str(data)], capture_output=True)
        shutil.rmtree(workdir, ignore_errors=True)


def fill(path: Path) -> int:
    """Write ``path`` until the file system has no page left; → bytes written."""
    written = 0
    with open(path, "wb", buffering=0) as f:
        for chunk in (1 << 20, 1 << 16, 1 << 12):
            block = b"\0" * chunk
            while True:
                try:
                    written += f.write(block)
                except OSError as e:
                    assert e.errno == errno.ENOSPC, e
                    break
    return written


def deliver(producer: Producer, topic: str, partition: int, values: list[bytes], timeout: float) -> tuple[list, list]:
    """Produce ``values`` and wait for their reports; → (acknowledged values, errors)."""
    acked, errors = [], []

    def report(err, msg):
        if err is None:
            acked.append(msg.value())
        else:
            errors.append(err)
    for value in values:
        producer.produce(topic, value=value, partition=partition, on_delivery=report)
    producer.flush(timeout)
    return acked, errors


def read_committed(bootstrap: str, topic: str, want: set[bytes], timeout: float = 60.0) -> set[bytes]:
    """Values a read_committed consumer sees in both partitions, read until ``want`` is among them (or the timeout)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:6]}",
                  "isolation.level": "read_committed", "enable.auto.commit": False})
    seen: set[bytes] = set()
    try:
        c.assign([TopicPartition(topic, p, 0) for p in (0, 1)])
        deadline = time.monotonic() + timeout
        while not want <= seen and time.monotonic() < deadline:
            for m in c.consume(100, 0.5):
                if m.error() is None:
                    seen.add(m.value())
    finally:
        c.close()
    return seen


def test_full_disk_then_space_back_recovers_without_restart(full_disk_server):
    srv = full_disk_server
    bootstrap = srv.bootstrap
    topic = create_topics(bootstrap, [f"full-{uuid.uuid4().hex[:8]}"], 2)[0]
    committed: list[bytes] = []
    acked_plain: list[bytes] = []
    aborted: list[bytes] = []

    a = Producer({"bootstrap.servers": bootstrap, "transactional.id": "diskfull-a"})
    a.init_transactions(30)
    a.begin_transaction()
    first = [b"a1-%d-%d" % (p, i) for p in (0, 1) for i in range(5)]
    for v in first:
        a.produce(topic, value=v, partition=int(v.split(b"-")[1]))
    a.commit_transaction(30)
    committed += first

    plain = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "message.timeout.ms": 8000})
    got, errors = deliver(plain, topic, 0, [b"p1-%d" % i for i in range(10)], 30)
    assert not errors and len(got) == 10
    acked_plain += got

    # A transaction with records on both partitions, acknowledged before the disk fills.
    a.begin_transaction()
    second = [b"a2-%d-%d" % (p, i) for p in (0, 1) for i in range(5)]
    for v in second:
        a.produce(topic, value=v, partition=int(v.split(b"-")[1]))
    assert a.flush(30) == 0

    d = Producer({"bootstrap.servers": bootstrap, "transactional.id": "diskfull-d", "message.timeout.ms": 8000})
    d.init_transactions(30)
    d.begin_transaction()

    filler = srv.data_dir / "filler"
    assert fill(filler) > 0

    # The plain producer's big records cannot be written: retriable errors, nothing acknowledged that is not kept.
    got, errors = deliver(plain, topic, 0, [b"p2-%d-" % i + BIG for i in range(5)], 15)
    acked_plain += got
    assert errors, "a write into the full disk was acknowledged"
    assert all(not e.fatal() for e in errors), errors

    # A transaction written into the full disk: its records cannot all be written.
    into_full = [b"d-%d-%d-" % (p, i) + BIG for p in (0, 1) for i in range(3)]
    errors = []
    for v in into_full:
        d.produce(topic, value=v, partition=int(v.split(b"-")[1]),
                  on_delivery=lambda err, msg: err is not None and errors.append(err))
    d.flush(15)
    assert errors and all(not e.fatal() for e in errors), errors

    # The commit: its PREPARE record may still fit a page of __transaction_state, its marker on partition 0 does not.
    try:
        a.commit_transaction(10)
        commit_answered = True
    except KafkaException as e:
        assert not e.args[0].fatal(), e
        commit_answered = False

    # New transactional ids until one fails: each InitProducerId writes a record to __transaction_state.
    failed_init = None
    for i in range(200):
        p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"diskfull-new-{i}"})
        try:
            p.init_transactions(5)
        except KafkaException as e:
            failed_init = e.args[0]
            break
        finally:
            p.flush(0)
            del p
    assert failed_init is not None, "__transaction_state never ran out of space"
    assert not failed_init.fatal(), failed_init
    assert srv.proc.poll() is None, srv.stderr_tail()

    filler.unlink()                 # space is back; no restart from here on

    c = Producer({"bootstrap.servers": bootstrap, "transactional.id": "diskfull-c"})
    c.init_transactions(60)
    c.begin_transaction()
    third = [b"c-%d-%d" % (p, i) for p in (0, 1) for i in range(5)]
    for v in third:
        c.produce(topic, value=v, partition=int(v.split(b"-")[1]))
    c.commit_transaction(60)
    committed += third

    if commit_answered:
        committed += second
    else:
        try:
            a.commit_transaction(60)
            committed += second
        except KafkaException as e:
            assert e.args[0].txn_requires_abort(), e
            a.abort_transaction(60)
            aborted += second

    d.abort_transaction(60)              # its writes failed: the client must abort (an abortable error)
    aborted += into_full

    got, errors = deliver(plain, topic, 0, [b"p3-%d" % i for i in range(5)] + [b"p3-big-" + BIG], 60)
    assert not errors, errors
    acked_plain += got

    want = set(committed) | set(acked_plain)
    seen = read_committed(bootstrap, topic, want)
    assert not want - seen, f"missing after recovery: {sorted(v[:12] for v in want - seen)}"
    assert not set(aborted) & seen

    assert srv.proc.poll() is None
    log = srv.stderr_path.read_text(errors="replace")
    assert "Traceback" not in log, srv.stderr_tail()
    offline = re.findall(r"partition (\S+) is offline: disk full", log)
    online = re.findall(r"partition (\S+) is back online", log)
    assert offline and sorted(offline) == sorted(online), (offline, online)
    assert "__transaction_state-0" in offline
