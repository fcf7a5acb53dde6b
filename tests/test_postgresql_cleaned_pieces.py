"""A cleaning's rewrite reaches the PostgreSQL engine's rows a piece at a time (Broker._cleaned_piece,
PostgresEngine.cleaned_piece_end): each commit reads at most about ROUND_BYTES of cleaned batches, and at no point
does the database lose a record the cleaned log keeps.  A real broker (in-process) on a real PostgreSQL."""
from __future__ import annotations

import psycopg
from confluent_kafka import Producer

from trireme.server import broker as broker_mod
from trireme.server.admin.client import Client
from trireme.server.postgresql import engine as engine_mod
from trireme.server.postgresql.engine import PostgresEngine
from trireme.testing import TriremeBroker
from trireme.wire import records

from compat_tests.clients import wait_until

TOPIC = "compacted"
KEYS = 150


def _records(datas) -> list[tuple[int, bytes, bytes]]:
    """(offset, key, value) of every record in these rows' bytes."""
    out = []
    for data in datas:
        for pos, _header in records.iter_batch_headers(bytes(data)):
            out += [(r.offset, r.key, r.value) for r in records.decode_records(bytes(data), pos)]
    return out


def _stored(dsn: str, topic_id) -> list[tuple[int, bytes, bytes]]:
    """(offset, key, value) of every record the database keeps for partition 0, in row order."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT data FROM trireme_batch WHERE topic_id = %s AND partition = 0 ORDER BY base_offset",
                            (topic_id,)).fetchall()
    return _records(data for (data,) in rows)


def test_a_long_cleaned_range_replaces_the_rows_a_piece_at_a_time_and_loses_nothing(tmp_path, postgres_database,
                                                                                     monkeypatch):
    monkeypatch.setattr(broker_mod, "ROUND_BYTES", 4096)       # in-process: the broker's own modules
    monkeypatch.setattr(engine_mod, "ROW_BYTES", 1024)         # rows of about 1 KiB: many row starts in a range
    pieces = []
    real_commit = PostgresEngine.commit

    def commit(self, appends, deleted):
        before = {a.key: _stored(postgres_database, a.key[0]) for a in appends if a.cleaned}
        refused = real_commit(self, appends, deleted)
        for a in appends:
            for first, end, rows in a.cleaned:
                after = _stored(postgres_database, a.key[0])
                # exactly the records of [first, end) replaced by the cleaned ones, and the round's new ones added:
                # a row that crossed ``end``, deleted whole, would take records after ``end`` with it
                expected = [r for r in before[a.key] if not first <= r[0] < end] + \
                    _records(data for _, _, data in rows) + _records(data for _, _, data in a.rows)
                pieces.append((first, end, sum(len(data) for _, _, data in rows), after, sorted(expected)))
        return refused
    monkeypatch.setattr(PostgresEngine, "commit", commit)

    broker = TriremeBroker(mode="thread", data_dir=tmp_path / "broker",
                           topics={TOPIC: {"partitions": 1, "configs": {"cleanup.policy": "compact",
                                                                       "segment.bytes": 32768}}},
                           config={"trireme.storage": "postgresql",
                                   "trireme.storage.postgresql.dsn": postgres_database,
                                   "log.cleaner.backoff.ms": 100})
    try:
        broker.start()
        # a record a batch, several requests in flight: a commit round, and so a row, holds several batches
        producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0, "acks": "all",
                             "batch.num.messages": 1})
        produced = []                             # (key, value) at each offset
        for i in range(KEYS * 12):                # each key 12 times: most records superseded
            key, value = b"k%d" % (i % KEYS), b"v%d-" % i + bytes(100)
            produced.append((key, value))
            producer.produce(TOPIC, key=key, value=value, partition=0)
            producer.poll(0)
        assert producer.flush(15) == 0
        with Client(broker.bootstrap) as client:
            topic_id = client.metadata([TOPIC]).topics[0].topic_id
        wait_until(lambda: len(_stored(postgres_database, topic_id)) < KEYS * 6, timeout=60,
                   what="the cleaned rows in the database")
        seen = [-1]

        def settled():                             # no piece committed for a second: the cleanings are through
            done, seen[0] = len(pieces) == seen[0], len(pieces)
            return done
        wait_until(settled, timeout=60, interval=1.0, what="the last piece")
    finally:
        broker.close()

    chained = sum(1 for a, b in zip(pieces, pieces[1:]) if b[0] == a[1])
    assert len(pieces) > 2 and chained >= 2        # ranges replaced in pieces, each from where the last one ended
    # each piece's cleaned batches: about ROUND_BYTES (read a row of about ROW_BYTES at a time), or on to where a
    # row of the database starts
    assert max(size for _, _, size, _, _ in pieces) < 4096 + 4 * 1024
    for _first, _end, _size, stored, expected in pieces:
        assert stored == expected
        offsets = [offset for offset, _, _ in stored]
        assert offsets == sorted(set(offsets))     # no record twice: no row kept beside its replacement
        # below the database's end (pieces commit while records are still produced), every key's latest record is
        # there after every piece: a cleaning drops only records a later one of the same key supersedes, so
        # nothing the cleaned log keeps was lost
        latest = {key: (offset, value) for offset, (key, value) in enumerate(produced[:offsets[-1] + 1])}
        have = {key: (offset, value) for offset, key, value in stored}
        assert have == latest
    assert len(pieces[-1][3]) < KEYS * 6
