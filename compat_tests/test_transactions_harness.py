"""Transactions with the harness-driven stock clients against a real Trireme
process: the Apache Kafka Java client 3.9.0 and 4.3.0
(compat_tests/java/Harness.java) and kafkajs 2.2.4
(compat_tests/js/harness.js).  Both harnesses speak the same command
protocol; each test runs once per client kind (ids ``java-3.9.0``,
``java-4.3.0``, ``kafkajs``) and what the clients do differently is data, a
``Kind`` each:

* Java: the broker runs at its default ``transaction.version`` 2, so the 4.3
  client runs transactions V2 (KIP-890 part 2: EndTxn v5 bumps the epoch of
  every transaction, Produce v12 / TxnOffsetCommit v5 add partitions, no
  AddPartitionsToTxn / AddOffsetsToTxn); 3.9 stays on the classic protocol
  (InitProducerId per producer session, AddPartitionsToTxn / AddOffsetsToTxn,
  EndTxn below v5).  ``Kind.transactions_v2`` says which, and
  test_commit_and_abort_across_partitions checks it by the producer epoch
  DescribeTransactions reports after six transactions.
  compat_tests/test_transactions_levels.py runs these tests for 4.3 at level 1.
  ``init_producer`` is initTransactions() (the InitProducerId).  A fenced
  producer raises InvalidProducerEpochException (Produce with the old epoch
  -> INVALID_PRODUCER_EPOCH) or ProducerFencedException (the coordinator's
  PRODUCER_FENCED).  Its consumers get ``fetch.max.wait.ms`` 50.
* kafkajs speaks the old transaction API versions (InitProducerId v0-1,
  AddPartitionsToTxn / AddOffsetsToTxn / EndTxn v0-1): a fenced producer
  must get INVALID_PRODUCER_EPOCH, never PRODUCER_FENCED (error 90, which
  kafkajs does not know).  It has no initTransactions(): the transactional
  InitProducerId goes out with a producer's first transaction() (harness op
  ``begin_txn``).  Its read_committed consumer (the harness' fetch mode:
  kafkajs' Fetch + Batch classes) drops aborted records using the Fetch
  response's aborted-transaction list, and control records.

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
  A has records in an open transaction when B's InitProducerId re-inits the
  id: A's next send fails (Java: InvalidProducerEpochException; kafkajs:
  INVALID_PRODUCER_EPOCH) and is not appended, A cannot commit (Java: fenced,
  possibly as a cause; kafkajs: INVALID_PRODUCER_EPOCH from EndTxn v<2), and
  (Java) A's abortTransaction() (EndTxn with the old epoch) fails with
  ProducerFencedException.  B's open transaction is then fenced by C: B's
  commit fails (Java: ProducerFencedException; kafkajs:
  INVALID_PRODUCER_EPOCH).  C commits; read_committed sees only C's records,
  read_uncommitted sees A's and B's first records too (both aborted by the
  coordinator) but not A's fenced send.
* ``test_timed_out_transaction_is_aborted``: a producer with
  transaction.timeout.ms=5000 leaves a transaction open (no commit, no abort,
  handle kept idle).  While it is open, ListOffsets read_committed (the LSO)
  stays at the transaction's first offset; after the timeout (the broker runs
  with a 500 ms abort-cleanup interval) the coordinator aborts it: the LSO
  reaches the high watermark, a read_committed consumer reads to the end
  without seeing any of its records, the idle producer's commit is fenced
  (as in B's commit above), and a later transaction with the same
  transactional.id is visible.
* ``test_consume_transform_produce`` (Java only: the kafkajs harness has no
  ``send_offsets_to_txn`` nor ``positions``): a read_committed group consumer reads an input
  topic (itself written transactionally, with an aborted transaction in it),
  a transactional producer writes transformed records and
  sendOffsetsToTransaction(positions, consumer.groupMetadata()).  After the
  commit the group's committed offsets (consumer committed(), which requires
  stable offsets, and Admin listConsumerGroupOffsets) equal the consumer's
  positions; an aborted round leaves them unchanged; a new member of the
  group resumes from them, re-processes the aborted round's input and
  commits; the output topic read_committed holds every transformed record
  exactly once.

* ``test_kip664_tooling_with_java_admin`` (Java): listTransactions,
  describeTransactions, describeProducers of an open transaction, find-hanging
  (listTransactions + describeProducers, as kafka-transactions.sh) finds
  nothing, and the Admin's abortTransaction (WriteTxnMarkers with the epochs
  DescribeProducers gave) releases the last stable offset.
* ``test_find_hanging_and_abort_with_java_admin``: a transaction whose
  coordinator state was lost (``__transaction_state`` removed while the broker
  was down) hangs; find-hanging reports it and the Admin abort clears it.
* ``test_back_to_back_commit_and_abort_java4`` (Java 4.3, transactions V2): rounds of a commit
  followed at once by an abort whose one record the client drops unsent (so its EndTxn(abort)
  goes out with nothing open, milliseconds after the commit returned, while the commit's markers
  are still being written), with the markers held 300 ms and without: no round fails (Kafka
  answers CONCURRENT_TRANSACTIONS there and the retry bumps the epoch: KAFKA-18464), every
  transaction ends with an epoch bump, and read_committed sees exactly the committed records.

One broker (with a short abort-cleanup interval) and one harness process per
client kind serve the whole module; every test uses its own topics,
transactional ids and handles.
"""
from __future__ import annotations

