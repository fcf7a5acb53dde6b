"""Transactions with the Python clients (confluent-kafka, kafka-python, aiokafka) and kcat against a real Trireme process.

For each client: several transactions across 3 topics × 2 partitions, some committed and some
aborted; a read_committed consumer of the same client sees exactly the committed records, in
order, and no control records, and its position reaches the end offsets; read_uncommitted sees
everything.  A zombie with the same transactional id is fenced.  A transaction left open is
aborted by the coordinator's timeout and read_committed consumers move past it.  KIP-664
tooling through kafka-python 3.0's admin client: list, describe, describe producers, find
hanging, and an abort that the broker refuses because the coordinator has the transaction open
(only a hanging one may be aborted with a marker).  kcat reads read_committed.
"""
from __future__ import annotations

import asyncio
import json
import subprocess
import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from compat_tests.clients import wait_until
from compat_tests.python_clients import create_topics

TOPICS = 3
PARTITIONS = 2
ROUNDS = (True, False, True, True, False)          # commit?
PER_PARTITION = 4
CLIENTS = ("confluent-kafka", "kafka-python", "aiokafka")
TIMEOUT_CONFIG = {"transaction.abort.timed.out.transaction.cleanup.interval.ms": 300}


def make_topics(bootstrap: str, prefix: str) -> list[str]:
    return create_topics(bootstrap, [f"{prefix}-{i}-{uuid.uuid4().hex[:8]}" for i in range(TOPICS)], PARTITIONS)


def open_transaction(bootstrap: str, txn_id: str, topic: str, keys: list[bytes], partition: int) -> Producer:
    """A confluent-kafka transactional producer with a transaction open, its records written (flushed)."""
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id})
    p.init_transactions(30)
    p.begin_transaction()
    for key in keys:
        p.produce(topic, key=key, value=b"x", partition=partition)
    p.flush(30)
    return p


def planned(topics: list[str]) -> list[tuple[bool, list[tuple[str, int, bytes, bytes]]]]:
    """The transactions to run: (commit?, [(topic, partition, key, value)]), records on every partition."""
    rounds = []
    for r, commit in enumerate(ROUNDS):
        recs = [(t, p, b"r%d-%s-%d-%d" % (r, t.encode(), p, i), b"%s-%d" % (b"commit" if commit else b"abort", i))
                for i in range(PER_PARTITION) for t in topics for p in range(PARTITIONS)]
        rounds.append((commit, recs))
    return rounds


def expected(rounds, committed_only: bool) -> dict[tuple[str, int], list[bytes]]:
    out: dict[tuple[str, int], list[bytes]] = {}
    for commit, recs in rounds:
        if committed_only and not commit:
            continue
        for t, p, k, _ in recs:
            out.setdefault((t, p), []).append(k)
    return out


