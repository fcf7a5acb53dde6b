"""Markers a partition refuses, against a real broker: a moot marker completes the transaction; a fenced one leaves it stuck, visible, and freed by an operator.

- moot: a client makes a partition of the transaction see a newer epoch of its producer id with an
  idempotent Produce (no transactional id) under that producer id and a higher epoch, which the
  checks on clients' markers cannot see (Kafka without ACLs has the same gap).  The coordinator's
  marker there is refused with INVALID_PRODUCER_EPOCH; it is moot, the transaction completes, the id
  works for the next one.
- stuck: since clients' markers are checked against the coordinator, no client can make a partition
  refuse the coordinator's epoch any more; the safety net is tested with fault injection
  (``trireme.debug.transaction.marker.refuse``: the coordinator's markers for a partition are
  answered TRANSACTION_COORDINATOR_FENCED).  The id stays in PrepareCommit, listed as stuck by the
  CLI, the status page and the metric, across a restart, with one log line per start and no retry
  loop; ``trireme transactions complete`` frees it.
"""
from __future__ import annotations

import re
import time
import urllib.request

import pytest

from compat_tests.clients import wait_until
from compat_tests.test_admin_cli import run, run_json
from compat_tests.test_bad_input import RawConn, batch, create_topic, produce, unique
from compat_tests.test_bad_transactions import add_partitions, end_txn, init, lso, produce_txn, txn_batch
from compat_tests.test_transactions_python import read_confluent

STATUS = {"trireme.status.listen": "127.0.0.1:0", "trireme.metrics.listen": "127.0.0.1:0",
          "trireme.status.actions.enable": True}
QUIET_S = 2.0          # how long the broker is watched for a retry loop (it used to log ~10 lines a second)


def log_lines(server, tid: str) -> list[str]:
    return [line for line in server.stderr_path.read_text(errors="replace").splitlines() if tid in line]


def retry_lines(server) -> list[str]:
    """Lines of a marker retry loop (before this was fixed: "... failed with INVALID_PRODUCER_EPOCH; retrying")."""
    return [line for line in server.stderr_path.read_text(errors="replace").splitlines()
            if "; retrying" in line or "not written yet" in line]


def describe(server, tid: str) -> dict:
    (d,) = run_json(server, "transactions", "describe", "--transactional-id", tid)
    return d


def status_address(server) -> str:
    """HOST:PORT of the (last) broker process's status page, as it logged it."""
    found = wait_until(lambda: re.findall(r"status page on http://(\S+)/", server.stderr_path.read_text(errors="replace")),
                       timeout=10, what="the status page address in the log")
    return found[-1]


def metric(server, name: str) -> float:
    url = wait_until(lambda: re.findall(r"metrics on (http://\S+/metrics)", server.stderr_path.read_text(errors="replace")),
                     timeout=10, what="the metrics address")[-1]
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    (value,) = [float(line.split()[-1]) for line in text.splitlines() if line.split(" ")[0] == name]
    return value


def stuck(server) -> list[dict]:
    return run_json(server, "transactions", "stuck", "--status-server", status_address(server))


@pytest.mark.server_config(STATUS)
def test_marker_refused_for_a_newer_producer_epoch_is_moot(server):
    with RawConn(server.bootstrap) as conn:
        topic = unique("moot")
        create_topic(conn, topic, partitions=2)
        tid = unique("tx-moot")
        status, pid, epoch = init(conn, tid)
        assert status == 0
        assert add_partitions(conn, tid, pid, epoch, topic, [0, 1]) == {(topic, 0): 0, (topic, 1): 0}
        assert produce_txn(conn, tid, topic, 0, txn_batch(pid, epoch, values=(b"a", b"b"))) == 0
        # A rogue idempotent batch (no transactional id) under the producer id with a higher epoch: partition 1
        # now knows a newer epoch of it than the transaction's.
        rogue = batch([b"rogue"], producer_id=pid, producer_epoch=epoch + 5, base_sequence=0)
        assert [p.error_code for p in produce(conn, topic, {1: rogue})] == [0]
        assert end_txn(conn, tid, pid, epoch, True) == 0
        # The marker on partition 1 is refused (INVALID_PRODUCER_EPOCH): moot; the transaction completes.
        wait_until(lambda: describe(server, tid)["transaction_state"] == "CompleteCommit", timeout=10,
                   what="the transaction to complete")
        # The id works for its next transaction.
        assert add_partitions(conn, tid, pid, epoch, topic, [0]) == {(topic, 0): 0}
        assert produce_txn(conn, tid, topic, 0, txn_batch(pid, epoch, seq=2, values=(b"c",))) == 0
        assert end_txn(conn, tid, pid, epoch, True) == 0
        wait_until(lambda: lso(conn, topic, 0) == 5, timeout=10, what="the second commit's marker")
        time.sleep(QUIET_S)
    got, _ = read_confluent(server.bootstrap, [(topic, 0), (topic, 1)], "read_committed")
    assert {tp: len(v) for tp, v in got.items()} == {(topic, 0): 3, (topic, 1): 1}   # 1: the rogue batch
    lines = log_lines(server, tid)
    assert len(lines) == 1 and "moot" in lines[0], lines
    assert not retry_lines(server)


