"""``trireme migrate``: a stopped local broker's data directory copied into PostgreSQL, then served by a broker on the
PostgreSQL engine with every record at its offset (timestamps, keys, headers as produced) and the groups' offsets."""
from __future__ import annotations

import subprocess

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from compat_tests.clients import kcat_consume
from compat_tests.cluster_support import cluster_config
from compat_tests.conftest import ServerProcess
from compat_tests.test_admin_cli import TRIREME

pytestmark = pytest.mark.trireme_only("migrates a trireme data directory into a PostgreSQL of its own")


def migrate(data_dir, dsn: str) -> subprocess.CompletedProcess:
    return subprocess.run(TRIREME + ["migrate", "--data-dir", str(data_dir), "--dsn", dsn],
                          capture_output=True, text=True, timeout=120)


def records(bootstrap: str, topic: str, partitions: int) -> list:
    return [(p, r.offset, r.timestamp, r.key, r.value, r.headers) for p in range(partitions)
            for r in kcat_consume(bootstrap, topic, p)]


def committed(bootstrap: str, group: str, topic: str, partitions: int) -> list[int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        return [tp.offset for tp in consumer.committed([TopicPartition(topic, p) for p in range(partitions)], 30)]
    finally:
        consumer.close()


def test_a_local_data_directory_is_served_from_postgresql_after_the_migration(tmp_path, postgres_database):
    topic, partitions = "orders", 3
    local = ServerProcess(tmp_path / "broker")
    local.start()
    try:
        admin = AdminClient({"bootstrap.servers": local.bootstrap})
        admin.create_topics([NewTopic(topic, partitions, 1, config={"retention.ms": "86400000"})])[topic].result(30)
        producer = Producer({"bootstrap.servers": local.bootstrap, "acks": "all", "enable.idempotence": True})
        for i in range(60):
            producer.produce(topic, key=b"k%d" % i, value=b"v%d" % i, partition=i % partitions,
                             timestamp=1_700_000_000_000 + i, headers=[("h", b"%d" % i)])
        assert producer.flush(30) == 0
        consumer = Consumer({"bootstrap.servers": local.bootstrap, "group.id": "billing",
                             "enable.auto.commit": False})
        consumer.commit(offsets=[TopicPartition(topic, p, 5 + p) for p in range(partitions)], asynchronous=False)
        consumer.close()
        before = records(local.bootstrap, topic, partitions)
    finally:
        assert local.stop() == 0
    assert len(before) == 60

    done = migrate(local.data_dir, postgres_database)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("migrated ")

    served = ServerProcess(tmp_path / "broker", config=cluster_config(postgres_database, 1))
    served.start()
    try:
        assert records(served.bootstrap, topic, partitions) == before
        assert committed(served.bootstrap, "billing", topic, partitions) == [5, 6, 7]
        admin = AdminClient({"bootstrap.servers": served.bootstrap})
        configs = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)])
        assert next(iter(configs.values())).result(30)["retention.ms"].value == "86400000"
    finally:
        served.stop()

    again = migrate(local.data_dir, postgres_database)              # the database is no longer empty
    assert again.returncode == 1 and "migrate into an empty database" in again.stderr


def test_open_transactions_are_refused_with_a_message(tmp_path, postgres_database):
    local = ServerProcess(tmp_path / "broker")
    local.start()
    try:
        admin = AdminClient({"bootstrap.servers": local.bootstrap})
        admin.create_topics([NewTopic("ledger", 1, 1)])["ledger"].result(30)
        producer = Producer({"bootstrap.servers": local.bootstrap, "transactional.id": "ledger-writer"})
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.produce("ledger", value=b"unfinished", partition=0)
        assert producer.flush(30) == 0
    finally:
        assert local.stop() == 0
    done = migrate(local.data_dir, postgres_database)
    assert done.returncode == 1
    assert done.stderr.startswith("trireme migrate: transactions are still open on ledger-0 (producer ")
