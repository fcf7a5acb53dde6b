"""Transactions (classic protocol, transactions V1) with the stock Apache Kafka
Java client 3.9.0 and 4.3.0 against a real Trireme process.

Trireme does not advertise the ``transaction.version`` feature, so the 4.3
client also runs transactions V1 (InitProducerId per producer session,
AddPartitionsToTxn / AddOffsetsToTxn, EndTxn below v5).

* ``test_commit_and_abort_across_partitions``: one transactional producer
  runs six transactions (three committed, three aborted) over 3 topics x 2
  partitions, every record keyed by (transaction, topic, partition, index).
  The acknowledged offsets are dense per transaction with exactly one offset
  per transaction marker; a read_committed consumer (assign + seek to the
  beginning, read to the end offsets) gets exactly the committed records in
  offset order and nothing else (no aborted records, no control records), a
  read_uncommitted consumer gets every appended record; both end at the high
  watermark, i.e. past the trailing markers; ListOffsets latest (LSO for
  read_committed) equals the high watermark once every transaction ended.
* ``test_zombie_fencing``: producers A, B, C share one transactional.id.
  A has records in an open transaction when B calls initTransactions(): A's
  next send fails with InvalidProducerEpochException (Produce with the old
  epoch -> INVALID_PRODUCER_EPOCH) and is not appended, A cannot commit, and
  A's abortTransaction() (EndTxn with the old epoch) fails with
  ProducerFencedException.  B's open transaction is then fenced by C: B's
  commitTransaction() fails with ProducerFencedException.  C commits; read_committed
  sees only C's records, read_uncommitted sees A's and B's first records too
  (both aborted by the coordinator) but not A's fenced send.
* ``test_timed_out_transaction_is_aborted``: a producer with
  transaction.timeout.ms=5000 leaves a transaction open (no commit, no abort,
  handle kept idle).  While it is open, ListOffsets read_committed (the LSO)
  stays at the transaction's first offset; after the timeout (the broker runs
  with a 500 ms abort-cleanup interval) the coordinator aborts it: the LSO
  reaches the high watermark, a read_committed consumer reads to the end
  without seeing any of its records, the idle producer's commit is fenced, and
  a later transaction with the same transactional.id is visible.
* ``test_consume_transform_produce``: a read_committed group consumer reads
  an input topic (itself written transactionally, with an aborted
  transaction in it), a transactional producer writes transformed records and
  sendOffsetsToTransaction(positions, consumer.groupMetadata()).  After the
  commit the group's committed offsets (consumer committed(), which requires
  stable offsets, and Admin listConsumerGroupOffsets) equal the consumer's
  positions; an aborted round leaves them unchanged; a new member of the
  group resumes from them, re-processes the aborted round's input and
  commits; the output topic read_committed holds every transformed record
  exactly once.

One broker (with a short abort-cleanup interval) and one harness process per
client version serve the whole module; every test uses its own topics,
transactional ids and handles.
"""
from __future__ import annotations

import time
import uuid
from typing import Iterator

import pytest

from compat_tests import clients
from compat_tests.harness_helpers import harness_pool, pooled_harness

pytestmark = pytest.mark.server_config({
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": 500,
})

BIG = 1_000_000                 # "count" for consume ... until_end
RC = {"isolation.level": "read_committed", "fetch.max.wait.ms": 50}
RU = {"isolation.level": "read_uncommitted", "fetch.max.wait.ms": 50}
# Fenced zombies: what the client raises (Produce answers INVALID_PRODUCER_EPOCH,
# the coordinator PRODUCER_FENCED).
FENCED = ("ProducerFencedException", "InvalidProducerEpochException")


# ------------------------------------------------------------------ fixtures

@pytest.fixture(scope="module")
def java_pool(module_server) -> Iterator[dict[str, clients.HarnessProcess]]:
    yield from harness_pool()


@pytest.fixture
def java(request, java_pool, module_server, java_version) -> Iterator[clients.HarnessProcess]:
    clients.require_java(java_version)
    yield from pooled_harness(request, java_pool, java_version,
                              lambda: clients.java_harness(java_version, module_server.bootstrap),
                              module_server, server_lines=80)


# ------------------------------------------------------------------- helpers

def uid() -> str:
    return uuid.uuid4().hex[:8]


def txn_config(tid: str, **extra) -> dict:
    return {"transactional.id": tid, "acks": "all", **extra}


