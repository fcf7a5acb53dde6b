"""Fixtures for the compatibility tests: a real Trireme server process and the
stock-client harnesses (see compat_tests/clients.py).

* ``server``        - function-scoped fresh broker (temp data dir + TOML config)
* ``module_server`` - one broker shared by a test module
* ``java_harness``  - factory: ``java_harness("3.9.0")`` -> HarnessProcess
* ``kafkajs_harness`` - factory: ``kafkajs_harness()`` -> HarnessProcess
* ``kcat``          - path of the kcat binary (fails if missing)

Broker properties can be added per test with
``@pytest.mark.server_config({"log.segment.bytes": 4096})``.
Missing clients make tests FAIL (not skip).
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# The shared helper modules assert too: rewrite them like the test modules
# so that their failures show the compared values.
pytest.register_assert_rewrite("compat_tests.group_members", "compat_tests.harness_helpers",
                               "compat_tests.python_clients")

from compat_tests import clients  # noqa: E402

# Short group timings so rebalances in tests are quick.
BASE_SERVER_CONFIG: dict[str, Any] = {
    "group.initial.rebalance.delay.ms": 0,
    "group.min.session.timeout.ms": 1000,
}

STARTUP_TIMEOUT = 30.0


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "server_config(props): extra broker properties (dict) for the server fixtures")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)


def _test_failed(node: Any) -> bool:
    for when in ("setup", "call"):
        rep = getattr(node, f"rep_{when}", None)
        if rep is not None and rep.failed:
            return True
    return False


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    s = str(v).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{s}"'


def write_toml(path: Path, props: dict[str, Any]) -> None:
    path.write_text("".join(f'"{k}" = {_toml_value(v)}\n' for k, v in props.items()))


def server_command() -> list[str]:
    script = Path(sys.executable).parent / "trireme"
    if script.exists():
        return [str(script), "serve"]
    return [sys.executable, "-m", "trireme", "serve"]


class ServerProcess:
    """A Trireme broker subprocess.

    ``.bootstrap`` ("127.0.0.1:PORT"), ``.port``, ``.data_dir``, ``.proc``,
    ``.stderr_path``; ``.stop()`` (SIGTERM, then SIGKILL after a grace
    period), ``.restart()`` (graceful stop + start on the same data dir and
    port), ``.kill9()`` (SIGKILL + start again on the same data dir, same port
    when it can be bound again), ``.stderr_tail()``.
    """

    def __init__(self, workdir: Path, config: dict[str, Any] | None = None,
                 extra_args: list[str] | None = None):
        self.workdir = Path(workdir)
        self.data_dir = self.workdir / "data"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.config_path = self.workdir / "server.toml"
        self.config = dict(BASE_SERVER_CONFIG)
        self.config.update(config or {})
        write_toml(self.config_path, self.config)
        self.stderr_path = self.workdir / "server.stderr.log"
        self.stdout_path = self.workdir / "server.stdout.log"
        self.extra_args = list(extra_args or [])
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self.host = "127.0.0.1"
        self.starts = 0
        self.preexec_fn: Callable[[], None] | None = None    # run in the child before exec (e.g. setrlimit)

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def __repr__(self) -> str:
        pid = self.proc.pid if self.proc else None
        return f"<ServerProcess {self.bootstrap} pid={pid} data={self.data_dir}>"

    # ------------------------------------------------------------- lifecycle

    def start(self, port: int | None = None) -> None:
        assert self.proc is None or self.proc.poll() is not None, "server already running"
        listen_port = port if port is not None else (self.port or 0)
        argv = server_command() + ["--data-dir", str(self.data_dir), "--listen",
                                   f"{self.host}:{listen_port}", "--config", str(self.config_path),
                                   *self.extra_args]
        self.starts += 1
        with open(self.stderr_path, "ab") as err:
            err.write(f"\n===== start #{self.starts}: {' '.join(argv)}\n".encode())
            err.flush()
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=err, cwd=str(self.workdir), preexec_fn=self.preexec_fn,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
        first = self._read_first_line(self.proc, STARTUP_TIMEOUT)
        prefix = "listening on "
        if not first.startswith(prefix):
            self._force_kill()
            raise RuntimeError(f"server did not announce its port (got {first!r})\n{self.stderr_tail()}")
        host, _, port_s = first[len(prefix):].strip().rpartition(":")
        self.host, self.port = host or self.host, int(port_s)
        threading.Thread(target=self._drain_stdout, args=(self.proc,), daemon=True).start()

    def _read_first_line(self, proc: subprocess.Popen, timeout: float) -> str:
        box: list[bytes] = []

        def reader() -> None:
            assert proc.stdout is not None
            box.append(proc.stdout.readline())

        t = threading.Thread(target=reader, daemon=True)
        t.start()
        t.join(timeout)
        if t.is_alive() or not box or not box[0]:
            code = proc.poll()
            self._force_kill()
            what = "exited with %s" % code if code is not None else f"said nothing for {timeout}s"
            raise RuntimeError(f"server {what} before 'listening on'\n{self.stderr_tail()}")
        return box[0].decode(errors="replace").strip()

    def _drain_stdout(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        with open(self.stdout_path, "ab") as out:
            for line in proc.stdout:
                out.write(line)
                out.flush()

    def _force_kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM and wait; SIGKILL if it does not exit within ``timeout``.
        Returns the exit code (None if it was not running)."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with open(self.stderr_path, "ab") as err:
                err.write(f"\n===== did not stop within {timeout}s of SIGTERM; killing\n".encode())
            self._force_kill()
            return self.proc.returncode

    def _start_same_port(self, wait: float = 15.0) -> None:
        port = self.port
        deadline = time.monotonic() + wait
        while True:
            try:
                self.start(port=port)
                return
            except RuntimeError:
                if time.monotonic() > deadline or not _port_busy(self.host, port):
                    if _port_busy(self.host, port):
                        # Give up on the old port; clients must re-bootstrap.
                        self.start(port=0)
                        return
                    if time.monotonic() > deadline:
                        raise
                time.sleep(0.5)

    def restart(self, between: Callable[[], None] | None = None) -> None:
        """Graceful stop, then start on the same data dir and port; ``between`` runs while it is stopped (e.g. to
        damage the data directory as an operator might)."""
        self.stop()
        if between is not None:
            between()
        self._start_same_port()

    def kill9(self, between: Callable[[], None] | None = None) -> None:
        """SIGKILL (no shutdown work at all), then start again on the same
        data dir (and port when possible); ``between`` runs while it is down
        (e.g. to cut the unsynced tail a power loss would have taken)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
        if between is not None:
            between()
        self._start_same_port()

    def stderr_tail(self, n: int = 80) -> str:
        try:
            lines = self.stderr_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])


