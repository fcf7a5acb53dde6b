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

from compat_tests.conftest import ServerProcess
from compat_tests.python_clients import unique_topic
from compat_tests.test_crash import (FAST_RECONNECT, PARTITIONS, Stream, check_acked_present, check_dense,
                                     consume_all, create_topic, kill_mid_stream)

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


def test_a_database_outage_refuses_writes_retriably_and_loses_nothing(tmp_path):
    """PostgreSQL stops (immediate mode: a crash) under an idempotent stream and starts again 3 s later: the
    broker's partitions go offline (KAFKA_STORAGE_ERROR, which the client retries) and come back by themselves;
    every record the client was told was written is there exactly once."""
    from trireme.postgresql import PostgresServer, PostgresUnavailable
    database = PostgresServer()
    try:
        database.start()
    except PostgresUnavailable as e:
        pytest.skip(str(e))
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
        database.close()