def keyed(txn: str, topic: str, p: int, n: int) -> list[dict]:
    return [clients.record(f"{txn} {topic}/{p} record {i}", key=f"{txn}/{topic}/{p}/{i}", partition=p)
            for i in range(n)]


def rows(records: list[dict]) -> list[tuple]:
    """(partition, offset, key, value) of harness records."""
    out = []
    for r in records:
        d = clients.decoded(r)
        out.append((r["partition"], r["offset"], d["key"], d["value"]))
    return out


def produce_in_txn(h: clients.HarnessProcess, handle: str, topic: str, recs: list[dict]) -> list[tuple]:
    """Send through the kept producer's open transaction -> its (partition,
    offset, key, value) rows."""
    r = h.call("produce", topic=topic, records=recs, handle=handle)
    assert r["ok"], f"produce in transaction failed: {r}\n{h.stderr_tail(30)}"
    return [(p, o, clients.unb64(x["key_b64"]), clients.unb64(x["value_b64"]))
            for (p, o), x in zip(r["offsets"], recs)]


def read_to_end(h: clients.HarnessProcess, topic: str, partitions: list[int], config: dict) -> dict:
    """assign + seekToBeginning, read until every position reached the end
    offsets (the consumer's isolation level)."""
    r = h.consume(topic, partitions=partitions, offset="earliest", count=BIG, config=config,
                  timeout_ms=15_000, until_end=True)
    assert r["ok"], f"consume failed: {r}\n{h.stderr_tail(30)}"
    assert r["timed_out"] is False, f"{topic}: did not reach the end offsets {r.get('end_offsets')}: " \
                                    f"position {r['position']}"
    return r


def end_offsets(h: clients.HarnessProcess, topic: str, partitions: list[int], iso: str) -> dict[int, int]:
    r = h.ok("consumer_offsets", topic=topic, partitions=partitions, config={"isolation.level": iso})
    return {x["partition"]: x["end"] for x in r["offsets"]}


def wait_lso(h: clients.HarnessProcess, topic: str, expected: dict[int, int], timeout: float = 10) -> None:
    """Wait until the read_committed end offsets (LSO) equal ``expected`` (the
    markers of completed transactions are written after EndTxn returns)."""
    last: list = [None]

    def ok() -> bool:
        last[0] = end_offsets(h, topic, sorted(expected), "read_committed")
        return last[0] == expected
    try:
        clients.wait_until(ok, timeout=timeout, interval=0.1, what=f"LSO of {topic} to reach {expected}")
    except AssertionError as e:
        raise AssertionError(f"{e}; last read_committed end offsets {last[0]}") from None


def fenced(res: dict) -> bool:
    texts = [res.get("error") or ""] + list(res.get("causes") or [])
    return any(t.startswith(FENCED) for t in texts)


def close_producers(h: clients.HarnessProcess, *handles: str) -> None:
    for handle in handles:
        h.call("close_producer", handle=handle)


# --------------------------------------------------------------------- tests

# (outcome, {(topic index, partition): records}) - every transaction spans
# several topics; the last ones end some partitions with an abort marker.
ALL6 = [(t, p) for t in range(3) for p in range(2)]
PLAN = [
    ("commit", {tp: 3 for tp in ALL6}),
    ("abort", {tp: 2 for tp in ALL6}),
    ("commit", {(0, 0): 2, (1, 1): 2, (2, 0): 1, (2, 1): 4}),
    ("abort", {(0, 0): 3, (0, 1): 3, (1, 0): 1}),
    ("commit", {tp: 1 for tp in ALL6}),
    ("abort", {(1, 1): 2, (2, 1): 2, (0, 1): 1}),
]


def run_plan(h: clients.HarnessProcess, handle: str, topics: list[str]):
    """Run PLAN; check the acknowledged offsets; -> (committed rows, all rows,
    expected high watermark) per (topic, partition)."""
    committed: dict[tuple[str, int], list] = {(t, p): [] for t in topics for p in range(2)}
    appended: dict[tuple[str, int], list] = {(t, p): [] for t in topics for p in range(2)}
    hw = {(t, p): 0 for t in topics for p in range(2)}
    for n, (outcome, spread) in enumerate(PLAN):
        txn = f"t{n}-{outcome}"
        h.ok("begin_txn", handle=handle)
        for ti, topic in enumerate(topics):
            recs = [r for p in range(2) for r in keyed(txn, topic, p, spread.get((ti, p), 0))]
            if not recs:
                continue
            got = produce_in_txn(h, handle, topic, recs)
            for p in range(2):
                part = [g for g in got if g[0] == p]
                # records of one transaction are dense, right after the
                # previous transaction's marker
                assert [g[1] for g in part] == list(range(hw[(topic, p)], hw[(topic, p)] + len(part))), \
                    (txn, topic, p, part, hw)
                appended[(topic, p)] += part
                if outcome == "commit":
                    committed[(topic, p)] += part
        h.ok(f"{outcome}_txn", handle=handle)
        for (ti, p), cnt in spread.items():
            if cnt:
                hw[(topics[ti], p)] += cnt + 1      # the records + one marker
    return committed, appended, hw


