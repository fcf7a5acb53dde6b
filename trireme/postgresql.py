"""A throwaway PostgreSQL server for tests: initdb into a temporary directory, serve on loopback, remove it all on close.

    from trireme.postgresql import PostgresServer

    with PostgresServer() as pg:
        with psycopg.connect(pg.dsn) as conn:
            ...

It runs the server binaries of the machine's PostgreSQL: Debian's newest ``/usr/lib/postgresql/<version>/bin``,
else ``initdb`` and ``postgres`` found on ``PATH`` (:func:`find_binaries`; :class:`PostgresUnavailable` when
neither has them).  ``start()`` runs ``initdb`` into a new temporary directory, then ``postgres`` listening on
127.0.0.1 at a free port and on a unix socket in that directory, waits until it is ready and creates the
database ``trireme``; ``dsn`` is its ``postgresql://`` URL (the superuser ``trireme`` with a random password).
``create_database()`` / ``drop_database()`` add and remove more.

PostgreSQL refuses to run as root: as root, ``initdb`` and ``postgres`` run as Debian's ``postgres`` account (the
one the ``postgresql`` package creates; ``user=`` names another), the temporary directory owned by it.

Durability is PostgreSQL's default (fsync on, synchronous commit); ``settings`` adds ``-c name=value``
settings (``{"fsync": "off"}`` for speed where a test does not care, ``{"max_connections": 200}``).
``stop(mode)`` shuts down as ``pg_ctl stop -m smart|fast|immediate`` does (immediate: no checkpoint, the next
start recovers from the WAL, as after a crash); ``start()`` again serves the same data on the same port;
``restart()`` is an immediate stop then a start.  ``close()`` (or leaving the ``with``) stops it and removes the
directory.  The server's log is ``log_path`` (``log_text()``); a failed start raises :class:`PostgresError`
carrying its end.
"""
from __future__ import annotations

import glob
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import Mapping

import psycopg

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
SUPERUSER = "trireme"
DATABASE = "trireme"
# pg_ctl's shutdown modes → the signal the postmaster takes for each.
STOP_SIGNALS = {"smart": signal.SIGTERM, "fast": signal.SIGINT, "immediate": signal.SIGQUIT}
_DATABASE_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


class PostgresError(RuntimeError):
    """The server could not start or stop (the message carries the end of its log)."""


class PostgresUnavailable(PostgresError):
    """This machine lacks what a server needs: PostgreSQL's server binaries, or (as root) an account to run them."""


