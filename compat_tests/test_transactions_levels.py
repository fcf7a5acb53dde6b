"""The finalized ``transaction.version`` feature and the Java client: level 1 keeps 4.3 on the classic protocol; raising the level switches a live producer to transactions V2.

* The harness tests of compat_tests/test_transactions_harness.py (commit and abort across
  3 topics x 2 partitions, zombie fencing, timeout abort, consume-transform-produce) run again
  for the Java 4.3.0 client with the broker at ``transaction.version`` 1: the client must see
  the level in ApiVersions and stay on transactions V1 (the producer epoch stays what
  InitProducerId gave, checked there), with the same results.
* ``test_describe_features``: the Java Admin's describeFeatures (an ApiVersions v4) lists
  transaction.version as supported 0-2 and finalized at 1, with an epoch.
* ``test_raising_the_level_under_a_live_producer``: a 4.3 producer runs transactions at level 1
  (epoch unchanged), the Java Admin raises the level to 2 (UpdateFeatures; a level above what
  the node supports is refused with INVALID_UPDATE_VERSION and changes nothing), and the same
  producer keeps committing: its next ApiVersions (after a broker restart, which also shows
  that the level is durable) shows level 2, and from then on each commit bumps the epoch
  (transactions V2).  read_committed sees every committed record exactly once, in order.
"""
from __future__ import annotations

import pytest

from compat_tests import test_transactions_harness as base
from compat_tests.python_clients import describe_transaction

pytestmark = pytest.mark.server_config({
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": 500,
    "transaction.version": 1,
})

JAVA_43_V1 = base.java_kind("4.3.0", transactions_v2=False)

harness_procs = base.harness_procs
h = base.h


@pytest.fixture(params=base.params([JAVA_43_V1]))
def kind(request) -> base.Kind:
    return request.param


test_commit_and_abort_across_partitions = base.test_commit_and_abort_across_partitions
test_zombie_fencing = base.test_zombie_fencing
test_timed_out_transaction_is_aborted = base.test_timed_out_transaction_is_aborted


@pytest.mark.parametrize("kind", base.params([JAVA_43_V1]))
def test_consume_transform_produce(h, kind):
    base.test_consume_transform_produce(h, kind)


def test_describe_features(h, kind):
    r = h.ok("describe_features")
    assert r["supported"]["transaction.version"] == [0, 2]
    assert r["finalized"] == {"transaction.version": 1}
    assert r["epoch"] is not None and r["epoch"] >= 1


def commit_one(h, handle: str, topic: str, tag: str) -> list[tuple]:
    h.ok("begin_txn", handle=handle)
    got = base.produce_in_txn(h, handle, topic, base.keyed(tag, topic, 0, 3) + base.keyed(tag, topic, 1, 2))
    h.ok("commit_txn", handle=handle)
    return got


def test_raising_the_level_under_a_live_producer(h, kind, module_server):
    u = base.uid()
    topic = f"txn-level-{u}"
    tid = f"level-{u}"
    h.ok("create_topic", topic=topic, partitions=2)
    handle = f"level-{u}"
    h.ok("init_producer", handle=handle, config=kind.txn_config(tid))
    committed = []
    try:
        for n in range(2):
            committed += commit_one(h, handle, topic, f"v1-{n}")
        assert describe_transaction(module_server.bootstrap, tid).producer_epoch == 0
        before = h.ok("describe_features")
        refused = h.call("update_features", feature="transaction.version", level=3)
        assert refused["ok"] is False and "InvalidUpdateVersionException" in refused["error"], refused
        assert h.ok("describe_features")["finalized"] == {"transaction.version": 1}
        h.ok("update_features", feature="transaction.version", level=2)
        after = h.ok("describe_features")
        assert after["finalized"] == {"transaction.version": 2} and after["epoch"] > before["epoch"]

        committed += commit_one(h, handle, topic, "between")      # still fine on the connection it has
        # A client reads the levels again when it opens a connection: here the broker restarts (the level
        # is durable); on Kafka a rolling restart or an idle connection's close does the same.
        module_server.restart()
        epoch = describe_transaction(module_server.bootstrap, tid).producer_epoch
        assert epoch == 0
        for n in range(3):
            committed += commit_one(h, handle, topic, f"v2-{n}")
        # From the first transaction after the reconnect on, every EndTxn bumped the epoch.
        assert describe_transaction(module_server.bootstrap, tid).producer_epoch >= epoch + 2
    finally:
        base.close_producers(h, handle)
        h.ok("update_features", feature="transaction.version", level=1, upgrade_type="SAFE_DOWNGRADE")
    rc = base.read_to_end(h, kind, topic, [0, 1], "read_committed")
    got = base.rows(rc["records"])
    for p in range(2):
        assert [g for g in got if g[0] == p] == [c for c in committed if c[0] == p]
    assert h.ok("describe_features")["finalized"] == {"transaction.version": 1}

