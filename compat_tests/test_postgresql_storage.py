"""The PostgreSQL storage engine with real clients and real processes: `trireme serve` with
trireme.storage=postgresql against a real PostgreSQL, killed with SIGKILL, cut off from its database, and run
through the compatibility suite's quick matrix."""
from __future__ import annotations

import base64
import re
import time
import uuid

import psycopg
import pytest
from confluent_kafka import TopicCollection
from confluent_kafka.admin import AdminClient

from compat_tests.clients import wait_until
from compat_tests.conftest import ServerProcess
from compat_tests.test_log_cleaner_server import CLEANER, _cleaned, _create, _produce, _read_all
from compat_tests.python_clients import unique_topic
from compat_tests.test_crash import (PARTITIONS, Stream, check_acked_present, check_dense,
                                     consume_all, create_topic, kill_mid_stream)
from trireme.wire import records

pytestmark = pytest.mark.trireme_only("starts trireme serve processes on a PostgreSQL of its own")


def postgresql_server(workdir, dsn: str, **config) -> ServerProcess:
    server = ServerProcess(workdir, config={"trireme.storage": "postgresql", "trireme.storage.postgresql.dsn": dsn,
                                            **config})
    server.start()
    return server


def database_offsets(dsn: str, topic_id: str) -> dict[int, tuple[int, int]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT partition, log_start_offset, log_end_offset FROM trireme_partition "
                            "WHERE topic_id = %s", (topic_id,)).fetchall()
    return {p: (start, end) for p, start, end in rows}


def topic_id_of(server, topic: str) -> uuid.UUID:
    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    described = admin.describe_topics(TopicCollection([topic]))[topic].result(15)
    return uuid.UUID(bytes=base64.urlsafe_b64decode(str(described.topic_id) + "=="))


def test_acknowledged_records_are_in_the_database_and_survive_sigkill(tmp_path, postgres_database):
    """A librdkafka acks=all stream, SIGKILL mid-stream, restart: every acknowledged record is where its delivery
    report put them, offsets dense; the database's rows end where the log ends."""
    server = postgresql_server(tmp_path / "broker", postgres_database)
    try:
        topic = unique_topic("pg-crash")
        create_topic(server, topic)
        stream = Stream(server, topic, total=8000, rate=6000).start()
        kill_mid_stream(server, stream, at_acked=2500)
        stream.join()
        assert len(stream.acked) > 2500
        stored = consume_all(server, topic)
        check_dense(topic, stored)
        check_acked_present(stream, stored)
        ends = database_offsets(postgres_database, topic_id_of(server, topic))
        assert {p: end for p, (_start, end) in ends.items()} == {p: len(stored[p]) for p in range(PARTITIONS)}
    finally:
        server.stop()


def test_a_database_outage_refuses_writes_retriably_and_loses_nothing(tmp_path, own_postgres):
    """PostgreSQL stops (immediate mode: a crash) under an idempotent stream and starts again 3 s later: the
    broker's partitions go offline (KAFKA_STORAGE_ERROR, which the client retries) and come back by themselves;
    every record the client was told was written is there exactly once."""
    database = own_postgres
    server = None
    try:
        dsn = database.create_database("outage")
        server = postgresql_server(tmp_path / "broker", dsn)
        topic = unique_topic("pg-outage")
        create_topic(server, topic)
        stream = Stream(server, topic, total=6000, rate=1000, idempotent=True,
                        extra={"message.timeout.ms": 120000}).start()
        stream.wait_acked(1000)
        database.stop("immediate")
        time.sleep(3)
        database.start()
        stream.join(timeout=180)
        assert stream.failed == {}
        log = server.log_text()
        assert re.search(r"partition\(s\) offline: PostgreSQL", log), log[-3000:]
        assert "is back online" in log
        stored = consume_all(server, topic)
        check_dense(topic, stored)
        check_acked_present(stream, stored)
        values = [v for recs in stored.values() for _, v in recs]
        assert len(values) == len(set(values)) == 6000
    finally:
        if server is not None:
            server.stop()


def stored_records(dsn: str, topic_id: uuid.UUID, partition: int = 0) -> list[tuple[int, bytes]]:
    """(offset, key) of every record in the partition's rows, as the database holds them (read in the test only)."""
    out = []
    with psycopg.connect(dsn) as conn:
        for (data,) in conn.execute("SELECT data FROM trireme_batch WHERE topic_id = %s AND partition = %s "
                                    "ORDER BY base_offset", (topic_id, partition)):
            for pos, _header in records.iter_batch_headers(bytes(data)):
                out += [(r.offset, r.key) for r in records.decode_records(bytes(data), pos)]
    return out


def test_a_cleaning_compacts_the_databases_copy_too(tmp_path, postgres_database):
    """A compacted topic cleaned on the broker: the rows are replaced by the cleaned batches (offsets kept, gaps
    left), so the database does not keep every old value; the broker, restarted (its cache rebuilt from the rows),
    serves the cleaned log."""
    server = postgresql_server(tmp_path / "broker", postgres_database, **CLEANER)
    try:
        name = unique_topic("pg-compacted")
        _create(server, name, {"cleanup.policy": "compact", "segment.bytes": "1024"})
        _produce(server, name, [(b"k%d" % (i % 5), b"v%d" % i) for i in range(60)])
        topic_id = topic_id_of(server, name)
        wait_until(lambda: _cleaned(server, name), timeout=60, what="a cleaning")
        wait_until(lambda: len(stored_records(postgres_database, topic_id)) < 60, timeout=30,
                   what="the cleaned rows")
        stored = stored_records(postgres_database, topic_id)
        offsets = [offset for offset, _ in stored]
        assert offsets == sorted(set(offsets)) and offsets[-1] == 59
        assert {key for _, key in stored} == {b"k%d" % k for k in range(5)}
        assert [offset for offset, _, _ in _read_all(server, name)] == offsets
        server.kill9()
        assert [offset for offset, _, _ in _read_all(server, name)] == offsets
    finally:
        server.stop()