def find_binaries() -> str:
    """The directory holding ``initdb`` and ``postgres``: Debian's newest version, else the one on PATH."""
    def version(path: str) -> tuple[int, ...]:
        name = os.path.basename(os.path.dirname(path))
        return tuple(int(p) for p in name.split(".") if p.isdigit())

    for bindir in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True):
        if all(os.access(os.path.join(bindir, b), os.X_OK) for b in ("initdb", "postgres")):
            return bindir
    initdb = shutil.which("initdb")
    if initdb and os.access(os.path.join(os.path.dirname(initdb), "postgres"), os.X_OK):
        return os.path.dirname(initdb)
    raise PostgresUnavailable("no PostgreSQL server binaries (initdb, postgres) under /usr/lib/postgresql/*/bin or "
                              "on PATH: install Debian's postgresql package (make sysdeps does)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    """One throwaway PostgreSQL cluster (see the module's docstring)."""

    def __init__(self, *, settings: Mapping[str, object] | None = None, user: str = "postgres",
                 bindir: str | None = None):
        self.settings = {str(k): str(v) for k, v in (settings or {}).items()}
        self.bindir = bindir
        self.user = user
        self.port: int | None = None
        self.password = secrets.token_hex(16)
        self.directory: str | None = None          # the temporary directory: data/, the socket, the log
        self._process: subprocess.Popen | None = None
        self._account: pwd.struct_passwd | None = None

    # ------------------------------------------------------------------ addresses

    @property
    def data_dir(self) -> str:
        return os.path.join(self._directory(), "data")

    @property
    def log_path(self) -> str:
        return os.path.join(self._directory(), "postgres.log")

    @property
    def dsn(self) -> str:
        """The ``postgresql://`` URL of the database ``trireme`` over TCP on 127.0.0.1."""
        return self.dsn_for(DATABASE)

    def dsn_for(self, database: str) -> str:
        if self.port is None:
            raise PostgresError("the server was never started")
        return f"postgresql://{SUPERUSER}:{self.password}@127.0.0.1:{self.port}/{database}"

    @property
    def pid(self) -> int | None:
        """The postmaster's process id while it runs."""
        return self._process.pid if self.running else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def log_text(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except (OSError, PostgresError):
            return ""

    def _directory(self) -> str:
        if self.directory is None:
            raise PostgresError("the server was never started")
        return self.directory

    # ------------------------------------------------------------------ life cycle

    def __enter__(self) -> "PostgresServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        where = f"127.0.0.1:{self.port}" if self.running else "stopped"
        return f"<PostgresServer {where} {self.directory}>"

    def start(self) -> "PostgresServer":
        """Start serving: the first time into a new cluster with the database ``trireme``, afterwards the same data
        on the same port."""
        if self.running:
            return self
        if self.directory is not None:
            self._start_postmaster()
            return self
        try:
            self._init_cluster()
            self._start_postmaster()
            self.create_database(DATABASE)
        except BaseException:
            self.close()        # a first start that failed leaves nothing behind
            raise
        return self

    def stop(self, mode: str = "fast") -> None:
        """Shut down as ``pg_ctl stop -m MODE`` does: ``smart`` waits for the clients, ``fast`` disconnects them
        and checkpoints, ``immediate`` stops at once (the next start replays the WAL)."""
        if not self.running:
            return
        self._process.send_signal(STOP_SIGNALS[mode])
        try:
            self._process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
            raise PostgresError(f"PostgreSQL did not stop ({mode}) within {STOP_TIMEOUT_S:.0f}s; killed.\n"
                                + self._log_tail()) from None

    def restart(self, mode: str = "immediate") -> None:
        """Stop (immediate: as a crash of the server would, committed transactions survive in the WAL) and start
        again on the same data and port."""
        self.stop(mode)
        self.start()

    def close(self) -> None:
        """Stop and remove the temporary directory."""
        try:
            if self.running:
                self.stop("immediate")      # the data goes away: nothing to checkpoint
        finally:
            if self.directory is not None:
                shutil.rmtree(self.directory, ignore_errors=True)

    # ------------------------------------------------------------------ databases

    def create_database(self, name: str) -> str:
        """Create an empty database; its DSN."""
        self._check_name(name)
        with psycopg.connect(self.dsn_for("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.dsn_for(name)

    def drop_database(self, name: str) -> None:
        """Drop a database, disconnecting its clients."""
        self._check_name(name)
        with psycopg.connect(self.dsn_for("postgres"), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    @staticmethod
    def _check_name(name: str) -> None:
        if not _DATABASE_NAME.fullmatch(name):
            raise ValueError(f"database name {name!r}: lower-case letters, digits and _, at most 63")

    # ------------------------------------------------------------------ internals

    def _run_as(self) -> dict:
        """Popen's arguments that run a server binary as the unprivileged account when we are root."""
        if self._account is None:
            return {}
        return {"user": self._account.pw_uid, "group": self._account.pw_gid, "extra_groups": []}

    def _init_cluster(self) -> None:
        bindir = self.bindir or find_binaries()
        if os.geteuid() == 0:
            try:
                self._account = pwd.getpwnam(self.user)
            except KeyError:
                raise PostgresUnavailable(f"running as root, PostgreSQL needs an unprivileged account: no user "
                                          f"{self.user!r} (Debian's postgresql package creates 'postgres')") from None
        self.bindir = bindir
        self.directory = tempfile.mkdtemp(prefix="trireme-pg-")
        if self._account is not None:
            os.chown(self.directory, self._account.pw_uid, self._account.pw_gid)
        pwfile = os.path.join(self.directory, "pwfile")
        with open(pwfile, "w") as f:
            f.write(self.password + "\n")
        if self._account is not None:
            os.chown(pwfile, self._account.pw_uid, self._account.pw_gid)
        command = [os.path.join(bindir, "initdb"), "--pgdata", self.data_dir, "--username", SUPERUSER,
                   "--pwfile", pwfile, "--auth", "scram-sha-256", "--encoding", "UTF8", "--locale", "C"]
        with open(self.log_path, "ab") as log:
            result = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=self.directory,
                                    env=self._environment(), **self._run_as())
        os.unlink(pwfile)
        if result.returncode != 0:
            raise PostgresError(f"initdb failed (exit {result.returncode}).\n" + self._log_tail())

    def _environment(self) -> dict[str, str]:
        # No PG* variables of the caller's (PGDATA, PGPORT, ...) reach the server; messages in English.
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_MESSAGES"] = "C"
        return env

    def _start_postmaster(self) -> None:
        if self.port is None:
            self.port = _free_port()
        command = [os.path.join(self.bindir, "postgres"), "-D", self.data_dir, "-p", str(self.port),
                   "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self.directory}"]
        for name, value in self.settings.items():
            command += ["-c", f"{name}={value}"]
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                             cwd=self.directory, env=self._environment(), **self._run_as())
        self._wait_ready()

    def _wait_ready(self) -> None:
        """Until the postmaster says "ready" in postmaster.pid (its status line, what pg_ctl waits on)."""
        deadline = time.monotonic() + START_TIMEOUT_S
        pidfile = os.path.join(self.data_dir, "postmaster.pid")
        while True:
            if self._process.poll() is not None:
                raise PostgresError(f"PostgreSQL exited at start-up (exit {self._process.returncode}).\n"
                                    + self._log_tail())
            try:
                with open(pidfile) as f:
                    lines = f.read().splitlines()
            except FileNotFoundError:
                lines = []
            if len(lines) >= 8 and lines[0].strip() == str(self._process.pid) and lines[7].strip() == "ready":
                return
            if time.monotonic() > deadline:
                self._process.kill()
                self._process.wait()
                raise PostgresError(f"PostgreSQL not ready within {START_TIMEOUT_S:.0f}s.\n" + self._log_tail())
            time.sleep(0.02)

    def _log_tail(self, lines: int = 30) -> str:
        tail = self.log_text().splitlines()[-lines:]
        return f"log ({self.log_path}):\n" + "\n".join(tail) if tail else f"log ({self.log_path}): (empty)"
