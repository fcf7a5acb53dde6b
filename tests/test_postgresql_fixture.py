"""The throwaway PostgreSQL of trireme/postgresql.py and the conftest fixtures built on it, against the real server."""
import os
import tempfile

import psycopg
import pytest

from trireme.postgresql import PostgresError, PostgresServer


def _uid(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Uid:"):
                return int(line.split()[1])       # the real uid
    raise AssertionError(f"no Uid line for {pid}")


def test_a_database_round_trips_bytea(postgres_database):
    payload = bytes(range(256)) * 64 + b"\x00"
    with psycopg.connect(postgres_database) as conn:
        conn.execute("CREATE TABLE batches (id int PRIMARY KEY, records bytea NOT NULL)")
        conn.execute("INSERT INTO batches VALUES (1, %s)", (payload,))
        conn.commit()
    with psycopg.connect(postgres_database) as conn:
        (records,) = conn.execute("SELECT records FROM batches WHERE id = 1").fetchone()
    assert bytes(records) == payload


def test_each_test_database_starts_empty(postgres_database):
    with psycopg.connect(postgres_database) as conn:
        tables = conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone()[0]
    assert tables == 0


def test_two_databases_are_independent(postgres):
    a, b = postgres.create_database("independent_a"), postgres.create_database("independent_b")
    try:
        with psycopg.connect(a) as conn:
            conn.execute("CREATE TABLE t (v text)")
            conn.execute("INSERT INTO t VALUES ('only in a')")
        with psycopg.connect(b) as conn:
            assert conn.execute("SELECT to_regclass('public.t')").fetchone()[0] is None
            conn.execute("CREATE TABLE t (v text)")
            assert conn.execute("SELECT count(*) FROM t").fetchone()[0] == 0
        with psycopg.connect(a) as conn:
            assert conn.execute("SELECT v FROM t").fetchall() == [("only in a",)]
    finally:
        postgres.drop_database("independent_a")
        postgres.drop_database("independent_b")


def test_an_immediate_restart_keeps_what_was_committed_and_nothing_else():
    with PostgresServer() as pg:
        port, pid = pg.port, pg.pid
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (v int)")
            conn.execute("INSERT INTO t SELECT generate_series(1, 1000)")
        open_txn = psycopg.connect(pg.dsn)
        open_txn.execute("INSERT INTO t VALUES (-1)")     # never committed
        pg.stop("immediate")
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(pg.dsn, connect_timeout=5)
        open_txn.close()
        pg.start()
        assert pg.port == port and f"@127.0.0.1:{port}/" in pg.dsn
        assert pg.pid != pid
        with psycopg.connect(pg.dsn) as conn:
            assert conn.execute("SELECT count(*), min(v), max(v) FROM t").fetchone() == (1000, 1, 1000)
        pg.restart()
        with psycopg.connect(pg.dsn) as conn:
            assert conn.execute("SELECT count(*) FROM t").fetchone()[0] == 1000


def test_close_stops_the_server_and_removes_its_directory():
    pg = PostgresServer().start()
    directory, pid = pg.directory, pg.pid
    assert os.path.isfile(os.path.join(pg.data_dir, "PG_VERSION"))
    pg.close()
    assert not os.path.exists(directory)
    assert not pg.running and pg.pid is None and pid is not None
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(pg.dsn, connect_timeout=5)


def test_a_failed_start_raises_with_the_log_and_leaves_no_directory(monkeypatch):
    made = []
    real_mkdtemp = tempfile.mkdtemp

    def mkdtemp(**kwargs):                      # the real one, remembering the directory it made
        made.append(real_mkdtemp(**kwargs))
        return made[-1]

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    with pytest.raises(PostgresError, match="unrecognized configuration parameter"):
        PostgresServer(settings={"no_such_setting": "1"}).start()
    assert made and not os.path.exists(made[0])


def test_settings_reach_the_server_and_fsync_is_on_by_default():
    with PostgresServer(settings={"max_connections": 42}) as pg, psycopg.connect(pg.dsn) as conn:
        assert conn.execute("SHOW max_connections").fetchone()[0] == "42"
        assert conn.execute("SHOW fsync").fetchone()[0] == "on"
        assert conn.execute("SHOW synchronous_commit").fetchone()[0] == "on"


@pytest.mark.skipif(os.geteuid() != 0, reason="the server runs as another user only when started as root")
def test_as_root_the_server_runs_as_the_unprivileged_postgres_account(postgres):
    import pwd
    uid = pwd.getpwnam("postgres").pw_uid
    assert uid != 0
    assert _uid(postgres.pid) == uid
    with psycopg.connect(postgres.dsn) as conn:
        backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        assert _uid(backend) == uid
    assert os.stat(postgres.data_dir).st_uid == uid