def test_commit_and_abort_across_partitions(java, java_version):
    t0 = time.monotonic()
    u = uid()
    topics = [f"txn-mix-{java_version}-{u}-{x}" for x in "abc"]
    for t in topics:
        java.ok("create_topic", topic=t, partitions=2)
    handle = f"mix-{u}"
    java.ok("init_producer", handle=handle, config=txn_config(f"mix-{u}"))
    try:
        committed, appended, hw = run_plan(java, handle, topics)
    finally:
        close_producers(java, handle)

    for t in topics:
        want = {p: hw[(t, p)] for p in range(2)}
        wait_lso(java, t, want)
        assert end_offsets(java, t, [0, 1], "read_uncommitted") == want

        rc = read_to_end(java, t, [0, 1], RC)
        assert rc["end_offsets"] == [[p, hw[(t, p)]] for p in range(2)]
        assert rc["position"] == [[p, hw[(t, p)]] for p in range(2)], "read_committed did not pass the markers"
        got = rows(rc["records"])
        for p in range(2):
            assert [g for g in got if g[0] == p] == committed[(t, p)], f"read_committed {t}-{p}"
        assert len(got) == sum(len(committed[(t, p)]) for p in range(2))
        assert all(k.split(b"/")[0].endswith(b"-commit") for _, _, k, _ in got)

        ru = read_to_end(java, t, [0, 1], RU)
        assert ru["position"] == [[p, hw[(t, p)]] for p in range(2)]
        got = rows(ru["records"])
        for p in range(2):
            assert [g for g in got if g[0] == p] == appended[(t, p)], f"read_uncommitted {t}-{p}"
        assert len(got) == sum(len(appended[(t, p)]) for p in range(2))
    assert time.monotonic() - t0 < 30


def test_zombie_fencing(java, java_version):
    u = uid()
    topic = f"txn-zombie-{java_version}-{u}"
    java.ok("create_topic", topic=topic, partitions=1)
    tid = f"zombie-{u}"
    a, b, c = (f"zombie-{x}-{u}" for x in "abc")
    try:
        java.ok("init_producer", handle=a, config=txn_config(tid))
        java.ok("begin_txn", handle=a)
        a_first = produce_in_txn(java, a, topic, keyed("A", topic, 0, 3))
        assert [o for _, o, _, _ in a_first] == [0, 1, 2]

        # B takes over the transactional id: A's open transaction is aborted
        java.ok("init_producer", handle=b, config=txn_config(tid))
        late = java.call("produce", topic=topic, records=keyed("A-late", topic, 0, 2), handle=a)
        # Produce with the old epoch -> INVALID_PRODUCER_EPOCH (an abortable error) ...
        assert late["ok"] is False and late["offsets"] == [None, None], late
        assert late["error"].startswith("InvalidProducerEpochException"), late
        commit_a = java.call("commit_txn", handle=a)        # (rethrown by the client)
        assert commit_a["ok"] is False and fenced(commit_a), commit_a
        # ... and EndTxn with the old epoch -> PRODUCER_FENCED
        abort_a = java.call("abort_txn", handle=a)
        assert abort_a["ok"] is False and abort_a["error"].startswith("ProducerFencedException"), abort_a

        # B has records in an open transaction when C takes over: B's commit
        # (EndTxn with B's epoch) is fenced
        java.ok("begin_txn", handle=b)
        b_first = produce_in_txn(java, b, topic, keyed("B", topic, 0, 2))
        assert [o for _, o, _, _ in b_first] == [4, 5]      # after A's records and abort marker
        java.ok("init_producer", handle=c, config=txn_config(tid))
        commit_b = java.call("commit_txn", handle=b)
        assert commit_b["ok"] is False and commit_b["error"].startswith("ProducerFencedException"), commit_b

        java.ok("begin_txn", handle=c)
        c_recs = produce_in_txn(java, c, topic, keyed("C", topic, 0, 3))
        assert [o for _, o, _, _ in c_recs] == [7, 8, 9]
        java.ok("commit_txn", handle=c)
    finally:
        close_producers(java, a, b, c)

    wait_lso(java, topic, {0: 11})
    rc = read_to_end(java, topic, [0], RC)
    assert rows(rc["records"]) == c_recs
    assert rc["position"] == 11
    ru = read_to_end(java, topic, [0], RU)
    assert rows(ru["records"]) == a_first + b_first + c_recs     # A's late send was never appended
    assert ru["position"] == 11


