"""The log cleaner's runtime against a real Trireme process: retention by cleanup.policy, segment.ms rolling,
cleaning of compacted topics, dump-log."""
from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from compat_tests.clients import wait_until
from compat_tests.python_clients import OP_TIMEOUT_S, unique_topic

pytestmark = pytest.mark.timeout(120)

HOUR_MS = 3_600_000


def _create(server, name: str, configs: dict[str, str]) -> None:
    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    admin.create_topics([NewTopic(name, 1, 1, config=configs)])[name].result(timeout=OP_TIMEOUT_S)


def _produce(server, topic: str, items, timestamp_ms: int | None = None) -> None:
    producer = Producer({"bootstrap.servers": server.bootstrap, "linger.ms": 0, "batch.num.messages": 1})
    for key, value in items:
        kwargs = {"timestamp": timestamp_ms} if timestamp_ms is not None else {}
        producer.produce(topic, key=key, value=value, **kwargs)
        producer.flush(OP_TIMEOUT_S)     # one batch per record: many segments
    assert producer.flush(OP_TIMEOUT_S) == 0


def _watermarks(server, topic: str) -> tuple[int, int]:
    consumer = Consumer({"bootstrap.servers": server.bootstrap, "group.id": "wm"})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=OP_TIMEOUT_S, cached=False)
    finally:
        consumer.close()


@pytest.mark.server_config({"log.retention.check.interval.ms": 100})
def test_time_and_size_retention_only_where_the_policy_includes_delete(server):
    """Kafka's UnifiedLog.deleteOldSegments: retention.ms / retention.bytes delete segments only when
    cleanup.policy includes delete; a compact-only topic keeps everything for the cleaner."""
    old = int(time.time() * 1000) - HOUR_MS          # past retention.ms below
    topics = {policy: unique_topic(f"retention-{policy.replace(',', '-')}") for policy in
              ("compact", "delete", "compact,delete")}
    for policy, name in topics.items():
        _create(server, name, {"cleanup.policy": policy, "segment.bytes": "200", "retention.ms": "1000",
                               "retention.bytes": "300"})
        _produce(server, name, [(f"k{i}".encode(), b"v" * 50) for i in range(20)], timestamp_ms=old)
    for policy in ("delete", "compact,delete"):
        wait_until(lambda: _watermarks(server, topics[policy])[0] > 0, timeout=30,
                   what=f"retention of the {policy} topic")
    time.sleep(0.5)                                   # several more retention rounds
    assert _watermarks(server, topics["compact"]) == (0, 20)


def _segment_files(server, topic: str) -> list[str]:
    return sorted(p.name for p in (server.data_dir / "logs" / f"{topic}-0").glob("*.log"))


def test_segment_ms_rolls_the_active_segment_on_the_next_append(server):
    """Kafka rolls on append: a segment whose first batch is more than segment.ms older than the appended one rolls,
    whatever its size (here far below segment.bytes)."""
    name = unique_topic("segment-ms")
    _create(server, name, {"cleanup.policy": "compact", "segment.ms": "60000"})
    now = int(time.time() * 1000)
    _produce(server, name, [(b"a", b"1"), (b"b", b"2")], timestamp_ms=now - 10 * 60_000)
    assert len(_segment_files(server, name)) == 1
    _produce(server, name, [(b"a", b"3")], timestamp_ms=now - 9 * 60_000)    # within segment.ms: no roll
    assert len(_segment_files(server, name)) == 1
    _produce(server, name, [(b"c", b"4")], timestamp_ms=now)                  # 10 minutes on
    assert _segment_files(server, name) == ["00000000000000000000.log", "00000000000000000003.log"]
    assert _watermarks(server, name) == (0, 4)


# --- the cleaner at work (needs state/cleaner.py, cleaner-core's) ------------------------------------------------

CLEANER = {"log.cleaner.backoff.ms": 100, "offsets.topic.segment.bytes": 2048,
           "transaction.state.log.segment.bytes": 2048}