import shutil
import time
import uuid
from dataclasses import dataclass, field
from functools import partial
from typing import Callable, Iterator

import pytest

from compat_tests import clients
from compat_tests.harness_helpers import harness_pool, pooled_harness
from compat_tests.python_clients import describe_transaction

pytestmark = pytest.mark.server_config({
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": 500,
})

BIG = 1_000_000                 # "count" for consume ... until_end


# ------------------------------------------------------------ client kinds

@dataclass(frozen=True)
class Failure:
    """How a harness reports a failed call: the response's ``field`` (Java:
    ``error``, "ExceptionClass: message"; kafkajs: ``error_type``, the Kafka
    error code name) names one of ``names``; with ``causes`` a cause of the
    exception may name it instead (Java's ``causes`` list)."""
    field: str
    names: tuple[str, ...]
    causes: bool = False

    def matches(self, res: dict) -> bool:
        texts = [res.get(self.field) or ""] + (list(res.get("causes") or []) if self.causes else [])
        return res["ok"] is False and any(t == n or t.startswith(n + ":") for t in texts for n in self.names)


@dataclass(frozen=True)
class Kind:
    """One harness-driven client and what it does differently."""
    id: str                                         # the test id
    require: Callable[[], None]                     # fails the test if the client is missing
    start: Callable[[str], clients.HarnessProcess]  # bootstrap -> harness process
    # InitProducerId goes out with the first begin_txn, not with init_producer
    init_on_begin: bool
    # a fenced producer's send (Produce with the old epoch)
    fenced_send: Failure
    # its commit after that send failed
    fenced_commit_after_send: Failure
    # its abort after that commit failed (None: not tried)
    fenced_abort: Failure | None
    # EndTxn (commit) with an epoch the coordinator bumped (another producer
    # took over the id, or the coordinator aborted a timed-out transaction)
    fenced_end_txn: Failure
    # added to every transactional producer's config
    producer_config: dict = field(default_factory=dict)
    # ends every transaction with an epoch bump (transactions V2)
    transactions_v2: bool = False
    # added to the isolation level of every assign/read-to-end consumer
    consumer_config: dict = field(default_factory=dict)

    def txn_config(self, tid: str, **extra) -> dict:
        return {"transactional.id": tid, **self.producer_config, "acks": "all", **extra}

    def consumer(self, isolation: str) -> dict:
        return {"isolation.level": isolation, **self.consumer_config}


