"""Keeps every partition's record batches, as produced, in PostgreSQL; the broker's own segments are a cache of them.

The seam is the partition log's durability (docs/architecture.md, "Storage engines").  With the local engine a
flush round fsyncs the segments; with this one the same round is one database transaction (:meth:`commit`) that
inserts every partition's new batches as rows and moves each partition's row to its new log end, fenced by the
node id and leader epoch this broker led it with: a broker deposed meanwhile changes nothing.  Concurrent produce
requests share that transaction as they share an fsync.  The broker's segments stay the local PartitionLog code,
without fsync; they are rebuilt from the rows when the broker takes a partition (:meth:`lead`, :meth:`batches`),
and every read is served from them.

Every call blocks: the broker makes them in its flush thread (after start-up), never on the event loop.  A lost
connection, a database that is down, a commit whose outcome is unknown: :class:`DatabaseUnavailable`, after which
the next call connects again.  The SQL lives in ``sql/``, one statement per file named after what it does.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import uuid
from importlib import resources
from typing import Iterator

import psycopg

from trireme.wire.records import iter_batch_headers

log = logging.getLogger("trireme.postgresql")

SCHEMA_VERSION = 1
# A row holds whole batches up to about this many bytes (a larger batch has a row of its own): rows are what a
# reload streams and what retention deletes.
ROW_BYTES = 1 << 20
CONNECT_TIMEOUT_S = 5


class DatabaseUnavailable(OSError):
    """The database could not be reached, or a commit's outcome is unknown: retry (the next call reconnects)."""


@functools.cache
def sql(name: str) -> str:
    """The statement in ``sql/<name>.sql``."""
    return resources.files(__package__).joinpath("sql", f"{name}.sql").read_text(encoding="utf-8")


PartitionKey = tuple[uuid.UUID, int]