def wait_for_markers(bootstrap: str, tps, end: int) -> None:
    """EndTxn answers once the PREPARE record is durable, as on Kafka; the markers are written right after."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused"})
    try:
        wait_until(lambda: all(c.get_watermark_offsets(TopicPartition(*tp), timeout=10)[1] == end for tp in tps),
                   timeout=20, what="the last transaction's markers")
    finally:
        c.close()


# --------------------------------------------------------------- producers

def run_confluent(bootstrap, txn_id, rounds):
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, "linger.ms": 5})
    p.init_transactions(30)
    for commit, recs in rounds:
        p.begin_transaction()
        for t, part, k, v in recs:
            p.produce(t, key=k, value=v, partition=part)
        p.flush(30)             # so an abort aborts written records, not just queued ones
        if commit:
            p.commit_transaction(30)
        else:
            p.abort_transaction(30)


def run_kafka_python(bootstrap, txn_id, rounds):
    from kafka import KafkaProducer
    p = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=txn_id, linger_ms=5)
    p.init_transactions()
    for commit, recs in rounds:
        p.begin_transaction()
        for t, part, k, v in recs:
            p.send(t, key=k, value=v, partition=part)
        p.flush()
        if commit:
            p.commit_transaction()
        else:
            p.abort_transaction()
    p.close()


def run_aiokafka(bootstrap, txn_id, rounds):
    from aiokafka import AIOKafkaProducer

    async def go():
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=txn_id, linger_ms=5)
        await p.start()
        try:
            for commit, recs in rounds:
                await p.begin_transaction()
                futures = [await p.send(t, key=k, value=v, partition=part) for t, part, k, v in recs]
                await asyncio.gather(*futures)
                if commit:
                    await p.commit_transaction()
                else:
                    await p.abort_transaction()
        finally:
            await p.stop()
    asyncio.run(go())


# --------------------------------------------------------------- consumers

def read_confluent(bootstrap, tps, isolation) -> tuple[dict, dict]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused-" + uuid.uuid4().hex,
                  "isolation.level": isolation, "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(t, p, 0) for t, p in tps])
    got: dict = {}
    ends = {tp: c.get_watermark_offsets(TopicPartition(*tp), timeout=10)[1] for tp in tps}
    deadline = time.time() + 30
    while time.time() < deadline:
        m = c.poll(0.2)
        if m is not None and not m.error():
            got.setdefault((m.topic(), m.partition()), []).append(m.key())
        positions = {(tp.topic, tp.partition): tp.offset for tp in c.position([TopicPartition(*tp) for tp in tps])}
        if m is None and all(positions[tp] >= ends[tp] for tp in tps):
            break
    positions = {(tp.topic, tp.partition): tp.offset for tp in c.position([TopicPartition(*tp) for tp in tps])}
    c.close()
    return got, {tp: (positions[tp], ends[tp]) for tp in tps}


def read_kafka_python(bootstrap, tps, isolation) -> tuple[dict, dict]:
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP
    c = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation, enable_auto_commit=False,
                      auto_offset_reset="earliest")
    parts = [KTP(t, p) for t, p in tps]
    c.assign(parts)
    c.seek_to_beginning(*parts)
    ends = {(tp.topic, tp.partition): off for tp, off in c.end_offsets(parts).items()}
    got: dict = {}
    deadline = time.time() + 30
    while time.time() < deadline:
        batch = c.poll(timeout_ms=200)
        for tp, msgs in batch.items():
            got.setdefault((tp.topic, tp.partition), []).extend(m.key for m in msgs)
        if not batch and all(c.position(tp) >= ends[(tp.topic, tp.partition)] for tp in parts):
            break
    positions = {(tp.topic, tp.partition): (c.position(tp), ends[(tp.topic, tp.partition)]) for tp in parts}
    c.close()
    return got, positions


def read_aiokafka(bootstrap, tps, isolation) -> tuple[dict, dict]:
    from aiokafka import AIOKafkaConsumer
    from aiokafka import TopicPartition as ATP

    async def go():
        c = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation, enable_auto_commit=False,
                             auto_offset_reset="earliest")
        await c.start()
        try:
            parts = [ATP(t, p) for t, p in tps]
            c.assign(parts)
            await c.seek_to_beginning(*parts)
            ends = {(tp.topic, tp.partition): off for tp, off in (await c.end_offsets(parts)).items()}
            got: dict = {}
            deadline = time.time() + 30
            while time.time() < deadline:
                batch = await c.getmany(timeout_ms=200)
                for tp, msgs in batch.items():
                    got.setdefault((tp.topic, tp.partition), []).extend(m.key for m in msgs)
                positions = [await c.position(tp) for tp in parts]
                if not batch and all(pos >= ends[(tp.topic, tp.partition)] for pos, tp in zip(positions, parts)):
                    break
            return got, {(tp.topic, tp.partition): (await c.position(tp), ends[(tp.topic, tp.partition)])
                         for tp in parts}
        finally:
            await c.stop()
    return asyncio.run(go())


PRODUCE = {"confluent-kafka": run_confluent, "kafka-python": run_kafka_python, "aiokafka": run_aiokafka}
READ = {"confluent-kafka": read_confluent, "kafka-python": read_kafka_python, "aiokafka": read_aiokafka}


@pytest.mark.parametrize("client", CLIENTS)
def test_commit_and_abort_across_topics(module_server, client):
    bootstrap = module_server.bootstrap
    topics = make_topics(bootstrap, f"tx-{client}")
    rounds = planned(topics)
    PRODUCE[client](bootstrap, f"txn-{client}-{uuid.uuid4().hex[:6]}", rounds)
    tps = [(t, p) for t in topics for p in range(PARTITIONS)]
    # One marker per transaction per partition.  EndTxn is answered at the commit point; the markers follow.
    per_partition_end = PER_PARTITION * len(ROUNDS) + len(ROUNDS)
    wait_for_markers(bootstrap, tps, per_partition_end)
    committed, positions = READ[client](bootstrap, tps, "read_committed")
    assert committed == expected(rounds, committed_only=True)
    assert all(pos == end == per_partition_end for pos, end in positions.values()), positions
    everything, positions = READ[client](bootstrap, tps, "read_uncommitted")
    assert everything == expected(rounds, committed_only=False)
    assert all(pos == end for pos, end in positions.values()), positions


def test_zombie_is_fenced(module_server):
    """A second producer with the same transactional id fences the first, whose open transaction is aborted."""
    bootstrap = module_server.bootstrap
    (topic,) = make_topics(bootstrap, "zombie")[:1]
    txn_id = "zombie-" + uuid.uuid4().hex[:6]
    zombie = open_transaction(bootstrap, txn_id, topic, [b"zombie-1"], 0)
    fresh = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id})
    fresh.init_transactions(30)
    with pytest.raises(KafkaException) as err:
        zombie.produce(topic, key=b"zombie-2", value=b"x", partition=0)
        zombie.flush(10)
        zombie.commit_transaction(30)
    assert err.value.args[0].fatal() or "fenced" in str(err.value).lower(), err.value
    fresh.begin_transaction()
    fresh.produce(topic, key=b"fresh-1", value=b"y", partition=0)
    fresh.commit_transaction(30)
    committed, _ = read_confluent(bootstrap, [(topic, 0)], "read_committed")
    assert committed == {(topic, 0): [b"fresh-1"]}
    everything, _ = read_confluent(bootstrap, [(topic, 0)], "read_uncommitted")
    assert everything[(topic, 0)][0] == b"zombie-1" and b"fresh-1" in everything[(topic, 0)]


@pytest.mark.server_config(TIMEOUT_CONFIG)
def test_open_transaction_times_out_and_consumers_move_past_it(server):
    bootstrap = server.bootstrap
    (topic,) = make_topics(bootstrap, "timeout")[:1]
    txn_id = "timeout-" + uuid.uuid4().hex[:6]
    stuck = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, "transaction.timeout.ms": 1500})
    stuck.init_transactions(30)
    stuck.begin_transaction()
    for i in range(5):
        stuck.produce(topic, key=b"stuck-%d" % i, value=b"x", partition=0)
    stuck.flush(30)
    # While it is open, read_committed sees nothing and ListOffsets latest (read_committed) is the LSO: 0.
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "g-" + uuid.uuid4().hex,
                  "isolation.level": "read_committed"})
    assert c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10) == (0, 0)
    # ... and a lookup by timestamp (ListOffsets at read_committed) finds nothing below the LSO.
    (found,) = c.offsets_for_times([TopicPartition(topic, 0, 0)], timeout=10)
    assert found.offset == -1, found
    wait_until(lambda: c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1] == 6, timeout=20,
               what="the timed-out transaction's abort marker")
    c.close()
    other = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id + "-next"})
    other.init_transactions(30)
    other.begin_transaction()
    other.produce(topic, key=b"after", value=b"y", partition=0)
    other.commit_transaction(30)
    committed, positions = read_confluent(bootstrap, [(topic, 0)], "read_committed")
    assert committed == {(topic, 0): [b"after"]}
    assert positions[(topic, 0)] == (8, 8)
    assert "timed out" in server.stderr_path.read_text(errors="replace")
    with pytest.raises(KafkaException):       # the stuck producer was fenced by the abort's epoch bump
        stuck.commit_transaction(10)


@pytest.mark.server_config({**TIMEOUT_CONFIG, "trireme.metrics.listen": "127.0.0.1:0"})
def test_transaction_metrics_show_what_holds_the_lso(server):
    """Open transactions per state, the oldest one's age, and HW - LSO per partition, scraped while one is open."""
    import re
    import urllib.request
    bootstrap = server.bootstrap
    (topic,) = make_topics(bootstrap, "metrics")[:1]
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": "metrics-" + uuid.uuid4().hex[:6]})
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(3):
        p.produce(topic, key=b"m%d" % i, value=b"x", partition=0)
    p.flush(30)
    time.sleep(0.3)
    url = re.search(r"metrics on (http://\S+/metrics)", server.stderr_path.read_text(errors="replace")).group(1)
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    assert 'trireme_transactions{state="Ongoing"} 1' in text
    assert float(re.search(r"^trireme_transaction_oldest_open_age_seconds (\S+)", text, re.M).group(1)) >= 0.3
    assert f'trireme_partition_lso_lag{{topic="{topic}",partition="0"}} 3' in text
    assert f'trireme_partition_producers{{topic="{topic}",partition="0"}} 1' in text
    p.commit_transaction(30)
    wait_until(lambda: f'trireme_partition_lso_lag{{topic="{topic}",partition="0"}} 0'
               in urllib.request.urlopen(url, timeout=5).read().decode(), timeout=10, what="LSO lag back to 0")
    wait_until(lambda: 'trireme_transactions{state="CompleteCommit"} 1'
               in urllib.request.urlopen(url, timeout=5).read().decode(), timeout=10, what="CompleteCommit")