def _read_all(server, topic: str) -> list[tuple[int, bytes | None, bytes | None]]:
    consumer = Consumer({"bootstrap.servers": server.bootstrap, "group.id": unique_topic("reader"),
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=OP_TIMEOUT_S, cached=False)
        consumer.assign([TopicPartition(topic, 0, low)])
        out = []
        deadline = time.monotonic() + 30
        while (not out or out[-1][0] < high - 1) and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                out.append((msg.offset(), msg.key(), msg.value()))
            if out and out[-1][0] >= high - 1:
                break
            if msg is None and high > 0 and _watermarks(server, topic)[1] == high and out and \
                    out[-1][0] >= high - 1:
                break
        return out
    finally:
        consumer.close()


def _cleaned(server, topic: str) -> bool:
    """Whether the cleaner finished a cleaning of the partition (its checkpoint exists)."""
    return (server.data_dir / "logs" / f"{topic}-0" / "cleaner-offset.checkpoint").exists()


@pytest.mark.server_config(CLEANER)
def test_the_cleaner_compacts_a_topic_to_the_latest_value_per_key(server):
    name = unique_topic("compacted")
    _create(server, name, {"cleanup.policy": "compact", "segment.bytes": "1024"})
    _produce(server, name, [(b"k%d" % (i % 5), b"v%d" % i) for i in range(60)])
    wait_until(lambda: _cleaned(server, name), timeout=60, what="a cleaning")
    records = _read_all(server, name)
    latest = {}
    for offset, key, value in records:
        latest[key] = value
    assert latest == {b"k%d" % k: b"v%d" % max(i for i in range(60) if i % 5 == k) for k in range(5)}
    offsets = [offset for offset, _, _ in records]
    assert offsets == sorted(set(offsets)) and len(offsets) < 60      # offsets kept, with gaps
    assert _watermarks(server, name)[1] == 60


def _describe_transaction(server, txn_id: str) -> dict:
    """The transactional id's state at the coordinator, as ``trireme transactions describe`` shows it."""
    import json
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-m", "trireme.server.cli", "transactions", "--bootstrap-server",
                           server.bootstrap, "--json", "describe", "--transactional-id", txn_id],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    described = json.loads(done.stdout)
    described = described[0] if isinstance(described, list) else described
    described.pop("transaction_duration_ms")       # grows with the clock
    return described


@pytest.mark.server_config(CLEANER)
def test_coordinator_logs_are_cleaned_and_replay_to_the_same_state(server):
    """__consumer_offsets and __transaction_state are compacted by the cleaner; after a restart the coordinators
    replay the cleaned logs to the same committed offsets and transactional ids."""
    from confluent_kafka import Consumer as C
    topic = unique_topic("offsets")
    _create(server, topic, {})
    groups = [unique_topic("g") for _ in range(3)]
    consumers = {g: C({"bootstrap.servers": server.bootstrap, "group.id": g, "enable.auto.commit": False})
                 for g in groups}
    try:
        for i in range(120):
            g = groups[i % 3]
            consumers[g].commit(offsets=[TopicPartition(topic, 0, i)], asynchronous=False)
        expected = {g: consumers[g].committed([TopicPartition(topic, 0)], timeout=OP_TIMEOUT_S)[0].offset
                    for g in groups}
    finally:
        for c in consumers.values():
            c.close()
    txn_ids = [unique_topic("txn") for _ in range(2)]
    for txn_id in txn_ids:
        producer = Producer({"bootstrap.servers": server.bootstrap, "transactional.id": txn_id})
        producer.init_transactions(OP_TIMEOUT_S)
        for i in range(15):
            producer.begin_transaction()
            producer.produce(topic, key=b"t", value=b"%d" % i)
            if i % 3 == 0:
                producer.abort_transaction(OP_TIMEOUT_S)
            else:
                producer.commit_transaction(OP_TIMEOUT_S)
        producer.flush(OP_TIMEOUT_S)
    wait_until(lambda: _cleaned(server, "__consumer_offsets") and _cleaned(server, "__transaction_state"),
               timeout=60, what="cleanings of the coordinators' logs")
    before = [_describe_transaction(server, txn_id) for txn_id in txn_ids]
    assert all(d["transaction_state"] == "CompleteCommit" for d in before)
    server.restart()
    assert [_describe_transaction(server, txn_id) for txn_id in txn_ids] == before
    consumer = C({"bootstrap.servers": server.bootstrap, "group.id": groups[0], "enable.auto.commit": False})
    try:
        for g in groups:
            consumer2 = C({"bootstrap.servers": server.bootstrap, "group.id": g, "enable.auto.commit": False})
            try:
                got = consumer2.committed([TopicPartition(topic, 0)], timeout=OP_TIMEOUT_S)[0].offset
            finally:
                consumer2.close()
            assert got == expected[g]
    finally:
        consumer.close()
    for txn_id in txn_ids:      # the transactional ids survive: a new producer fences the old epoch and goes on
        producer = Producer({"bootstrap.servers": server.bootstrap, "transactional.id": txn_id})
        producer.init_transactions(OP_TIMEOUT_S)
        producer.begin_transaction()
        producer.produce(topic, key=b"t", value=b"after")
        producer.commit_transaction(OP_TIMEOUT_S)


