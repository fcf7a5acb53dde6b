"""Transactions with kafkajs 2.2.4 against a real Trireme process (through
compat_tests/js/harness.js).

kafkajs speaks the old transaction API versions (InitProducerId v0-1,
AddPartitionsToTxn / AddOffsetsToTxn / EndTxn v0-1): a fenced producer must
get INVALID_PRODUCER_EPOCH, never PRODUCER_FENCED (error 90, which kafkajs
does not know).  It has no initTransactions(): the transactional
InitProducerId goes out with a producer's first transaction() (harness op
``begin_txn``).  Its read_committed consumer (the harness' fetch mode: kafkajs'
Fetch + Batch classes) drops aborted records using the Fetch response's
aborted-transaction list, and control records.

* ``test_commit_and_abort_across_partitions``: one transactional producer
  runs six transactions (three committed, three aborted) over 3 topics x 2
  partitions, every record keyed by (transaction, topic, partition, index);
  acknowledged offsets are dense per transaction, with one offset per marker;
  read_committed from the beginning to the end offsets returns exactly the
  committed records in offset order, read_uncommitted every appended record;
  both end at the high watermark (past the trailing markers); ListOffsets
  latest read_committed (the LSO) equals the high watermark.
* ``test_zombie_fencing``: producers A, B, C share one transactional.id.  A
  has records in an open transaction when B's first transaction() re-inits
  the id: A's next send fails with INVALID_PRODUCER_EPOCH (Produce) and is not
  appended, A's commit fails with INVALID_PRODUCER_EPOCH (EndTxn v<2).  B's
  open transaction is fenced by C the same way (B's commit fails).  C commits;
  read_committed sees only C's records; read_uncommitted also A's and B's
  first records (aborted by the coordinator) but not A's fenced send.
* ``test_timed_out_transaction_is_aborted``: a producer with
  transactionTimeout 5000 ms leaves a transaction open and idles.  While it
  is open the LSO stays at the transaction's first offset; after the timeout
  (broker abort-cleanup interval 500 ms) the coordinator aborts it:
  read_committed reads to the end seeing none of its records, the idle
  producer's commit fails with INVALID_PRODUCER_EPOCH, and a later
  transaction with the same transactional id is visible.

(consume-transform-produce with sendOffsets is covered with the Java client
in test_transactions_java.py.)
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

BIG = 1_000_000
RC = {"isolation.level": "read_committed"}
RU = {"isolation.level": "read_uncommitted"}


# ------------------------------------------------------------------ fixtures

@pytest.fixture(scope="module")
def js_pool(module_server) -> Iterator[dict[str, clients.HarnessProcess]]:
    yield from harness_pool()


@pytest.fixture
def js(request, js_pool, module_server) -> Iterator[clients.HarnessProcess]:
    clients.require_kafkajs()
    yield from pooled_harness(request, js_pool, "kafkajs",
                              lambda: clients.kafkajs_harness(module_server.bootstrap),
                              module_server, server_lines=80)


# ------------------------------------------------------------------- helpers

def uid() -> str:
    return uuid.uuid4().hex[:8]


def txn_config(tid: str, **extra) -> dict:
    return {"transactional.id": tid, "enable.idempotence": True, "acks": "all", **extra}


def keyed(txn: str, topic: str, p: int, n: int) -> list[dict]:
    return [clients.record(f"{txn} {topic}/{p} record {i}", key=f"{txn}/{topic}/{p}/{i}", partition=p)
            for i in range(n)]


def rows(records: list[dict]) -> list[tuple]:
    out = []
    for r in records:
        d = clients.decoded(r)
        out.append((r["partition"], r["offset"], d["key"], d["value"]))
    return out


def produce_in_txn(h: clients.HarnessProcess, handle: str, topic: str, recs: list[dict]) -> list[tuple]:
    r = h.call("produce", topic=topic, records=recs, handle=handle)
    assert r["ok"], f"produce in transaction failed: {r}\n{h.stderr_tail(30)}"
    return [(p, o, clients.unb64(x["key_b64"]), clients.unb64(x["value_b64"]))
            for (p, o), x in zip(r["offsets"], recs)]


def read_to_end(h: clients.HarnessProcess, topic: str, partitions: list[int], config: dict) -> dict:
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
    last: list = [None]

    def ok() -> bool:
        last[0] = end_offsets(h, topic, sorted(expected), "read_committed")
        return last[0] == expected
    try:
        clients.wait_until(ok, timeout=timeout, interval=0.1, what=f"LSO of {topic} to reach {expected}")
    except AssertionError as e:
        raise AssertionError(f"{e}; last read_committed end offsets {last[0]}") from None


def epoch_error(res: dict) -> bool:
    return res["ok"] is False and res.get("error_type") == "INVALID_PRODUCER_EPOCH"


def close_producers(h: clients.HarnessProcess, *handles: str) -> None:
    for handle in handles:
        h.call("close_producer", handle=handle)


# --------------------------------------------------------------------- tests

ALL6 = [(t, p) for t in range(3) for p in range(2)]
PLAN = [
    ("commit", {tp: 3 for tp in ALL6}),
    ("abort", {tp: 2 for tp in ALL6}),
    ("commit", {(0, 0): 2, (1, 1): 2, (2, 0): 1, (2, 1): 4}),
    ("abort", {(0, 0): 3, (0, 1): 3, (1, 0): 1}),
    ("commit", {tp: 1 for tp in ALL6}),
    ("abort", {(1, 1): 2, (2, 1): 2, (0, 1): 1}),
]


def test_commit_and_abort_across_partitions(js):
    t0 = time.monotonic()
    u = uid()
    topics = [f"js-txn-mix-{u}-{x}" for x in "abc"]
    for t in topics:
        js.ok("create_topic", topic=t, partitions=2)
    handle = f"mix-{u}"
    committed = {(t, p): [] for t in topics for p in range(2)}
    appended = {(t, p): [] for t in topics for p in range(2)}
    hw = {(t, p): 0 for t in topics for p in range(2)}
    js.ok("init_producer", handle=handle, config=txn_config(f"js-mix-{u}"))
    try:
        for n, (outcome, spread) in enumerate(PLAN):
            txn = f"t{n}-{outcome}"
            js.ok("begin_txn", handle=handle)
            for ti, topic in enumerate(topics):
                recs = [r for p in range(2) for r in keyed(txn, topic, p, spread.get((ti, p), 0))]
                if not recs:
                    continue
                got = produce_in_txn(js, handle, topic, recs)
                for p in range(2):
                    part = [g for g in got if g[0] == p]
                    assert [g[1] for g in part] == list(range(hw[(topic, p)], hw[(topic, p)] + len(part))), \
                        (txn, topic, p, part, hw)
                    appended[(topic, p)] += part
                    if outcome == "commit":
                        committed[(topic, p)] += part
            js.ok(f"{outcome}_txn", handle=handle)
            for (ti, p), cnt in spread.items():
                if cnt:
                    hw[(topics[ti], p)] += cnt + 1
    finally:
        close_producers(js, handle)

    for t in topics:
        want = {p: hw[(t, p)] for p in range(2)}
        wait_lso(js, t, want)
        assert end_offsets(js, t, [0, 1], "read_uncommitted") == want

        rc = read_to_end(js, t, [0, 1], RC)
        assert rc["end_offsets"] == [[p, hw[(t, p)]] for p in range(2)]
        assert rc["position"] == [[p, hw[(t, p)]] for p in range(2)], "read_committed did not pass the markers"
        got = rows(rc["records"])
        for p in range(2):
            assert [g for g in got if g[0] == p] == committed[(t, p)], f"read_committed {t}-{p}"
        assert len(got) == sum(len(committed[(t, p)]) for p in range(2))
        assert all(k.split(b"/")[0].endswith(b"-commit") for _, _, k, _ in got)

        ru = read_to_end(js, t, [0, 1], RU)
        assert ru["position"] == [[p, hw[(t, p)]] for p in range(2)]
        got = rows(ru["records"])
        for p in range(2):
            assert [g for g in got if g[0] == p] == appended[(t, p)], f"read_uncommitted {t}-{p}"
        assert len(got) == sum(len(appended[(t, p)]) for p in range(2))
    assert time.monotonic() - t0 < 30


def test_zombie_fencing(js):
    u = uid()
    topic = f"js-txn-zombie-{u}"
    js.ok("create_topic", topic=topic, partitions=1)
    tid = f"js-zombie-{u}"
    a, b, c = (f"zombie-{x}-{u}" for x in "abc")
    try:
        for handle in (a, b, c):
            js.ok("init_producer", handle=handle, config=txn_config(tid))
        js.ok("begin_txn", handle=a)
        a_first = produce_in_txn(js, a, topic, keyed("A", topic, 0, 3))
        assert [o for _, o, _, _ in a_first] == [0, 1, 2]

        js.ok("begin_txn", handle=b)        # B's InitProducerId: A's transaction is aborted
        late = js.call("produce", topic=topic, records=keyed("A-late", topic, 0, 2), handle=a)
        assert epoch_error(late) and late["offsets"] == [None, None], late
        commit_a = js.call("commit_txn", handle=a)
        assert epoch_error(commit_a), commit_a

        b_first = produce_in_txn(js, b, topic, keyed("B", topic, 0, 2))
        assert [o for _, o, _, _ in b_first] == [4, 5]      # after A's records and abort marker
        js.ok("begin_txn", handle=c)        # C's InitProducerId: B's transaction is aborted
        commit_b = js.call("commit_txn", handle=b)
        assert epoch_error(commit_b), commit_b

        c_recs = produce_in_txn(js, c, topic, keyed("C", topic, 0, 3))
        assert [o for _, o, _, _ in c_recs] == [7, 8, 9]
        js.ok("commit_txn", handle=c)
    finally:
        close_producers(js, a, b, c)

    wait_lso(js, topic, {0: 11})
    rc = read_to_end(js, topic, [0], RC)
    assert rows(rc["records"]) == c_recs
    assert rc["position"] == 11
    ru = read_to_end(js, topic, [0], RU)
    assert rows(ru["records"]) == a_first + b_first + c_recs
    assert ru["position"] == 11


def test_timed_out_transaction_is_aborted(js):
    u = uid()
    topic = f"js-txn-timeout-{u}"
    js.ok("create_topic", topic=topic, partitions=2)
    tid = f"js-timeout-{u}"
    z, later = f"timeout-z-{u}", f"timeout-later-{u}"
    try:
        js.ok("init_producer", handle=z, config=txn_config(tid, **{"transaction.timeout.ms": 5000}))
        t_begin = time.monotonic()
        js.ok("begin_txn", handle=z)
        open_recs = produce_in_txn(js, z, topic, keyed("Z", topic, 0, 3) + keyed("Z", topic, 1, 2))
        assert end_offsets(js, topic, [0, 1], "read_uncommitted") == {0: 3, 1: 2}
        assert end_offsets(js, topic, [0, 1], "read_committed") == {0: 0, 1: 0}
        wait_lso(js, topic, {0: 4, 1: 3}, timeout=25)
        took = time.monotonic() - t_begin
        assert took >= 4.9, f"the transaction was aborted after {took:.2f}s, before its 5 s timeout"

        rc = read_to_end(js, topic, [0, 1], RC)
        assert rc["records"] == [] and rc["position"] == [[0, 4], [1, 3]], rc
        ru = read_to_end(js, topic, [0, 1], RU)
        assert sorted(rows(ru["records"])) == sorted(open_recs)
        assert ru["position"] == [[0, 4], [1, 3]]

        late = js.call("commit_txn", handle=z)
        assert epoch_error(late), late

        js.ok("init_producer", handle=later, config=txn_config(tid))
        js.ok("begin_txn", handle=later)
        new = produce_in_txn(js, later, topic, keyed("L", topic, 0, 2) + keyed("L", topic, 1, 1))
        assert [(p, o) for p, o, _, _ in new] == [(0, 4), (0, 5), (1, 3)]
        js.ok("commit_txn", handle=later)
    finally:
        close_producers(js, z, later)

    wait_lso(js, topic, {0: 7, 1: 5})
    rc = read_to_end(js, topic, [0, 1], RC)
    assert sorted(rows(rc["records"])) == sorted(new)
    assert rc["position"] == [[0, 7], [1, 5]]