def test_timed_out_transaction_is_aborted(java, java_version):
    u = uid()
    topic = f"txn-timeout-{java_version}-{u}"
    java.ok("create_topic", topic=topic, partitions=2)
    tid = f"timeout-{u}"
    z, later = f"timeout-z-{u}", f"timeout-later-{u}"
    try:
        java.ok("init_producer", handle=z, config=txn_config(tid, **{"transaction.timeout.ms": 5000}))
        t_begin = time.monotonic()
        java.ok("begin_txn", handle=z)
        open_recs = produce_in_txn(java, z, topic, keyed("Z", topic, 0, 3) + keyed("Z", topic, 1, 2))
        # open: the LSO stays at the transaction's first offset
        assert end_offsets(java, topic, [0, 1], "read_uncommitted") == {0: 3, 1: 2}
        assert end_offsets(java, topic, [0, 1], "read_committed") == {0: 0, 1: 0}
        # ... and then the producer does nothing at all
        wait_lso(java, topic, {0: 4, 1: 3}, timeout=25)
        took = time.monotonic() - t_begin
        assert took >= 4.9, f"the transaction was aborted after {took:.2f}s, before its 5 s timeout"

        rc = read_to_end(java, topic, [0, 1], RC)
        assert rc["records"] == [] and rc["position"] == [[0, 4], [1, 3]], rc
        ru = read_to_end(java, topic, [0, 1], RU)
        assert sorted(rows(ru["records"])) == sorted(open_recs)
        assert ru["position"] == [[0, 4], [1, 3]]

        # the coordinator bumped the epoch when it aborted: the idle producer is a zombie
        late = java.call("commit_txn", handle=z)
        assert late["ok"] is False and late["error"].startswith("ProducerFencedException"), late

        java.ok("init_producer", handle=later, config=txn_config(tid))
        java.ok("begin_txn", handle=later)
        new = produce_in_txn(java, later, topic, keyed("L", topic, 0, 2) + keyed("L", topic, 1, 1))
        assert [(p, o) for p, o, _, _ in new] == [(0, 4), (0, 5), (1, 3)]
        java.ok("commit_txn", handle=later)
    finally:
        close_producers(java, z, later)

    wait_lso(java, topic, {0: 7, 1: 5})
    rc = read_to_end(java, topic, [0, 1], RC)
    assert sorted(rows(rc["records"])) == sorted(new)
    assert rc["position"] == [[0, 7], [1, 5]]