@pytest.mark.server_config({"log.cleaner.backoff.ms": 100, "log.roll.ms": 300})
def test_the_cluster_metadata_log_is_cleaned_and_replays_to_the_same_users(server):
    """__cluster_metadata (SCRAM users here) rolls by segment.ms like any topic and is compacted: upserted and
    deleted users replay to the same set after a restart."""
    from confluent_kafka.admin import (ScramCredentialInfo, ScramMechanism, UserScramCredentialDeletion,
                                       UserScramCredentialUpsertion)
    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    users = [unique_topic("user") for _ in range(4)]
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096)
    for round_ in range(6):
        changes = [UserScramCredentialUpsertion(u, info, b"secret-%d" % round_) for u in users]
        if round_ == 5:
            changes = [UserScramCredentialDeletion(users[0], ScramMechanism.SCRAM_SHA_256)]
        for future in admin.alter_user_scram_credentials(changes).values():
            future.result(timeout=OP_TIMEOUT_S)
        time.sleep(0.4)                              # past segment.ms: the next change rolls the segment

    def described() -> dict:
        got = admin.describe_user_scram_credentials().result(timeout=OP_TIMEOUT_S)
        return {user: sorted((i.mechanism, i.iterations) for i in d.scram_credential_infos)
                for user, d in got.items() if user in users}
    before = described()
    assert sorted(before) == sorted(users[1:])
    wait_until(lambda: _cleaned(server, "__cluster_metadata"), timeout=60, what="a cleaning of __cluster_metadata")
    server.restart()
    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    assert described() == before


@pytest.mark.server_config({**CLEANER, "trireme.metrics.listen": "127.0.0.1:0", "trireme.status.listen": "127.0.0.1:0"})
def test_metrics_status_page_and_dump_log_show_a_cleaning(server):
    import re
    import subprocess
    import sys
    import urllib.request
    from compat_tests.test_metrics import _metrics_url
    url = _metrics_url(server)
    name = unique_topic("seen")
    _create(server, name, {"cleanup.policy": "compact", "segment.bytes": "1024"})
    _produce(server, name, [(b"k%d" % (i % 3), b"v%d" % i) for i in range(40)])
    wait_until(lambda: _cleaned(server, name), timeout=60, what="a cleaning")
    text = ""

    def sample(metric: str) -> float:
        return float(re.search(rf"^{metric} (\S+)$", text, re.M).group(1))

    def counted() -> bool:      # the checkpoint is written with the swap's files, just before the cleaning counts
        nonlocal text
        text = urllib.request.urlopen(url, timeout=5).read().decode()
        return sample("trireme_log_cleaner_cleanings_total") >= 1
    wait_until(counted, timeout=10, what="the cleaning counted")
    assert sample("trireme_log_cleaner_bytes_written_total") > 0
    assert sample("trireme_log_cleaner_last_cleaning_timestamp_seconds") > 0
    assert f'trireme_log_cleaner_dirty_ratio{{topic="{name}",partition="0"}}' in text
    page = urllib.request.urlopen(url.replace("/metrics", "/"), timeout=5).read().decode()
    partitions = page[page.index('<section id="partitions">'):]        # the cluster section lists it too
    row = partitions[partitions.index(name):].split("</tr>", 1)[0]
    assert "cleaned " in row and " ago" in row
    dumped = subprocess.run([sys.executable, "-m", "trireme.server.cli", "dump-log", "--files",
                             str(server.data_dir / "logs" / f"{name}-0"), "--print-data-log"],
                            capture_output=True, text=True, timeout=60)
    assert dumped.returncode == 0, dumped.stderr
    offsets = [int(m) for m in re.findall(r"^\| offset: (\d+) ", dumped.stdout, re.M)]
    assert offsets == sorted(offsets) and len(offsets) < 40      # what compaction removed is not there
    assert "key: k0 payload: v39" in dumped.stdout and "key: k0 payload: v0\n" not in dumped.stdout


