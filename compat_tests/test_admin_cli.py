"""The admin command line (`trireme topics|groups|transactions`) against a live broker, run as a user runs it.

Real clients make the state the commands look at and change: confluent-kafka and kafka-python
consumers in groups, confluent-kafka transactional producers with open transactions, and hanging
transactions from raw transactional produce requests whose coordinator state is then lost (the
broker restarted without its `__transaction_state` log, so no coordinator will ever finish them).
What the commands change is checked with real clients too (committed offsets, partition counts,
topic configs, a fenced producer, what read_committed consumers see).
"""
from __future__ import annotations

import datetime
import json
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource
from kafka import KafkaConsumer

from compat_tests.clients import wait_until
from compat_tests.python_clients import create_topics, unique_topic
from compat_tests.test_bad_input import RawConn
from compat_tests.test_bad_transactions import add_partitions, init, lso, produce_txn
from compat_tests.test_transactions_python import open_transaction, read_confluent
from trireme.wire import records

_SCRIPT = Path(sys.executable).parent / "trireme"
TRIREME = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "trireme"]
MINUTE_MS = 60000


def run(server, tool: str, *args: str, expect: int = 0) -> subprocess.CompletedProcess:
    """``trireme TOOL --bootstrap-server ... ARGS``; asserts the exit status."""
    out = subprocess.run(TRIREME + [tool, "--bootstrap-server", server.bootstrap, *args],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == expect, (out.returncode, out.stdout, out.stderr)
    return out


def run_json(server, tool: str, *args: str):
    return json.loads(run(server, tool, "--json", *args).stdout)


def committed(bootstrap: str, group: str, tps) -> dict:
    """The group's committed offsets, as confluent-kafka reads them (-1001 when none)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        return {(tp.topic, tp.partition): tp.offset
                for tp in c.committed([TopicPartition(t, p) for t, p in tps], timeout=30)}
    finally:
        c.close()


def produce(bootstrap: str, topic: str, per_partition: dict[int, int], base_ts: int | None = None) -> None:
    """``per_partition[p]`` records to each partition, record i at ``base_ts + i`` seconds when given."""
    p = Producer({"bootstrap.servers": bootstrap})
    for partition, n in per_partition.items():
        for i in range(n):
            ts = {} if base_ts is None else {"timestamp": base_ts + i * 1000}
            p.produce(topic, value=b"v%d" % i, partition=partition, **ts)
    assert p.flush(30) == 0


# --------------------------------------------------------------------------- topics

def test_topics_create_list_describe_alter_delete(module_server):
    bootstrap = module_server.bootstrap
    topic = unique_topic("cli-topic")
    out = run(module_server, "topics", "--create", "--topic", topic, "--partitions", "3",
              "--replication-factor", "1", "--config", "retention.ms=3600000")
    assert out.stdout == f"Created topic {topic}.\n"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    assert len(admin.list_topics(topic, timeout=10).topics[topic].partitions) == 3

    table = run(module_server, "topics", "--list").stdout.splitlines()
    assert table[0].split() == ["TOPIC", "PARTITIONS", "INTERNAL"]
    assert [topic, "3", "false"] in [line.split() for line in table[1:]]
    assert {"topic": topic, "partitions": 3, "internal": False} in run_json(module_server, "topics", "--list")

    (described,) = run_json(module_server, "topics", "--describe", "--topic", topic)
    assert described["partition_count"] == 3 and described["replication_factor"] == 1
    assert described["configs"] == {"retention.ms": "3600000"}
    assert [p["partition"] for p in described["partitions"]] == [0, 1, 2]
    assert all(p["replicas"] == [p["leader"]] == p["isr"] for p in described["partitions"])

    # Existing topic: an error, unless --if-not-exists.
    out = run(module_server, "topics", "--create", "--topic", topic, expect=1)
    assert "TOPIC_ALREADY_EXISTS" in out.stderr and out.stderr.startswith("trireme topics: ")
    run(module_server, "topics", "--create", "--topic", topic, "--if-not-exists")

    run(module_server, "topics", "--alter", "--topic", topic, "--partitions", "5",
        "--config", "segment.bytes=1048576", "--delete-config", "retention.ms")
    assert len(admin.list_topics(topic, timeout=10).topics[topic].partitions) == 5
    (configs,) = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)]).values()
    configs = configs.result(timeout=30)
    assert configs["segment.bytes"].value == "1048576" and not configs["segment.bytes"].is_default
    assert configs["retention.ms"].is_default
    out = run(module_server, "topics", "--alter", "--topic", topic, "--partitions", "2", expect=1)
    assert "INVALID_PARTITIONS" in out.stderr

    out = run(module_server, "topics", "--delete", "--topic", topic)
    assert out.stdout == f"Deleted topic {topic}.\n"
    wait_until(lambda: topic not in admin.list_topics(timeout=10).topics, what="topic gone")
    assert "UNKNOWN_TOPIC_OR_PARTITION" in run(module_server, "topics", "--delete", "--topic", topic, expect=1).stderr
    run(module_server, "topics", "--delete", "--topic", topic, "--if-exists")
    assert "UNKNOWN_TOPIC_OR_PARTITION" in run(module_server, "topics", "--describe", "--topic", topic,
                                               expect=1).stderr


# --------------------------------------------------------------------------- groups

def _kafka_python_member(bootstrap: str, topic: str, group: str, client_id: str, records: int) -> KafkaConsumer:
    """A kafka-python consumer in ``group`` that has read and committed ``records`` records, still a member."""
    c = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, client_id=client_id,
                      auto_offset_reset="earliest", enable_auto_commit=False, max_poll_records=records)
    got = 0
    deadline = time.monotonic() + 30
    while got < records and time.monotonic() < deadline:
        got += sum(len(v) for v in c.poll(timeout_ms=500, max_records=records - got).values())
    assert got == records
    c.commit()
    return c


def _confluent_member(bootstrap: str, topic: str, group: str, client_id: str, records: int) -> Consumer:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "client.id": client_id,
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe([topic])
    got = []
    deadline = time.monotonic() + 30
    while len(got) < records and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            got.append(m)
    assert len(got) == records
    c.commit(offsets=[TopicPartition(m.topic(), m.partition(), m.offset() + 1) for m in got], asynchronous=False)
    return c


def test_groups_list_describe_with_lag_and_members(module_server):
    bootstrap = module_server.bootstrap
    (topic,) = create_topics(bootstrap, [unique_topic("cli-groups")], 2)
    produce(bootstrap, topic, {0: 6, 1: 4})
    suffix = uuid.uuid4().hex[:8]
    groups = {"kafka-python": f"cli-kp-{suffix}", "confluent-kafka": f"cli-ck-{suffix}"}
    client_ids = {name: f"{name}-{suffix}" for name in groups}
    kp = _kafka_python_member(bootstrap, topic, groups["kafka-python"], client_ids["kafka-python"], 3)
    ck = _confluent_member(bootstrap, topic, groups["confluent-kafka"], client_ids["confluent-kafka"], 7)
    try:
        listed = {g["group"]: g for g in run_json(module_server, "groups", "--list")}
        for group in groups.values():
            assert listed[group] == {"group": group, "state": "Stable", "protocol_type": "consumer"}
        assert {g["group"] for g in run_json(module_server, "groups", "--list", "--state", "Empty")}.isdisjoint(
            groups.values())

        for name, group in groups.items():
            (described,) = run_json(module_server, "groups", "--describe", "--group", group)
            assert described["state"] == "Stable"
            (member,) = described["members"]
            assert member["client_id"] == client_ids[name] and member["partitions"] == 2
            offsets = {(o["topic"], o["partition"]): o for o in described["offsets"]}
            assert set(offsets) == {(topic, 0), (topic, 1)}
            want = committed(bootstrap, group, offsets)
            for tp, o in offsets.items():
                current = want[tp] if want[tp] >= 0 else None
                end = {0: 6, 1: 4}[tp[1]]
                assert (o["current_offset"], o["log_end_offset"]) == (current, end)
                assert o["lag"] == (None if current is None else end - current)
                assert o["consumer_id"] == member["consumer_id"] and o["client_id"] == client_ids[name]
            assert sum(o["log_end_offset"] - (o["current_offset"] or 0) for o in offsets.values()) == \
                10 - {"kafka-python": 3, "confluent-kafka": 7}[name]

        table = run(module_server, "groups", "--describe", "--group", groups["confluent-kafka"]).stdout.splitlines()
        assert table[0].split() == ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG",
                                    "CONSUMER-ID", "HOST", "CLIENT-ID"]
        rows = {tuple(line.split()[1:3]): line.split() for line in table[1:]}
        want = committed(bootstrap, groups["confluent-kafka"], [(topic, 0), (topic, 1)])
        assert sum(want.values()) == 7
        for p, end in ((0, 6), (1, 4)):
            assert rows[(topic, str(p))][3:6] == [str(want[(topic, p)]), str(end), str(end - want[(topic, p)])]
        members = run(module_server, "groups", "--describe", "--members", "--group", groups["kafka-python"])
        assert members.stdout.splitlines()[1].split()[-2:] == [client_ids["kafka-python"], "2"]
        (state,) = run_json(module_server, "groups", "--describe", "--state", "--group", groups["kafka-python"])
        assert (state["state"], state["members"], state["assignment_strategy"]) == ("Stable", 1, "range")

        # An active group keeps its offsets and itself.
        out = run(module_server, "groups", "--reset-offsets", "--group", groups["kafka-python"], "--all-topics",
                  "--to-earliest", "--execute", expect=1)
        assert "inactive" in out.stderr and "Stable" in out.stderr
        out = run(module_server, "groups", "--delete", "--group", groups["confluent-kafka"], expect=1)
        assert "NON_EMPTY_GROUP" in out.stderr
    finally:
        kp.close()
        ck.close()
    # Empty now: described without members, then deleted.
    (described,) = run_json(module_server, "groups", "--describe", "--group", groups["kafka-python"])
    assert described["state"] == "Empty" and described["members"] == []
    assert all(o["consumer_id"] is None for o in described["offsets"])
    out = run(module_server, "groups", "--delete", "--group", groups["kafka-python"], "--group",
              groups["confluent-kafka"])
    assert "was successful" in out.stdout
    listed = {g["group"] for g in run_json(module_server, "groups", "--list")}
    assert listed.isdisjoint(groups.values())
    assert "does not exist" in run(module_server, "groups", "--describe", "--group", groups["kafka-python"],
                                   expect=1).stderr


def test_reset_offsets(module_server):
    bootstrap = module_server.bootstrap
    (topic,) = create_topics(bootstrap, [unique_topic("cli-reset")], 2)
    base_ts = int(time.time() * 1000) - 3600_000
    produce(bootstrap, topic, {0: 10, 1: 10}, base_ts=base_ts)
    group = "cli-reset-" + uuid.uuid4().hex[:8]
    tps = [(topic, 0), (topic, 1)]
    _confluent_member(bootstrap, topic, group, "cli-reset", 20).close()
    assert committed(bootstrap, group, tps) == {(topic, 0): 10, (topic, 1): 10}

    def reset(*args: str, expect: int = 0):
        out = run(module_server, "groups", "--json", "--reset-offsets", "--group", group, *args, expect=expect)
        return ({(r["topic"], r["partition"]): r["new_offset"] for r in json.loads(out.stdout)} if expect == 0
                else None), out.stderr

    # Without --execute: a dry run, said so on stderr, nothing committed.
    new, err = reset("--all-topics", "--to-earliest")
    assert new == {(topic, 0): 0, (topic, 1): 0} and "dry run" in err
    assert committed(bootstrap, group, tps) == {(topic, 0): 10, (topic, 1): 10}
    new, err = reset("--all-topics", "--to-earliest", "--dry-run")
    assert new == {(topic, 0): 0, (topic, 1): 0} and err == ""

    new, _ = reset("--all-topics", "--to-earliest", "--execute")
    assert committed(bootstrap, group, tps) == new == {(topic, 0): 0, (topic, 1): 0}
    new, _ = reset("--topic", f"{topic}:1", "--to-latest", "--execute")
    assert committed(bootstrap, group, tps) == {(topic, 0): 0, (topic, 1): 10} and new == {(topic, 1): 10}
    new, err = reset("--topic", topic, "--shift-by", "-3", "--execute")
    assert committed(bootstrap, group, tps) == new == {(topic, 0): 0, (topic, 1): 7}
    assert "earliest" in err                    # partition 0 could not go below 0: kept there, with a warning
    new, err = reset("--topic", topic, "--to-offset", "4", "--execute")
    assert committed(bootstrap, group, tps) == new == {(topic, 0): 4, (topic, 1): 4} and err == ""
    new, err = reset("--topic", topic, "--to-offset", "99", "--execute")
    assert committed(bootstrap, group, tps) == new == {(topic, 0): 10, (topic, 1): 10} and "latest" in err
    # Record i was written at base_ts + i s: 2.5 s after base_ts the first record at or after it is offset 3.
    when = datetime.datetime.fromtimestamp((base_ts + 2500) / 1000, datetime.timezone.utc).isoformat()
    new, _ = reset("--all-topics", "--to-datetime", when, "--execute")
    assert committed(bootstrap, group, tps) == new == {(topic, 0): 3, (topic, 1): 3}
    local = datetime.datetime.fromtimestamp((base_ts + 7000) / 1000).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3]
    new, _ = reset("--topic", f"{topic}:0", "--to-datetime", local, "--execute")      # no zone: local time
    assert committed(bootstrap, group, tps) == {(topic, 0): 7, (topic, 1): 3}
    new, _ = reset("--all-topics", "--to-datetime", "2999-01-01T00:00:00Z", "--execute")   # none that late: the end
    assert committed(bootstrap, group, tps) == new == {(topic, 0): 10, (topic, 1): 10}

    # A consumer of the group starts where the reset put it.
    reset("--topic", f"{topic}:0", "--to-offset", "8", "--execute")
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0)])
    m = None
    deadline = time.monotonic() + 30
    while m is None and time.monotonic() < deadline:
        m = c.poll(0.5)
    c.close()
    assert m is not None and not m.error() and m.offset() == 8

    assert "needs one of" in reset("--to-earliest", expect=1)[1]
    assert "no committed offset" in run(module_server, "groups", "--reset-offsets", "--group", "cli-none-" + group,
                                        "--topic", topic, "--shift-by", "1", expect=1).stderr
    # A group that does not exist yet (Dead) may get offsets before its first member joins, as on Kafka.
    fresh = "cli-fresh-" + group
    run(module_server, "groups", "--reset-offsets", "--group", fresh, "--topic", topic, "--to-offset", "2", "--execute")
    assert committed(bootstrap, fresh, tps) == {(topic, 0): 2, (topic, 1): 2}


# --------------------------------------------------------------------------- transactions

def test_transactions_list_describe_and_force_terminate(module_server):
    bootstrap = module_server.bootstrap
    (topic,) = create_topics(bootstrap, [unique_topic("cli-txn")], 2)
    txn_id = "cli-txn-" + uuid.uuid4().hex[:8]
    producer = open_transaction(bootstrap, txn_id, topic, [b"k%d" % i for i in range(3)], 1)

    listed = [t for t in run_json(module_server, "transactions", "list") if t["transactional_id"] == txn_id]
    assert len(listed) == 1 and listed[0]["transaction_state"] == "Ongoing"
    pid = listed[0]["producer_id"]
    assert [t["transactional_id"] for t in run_json(
        module_server, "transactions", "list", "--transactional-id-pattern", txn_id.replace("-", ".") + "$")] == [txn_id]
    (desc,) = run_json(module_server, "transactions", "describe", "--transactional-id", txn_id)
    assert (desc["transaction_state"], desc["producer_id"], desc["topic_partitions"]) == ("Ongoing", pid, f"{topic}-1")
    assert desc["transaction_duration_ms"] >= 0 and desc["current_transaction_start_time_ms"] > 0
    # kafka-transactions.sh puts --bootstrap-server before the sub-command; after it works too.
    table = subprocess.run(TRIREME + ["transactions", "describe-producers", "--bootstrap-server", bootstrap,
                                      "--topic", topic, "--partition", "1"], capture_output=True, text=True,
                           timeout=60, check=True).stdout.splitlines()
    assert table[0].split() == ["ProducerId", "ProducerEpoch", "LatestCoordinatorEpoch", "LastSequence",
                                "LastTimestamp", "CurrentTransactionStartOffset"]
    (producer_row,) = [line.split() for line in table[1:] if line.split()[0] == str(pid)]
    assert producer_row[3] == "2" and producer_row[5] == "0"
    # Open, but the coordinator has it: not hanging, whatever the age limit.
    assert run_json(module_server, "transactions", "find-hanging", "--topic", topic,
                    "--max-transaction-timeout", "0") == []

    out = run(module_server, "transactions", "force-terminate", "--transactional-id", txn_id)
    assert "Terminated" in out.stdout
    (desc,) = run_json(module_server, "transactions", "describe", "--transactional-id", txn_id)
    assert desc["transaction_state"] in ("CompleteAbort", "Empty") and desc["producer_epoch"] >= 1
    with pytest.raises(KafkaException):            # the producer is fenced
        producer.commit_transaction(30)
    got, positions = read_confluent(bootstrap, [(topic, 1)], "read_committed")
    assert got == {} and positions[(topic, 1)] == (4, 4)     # three records and the abort marker, all skipped
    assert "TRANSACTIONAL_ID_NOT_FOUND" in run(module_server, "transactions", "describe", "--transactional-id",
                                               "cli-never-" + txn_id, expect=1).stderr


def _hanging_transaction(conn: RawConn, topic: str, partition: int, timestamp: int) -> tuple[int, int]:
    """A transaction open on ``topic``-``partition`` from raw requests, its records written at ``timestamp``
    → (producer id, epoch)."""
    tid = "cli-hang-" + uuid.uuid4().hex[:8]
    err, pid, epoch = init(conn, tid, timeout_ms=900000)
    assert err == 0
    assert add_partitions(conn, tid, pid, epoch, topic, [partition]) == {(topic, partition): 0}
    data = records.build_batch([(None, b"a", [], timestamp), (None, b"b", [], timestamp)], producer_id=pid,
                               producer_epoch=epoch, base_sequence=0, transactional=True)
    assert produce_txn(conn, tid, topic, partition, data) == 0
    return pid, epoch


def test_find_hanging_and_abort(server):
    bootstrap = server.bootstrap
    (topic,) = create_topics(bootstrap, [unique_topic("cli-hang")], 3)
    produce(bootstrap, topic, {0: 2, 1: 2, 2: 2})
    now = int(time.time() * 1000)
    with RawConn(bootstrap) as conn:
        old_pid, old_epoch = _hanging_transaction(conn, topic, 0, now - 20 * MINUTE_MS)
        new_pid, new_epoch = _hanging_transaction(conn, topic, 1, now)
    # The coordinator's log is lost: these two transactions are open on their partitions and no coordinator
    # will ever write their markers.
    server.stop()
    shutil.rmtree(server.data_dir / "logs" / "__transaction_state-0")
    server.start(port=0)
    bootstrap = server.bootstrap
    with RawConn(bootstrap) as conn:
        assert [lso(conn, topic, p) for p in range(3)] == [2, 2, 2]
    # A transaction its coordinator knows (after the restart), open on partition 2: never hanging.
    known = open_transaction(bootstrap, "cli-known-" + uuid.uuid4().hex[:8], topic, [b"k"], 2)

    (described,) = run_json(server, "topics", "--describe", "--topic", topic)
    broker = str(described["partitions"][0]["leader"])
    # Past the default 15 minutes only the old one; with no age limit both.
    (old,) = run_json(server, "transactions", "find-hanging", "--broker-id", broker)
    assert (old["topic"], old["partition"], old["producer_id"], old["producer_epoch"], old["start_offset"]) == \
        (topic, 0, old_pid, old_epoch, 2)
    assert old["duration_min"] >= 20 and old["coordinator_epoch"] == -1
    hanging = run_json(server, "transactions", "find-hanging", "--topic", topic, "--max-transaction-timeout", "0")
    assert [(h["partition"], h["producer_id"]) for h in hanging] == [(0, old_pid), (1, new_pid)]
    table = run(server, "transactions", "find-hanging", "--topic", topic, "--partition", "1",
                "--max-transaction-timeout", "0").stdout.splitlines()
    assert table[0].split() == ["Topic", "Partition", "ProducerId", "ProducerEpoch", "CoordinatorEpoch",
                                "StartOffset", "LastTimestamp", "Duration(min)"]
    assert table[1].split()[:6] == [topic, "1", str(new_pid), str(new_epoch), "-1", "2"]

    out = run(server, "transactions", "abort", "--topic", topic, "--partition", "0", "--start-offset", "5", expect=1)
    assert "no open transaction starts at offset 5" in out.stderr
    out = run(server, "transactions", "abort", "--topic", topic, "--partition", "0", "--start-offset", "2")
    assert f"producer {old_pid}" in out.stdout
    aborted = run_json(server, "transactions", "abort", "--topic", topic, "--partition", "1",
                       "--producer-id", str(new_pid), "--producer-epoch", str(new_epoch),
                       "--coordinator-epoch", "-1")["aborted"]
    assert (aborted["producer_id"], aborted["coordinator_epoch"]) == (new_pid, 0)

    with RawConn(bootstrap) as conn:
        assert [lso(conn, topic, p) for p in (0, 1)] == [5, 5]           # 2 records, 2 transactional, 1 marker
    got, positions = read_confluent(bootstrap, [(topic, 0), (topic, 1)], "read_committed")
    assert got == {(topic, 0): [None, None], (topic, 1): [None, None]}    # only the two plain records each
    assert positions == {(topic, 0): (5, 5), (topic, 1): (5, 5)}
    producers = run_json(server, "transactions", "describe-producers", "--topic", topic, "--partition", "0")
    (state,) = [p for p in producers if p["producer_id"] == old_pid]
    assert state["current_transaction_start_offset"] is None and state["latest_coordinator_epoch"] == 0
    assert run_json(server, "transactions", "find-hanging", "--topic", topic, "--max-transaction-timeout", "0") == []
    known.commit_transaction(30)


# --------------------------------------------------------------------------- errors

def test_cluster_describe_shows_this_broker_alone_with_the_local_engine(module_server):
    """The local engine is a cluster of one: this broker, its controller, leading every partition at epoch 0."""
    (topic,) = create_topics(module_server.bootstrap, [unique_topic("cli-cluster")], 2)
    described = run_json(module_server, "cluster", "--describe", "--topic", topic)
    (me,) = described["brokers"]
    assert (me["host"], me["port"], me["controller"]) == ("127.0.0.1", module_server.port, True)
    assert described["controller_id"] == me["node_id"]
    assert described["partitions"] == [{"topic": topic, "partition": i, "leader": me["node_id"], "leader_epoch": 0}
                                       for i in range(2)]
    text = run(module_server, "cluster", "--describe", "--topic", topic).stdout
    assert f"{topic}  1          {me['node_id']}" in text and "CONTROLLER" in text


def test_errors_exit_non_zero_with_a_message(tmp_path):
    """No broker, or a command line that does not make sense: a message on stderr and a non-zero exit."""
    with socket.socket() as s:                       # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = subprocess.run(TRIREME + ["topics", "--list", "--bootstrap-server", f"127.0.0.1:{port}"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.startswith(f"trireme topics: cannot connect to 127.0.0.1:{port}")
    out = subprocess.run(TRIREME + ["groups", "--topic", "t"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "one of the arguments --list --describe --delete --reset-offsets is required" \
        in out.stderr
    out = subprocess.run(TRIREME + ["transactions", "abort", "--topic", "t"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and "--partition" in out.stderr