def java_kind(version: str, transactions_v2: bool | None = None) -> Kind:
    """The Java client; it runs transactions V2 from 4.x when the broker's transaction.version is 2 (the default)."""
    return Kind(
        id=f"java-{version}",
        transactions_v2=version.split(".")[0] >= "4" if transactions_v2 is None else transactions_v2,
        require=partial(clients.require_java, version),
        start=partial(clients.java_harness, version),
        consumer_config={"fetch.max.wait.ms": 50},
        init_on_begin=False,
        fenced_send=Failure("error", ("InvalidProducerEpochException",)),
        # (the send's error, rethrown by the client)
        fenced_commit_after_send=Failure("error", ("ProducerFencedException", "InvalidProducerEpochException"),
                                         causes=True),
        fenced_abort=Failure("error", ("ProducerFencedException",)),
        fenced_end_txn=Failure("error", ("ProducerFencedException",)),
    )


# kafkajs knows no PRODUCER_FENCED: every fenced call gets INVALID_PRODUCER_EPOCH
EPOCH = Failure("error_type", ("INVALID_PRODUCER_EPOCH",))
KAFKAJS = Kind(
    id="kafkajs",
    require=clients.require_kafkajs,
    start=clients.kafkajs_harness,
    producer_config={"enable.idempotence": True},
    init_on_begin=True,
    fenced_send=EPOCH,
    fenced_commit_after_send=EPOCH,
    # not tried: after the failed commit kafkajs refuses the abort itself
    # ("Cannot continue to use transaction once ended"), no EndTxn goes out
    fenced_abort=None,
    fenced_end_txn=EPOCH,
)
JAVA_KINDS = [java_kind(v) for v in clients.JAVA_VERSIONS]


def params(kinds: list[Kind]) -> list:
    return [pytest.param(k, id=k.id) for k in kinds]


# ------------------------------------------------------------------ fixtures

@pytest.fixture(scope="module")
def harness_procs(module_server) -> Iterator[dict[str, clients.HarnessProcess]]:
    yield from harness_pool()


@pytest.fixture(params=params(JAVA_KINDS + [KAFKAJS]))
def kind(request) -> Kind:
    return request.param


@pytest.fixture
def h(request, harness_procs, module_server, kind) -> Iterator[clients.HarnessProcess]:
    kind.require()
    yield from pooled_harness(request, harness_procs, kind.id, lambda: kind.start(module_server.bootstrap),
                              module_server, server_lines=80)


# ------------------------------------------------------------------- helpers

def uid() -> str:
    return uuid.uuid4().hex[:8]


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