def test_kcat_reads_read_committed(module_server, kcat):
    bootstrap = module_server.bootstrap
    topics = make_topics(bootstrap, "kcat-tx")
    rounds = planned(topics)
    run_confluent(bootstrap, "kcat-tx-" + uuid.uuid4().hex[:6], rounds)
    want = expected(rounds, committed_only=True)
    for t in topics:
        for p in range(PARTITIONS):
            out = subprocess.run([kcat, "-b", bootstrap, "-C", "-t", t, "-p", str(p), "-o", "beginning", "-e",
                                  "-X", "isolation.level=read_committed", "-J", "-q"],
                                 capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, out.stderr
            keys = [json.loads(line)["key"].encode() for line in out.stdout.splitlines() if line.strip()]
            assert keys == want[(t, p)]


def test_kip664_tooling_with_kafka_python_admin(module_server):
    """list/describe transactions, describe producers, find hanging, and an admin abort (WriteTxnMarkers sent by
    the admin client with the producer's epoch and coordinator epoch read from DescribeProducers) of a transaction
    that is not hanging: refused (INVALID_TXN_STATE), as a marker would end it behind its coordinator's back."""
    from kafka import KafkaAdminClient
    from kafka import TopicPartition as KTP
    from kafka.admin import AbortTransactionSpec, TransactionState
    from kafka.errors import InvalidTxnStateError
    bootstrap = module_server.bootstrap
    (topic,) = make_topics(bootstrap, "kip664")[:1]
    txn_id = "kip664-" + uuid.uuid4().hex[:6]
    open_txn = open_transaction(bootstrap, txn_id, topic, [b"open-%d" % i for i in range(3)], 1)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        listed = [t for ts in admin.list_transactions(state_filters=["Ongoing"]).values() for t in ts]
        mine = [t for t in listed if t.transactional_id == txn_id]
        assert len(mine) == 1 and mine[0].state == TransactionState.ONGOING, listed
        assert not [t for ts in admin.list_transactions(state_filters=["CompleteCommit"]).values() for t in ts
                    if t.transactional_id == txn_id]
        desc = admin.describe_transactions([txn_id])[txn_id]
        assert desc.state == TransactionState.ONGOING and desc.producer_id == mine[0].producer_id
        assert desc.topic_partitions == {KTP(topic, 1)} and desc.transaction_start_time_ms > 0
        state = admin.describe_producers([KTP(topic, 1)])[KTP(topic, 1)]
        (producer,) = [s for s in state.active_producers if s.producer_id == desc.producer_id]
        assert producer.current_transaction_start_offset == 0 and producer.last_sequence == 2
        assert producer.producer_epoch == desc.producer_epoch
        # Open for seconds, not past the timeout plus the tool's 5 minutes of slack: not hanging.
        assert txn_id not in str(admin.find_hanging_transactions(max_transaction_timeout_ms=0))
        # The coordinator has this transaction open: an admin abort (a marker) is refused and changes nothing.
        with pytest.raises(InvalidTxnStateError):
            admin.abort_transaction(AbortTransactionSpec(KTP(topic, 1), producer.producer_id,
                                                         producer.producer_epoch, producer.coordinator_epoch))
        state = admin.describe_producers([KTP(topic, 1)])[KTP(topic, 1)]
        (producer,) = [s for s in state.active_producers if s.producer_id == desc.producer_id]
        assert producer.current_transaction_start_offset == 0
        open_txn.abort_transaction(30)                # its producer (or its timeout) ends it
    finally:
        admin.close()
    # The coordinator's marker follows the producer's EndTxn: read once it is there.
    wait_until(lambda: read_confluent(bootstrap, [(topic, 1)], "read_committed")[1][(topic, 1)][1] == 4,
               what="the abort marker")
    committed, positions = read_confluent(bootstrap, [(topic, 1)], "read_committed")
    assert committed == {} and positions[(topic, 1)] == (4, 4)