def _metadata_records(data_dir) -> list:
    """Every (key, value) record of the data directory's __cluster_metadata log, read from its files."""
    from trireme.state.log import PartitionLog
    from trireme.state.storage import FileStorage
    from trireme.wire import records as rec
    plog = PartitionLog.open(FileStorage(str(data_dir)), "logs/__cluster_metadata-0", now_ms=int(time.time() * 1000))
    found = []
    try:
        offset, end = plog.log_start_offset, plog.log_end_offset
        while offset < end:
            data = plog.read(offset, 1 << 20, end)
            for pos, header in rec.iter_batch_headers(data):
                found += [(bytes(r.key), None if r.value is None else bytes(r.value))
                          for r in rec.decode_records(data, pos)]
                offset = header.next_offset
    finally:
        plog.close()
    return found


@pytest.mark.server_config({"log.cleaner.backoff.ms": 100, "log.roll.ms": 300, "log.cleaner.delete.retention.ms": 0,
                            "log.cleaner.min.cleanable.ratio": 0.01})
def test_the_cluster_metadata_log_keeps_the_latest_record_per_topic_and_drops_deleted_topics(server):
    """Topic records in __cluster_metadata are compacted by the cleaner as the other sections' are: one record per
    live topic, and a deleted topic's tombstone dropped once past the delete horizon (the second cleaning here)."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource
    from trireme.state.cluster_metadata import REMOVE_TOPIC_RECORD, TOPIC_RECORD, decode_key, decode_value, record_type
    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    kept, gone = unique_topic("kept"), [unique_topic("gone") for _ in range(3)]

    def alter_kept(value: str) -> None:
        resource = ConfigResource(ConfigResource.Type.TOPIC, kept, incremental_configs=[
            ConfigEntry("retention.ms", value, incremental_operation=AlterConfigOpType.SET)])
        admin.incremental_alter_configs([resource])[resource].result(timeout=OP_TIMEOUT_S)

    _create(server, kept, {})
    for i, name in enumerate(gone):
        alter_kept(str(1000 + i))
        _create(server, name, {})
        admin.delete_topics([name])[name].result(timeout=OP_TIMEOUT_S)
        time.sleep(0.4)                              # past segment.ms: the next change rolls the segment
    checkpoint = server.data_dir / "logs" / "__cluster_metadata-0" / "cleaner-offset.checkpoint"
    wait_until(checkpoint.exists, timeout=60, what="a cleaning of __cluster_metadata")
    alter_kept("5000")
    time.sleep(0.4)
    _create(server, unique_topic("last"), {})        # rolls the segment holding the last change of kept
    last_segment = max(int(f.name[:-len(".log")]) for f in checkpoint.parent.glob("*.log"))
    time.sleep(0.4)
    _create(server, unique_topic("roll"), {})

    def first_dirty() -> int:
        return int(checkpoint.read_text().split()[1])
    # a cleaning that covered the last change of kept (a cleaning between that change and the roll after it, which
    # the cleaner may well start, leaves it dirty)
    wait_until(lambda: first_dirty() >= last_segment, timeout=60, what="a cleaning past the last change of kept")
    found = []
    server.restart(between=lambda: found.extend(_metadata_records(server.data_dir)))

    topic_records = [(decode_key(k, "TopicRecordKey").topic_id, v) for k, v in found if record_type(k) == TOPIC_RECORD]
    names = [decode_value(v, "TopicRecordValue").name for _, v in topic_records if v is not None]
    assert names.count(kept) == 1                                         # the latest only
    assert not [v for _, v in topic_records if v is None]                 # deleted topics' tombstones gone
    assert len(topic_records) == len({topic_id for topic_id, _ in topic_records})
    removed = sorted(decode_key(k, "RemoveTopicKey").name for k, v in found if record_type(k) == REMOVE_TOPIC_RECORD)
    assert removed == sorted(gone)                   # each deleted name keeps its next leader epoch
    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    configs = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, kept)])
    assert next(iter(configs.values())).result(timeout=OP_TIMEOUT_S)["retention.ms"].value == "5000"