def read_to_end(h: clients.HarnessProcess, kind: Kind, topic: str, partitions: list[int],
                isolation: str) -> dict:
    """assign + seekToBeginning, read until every position reached the end
    offsets (the consumer's isolation level)."""
    r = h.consume(topic, partitions=partitions, offset="earliest", count=BIG, config=kind.consumer(isolation),
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


def take_over(h: clients.HarnessProcess, kind: Kind, handle: str, tid: str) -> None:
    """A new producer for ``tid`` up to its InitProducerId, which bumps the
    epoch: the id's previous producer is fenced and its open transaction
    aborted.  Java: init_producer (initTransactions()); kafkajs: init_producer
    and its first begin_txn (transaction())."""
    h.ok("init_producer", handle=handle, config=kind.txn_config(tid))
    if kind.init_on_begin:
        h.ok("begin_txn", handle=handle)


def begin_after_take_over(h: clients.HarnessProcess, kind: Kind, handle: str) -> None:
    """begin_txn, unless ``take_over`` already did."""
    if not kind.init_on_begin:
        h.ok("begin_txn", handle=handle)


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


def test_commit_and_abort_across_partitions(h, kind):
    u = uid()
    topics = [f"txn-mix-{kind.id}-{u}-{x}" for x in "abc"]
    for t in topics:
        h.ok("create_topic", topic=t, partitions=2)
    handle = f"mix-{u}"
    tid = f"mix-{kind.id}-{u}"
    h.ok("init_producer", handle=handle, config=kind.txn_config(tid))
    try:
        committed, appended, hw = run_plan(h, handle, topics)
    finally:
        close_producers(h, handle)
    # Transactions V2 bumps the epoch with each EndTxn; the classic protocol keeps the one InitProducerId gave.
    assert describe_transaction(h.bootstrap, tid).producer_epoch == (len(PLAN) if kind.transactions_v2 else 0)

    for t in topics:
        want = {p: hw[(t, p)] for p in range(2)}
        wait_lso(h, t, want)
        assert end_offsets(h, t, [0, 1], "read_uncommitted") == want

        rc = read_to_end(h, kind, t, [0, 1], "read_committed")
        assert rc["end_offsets"] == [[p, hw[(t, p)]] for p in range(2)]
        assert rc["position"] == [[p, hw[(t, p)]] for p in range(2)], "read_committed did not pass the markers"
        got = rows(rc["records"])
        for p in range(2):
            assert [g for g in got if g[0] == p] == committed[(t, p)], f"read_committed {t}-{p}"
        assert len(got) == sum(len(committed[(t, p)]) for p in range(2))
        assert all(k.split(b"/")[0].endswith(b"-commit") for _, _, k, _ in got)

        ru = read_to_end(h, kind, t, [0, 1], "read_uncommitted")
        assert ru["position"] == [[p, hw[(t, p)]] for p in range(2)]
        got = rows(ru["records"])
        for p in range(2):
            assert [g for g in got if g[0] == p] == appended[(t, p)], f"read_uncommitted {t}-{p}"
        assert len(got) == sum(len(appended[(t, p)]) for p in range(2))


def test_zombie_fencing(h, kind):
    u = uid()
    topic = f"txn-zombie-{kind.id}-{u}"
    h.ok("create_topic", topic=topic, partitions=1)
    tid = f"zombie-{kind.id}-{u}"
    a, b, c = (f"zombie-{x}-{u}" for x in "abc")
    try:
        take_over(h, kind, a, tid)
        begin_after_take_over(h, kind, a)
        a_first = produce_in_txn(h, a, topic, keyed("A", topic, 0, 3))
        assert [o for _, o, _, _ in a_first] == [0, 1, 2]

        # B takes over the transactional id: A's open transaction is aborted
        take_over(h, kind, b, tid)
        late = h.call("produce", topic=topic, records=keyed("A-late", topic, 0, 2), handle=a)
        # Produce with the old epoch -> INVALID_PRODUCER_EPOCH, nothing appended ...
        assert late["ok"] is False and late["offsets"] == [None, None], late
        assert kind.fenced_send.matches(late), late
        commit_a = h.call("commit_txn", handle=a)
        assert commit_a["ok"] is False and kind.fenced_commit_after_send.matches(commit_a), commit_a
        # ... and EndTxn with the old epoch -> PRODUCER_FENCED
        if kind.fenced_abort is not None:
            abort_a = h.call("abort_txn", handle=a)
            assert abort_a["ok"] is False and kind.fenced_abort.matches(abort_a), abort_a

        # B has records in an open transaction when C takes over: B's commit
        # (EndTxn with B's epoch) is fenced
        begin_after_take_over(h, kind, b)
        b_first = produce_in_txn(h, b, topic, keyed("B", topic, 0, 2))
        assert [o for _, o, _, _ in b_first] == [4, 5]      # after A's records and abort marker
        take_over(h, kind, c, tid)
        commit_b = h.call("commit_txn", handle=b)
        assert commit_b["ok"] is False and kind.fenced_end_txn.matches(commit_b), commit_b

        begin_after_take_over(h, kind, c)
        c_recs = produce_in_txn(h, c, topic, keyed("C", topic, 0, 3))
        assert [o for _, o, _, _ in c_recs] == [7, 8, 9]
        h.ok("commit_txn", handle=c)
    finally:
        close_producers(h, a, b, c)

    wait_lso(h, topic, {0: 11})
    rc = read_to_end(h, kind, topic, [0], "read_committed")
    assert rows(rc["records"]) == c_recs
    assert rc["position"] == 11
    ru = read_to_end(h, kind, topic, [0], "read_uncommitted")
    assert rows(ru["records"]) == a_first + b_first + c_recs     # A's late send was never appended
    assert ru["position"] == 11


def test_timed_out_transaction_is_aborted(h, kind):
    u = uid()
    topic = f"txn-timeout-{kind.id}-{u}"
    h.ok("create_topic", topic=topic, partitions=2)
    tid = f"timeout-{kind.id}-{u}"
    z, later = f"timeout-z-{u}", f"timeout-later-{u}"
    try:
        h.ok("init_producer", handle=z, config=kind.txn_config(tid, **{"transaction.timeout.ms": 5000}))
        t_begin = time.monotonic()
        h.ok("begin_txn", handle=z)
        open_recs = produce_in_txn(h, z, topic, keyed("Z", topic, 0, 3) + keyed("Z", topic, 1, 2))
        # open: the LSO stays at the transaction's first offset
        assert end_offsets(h, topic, [0, 1], "read_uncommitted") == {0: 3, 1: 2}
        assert end_offsets(h, topic, [0, 1], "read_committed") == {0: 0, 1: 0}
        # ... and then the producer does nothing at all
        wait_lso(h, topic, {0: 4, 1: 3}, timeout=25)
        took = time.monotonic() - t_begin
        assert took >= 4.9, f"the transaction was aborted after {took:.2f}s, before its 5 s timeout"

        rc = read_to_end(h, kind, topic, [0, 1], "read_committed")
        assert rc["records"] == [] and rc["position"] == [[0, 4], [1, 3]], rc
        ru = read_to_end(h, kind, topic, [0, 1], "read_uncommitted")
        assert sorted(rows(ru["records"])) == sorted(open_recs)
        assert ru["position"] == [[0, 4], [1, 3]]

        # the coordinator bumped the epoch when it aborted: the idle producer is a zombie
        late = h.call("commit_txn", handle=z)
        assert late["ok"] is False and kind.fenced_end_txn.matches(late), late

        h.ok("init_producer", handle=later, config=kind.txn_config(tid))
        h.ok("begin_txn", handle=later)
        new = produce_in_txn(h, later, topic, keyed("L", topic, 0, 2) + keyed("L", topic, 1, 1))
        assert [(p, o) for p, o, _, _ in new] == [(0, 4), (0, 5), (1, 3)]
        h.ok("commit_txn", handle=later)
    finally:
        close_producers(h, z, later)

    wait_lso(h, topic, {0: 7, 1: 5})
    rc = read_to_end(h, kind, topic, [0, 1], "read_committed")
    assert sorted(rows(rc["records"])) == sorted(new)
    assert rc["position"] == [[0, 7], [1, 5]]


@pytest.mark.parametrize("kind", params(JAVA_KINDS))
def test_consume_transform_produce(h, kind):
    u = uid()
    src, dst = f"ctp-in-{kind.id}-{u}", f"ctp-out-{kind.id}-{u}"
    group = f"ctp-group-{u}"
    for t in (src, dst):
        h.ok("create_topic", topic=t, partitions=2)
    feeder, proc = f"ctp-feed-{u}", f"ctp-proc-{u}"
    c1, c2 = f"ctp-c1-{u}", f"ctp-c2-{u}"
    consumer_cfg = {"isolation.level": "read_committed", "fetch.max.wait.ms": 100,
                    "session.timeout.ms": 6000, "heartbeat.interval.ms": 500}
    open_consumers: list[str] = []

    def feed(tag: str, n: int, outcome: str) -> list[tuple]:
        h.ok("begin_txn", handle=feeder)
        got = produce_in_txn(h, feeder, src, keyed(tag, src, 0, n) + keyed(tag, src, 1, n))
        h.ok(f"{outcome}_txn", handle=feeder)
        return got

    def poll_n(handle: str, n: int) -> list[tuple]:
        out: list[dict] = []
        deadline = time.monotonic() + 20
        while len(out) < n and time.monotonic() < deadline:
            out += h.ok("poll", handle=handle, timeout_ms=1000, max=n - len(out))["records"]
        assert len(out) == n, f"{handle}: polled {len(out)} of {n} records"
        return rows(out)

    def transform(consumed: list[tuple]) -> list[dict]:
        return [clients.record(b"OUT " + v, key=k, partition=p) for p, _, k, v in consumed]

    def positions(handle: str) -> list[list]:
        return [[t, p, o] for t, p, o in h.ok("positions", handle=handle)["positions"]]

    def committed(handle: str) -> list[list]:
        r = h.ok("committed", handle=handle, topic=src, partitions=[0, 1])["committed"]
        return [[src, p, o] for p, o, _ in r]

    def admin_offsets() -> list[list]:
        return [[t, p, o] for t, p, o, _ in h.ok("group_offsets", group=group)["offsets"]]

    def transform_round(consumer: str, expected: list[tuple]) -> tuple[list[tuple], list[list]]:
        """Poll the round's input, open a transaction and write it transformed
        -> (output rows, the consumer's positions)."""
        consumed = poll_n(consumer, len(expected))
        assert sorted(consumed) == sorted(expected)
        h.ok("begin_txn", handle=proc)
        out = produce_in_txn(h, proc, dst, transform(consumed))
        return out, positions(consumer)

    try:
        h.ok("init_producer", handle=feeder, config=kind.txn_config(f"ctp-feed-{u}"))
        h.ok("init_producer", handle=proc, config=kind.txn_config(f"ctp-proc-{u}"))
        round1 = feed("in1", 5, "commit")
        h.ok("subscribe", topic=src, group=group, config=consumer_cfg, handle=c1)
        open_consumers.append(c1)
        # round 1: committed
        out1, pos1 = transform_round(c1, round1)
        assert [x[:2] for x in pos1] == [[src, 0], [src, 1]] and all(x[2] >= 5 for x in pos1), pos1
        sent = h.ok("send_offsets_to_txn", handle=proc, consumer=c1)
        assert sent["offsets"] == pos1 and sent["group"] == group
        assert sent["generation_id"] >= 1 and sent["member_id"], sent
        h.ok("commit_txn", handle=proc)
        assert committed(c1) == pos1
        clients.wait_until(lambda: admin_offsets() == pos1, timeout=10, what="admin offsets == positions")

        # round 2 (its input comes after an aborted input transaction): aborted
        # - the committed offsets stay where round 1 left them
        feed("in-aborted", 2, "abort")
        round2 = feed("in2", 3, "commit")
        _, pos2 = transform_round(c1, round2)
        assert all(b[2] > a[2] for a, b in zip(pos1, pos2)), (pos1, pos2)
        assert h.ok("send_offsets_to_txn", handle=proc, consumer=c1)["offsets"] == pos2
        h.ok("abort_txn", handle=proc)
        assert committed(c1) == pos1
        assert admin_offsets() == pos1

        # a new member resumes from the committed offsets and redoes round 2
        h.ok("close_consumer", handle=c1)
        open_consumers.remove(c1)
        h.ok("subscribe", topic=src, group=group, config=consumer_cfg, handle=c2)
        open_consumers.append(c2)
        out2, pos3 = transform_round(c2, round2)
        # past the last record of round 2, at most past its commit marker (the
        # Java consumer skips a control batch on the poll after the records)
        last = {p: max(o for q, o, _, _ in round2 if q == p) for p in range(2)}
        assert all(last[p] + 1 <= o <= last[p] + 2 for _, p, o in pos3), (pos3, last)
        h.ok("send_offsets_to_txn", handle=proc, consumer=c2)
        h.ok("commit_txn", handle=proc)
        assert committed(c2) == pos3
        clients.wait_until(lambda: admin_offsets() == pos3, timeout=10, what="admin offsets == positions")
    finally:
        for c in open_consumers:
            h.call("close_consumer", handle=c)
        close_producers(h, feeder, proc)

    # the output holds every input record transformed exactly once
    hw = {}
    for p in range(2):
        hw[p] = max(o for q, o, _, _ in out1 + out2 if q == p) + 2     # + the commit marker
    wait_lso(h, dst, hw)
    rc = read_to_end(h, kind, dst, [0, 1], "read_committed")
    got = rows(rc["records"])
    for p in range(2):
        assert [g for g in got if g[0] == p] == sorted(x for x in out1 + out2 if x[0] == p)
    assert len(got) == len(out1 + out2)
    assert sorted((k, v) for _, _, k, v in got) == sorted((k, b"OUT " + v) for _, _, k, v in round1 + round2)
    assert rc["position"] == [[p, hw[p]] for p in range(2)]


def find_hanging(h: clients.HarnessProcess, topic: str, partitions: list[int]) -> list[dict]:
    """What ``kafka-transactions.sh find-hanging`` does with the Admin API: every producer with an open transaction
    on the partitions whose producer id the coordinators list as Ongoing on none of them."""
    ongoing = {t["producer_id"] for t in h.ok("list_transactions", states=["Ongoing"])["transactions"]}
    out = []
    for p in partitions:
        for producer in h.ok("describe_producers", topic=topic, partition=p)["producers"]:
            if producer["txn_start_offset"] is not None and producer["producer_id"] not in ongoing:
                out.append({"partition": p, **producer})
    return out


@pytest.mark.parametrize("kind", params(JAVA_KINDS))
def test_kip664_tooling_with_java_admin(h, kind):
    """listTransactions, describeTransactions, describeProducers, find-hanging (none) and abortTransaction (the
    Admin sends WriteTxnMarkers with the epochs DescribeProducers gave) of an open transaction: refused
    (INVALID_TXN_STATE), since its coordinator has it open there; its producer aborts it."""
    u = uid()
    topic, tid, handle = f"kip664-{kind.id}-{u}", f"kip664-{kind.id}-{u}", f"kip664-{u}"
    h.ok("create_topic", topic=topic, partitions=2)
    h.ok("init_producer", handle=handle, config=kind.txn_config(tid))
    try:
        h.ok("begin_txn", handle=handle)
        produce_in_txn(h, handle, topic, keyed("open", topic, 1, 3))
        listed = [t for t in h.ok("list_transactions", states=["Ongoing"])["transactions"]
                  if t["transactional_id"] == tid]
        assert len(listed) == 1 and listed[0]["state"] == "Ongoing", listed
        assert not [t for t in h.ok("list_transactions", states=["CompleteCommit"])["transactions"]
                    if t["transactional_id"] == tid]
        desc = h.ok("describe_transactions", ids=[tid])["transactions"][tid]
        assert desc["state"] == "Ongoing" and desc["producer_id"] == listed[0]["producer_id"]
        assert desc["partitions"] == [[topic, 1]] and desc["start_time_ms"] > 0 and desc["coordinator"] == 1
        (producer,) = [p for p in h.ok("describe_producers", topic=topic, partition=1)["producers"]
                       if p["producer_id"] == desc["producer_id"]]
        assert (producer["txn_start_offset"], producer["last_sequence"], producer["producer_epoch"]) == \
            (0, 2, desc["producer_epoch"])
        assert find_hanging(h, topic, [0, 1]) == []          # the coordinator knows it: not hanging
        assert end_offsets(h, topic, [1], "read_committed") == {1: 0}
        refused = h.call("abort_transaction", topic=topic, partition=1, producer_id=producer["producer_id"],
                         producer_epoch=producer["producer_epoch"],
                         coordinator_epoch=producer["coordinator_epoch"] or 0)
        assert refused["ok"] is False and "InvalidTxnStateException" in refused["error"], refused
        (producer,) = [p for p in h.ok("describe_producers", topic=topic, partition=1)["producers"]
                       if p["producer_id"] == desc["producer_id"]]
        assert producer["txn_start_offset"] == 0
        h.ok("abort_txn", handle=handle)
        wait_lso(h, topic, {1: 4})                          # three records and the marker
        (producer,) = [p for p in h.ok("describe_producers", topic=topic, partition=1)["producers"]
                       if p["producer_id"] == desc["producer_id"]]
        assert producer["txn_start_offset"] is None
        rc = read_to_end(h, kind, topic, [1], "read_committed")
        assert rc["records"] == []
    finally:
        close_producers(h, handle)


def test_find_hanging_and_abort_with_java_admin(server):
    """A transaction the coordinator lost (its log removed while the broker was down, as an operator might) hangs
    on its partition: find-hanging (Admin listTransactions + describeProducers) reports it, and the Admin's
    abortTransaction writes the marker that releases the last stable offset."""
    clients.require_java("4.3.0")
    u = uid()
    topic, tid = f"hanging-{u}", f"hanging-{u}"
    h = clients.java_harness("4.3.0", server.bootstrap)
    try:
        h.ok("create_topic", topic=topic, partitions=1)
        h.ok("init_producer", handle="p", config={"transactional.id": tid, "acks": "all"})
        h.ok("begin_txn", handle="p")
        produce_in_txn(h, "p", topic, keyed("lost", topic, 0, 2))
    finally:
        h.kill()                  # no clean close: it would abort the transaction
    server.restart(between=lambda: shutil.rmtree(server.data_dir / "logs" / "__transaction_state-0"))
    with clients.java_harness("4.3.0", server.bootstrap) as h:
        assert end_offsets(h, topic, [0], "read_committed") == {0: 0}
        (hanging,) = find_hanging(h, topic, [0])
        assert hanging["txn_start_offset"] == 0 and hanging["last_sequence"] == 1
        assert tid not in {t["transactional_id"] for t in h.ok("list_transactions")["transactions"]}
        h.ok("abort_transaction", topic=topic, partition=0, producer_id=hanging["producer_id"],
             producer_epoch=hanging["producer_epoch"], coordinator_epoch=hanging["coordinator_epoch"] or 0)
        assert find_hanging(h, topic, [0]) == []
        assert end_offsets(h, topic, [0], "read_committed") == {0: 3}
        assert read_to_end(h, java_kind("4.3.0"), topic, [0], "read_committed")["records"] == []


@pytest.mark.parametrize("rounds,marker_delay_ms", [
    pytest.param(5, 300, marks=pytest.mark.server_config({"trireme.debug.transaction.marker.delay.ms": 300}),
                 id="markers-held"),
    pytest.param(30, 0, id="markers-at-once"),
])
def test_back_to_back_commit_and_abort_java4(server, rounds, marker_delay_ms):
    clients.require_java("4.3.0")
    u = uid()
    topic, tid = f"b2b-{u}", f"b2b-{u}"
    with clients.java_harness("4.3.0", server.bootstrap) as h:
        h.ok("create_topic", topic=topic, partitions=1)
        # linger.ms: the aborted transaction's record stays in the client until abortTransaction() drops it
        h.ok("init_producer", handle="p", config={"transactional.id": tid, "acks": "all", "linger.ms": "5000"})
        committed = []
        for n in range(rounds):
            h.ok("begin_txn", handle="p")
            committed += produce_in_txn(h, "p", topic, keyed(f"c{n}", topic, 0, 1))
            h.ok("commit_txn", handle="p")
            h.ok("begin_txn", handle="p")
            h.ok("send", handle="p", topic=topic, records=keyed(f"a{n}", topic, 0, 1))
            aborted = h.call("abort_txn", handle="p")
            assert aborted["ok"], f"round {n}: {aborted}\n{h.stderr_tail(30)}"
        close_producers(h, "p")
        got = read_to_end(h, java_kind("4.3.0"), topic, [0], "read_committed")
        assert rows(got["records"]) == committed
    assert describe_transaction(server.bootstrap, tid).producer_epoch == 2 * rounds   # each EndTxn bumped it
