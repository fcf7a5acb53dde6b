"""Fixtures for the compatibility tests: a real Trireme server process and the
stock-client harnesses (see compat_tests/clients.py).

* ``server``        - function-scoped fresh broker (temp data dir + TOML config)
* ``module_server`` - one broker shared by a test module
* ``java_harness``  - factory: ``java_harness("3.9.0")`` -> HarnessProcess
* ``kafkajs_harness`` - factory: ``kafkajs_harness()`` -> HarnessProcess
* ``kcat``          - path of the kcat binary (fails if missing)
* ``secured_server`` - one broker per module with PLAINTEXT, SSL (mTLS) and SASL_SSL
  (SCRAM-SHA-512, OAUTHBEARER) listeners and certificates made for the run
  (compat_tests/security.py ``SecuredListeners``)

Broker properties can be added per test with
``@pytest.mark.server_config({"log.segment.bytes": 4096})``.
Missing clients make tests FAIL (not skip).

External mode (``--bootstrap HOST:PORT``, see compat_tests/README.md): ``server`` and
``module_server`` are an :class:`ExternalBroker` instead — the broker someone else runs.  What a
test cannot do to it (read its log, look at its files or process, stop it; restart it without
``--restart-command``; Trireme-only features and settings; an expectation of a Kafka generation the
broker is not) ends the test as skipped with a reason starting "not applicable: ", which the
report (compat_tests/matrix.py) shows as such.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
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

from compat_tests import clients, matrix, security  # noqa: E402
from compat_tests.broker_probe import (  # noqa: E402,F401  (BrokerInfo, broker_info: tests import them from here)
    BASE_SERVER_CONFIG, BrokerInfo, broker_info, wait_until_answering)
from compat_tests.matrix import not_applicable  # noqa: E402
from trireme.testing import TriremeBroker  # noqa: E402



def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("compat", "the compatibility suite against any broker")
    group.addoption("--bootstrap", metavar="HOST:PORT",
                    help="run against this broker instead of a trireme serve the suite starts itself")
    group.addoption("--restart-command", metavar="CMD",
                    help="shell command that restarts the --bootstrap broker gracefully (same data and address); "
                         "tests that restart the broker are not applicable without it")
    group.addoption("--kill-command", metavar="CMD",
                    help="shell command that kills the --bootstrap broker hard (SIGKILL) and starts it again; "
                         "crash tests are not applicable without it")
    group.addoption("--broker-config", metavar="NAME=VALUE", action="append", default=[],
                    help="a setting the --bootstrap broker has (repeatable); a test assuming another value of it "
                         "is not applicable")
    matrix.addoption(group)


def pytest_configure(config: pytest.Config) -> None:
    _secure_every_client(config)
    config.addinivalue_line(
        "markers", "server_config(props): extra broker properties (dict) for the server fixtures; against an "
                   "external broker they are the settings the test assumes")
    config.addinivalue_line(
        "markers", "trireme_only(what): tests a Trireme-only feature; not applicable against an external broker")
    config.addinivalue_line(
        "markers", "kafka_version(major): expects the behaviour of Kafka >= major (e.g. 4: KIP-896 removals); "
                   "not applicable against an older broker")
    matrix.configure(config)


def _secure_every_client(config: pytest.Config) -> None:
    """--command-config FILE: every client of the run reaches --bootstrap (a secured listener) with the file's
    settings (compat_tests/secured_run.py), the probe too.  Before the test modules are imported."""
    path = config.getoption("command_config")
    if not path:
        return
    if not config.getoption("bootstrap"):
        raise pytest.UsageError("--command-config names how to reach --bootstrap: give both")
    from compat_tests import broker_probe, secured_run
    from trireme.server.admin import security as admin_security
    config.compat_security = security.ClientSecurity.from_properties(security.read_properties(path))
    secured_run.install(config.compat_security)
    broker_probe.PROBE_SECURITY = admin_security.load_command_config(path)


# Broker settings a test's server_config may name that only make it quicker (its waits are shorter) or that only
# tests not applying elsewhere depend on: against an external broker such a test runs without them.  A test
# naming any other setting is not applicable unless --broker-config declares the broker has it.
TUNING_SETTINGS = {
    "transaction.abort.timed.out.transaction.cleanup.interval.ms",     # a timed-out transaction is aborted sooner
    "socket.request.max.bytes",     # test_bad_input: only its tests reading the broker's log depend on it
}

# Whole modules that test Trireme-only features (no marks needed in them).
TRIREME_ONLY_MODULES = {
    "test_admin_cli.py": "Trireme's admin command line",
    "test_metrics.py": "Trireme's metrics endpoint",
    "test_status_page.py": "Trireme's status page",
}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """External mode: mark what cannot apply to an external broker (before matrix.py selects tests)."""
    if not config.getoption("bootstrap"):
        return
    declared = dict(kv.partition("=")[::2] for kv in config.getoption("broker_config"))
    for item in items:
        reason = _static_not_applicable(item, declared)
        if reason is not None:
            item.compat_not_applicable = reason
            item.add_marker(pytest.mark.skip(reason=matrix.NOT_APPLICABLE + reason))


def _static_not_applicable(item: pytest.Item, declared: dict[str, str]) -> str | None:
    mark = item.get_closest_marker("trireme_only")
    if mark is not None or item.path.name in TRIREME_ONLY_MODULES:
        return "Trireme-only: " + (mark.args[0] if mark is not None and mark.args else
                                   TRIREME_ONLY_MODULES.get(item.path.name, "a Trireme feature"))
    props = _server_config_from_marks(item)
    own = sorted(k for k in props if k.startswith("trireme."))
    if own:
        return "needs Trireme settings " + ", ".join(f"{k}={props[k]}" for k in own)
    wanted = {k: _toml_value(v).strip('"') for k, v in props.items()}
    missing = sorted(k for k in wanted if k not in TUNING_SETTINGS and k not in declared)
    if missing:
        return "needs " + ", ".join(f"{k}={wanted[k]}" for k in missing) + " (--broker-config when the broker has it)"
    differs = sorted(k for k in wanted if k in declared and declared[k] != wanted[k])
    if differs:
        return "needs " + ", ".join(f"{k}={wanted[k]} (the broker has {declared[k]})" for k in differs)
    return None


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A Kafka-generation expectation is checked against the broker's ApiVersions."""
    mark = item.get_closest_marker("kafka_version")
    bootstrap = item.config.getoption("bootstrap")
    if mark is None or not bootstrap:
        return
    info = broker_info(bootstrap)
    if info.kafka_major < mark.args[0]:
        not_applicable(f"expects Kafka {mark.args[0]} behaviour; the broker answers ApiVersions as Kafka "
                       f"{info.kafka_major}.x")


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


