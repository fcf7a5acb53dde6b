"""Markers a partition refuses, against a real broker: a moot marker completes the transaction; a fenced one leaves it stuck, visible, and freed by an operator.

Each scenario plants a rogue marker (raw WriteTxnMarkers) on a partition for the producer id the
next transactional producer will get, *before* that producer exists, so the coordinator has no
transaction for it yet (the check on rogue markers leaves such markers alone: that is KIP-664's
admin abort).  Then a producer from raw requests uses that producer id:

- moot: the rogue marker carries a higher producer epoch.  The transaction adds that partition but
  cannot write to it (its epoch is older), so the coordinator's marker there is refused with
  INVALID_PRODUCER_EPOCH; it is moot, the transaction completes, the id works for the next one.
- stuck: the rogue marker carries a higher coordinator epoch.  The producer writes to the partition
  (same producer epoch), and the coordinator's marker is refused with TRANSACTION_COORDINATOR_FENCED.
  The id stays in PrepareCommit, listed as stuck by the CLI, the status page and the metric, across a
  restart, with one log line per start and no retry loop; ``trireme transactions complete`` frees it.
"""
from __future__ import annotations

import json
import re
import time
import urllib.request

import pytest

from compat_tests.clients import wait_until
from compat_tests.test_admin_cli import run, run_json
from compat_tests.test_bad_input import RawConn, create_topic, req, unique
from compat_tests.test_bad_transactions import add_partitions, end_txn, init, lso, markers, produce_txn, txn_batch
from compat_tests.test_transactions_python import read_confluent

STATUS = {"trireme.status.listen": "127.0.0.1:0", "trireme.metrics.listen": "127.0.0.1:0",
          "trireme.status.actions.enable": True}
QUIET_S = 2.0          # how long the broker is watched for a retry loop (it used to log ~10 lines a second)


def next_producer_id(conn: RawConn) -> int:
    """The producer id the next InitProducerId gets: one more than an idempotent producer's just allocated."""
    r = conn.request("InitProducerId", 4, req("InitProducerId", transactional_id=None, transaction_timeout_ms=-1,
                                              producer_id=-1, producer_epoch=-1))
    assert r.error_code == 0
    return r.producer_id + 1


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
        pid = next_producer_id(conn)
        # The partition sees producer epoch 5 of this producer id before the producer exists.
        assert markers(conn, pid, 5, topic, 1, coordinator_epoch=0) == 0
        tid = unique("tx-moot")
        assert init(conn, tid) == (0, pid, 0)
        assert add_partitions(conn, tid, pid, 0, topic, [0, 1]) == {(topic, 0): 0, (topic, 1): 0}
        assert produce_txn(conn, tid, topic, 0, txn_batch(pid, 0, values=(b"a", b"b"))) == 0
        assert produce_txn(conn, tid, topic, 1, txn_batch(pid, 0)) != 0     # epoch 0 is older there
        assert end_txn(conn, tid, pid, 0, True) == 0
        # The marker on partition 1 is refused (INVALID_PRODUCER_EPOCH): moot; the transaction completes.
        wait_until(lambda: describe(server, tid)["transaction_state"] == "CompleteCommit", timeout=10,
                   what="the transaction to complete")
        # The id works for its next transaction.
        assert add_partitions(conn, tid, pid, 0, topic, [0]) == {(topic, 0): 0}
        assert produce_txn(conn, tid, topic, 0, txn_batch(pid, 0, seq=2, values=(b"c",))) == 0
        assert end_txn(conn, tid, pid, 0, True) == 0
        wait_until(lambda: lso(conn, topic, 0) == 5, timeout=10, what="the second commit's marker")
        time.sleep(QUIET_S)
    got, _ = read_confluent(server.bootstrap, [(topic, 0), (topic, 1)], "read_committed")
    assert {tp: len(v) for tp, v in got.items()} == {(topic, 0): 3}
    lines = log_lines(server, tid)
    assert len(lines) == 1 and "moot" in lines[0], lines
    assert not retry_lines(server)


@pytest.mark.server_config(STATUS)
def test_marker_fenced_by_a_newer_coordinator_epoch_is_stuck_until_completed(server):
    with RawConn(server.bootstrap) as conn:
        topic = unique("fenced")
        create_topic(conn, topic, partitions=2)
        pid = next_producer_id(conn)
        # The partition sees coordinator epoch 5 for this producer id before the producer exists.
        assert markers(conn, pid, 0, topic, 1, coordinator_epoch=5) == 0
        tid = unique("tx-stuck")
        assert init(conn, tid) == (0, pid, 0)
        assert add_partitions(conn, tid, pid, 0, topic, [0, 1]) == {(topic, 0): 0, (topic, 1): 0}
        for partition in (0, 1):
            assert produce_txn(conn, tid, topic, partition, txn_batch(pid, 0, values=(b"a", b"b"))) == 0
        assert end_txn(conn, tid, pid, 0, True) == 0
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