STUCK_TOPIC = "stuck-by-injection"


@pytest.mark.server_config({**STATUS, "trireme.debug.transaction.marker.refuse": f"{STUCK_TOPIC}-1"})
def test_marker_fenced_by_a_newer_coordinator_epoch_is_stuck_until_completed(server):
    with RawConn(server.bootstrap) as conn:
        topic = STUCK_TOPIC
        create_topic(conn, topic, partitions=2)
        tid = unique("tx-stuck")
        status, pid, epoch = init(conn, tid)
        assert status == 0
        assert add_partitions(conn, tid, pid, epoch, topic, [0, 1]) == {(topic, 0): 0, (topic, 1): 0}
        for partition in (0, 1):
            assert produce_txn(conn, tid, topic, partition, txn_batch(pid, epoch, values=(b"a", b"b"))) == 0
        assert end_txn(conn, tid, pid, epoch, True) == 0
        wait_until(lambda: lso(conn, topic, 0) == 3, timeout=10, what="the marker on partition 0")
    rows = wait_until(lambda: [r for r in stuck(server) if r["transactional_id"] == tid], timeout=10,
                      what="the transaction listed as stuck")
    assert rows[0]["transaction_state"] == "PrepareCommit"
    assert rows[0]["partitions"] == f"{topic}-1:TRANSACTION_COORDINATOR_FENCED"
    time.sleep(QUIET_S)
    lines = log_lines(server, tid)
    assert len(lines) == 1 and "TRANSACTION_COORDINATOR_FENCED" in lines[0] and "refused for good" in lines[0], lines
    assert metric(server, "trireme_transactions_stuck") == 1
    page = urllib.request.urlopen(f"http://{status_address(server)}/", timeout=10).read().decode()
    assert 'id="stuck"' in page and tid in page.split('id="stuck"')[1].split("</section>")[0]
    assert describe(server, tid)["transaction_state"] == "PrepareCommit"

    # A restart: still stuck and visible, one line again, no retry loop.
    server.restart()
    wait_until(lambda: [r for r in stuck(server) if r["transactional_id"] == tid], timeout=20,
               what="the transaction listed as stuck after the restart")
    time.sleep(QUIET_S)
    refusals = [line for line in log_lines(server, tid) if "refused" in line]
    assert len(refusals) == 2, log_lines(server, tid)          # one more line for the second start, no loop
    assert metric(server, "trireme_transactions_stuck") == 1

    out = run(server, "transactions", "complete", "--transactional-id", tid,
              "--status-server", status_address(server))
    assert "Completed" in out.stdout, out.stdout
    wait_until(lambda: describe(server, tid)["transaction_state"] == "CompleteCommit", timeout=10,
               what="the transaction to complete")
    assert stuck(server) == []
    assert metric(server, "trireme_transactions_stuck") == 0
    got, _ = read_confluent(server.bootstrap, [(topic, 0), (topic, 1)], "read_committed")
    assert {tp: len(v) for tp, v in got.items()} == {(topic, 0): 2, (topic, 1): 2}
    assert not retry_lines(server)
    # Nothing is stuck any more: completing it again is refused.
    out = run(server, "transactions", "complete", "--transactional-id", tid, "--status-server",
              status_address(server), expect=1)
    assert "no stuck transaction" in out.stderr