class ServerProcess(TriremeBroker):
    """A Trireme broker subprocess for the suite: :class:`trireme.testing.TriremeBroker` in subprocess mode, in a
    working directory of its own (``data/``, ``server.toml`` written from ``config``, ``server.stderr.log``,
    ``server.stdout.log``), started with the installed ``trireme serve`` and any ``extra_args``.

    ``.bootstrap`` ("127.0.0.1:PORT"), ``.port``, ``.data_dir``, ``.proc``,
    ``.stderr_path``; ``.stop()`` (SIGTERM, then SIGKILL after a grace
    period; returns the exit code), ``.restart()`` (graceful stop + start on the same data dir and
    port), ``.kill9()`` (SIGKILL + start again on the same data dir, same port
    when it can be bound again), ``.stderr_tail()``; TriremeBroker's ``log_text()``/``log_position()``.
    """

    external = False

    def __init__(self, workdir: Path, config: dict[str, Any] | None = None,
                 extra_args: list[str] | None = None):
        self.workdir = Path(workdir)
        super().__init__(mode="subprocess", data_dir=self.workdir / "data")
        self.data_dir = self.workdir / "data"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.config_path = self.workdir / "server.toml"
        self.config = dict(BASE_SERVER_CONFIG)
        self.config.update(config or {})
        write_toml(self.config_path, self.config)
        self.stderr_path = self.workdir / "server.stderr.log"
        self.stdout_path = self._stdout_path = self.workdir / "server.stdout.log"
        self._cwd = str(self.workdir)
        self.extra_args = list(extra_args or [])

    # TriremeBroker's subprocess mode, with the suite's command line, files and names.
    def _command(self) -> list[str]:
        return server_command() + ["--data-dir", str(self.data_dir), "--listen", f"{self.host}:{self.port}",
                                   "--config", str(self.config_path), *self.extra_args]

    def _log_file(self) -> str:
        return str(self.stderr_path)

    @property
    def proc(self) -> subprocess.Popen | None:
        return self._proc

    @property
    def preexec_fn(self) -> Callable[[], None] | None:
        """Run in the child before exec (e.g. setrlimit)."""
        return self._preexec_fn

    @preexec_fn.setter
    def preexec_fn(self, fn: Callable[[], None] | None) -> None:
        self._preexec_fn = fn

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"       # also while stopped: where it was (and will be again)

    def __repr__(self) -> str:
        pid = self.proc.pid if self.proc else None
        return f"<ServerProcess {self.bootstrap} pid={pid} data={self.data_dir}>"

    # ------------------------------------------------------------- lifecycle

    def start(self, port: int | None = None) -> None:
        assert not self.running, "server already running"
        if port is not None:
            self.port = port
        super().start()

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM and wait; SIGKILL if it does not exit within ``timeout``.
        Returns the exit code (None if it was never started)."""
        if self._proc is not None and self._proc.poll() is not None:
            return self._proc.returncode
        return self._terminate(timeout)[0]

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
        self.kill()
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


# ------------------------------------------------------------ external brokers


class ExternalBroker:
    """A broker the suite did not start (``--bootstrap``), in place of a :class:`ServerProcess`: same
    ``bootstrap``; ``restart()``/``kill9()`` run the user's commands; its process, files and log are
    not the suite's, so a test needing them is not applicable."""

    external = True
    _NEEDS = {"proc": "process", "data_dir": "data directory", "workdir": "working directory",
              "stderr_path": "log", "stdout_path": "output", "config_path": "configuration file",
              "config": "configuration"}

    def __init__(self, bootstrap: str, restart_command: str | None = None, kill_command: str | None = None):
        # A cluster is given as a list of its brokers (HOST:PORT,HOST:PORT,...): clients bootstrap from the whole
        # list; ``host``/``port`` are its first broker's, for a test that opens a socket of its own.
        self.bootstrap = bootstrap
        self.host, _, port = bootstrap.split(",")[0].rpartition(":")
        self.port = int(port)
        self.restart_command, self.kill_command = restart_command, kill_command

    def __repr__(self) -> str:
        return f"<ExternalBroker {self.bootstrap}>"

    def __getattr__(self, name: str) -> Any:
        if name in ExternalBroker._NEEDS:
            not_applicable(f"needs the broker's {ExternalBroker._NEEDS[name]} (an external broker)")
        raise AttributeError(name)

    def _run(self, command: str | None, option: str, what: str) -> None:
        if not command:
            not_applicable(f"{what}: needs {option}")
        done = subprocess.run(command, shell=True, timeout=600)
        assert done.returncode == 0, f"{option} {command!r} exited with {done.returncode}"
        wait_until_answering(self.bootstrap, 120)

    def restart(self, between: Callable[[], None] | None = None) -> None:
        if between is not None:
            not_applicable("changes the broker's data directory while it is stopped")
        self._run(self.restart_command, "--restart-command", "restarts the broker")

    def kill9(self) -> None:
        self._run(self.kill_command, "--kill-command", "kills the broker (SIGKILL)")

    def stop(self, timeout: float = 20.0) -> None:
        not_applicable("stops the broker")

    def start(self, port: int | None = None) -> None:
        not_applicable("starts the broker")

    def stderr_tail(self, n: int = 80) -> str:
        return "(an external broker: its log is not available to the suite)"