def test_consume_transform_produce(java, java_version):
    u = uid()
    src, dst = f"ctp-in-{java_version}-{u}", f"ctp-out-{java_version}-{u}"
    group = f"ctp-group-{u}"
    for t in (src, dst):
        java.ok("create_topic", topic=t, partitions=2)
    feeder, proc = f"ctp-feed-{u}", f"ctp-proc-{u}"
    c1, c2 = f"ctp-c1-{u}", f"ctp-c2-{u}"
    consumer_cfg = {"isolation.level": "read_committed", "fetch.max.wait.ms": 100,
                    "session.timeout.ms": 6000, "heartbeat.interval.ms": 500}
    open_consumers: list[str] = []

    def feed(tag: str, n: int, outcome: str) -> list[tuple]:
        java.ok("begin_txn", handle=feeder)
        got = produce_in_txn(java, feeder, src, keyed(tag, src, 0, n) + keyed(tag, src, 1, n))
        java.ok(f"{outcome}_txn", handle=feeder)
        return got

    def poll_n(handle: str, n: int) -> list[tuple]:
        out: list[dict] = []
        deadline = time.monotonic() + 20
        while len(out) < n and time.monotonic() < deadline:
            out += java.ok("poll", handle=handle, timeout_ms=1000, max=n - len(out))["records"]
        assert len(out) == n, f"{handle}: polled {len(out)} of {n} records"
        return rows(out)

    def transform(consumed: list[tuple]) -> list[dict]:
        return [clients.record(b"OUT " + v, key=k, partition=p) for p, _, k, v in consumed]

    def positions(handle: str) -> list[list]:
        return [[t, p, o] for t, p, o in java.ok("positions", handle=handle)["positions"]]

    def committed(handle: str) -> list[list]:
        r = java.ok("committed", handle=handle, topic=src, partitions=[0, 1])["committed"]
        return [[src, p, o] for p, o, _ in r]

    def admin_offsets() -> list[list]:
        return [[t, p, o] for t, p, o, _ in java.ok("group_offsets", group=group)["offsets"]]

    try:
        java.ok("init_producer", handle=feeder, config=txn_config(f"ctp-feed-{u}"))
        java.ok("init_producer", handle=proc, config=txn_config(f"ctp-proc-{u}"))
        round1 = feed("in1", 5, "commit")
        java.ok("subscribe", topic=src, group=group, config=consumer_cfg, handle=c1)
        open_consumers.append(c1)
        # round 1: committed
        consumed = poll_n(c1, 10)
        assert sorted(consumed) == sorted(round1)
        java.ok("begin_txn", handle=proc)
        out1 = produce_in_txn(java, proc, dst, transform(consumed))
        pos1 = positions(c1)
        assert [x[:2] for x in pos1] == [[src, 0], [src, 1]] and all(x[2] >= 5 for x in pos1), pos1
        sent = java.ok("send_offsets_to_txn", handle=proc, consumer=c1)
        assert sent["offsets"] == pos1 and sent["group"] == group
        assert sent["generation_id"] >= 1 and sent["member_id"], sent
        java.ok("commit_txn", handle=proc)
        assert committed(c1) == pos1
        clients.wait_until(lambda: admin_offsets() == pos1, timeout=10, what="admin offsets == positions")

        # round 2 (its input comes after an aborted input transaction): aborted
        # - the committed offsets stay where round 1 left them
        feed("in-aborted", 2, "abort")
        round2 = feed("in2", 3, "commit")
        consumed2 = poll_n(c1, 6)
        assert sorted(consumed2) == sorted(round2)
        java.ok("begin_txn", handle=proc)
        produce_in_txn(java, proc, dst, transform(consumed2))
        pos2 = positions(c1)
        assert all(b[2] > a[2] for a, b in zip(pos1, pos2)), (pos1, pos2)
        assert java.ok("send_offsets_to_txn", handle=proc, consumer=c1)["offsets"] == pos2
        java.ok("abort_txn", handle=proc)
        assert committed(c1) == pos1
        assert admin_offsets() == pos1

        # a new member resumes from the committed offsets and redoes round 2
        java.ok("close_consumer", handle=c1)
        open_consumers.remove(c1)
        java.ok("subscribe", topic=src, group=group, config=consumer_cfg, handle=c2)
        open_consumers.append(c2)
        redo = poll_n(c2, 6)
        assert sorted(redo) == sorted(round2)
        java.ok("begin_txn", handle=proc)
        out2 = produce_in_txn(java, proc, dst, transform(redo))
        pos3 = positions(c2)
        # past the last record of round 2, at most past its commit marker (the
        # Java consumer skips a control batch on the poll after the records)
        last = {p: max(o for q, o, _, _ in round2 if q == p) for p in range(2)}
        assert all(last[p] + 1 <= o <= last[p] + 2 for _, p, o in pos3), (pos3, last)
        java.ok("send_offsets_to_txn", handle=proc, consumer=c2)
        java.ok("commit_txn", handle=proc)
        assert committed(c2) == pos3
        clients.wait_until(lambda: admin_offsets() == pos3, timeout=10, what="admin offsets == positions")
    finally:
        for h in open_consumers:
            java.call("close_consumer", handle=h)
        close_producers(java, feeder, proc)

    # the output holds every input record transformed exactly once
    hw = {}
    for p in range(2):
        hw[p] = max(o for q, o, _, _ in out1 + out2 if q == p) + 2     # + the commit marker
    wait_lso(java, dst, hw)
    rc = read_to_end(java, dst, [0, 1], RC)
    got = rows(rc["records"])
    for p in range(2):
        assert [g for g in got if g[0] == p] == sorted(x for x in out1 + out2 if x[0] == p)
    assert len(got) == len(out1 + out2)
    assert sorted((k, v) for _, _, k, v in got) == sorted((k, b"OUT " + v) for _, _, k, v in round1 + round2)
    assert rc["position"] == [[p, hw[p]] for p in range(2)]
