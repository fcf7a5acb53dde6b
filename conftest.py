"""Test-wide settings and fixtures: in CI (CI=true) hypothesis runs derandomized (a fixed seed) with no example database;
``postgres`` / ``postgres_database`` give tests a real PostgreSQL (trireme/postgresql.py)."""
import itertools
import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("ci", derandomize=True, database=None, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "dev"))

_databases = itertools.count(1)


def _postgres_server():
    """A started throwaway PostgreSQL, closed after.  Skips when the machine lacks PostgreSQL; under CI (CI=true),
    where `make test` installs it, fails instead."""
    from trireme.postgresql import PostgresServer, PostgresUnavailable
    server = PostgresServer()
    try:
        server.start()
    except PostgresUnavailable as e:
        if os.environ.get("CI"):
            pytest.fail(f"CI: {e}", pytrace=False)
        pytest.skip(str(e))
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def postgres():
    """One throwaway PostgreSQL server for the session (one per xdist worker: each its own directory and port).
    Tests that stop or restart a server use ``own_postgres``."""
    yield from _postgres_server()


@pytest.fixture
def own_postgres():
    """A throwaway PostgreSQL of the test's own, which it may stop, crash or restart."""
    yield from _postgres_server()


@pytest.fixture
def postgres_database(postgres):
    """The DSN of a new, empty database on the session's server, dropped after the test."""
    name = f"test_{next(_databases)}"
    dsn = postgres.create_database(name)
    try:
        yield dsn
    finally:
        postgres.drop_database(name)