@dataclasses.dataclass(slots=True)
class PartitionAppend:
    """One partition's part of a commit: its batches from ``from_offset`` (the log end its last commit left) to
    ``end_offset``, as rows of (base offset, last offset, bytes), and its log start offset now."""

    key: PartitionKey
    leader_epoch: int
    from_offset: int
    end_offset: int
    start_offset: int
    rows: list[tuple[int, int, bytes]]
    new: bool = False               # created while this broker runs: its row may not exist yet
    # a range a cleaning rewrote, or a piece of it (PostgresEngine.cleaned_piece_end), committed already on the
    # broker: (first offset, end offset, the rows that replace theirs)
    cleaned: list[tuple[int, int, list[tuple[int, int, bytes]]]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(slots=True, frozen=True)
class PartitionRow:
    """A partition's row as the database has it."""

    leader_id: int
    leader_epoch: int
    log_start_offset: int
    log_end_offset: int


class Database:
    """One connection to PostgreSQL, made when first needed and again after it broke, used by one thread at a time:
    every call is a transaction, and any database error is DatabaseUnavailable."""

    def __init__(self, dsn: str, application_name: str):
        self.dsn = dsn
        self.application_name = application_name
        self._conn: psycopg.Connection | None = None
        self._lock = threading.Lock()

    def _connection(self) -> psycopg.Connection:
        conn = self._conn
        if conn is not None and not conn.closed and not conn.broken:
            return conn
        if conn is not None:
            conn.close()
        self._conn = None
        try:
            self._conn = psycopg.connect(self.dsn, autocommit=False, connect_timeout=CONNECT_TIMEOUT_S,
                                         application_name=self.application_name)
        except psycopg.Error as e:
            raise DatabaseUnavailable(f"cannot connect to PostgreSQL: {_reason(e)}") from None
        return self._conn

    def run(self, work):
        """``work(connection)`` in one transaction → its value; any database error → DatabaseUnavailable (rolled
        back, or of unknown outcome when the connection went during the commit)."""
        with self._lock:
            conn = self._connection()
            try:
                with conn.transaction():
                    return work(conn)
            except psycopg.Error as e:
                self._forget_if_broken(conn)
                raise DatabaseUnavailable(f"PostgreSQL: {_reason(e)}") from None

    def stream(self, statement: str, params: dict, itersize: int = 16) -> Iterator[tuple]:
        """The rows of ``statement`` through a server-side cursor, a few at a time; the caller consumes them all
        before its next call."""
        with self._lock:
            conn = self._connection()
            try:
                with conn.transaction(), conn.cursor(name="trireme_stream") as cursor:
                    cursor.itersize = itersize
                    cursor.execute(statement, params)
                    yield from cursor
            except psycopg.Error as e:
                self._forget_if_broken(conn)
                raise DatabaseUnavailable(f"PostgreSQL: {_reason(e)}") from None

    def _forget_if_broken(self, conn) -> None:
        if conn.broken or conn.closed:
            self._conn = None

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


class PostgresEngine:
    def __init__(self, dsn: str, node_id: int):
        self.dsn = dsn
        self.node_id = node_id
        self._db = Database(dsn, f"trireme node {node_id}: commits")
        self._loader = Database(dsn, f"trireme node {node_id}: loads")     # rebuilding a partition never waits
        self._starts: dict[PartitionKey, int] = {}     # each partition's log start as last committed

    def _run(self, work):
        return self._db.run(work)

    def close(self) -> None:
        self._db.close()
        self._loader.close()

    # --- start-up -----------------------------------------------------------------------------------------------

    def start(self, cluster_id: str) -> str:
        """Create the tables when missing; → the cluster id the database keeps (``cluster_id`` on a new one)."""
        def work(conn):
            conn.execute("SELECT pg_advisory_xact_lock(7265447)")       # two brokers creating the tables at once
            conn.execute(sql("schema"))
            conn.execute(sql("cluster_insert"), {"cluster_id": cluster_id, "schema_version": SCHEMA_VERSION})
            return conn.execute(sql("cluster_select")).fetchone()
        found, version = self._run(work)
        if version != SCHEMA_VERSION:
            raise DatabaseUnavailable(f"the database's schema version is {version}; this broker knows "
                                      f"{SCHEMA_VERSION}")
        return found

    def open(self, key: PartitionKey) -> PartitionRow | None:
        """Take a partition the controller named this broker to lead, with a new leader epoch (fencing any earlier
        process of this node id) → its row; None if another broker was named meanwhile."""
        topic_id, partition = key
        found = self._loader.run(lambda conn: conn.execute(sql("partition_open"), {
            "topic_id": topic_id, "partition": partition, "node_id": self.node_id}).fetchone())
        if found is None:
            return None
        epoch, start, end = found
        self._starts[key] = start
        return PartitionRow(self.node_id, epoch, start, end)

    def holds_partitions(self) -> bool:
        """Whether the database holds any partition's row (``trireme migrate`` copies only into an empty one)."""
        return self._loader.run(lambda conn: conn.execute(sql("partitions_select")).fetchone()) is not None

    def row(self, key: PartitionKey) -> PartitionRow | None:
        """The partition's row as it is, without taking the partition (a follower's copy of a log)."""
        topic_id, partition = key
        found = self._loader.run(lambda conn: conn.execute(sql("partition_select"), {
            "topic_id": topic_id, "partition": partition}).fetchone())
        return None if found is None else PartitionRow(*found)

    def batches(self, key: PartitionKey, from_offset: int, end_offset: int) -> Iterator[tuple[int, bytes]]:
        """The partition's rows that reach ``from_offset`` and start below ``end_offset``, in offset order: (base
        offset, whole batches), streamed."""
        topic_id, partition = key
        return self._loader.stream(sql("batch_select"), {"topic_id": topic_id, "partition": partition,
                                                         "from_offset": from_offset, "end_offset": end_offset})

    # --- the flush round ----------------------------------------------------------------------------------------

    def cleaned_piece_end(self, key: PartitionKey, first: int, stop: int, end: int) -> int:
        """A cleaned range [first, end) is replaced a piece at a time when its cleaned batches are many (the broker
        reads at most about ROUND_BYTES of them for a commit, up to ``stop``): where the piece from ``first`` ends
        so that none of the rows it replaces crosses it (a row start; ``end`` at the most).  The cleaned batches keep
        the offsets of the batches they come from, so none crosses a row start either."""
        topic_id, partition = key
        return self._run(lambda conn: conn.execute(sql("batch_piece_end"), {
            "topic_id": topic_id, "partition": partition, "first_offset": first, "stop_offset": stop,
            "end_offset": end}).fetchone()[0])

    def commit(self, appends: list[PartitionAppend], deleted: list[PartitionKey]) -> dict[PartitionKey, PartitionRow]:
        """One transaction: each partition's rows inserted and its row moved to its new log end (rows wholly below
        its log start deleted), and the deleted partitions' rows and batches gone.  → {key: the partition's row as
        found} for the appends that did not apply because the row was not where this broker left it: led by
        another broker or at another epoch (fenced), or already at a later log end (a commit whose answer was lost
        did commit).  Raises DatabaseUnavailable (nothing is known to be committed)."""
        def work(conn):
            cursor = conn.cursor()
            refused: dict[PartitionKey, PartitionRow] = {}
            for key in deleted:
                cursor.execute(sql("partition_delete"), {"topic_id": key[0], "partition": key[1]})
            rows = []
            for a in appends:
                params = {"topic_id": a.key[0], "partition": a.key[1], "node_id": self.node_id,
                          "leader_epoch": a.leader_epoch}
                if a.new:
                    cursor.execute(sql("partition_insert_new"), params)
                cursor.execute(sql("partition_append"), {**params, "from_offset": a.from_offset,
                                                         "end_offset": a.end_offset, "start_offset": a.start_offset})
                if cursor.fetchone() is None:
                    found = cursor.execute(sql("partition_select"), params).fetchone()
                    refused[a.key] = PartitionRow(*found) if found else PartitionRow(-1, -1, 0, 0)
                    continue
                rows.extend({**params, "base_offset": base, "last_offset": last, "data": data}
                            for base, last, data in a.rows)
                for first, end, cleaned in a.cleaned:
                    cursor.execute(sql("batch_delete_range"), {**params, "first_offset": first, "end_offset": end})
                    rows.extend({**params, "base_offset": base, "last_offset": last, "data": data}
                                for base, last, data in cleaned)
                if a.start_offset > self._starts.get(a.key, 0):
                    cursor.execute(sql("batch_delete_below"), {**params, "start_offset": a.start_offset})
            if rows:
                cursor.executemany(sql("batch_insert"), rows)
            return refused
        refused = self._run(work)
        for key in deleted:
            self._starts.pop(key, None)
        for a in appends:
            if a.key not in refused:
                self._starts[a.key] = max(self._starts.get(a.key, 0), a.start_offset)
        return refused


def load_partition(engine: PostgresEngine, key: PartitionKey, log, now_ms: int, row: PartitionRow) -> int:
    """Rebuild ``log``, empty, from the partition's rows, as ``row`` (what :meth:`PostgresEngine.open` gave, or the
    row a follower read) says they are: the batches keep their offsets, the log start is the row's → the leader
    epoch."""
    append_rows(engine, key, log, now_ms, row.log_start_offset, row.log_end_offset)
    if log.log_end_offset < row.log_start_offset:
        log.truncate_fully_and_start_at(row.log_start_offset)
    elif log.log_start_offset < row.log_start_offset:
        log.delete_records(row.log_start_offset)
    if log.log_end_offset != row.log_end_offset:
        raise DatabaseUnavailable(f"partition {key[0]}-{key[1]}: its rows end at {log.log_end_offset}, its row says "
                                  f"{row.log_end_offset}")
    return row.leader_epoch


def append_rows(engine: PostgresEngine, key: PartitionKey, log, now_ms: int, from_offset: int,
                end_offset: int) -> None:
    """Append to ``log`` the partition's rows from ``from_offset`` (at or past its log end) to ``end_offset``."""
    append_committed(log, engine.batches(key, from_offset, end_offset), now_ms)


def append_committed(log, rows, now_ms: int) -> None:
    """Append rows of (base offset, batches) as the database has them to ``log``, the batches with their offsets (any
    below its log end skipped), and mark them durable: they are committed."""
    for _base, data in rows:
        buf = bytearray(data)
        batches = [(pos, h) for pos, h in iter_batch_headers(buf) if h.base_offset >= log.log_end_offset]
        if batches:
            first = batches[0][0]
            log.append(memoryview(buf)[first:], [(pos - first, h) for pos, h in batches], now_ms, keep_offsets=True)
    log.flush_done(log.flush_begin())


def rows_of(log, from_offset: int, target: int, max_bytes: int) -> tuple[list[tuple[int, int, bytes]], int]:
    """A partition log's batches from ``from_offset`` towards ``target``, at most about ``max_bytes`` of them (at
    least one batch), as rows of (base offset, last offset, bytes) of about ROW_BYTES each, none across a segment
    boundary → (rows, the offset after the last batch).  Reads batch headers only."""
    rows: list[tuple[int, int, bytes]] = []
    offset, taken = from_offset, 0
    bases = log.segment_base_offsets
    while offset < target and (taken < max_bytes or not rows):
        segment_end = next((b for b in bases if b > offset), target)
        data = log.read(offset, ROW_BYTES, min(target, segment_end))
        if not data:
            break
        first = last = None
        for _pos, header in iter_batch_headers(data):
            if first is None:
                first = header.base_offset
            last = header.base_offset + header.last_offset_delta
        rows.append((first, last, bytes(data)))
        taken += len(data)
        offset = last + 1
    return rows, offset


def _reason(error: psycopg.Error) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