def _port_busy(host: str, port: int | None) -> bool:
    if not port:
        return False
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def _server_config_from_marks(node: Any) -> dict[str, Any]:
    props: dict[str, Any] = {}
    for mark in reversed(list(node.iter_markers("server_config"))):
        for arg in mark.args:
            props.update(arg)
        props.update(mark.kwargs)
    return props


def _start_server(request: pytest.FixtureRequest, node: Any) -> Iterator[ServerProcess]:
    workdir = Path(tempfile.mkdtemp(prefix="trireme-compat-"))
    srv = ServerProcess(workdir, config=_server_config_from_marks(node))
    try:
        srv.start()
    except Exception:
        print(f"\n----- server stderr ({srv.stderr_path}) -----\n{srv.stderr_tail()}")
        raise
    try:
        yield srv
    finally:
        code = srv.stop()
        failed = _test_failed(request.node) if request.scope == "function" else (
            request.session.testsfailed > 0)
        if failed or (code not in (None, 0, -signal.SIGTERM)):
            print(f"\n----- server exit code {code}; stderr tail ({srv.stderr_path}) -----\n"
                  f"{srv.stderr_tail()}")
        if not failed and os.environ.get("TRIREME_KEEP_DATA") != "1":
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"server workdir kept: {workdir}")


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    """A fresh broker for one test."""
    yield from _start_server(request, request.node)


@pytest.fixture(scope="module")
def module_server(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    """One broker shared by all tests of a module (marks on the module apply)."""
    yield from _start_server(request, request.node)


# ------------------------------------------------------------------ clients

def _harness_factory(request: pytest.FixtureRequest, default_bootstrap: Callable[[], str]):
    started: list[clients.HarnessProcess] = []

    def make(kind: str, version: str | None = None, bootstrap: str | None = None,
             **kw: Any) -> clients.HarnessProcess:
        if kind == "java":
            clients.require_java(version or "")
        else:
            clients.require_kafkajs()
        h = clients.HarnessProcess(kind, bootstrap or default_bootstrap(), version, **kw)
        started.append(h)
        return h

    yield make
    failed = _test_failed(request.node)
    for h in started:
        if failed:
            print(f"\n----- {h.name} harness stderr tail ({h.stderr_path}) -----\n{h.stderr_tail(40)}")
        h.close(keep_log=failed)


def _default_bootstrap(request: pytest.FixtureRequest) -> Callable[[], str]:
    def get() -> str:
        for name in ("server", "module_server"):
            if name in request.fixturenames:
                return request.getfixturevalue(name).bootstrap
        raise RuntimeError("pass bootstrap= or use the server fixture")
    return get


@pytest.fixture
def java_harness(request: pytest.FixtureRequest):
    """Factory: ``java_harness("3.9.0" | "4.3.0", bootstrap=None)``; the
    bootstrap defaults to the test's ``server``/``module_server``."""
    gen = _harness_factory(request, _default_bootstrap(request))
    make = next(gen)
    yield lambda version, bootstrap=None, **kw: make("java", version, bootstrap, **kw)
    next(gen, None)


@pytest.fixture
def kafkajs_harness(request: pytest.FixtureRequest):
    """Factory: ``kafkajs_harness(bootstrap=None)``."""
    gen = _harness_factory(request, _default_bootstrap(request))
    make = next(gen)
    yield lambda bootstrap=None, **kw: make("kafkajs", None, bootstrap, **kw)
    next(gen, None)


@pytest.fixture
def kcat() -> str:
    """Path of kcat (the test fails if it is not installed)."""
    return clients.require_kcat()


@pytest.fixture(params=list(clients.JAVA_VERSIONS))
def java_version(request: pytest.FixtureRequest) -> str:
    """Parametrizes a test over every Java client version."""
    return request.param
