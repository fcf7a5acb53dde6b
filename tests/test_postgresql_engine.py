"""The PostgreSQL storage engine (server/postgresql/engine.py) against a real PostgreSQL: commits, fencing by leader
epoch, a lost commit answer, and a partition log rebuilt from its rows."""
from __future__ import annotations

import uuid

import psycopg
import pytest

from trireme.server.postgresql.engine import (ROW_BYTES, DatabaseUnavailable, PartitionAppend, PostgresEngine,
                                              load_partition, rows_of)
from trireme.state.log import PartitionLog
from trireme.state.storage import MemoryStorage

from tests.test_log import append, make_batch, read_all, values_of

TOPIC = uuid.UUID(int=77)


def _log(storage=None, name="p") -> PartitionLog:
    return PartitionLog.open(storage or MemoryStorage(), name, now_ms=0, unsafe_no_fsync=True)


def take(engine: PostgresEngine, key=(TOPIC, 0)):
    """The partition named to ``engine``'s broker (as the controller would: a row for a new one) and taken by it
    (PostgresEngine.open: a new leader epoch) → its row."""
    with psycopg.connect(engine.dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO trireme_partition VALUES (%s, %s, %s, 0, 0, 0) ON CONFLICT (topic_id, partition) "
                     "DO UPDATE SET leader_id = EXCLUDED.leader_id", (key[0], key[1], engine.node_id))
    return engine.open(key)


def reload(engine: PostgresEngine, log: PartitionLog, key=(TOPIC, 0)) -> int:
    """``log`` rebuilt from the partition's rows, the partition taken by ``engine``'s broker → its leader epoch."""
    return load_partition(engine, key, log, 0, take(engine, key))


def _commit_all(engine: PostgresEngine, log: PartitionLog, epoch: int, partition: int = 0, new: bool = False):
    start = log.durable_offset
    rows, end = rows_of(log, start, log.log_end_offset, 1 << 30)
    refused = engine.commit([PartitionAppend((TOPIC, partition), epoch, start, end, log.log_start_offset, rows,
                                             new)], [])
    if not refused:
        log.flush_done(end)
    return refused


@pytest.fixture
def engine(postgres_database):
    e = PostgresEngine(postgres_database, node_id=1)
    e.start("cluster-a")
    yield e
    e.close()


def test_the_first_broker_names_the_cluster_and_later_ones_find_it(postgres_database):
    first, second = PostgresEngine(postgres_database, 1), PostgresEngine(postgres_database, 2)
    try:
        assert first.start("cluster-a") == "cluster-a"
        assert second.start("cluster-b") == "cluster-a"
    finally:
        first.close()
        second.close()


def test_committed_batches_come_back_with_their_offsets_into_a_new_log(engine):
    log = _log()
    for i in range(5):
        append(log, make_batch([b"a%d" % i, b"b%d" % i]))
    assert _commit_all(engine, log, 0, new=True) == {}
    copy = _log()
    epoch = reload(engine, copy)
    assert epoch == 1                                   # leading it again: a new epoch
    assert (copy.log_start_offset, copy.log_end_offset, copy.high_watermark) == (0, 10, 10)
    assert read_all(copy) == read_all(log)


def test_a_deposed_leaders_commit_changes_nothing(postgres_database):
    """Node 2 takes the partition (a new leader epoch); node 1's commit at its old epoch is refused, with the row
    as found, and none of its batches is stored."""
    one, two = PostgresEngine(postgres_database, 1), PostgresEngine(postgres_database, 2)
    try:
        one.start("c")
        two.start("c")
        log = _log()
        append(log, make_batch([b"first"]))
        assert _commit_all(one, log, 0, new=True) == {}
        taken = take(two)
        assert (taken.leader_id, taken.leader_epoch, taken.log_end_offset) == (2, 1, 1)
        append(log, make_batch([b"too late"]))
        refused = _commit_all(one, log, 0)
        assert refused[(TOPIC, 0)].leader_id == 2 and refused[(TOPIC, 0)].leader_epoch == 1
        copy = _log()
        reload(two, copy)
        assert values_of(read_all(copy)) == [b"first"]
    finally:
        one.close()
        two.close()


def test_a_commit_whose_answer_was_lost_is_found_committed(engine):
    """Committing the same batches again (the first answer lost) is refused with the row at their end: the caller
    then knows they are durable."""
    log = _log()
    append(log, make_batch([b"x"]))
    rows, end = rows_of(log, 0, log.log_end_offset, 1 << 30)
    again = PartitionAppend((TOPIC, 0), 0, 0, end, 0, rows, True)
    assert engine.commit([again], []) == {}
    row = engine.commit([again], [])[(TOPIC, 0)]
    assert (row.leader_id, row.leader_epoch, row.log_end_offset) == (1, 0, end)


def test_rows_hold_whole_batches_of_about_row_bytes_and_never_cross_a_segment(engine):
    log = PartitionLog.open(MemoryStorage(), "p", now_ms=0, unsafe_no_fsync=True, segment_bytes=3 * ROW_BYTES)
    for _ in range(10):
        append(log, make_batch([b"v" * 400_000]))
    rows, end = rows_of(log, 0, log.log_end_offset, 1 << 40)
    assert end == 10 and [r[0] for r in rows] == sorted(r[0] for r in rows)
    bases = set(log.segment_base_offsets)
    for base, last, data in rows:
        assert len(data) <= ROW_BYTES + 400_100
        assert not any(base < b <= last for b in bases), (base, last, bases)
    assert b"".join(r[2] for r in rows) == read_all(log)
    limited, stop = rows_of(log, 0, log.log_end_offset, 1)     # a round's limit: at least one row
    assert len(limited) == 1 and stop == limited[0][1] + 1


def test_the_log_start_moves_and_rows_below_it_go(engine, postgres_database):
    log = PartitionLog.open(MemoryStorage(), "p", now_ms=0, unsafe_no_fsync=True, segment_bytes=300)
    for i in range(8):
        append(log, make_batch([b"%d" % i * 100]))
    assert _commit_all(engine, log, 0, new=True) == {}
    log.delete_records(5)
    assert _commit_all(engine, log, 0) == {}
    with psycopg.connect(postgres_database) as conn:
        lowest = conn.execute("SELECT min(last_offset) FROM trireme_batch").fetchone()[0]
    assert lowest >= 4                      # the row holding offset 4 may stay (it reaches the start)
    copy = _log()
    reload(engine, copy)
    assert (copy.log_start_offset, copy.log_end_offset) == (5, 8)
    assert values_of(read_all(copy)) == [b"%d" % i * 100 for i in range(5, 8)]


def test_a_log_whose_rows_are_all_gone_starts_at_its_log_start(engine):
    log = _log()
    for i in range(3):
        append(log, make_batch([b"%d" % i]))
    assert _commit_all(engine, log, 0, new=True) == {}
    log.delete_records(3)
    assert _commit_all(engine, log, 0) == {}
    copy = _log()
    reload(engine, copy)
    assert (copy.log_start_offset, copy.log_end_offset) == (3, 3)


def test_a_deleted_partition_is_forgotten(engine):
    log = _log()
    append(log, make_batch([b"gone"]))
    assert _commit_all(engine, log, 0, new=True) == {}
    engine.commit([], [(TOPIC, 0)])
    copy = _log()
    assert reload(engine, copy) == 1        # a new row (epoch 0), taken once
    assert copy.log_end_offset == 0


def test_an_unreachable_database_is_database_unavailable():
    engine = PostgresEngine("postgresql://nobody@127.0.0.1:1/none", node_id=1)
    with pytest.raises(DatabaseUnavailable):
        engine.start("c")