def _external_broker(config: pytest.Config) -> ExternalBroker | None:
    bootstrap = config.getoption("bootstrap")
    if not bootstrap:
        return None
    return ExternalBroker(bootstrap, config.getoption("restart_command"), config.getoption("kill_command"))


def _server_config_from_marks(node: Any) -> dict[str, Any]:
    props: dict[str, Any] = {}
    for mark in reversed(list(node.iter_markers("server_config"))):
        for arg in mark.args:
            props.update(arg)
        props.update(mark.kwargs)
    return props


def _start_server(request: pytest.FixtureRequest, node: Any,
                  base_config: dict[str, Any] | None = None) -> Iterator[ServerProcess]:
    external = _external_broker(request.config)
    if external is not None:
        yield external
        return
    workdir = Path(tempfile.mkdtemp(prefix="trireme-compat-"))
    srv = ServerProcess(workdir, config={**(base_config or {}), **_server_config_from_marks(node)})
    try:
        srv.start()
    except Exception:
        print(f"\n----- server stderr ({srv.stderr_path}) -----\n{srv.stderr_tail()}")
        raise
    try:
        yield srv
    finally:
        stopped_here = srv.running
        code = srv.stop()
        failed = _test_failed(request.node) if request.scope == "function" else (
            request.session.testsfailed > 0)
        unclean = stopped_here and code != 0      # SIGTERM: a clean stop exits 0
        if failed or unclean or code not in (None, 0):
            print(f"\n----- server exit code {code}; stderr tail ({srv.stderr_path}) -----\n"
                  f"{srv.stderr_tail()}")
        if not failed and not unclean and os.environ.get("TRIREME_KEEP_DATA") != "1":
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"server workdir kept: {workdir}")
        if unclean and not failed:
            pytest.fail(f"the server exited with {code} on SIGTERM (a clean stop exits 0)", pytrace=False)


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    """A fresh broker for one test."""
    yield from _start_server(request, request.node)


@pytest.fixture(scope="module")
def module_server(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    """One broker shared by all tests of a module (marks on the module apply)."""
    yield from _start_server(request, request.node)


@pytest.fixture(scope="module")
def secured_server(request: pytest.FixtureRequest, tmp_path_factory) -> Iterator[security.SecuredListeners]:
    """One broker per module with the fixture's PLAINTEXT listener, an SSL listener requiring client
    certificates and a SASL_SSL listener (SCRAM-SHA-512 with the first user, unsecured OAUTHBEARER); the
    certificates are made for this module with trustme."""
    if request.config.getoption("bootstrap"):
        not_applicable("starts a broker with TLS and SASL listeners of its own")
    tls = security.make_tls_files(tmp_path_factory.mktemp("tls"))
    gen = _start_server(request, request.node, security.secured_broker_config(tls))
    srv = next(gen)
    try:
        yield security.SecuredListeners(srv.bootstrap, srv.bootstrap_for("SSL"), srv.bootstrap_for("SASL_SSL"), tls,
                                        srv)
    finally:
        next(gen, None)


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


@pytest.fixture
def broker(request: pytest.FixtureRequest) -> BrokerInfo:
    """What the test's broker (``server``/``module_server``) answers about itself (:class:`BrokerInfo`)."""
    return broker_info(_default_bootstrap(request)())


@pytest.fixture(params=list(clients.JAVA_VERSIONS))
def java_version(request: pytest.FixtureRequest) -> str:
    """Parametrizes a test over every Java client version."""
    return request.param
