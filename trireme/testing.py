"""A real Trireme broker for your tests, as a context manager: in this process (trio on a thread) or as a subprocess.

    from trireme.testing import TriremeBroker

    with TriremeBroker(topics={"orders": 3}) as broker:
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
        ...

In-process (``mode="thread"``, the default) the broker runs ``trio.run`` on a daemon thread of this
process, on a free port of 127.0.0.1, with in-memory storage (``storage="memory"``, the default: nothing
touches the disk) or a temporary data directory (``storage="disk"``).  ``mode="subprocess"`` runs
``python -m trireme serve`` on a temporary data directory instead, for tests that ``kill()`` it (kill -9).

Topics given up front exist when the bootstrap address is handed out.  Test-friendly defaults
(``TEST_DEFAULTS``: no initial rebalance delay, as Kafka's test containers set it) apply unless ``config``
overrides them with Kafka's property names.  Extra listeners come from Kafka's ``listeners`` property
(``config={"listeners": "SSL://127.0.0.1:0", "ssl.keystore.location": ...}``): the fixture's own address
stays the PLAINTEXT listener and ``bootstrap``; ``listener_ports`` maps every listener name to its bound
port and ``bootstrap_for("SSL")`` gives that listener's address.  ``restart()`` stops cleanly and starts again on the same data
and port (clients reconnect by themselves); ``close()`` (or leaving the ``with``) stops and removes the
temporary data.  ``log_text()`` is the broker's log: its own records in thread mode (they are kept off the
``trireme`` logger's parents so they don't mix with your application's), its stderr in subprocess mode.
The pytest plugin (trireme.pytest_plugin) builds its fixtures on this class.
"""
from __future__ import annotations

import itertools
import logging
import os
import shutil
import signal
import subprocess
import sys
import re
import tempfile
import threading
from typing import Any, Iterable, Mapping

TEST_DEFAULTS: dict[str, Any] = {
    "group.initial.rebalance.delay.ms": 0,      # a group's first rebalance at once, as Kafka test containers set
    "trireme.shutdown.grace.ms": 2000,          # teardown is not held up by a consumer's long poll
}
# In memory there is nothing to fsync to: the durability machinery is kept (restart works) without the copying.
MEMORY_DEFAULTS: dict[str, Any] = {"trireme.fsync.enable": False}
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
# The stdout line of each listener after the first (server/cli.py listening_line).
LISTENING_LINE = re.compile(r"listening on (\S*):(\d+) listener=(\S+) security_protocol=(\S+)$")

_ids = itertools.count(1)


class BrokerError(RuntimeError):
    """The broker could not start, or failed while running (the message carries the end of its log)."""


def _topic_specs(topics) -> list[tuple[str, int, dict[str, str]]]:
    """``{"name": partitions}``, ``{"name": {"partitions": 3, "configs": {...}}}`` or names → (name, partitions,
    configs) as ``trireme serve --topic`` takes them (-1 partitions: num.partitions)."""
    if topics is None:
        return []
    if not isinstance(topics, Mapping):
        topics = {name: -1 for name in topics}
    specs = []
    for name, spec in topics.items():
        if isinstance(spec, Mapping):
            specs.append((name, int(spec.get("partitions", -1)),
                          {k: str(v) for k, v in (spec.get("configs") or {}).items()}))
        else:
            specs.append((name, int(spec), {}))
    return specs


class _BrokerThreadLog(logging.Handler):
    """Keeps the records the broker's thread logs (the broker's own log in thread mode)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter(LOG_FORMAT))
        self.thread_ident: int | None = None
        self.lines: list[str] = []
        self.lines_lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread == self.thread_ident:
            text = self.format(record)
            with self.lines_lock:
                self.lines.append(text)


class _LoggerUse:
    """While any in-process broker runs, the ``trireme`` logger logs at the configured level to the brokers'
    own handlers only; afterwards it is put back as it was."""

    lock = threading.Lock()
    users = 0
    saved: tuple[int, bool] | None = None

    @classmethod
    def acquire(cls, handler: logging.Handler, level: str) -> None:
        logger = logging.getLogger("trireme")
        with cls.lock:
            if cls.users == 0:
                cls.saved = (logger.level, logger.propagate)
                logger.setLevel(level)
                logger.propagate = False
            cls.users += 1
            logger.addHandler(handler)

    @classmethod
    def release(cls, handler: logging.Handler) -> None:
        logger = logging.getLogger("trireme")
        with cls.lock:
            logger.removeHandler(handler)
            cls.users -= 1
            if cls.users == 0 and cls.saved is not None:
                logger.setLevel(cls.saved[0])
                logger.propagate = cls.saved[1]


class TriremeBroker:
    """One broker for tests; see the module's docstring.  ``bootstrap`` is "HOST:PORT" once started."""

    def __init__(self, *, topics: Mapping[str, Any] | Iterable[str] | None = None,
                 config: Mapping[str, Any] | None = None, mode: str = "thread", storage: str = "memory",
                 host: str = "127.0.0.1", port: int = 0, data_dir: str | os.PathLike | None = None):
        if mode not in ("thread", "subprocess"):
            raise ValueError(f"mode must be 'thread' or 'subprocess', not {mode!r}")
        if storage not in ("memory", "disk"):
            raise ValueError(f"storage must be 'memory' or 'disk', not {storage!r}")
        if mode == "subprocess" or data_dir is not None:
            storage = "disk"                     # a subprocess (and a given directory) keeps its data on disk
        self.mode = mode
        self.storage = storage
        self.host = host
        self.port = port
        self.topics = _topic_specs(topics)
        self.config = {**TEST_DEFAULTS, **(MEMORY_DEFAULTS if storage == "memory" else {}), **(config or {})}
        self.name = f"trireme-test-broker-{next(_ids)}"
        self._own_dir = data_dir is None
        self.data_dir = str(data_dir) if data_dir is not None else None
        self._memory = None                      # MemoryStorage kept across restarts
        self._thread: threading.Thread | None = None
        self._token = None
        self._listener = None
        self._failure: BaseException | None = None
        self._log = _BrokerThreadLog()
        self._proc: subprocess.Popen | None = None
        self._stderr_path: str | None = None
        self._stdout_path: str | None = None     # the subprocess's stdout after its first line (else dropped)
        self._cwd: str | None = None
        self._preexec_fn = None                  # run in the child before exec (e.g. setrlimit)
        self.starts = 0
        self.listener_ports: dict[str, int] = {}     # listener name → bound port, once started

    # --- what tests use ----------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        if not self.running:
            raise BrokerError(f"{self.name} is not running")
        return f"{self.host}:{self.port}"

    def bootstrap_for(self, listener: str) -> str:
        """HOST:PORT of the listener named ``listener`` (e.g. "SSL"), once started."""
        if not self.running:
            raise BrokerError(f"{self.name} is not running")
        try:
            return f"{self.host}:{self.listener_ports[listener.upper()]}"
        except KeyError:
            raise BrokerError(f"{self.name} has no listener {listener} ({', '.join(self.listener_ports)})") from None

    @property
    def running(self) -> bool:
        if self.mode == "thread":
            return self._thread is not None and self._thread.is_alive() and self._listener is not None
        return self._proc is not None and self._proc.poll() is None

    def __enter__(self) -> "TriremeBroker":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        where = f"{self.host}:{self.port}" if self.running else "stopped"
        return f"<TriremeBroker {self.name} {self.mode}/{self.storage} {where}>"

    def start(self) -> "TriremeBroker":
        """Start serving (again, after stop() or kill(): same data, same port once one was bound)."""
        if self.running:
            raise BrokerError(f"{self.name} is already running")
        if self.storage == "disk" and self.data_dir is None:
            self.data_dir = tempfile.mkdtemp(prefix="trireme-test-")
        self.starts += 1
        (self._start_thread if self.mode == "thread" else self._start_subprocess)()
        return self

    def stop(self) -> None:
        """Stop cleanly (in-flight requests finish, logs are flushed); the data stays for start()."""
        if self.mode == "thread":
            self._stop_thread()
        else:
            self._stop_subprocess()

    def restart(self) -> None:
        """stop() then start(): what a durability test wants between writing and reading back."""
        self.stop()
        self.start()

    def kill(self) -> None:
        """SIGKILL the subprocess: no shutdown work at all.  start() brings it back on the same data."""
        if self.mode != "subprocess":
            raise BrokerError("kill() needs mode='subprocess' (an in-process broker cannot be killed -9)")
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGKILL)
            self._proc.wait(timeout=STOP_TIMEOUT_S)

    def close(self) -> None:
        """stop(), then remove the temporary data directory (a directory you gave is left alone)."""
        try:
            self.stop()
        finally:
            if self._own_dir and self.data_dir is not None:
                shutil.rmtree(self.data_dir, ignore_errors=True)
                self.data_dir = None
            self._memory = None

    def log_position(self) -> int:
        """A mark in the log, for log_text(since=...)."""
        if self.mode == "thread":
            with self._log.lines_lock:
                return len(self._log.lines)
        return os.path.getsize(self._stderr_path) if self._stderr_path and os.path.exists(self._stderr_path) else 0

    def log_text(self, since: int = 0) -> str:
        """The broker's log (from the mark ``since``)."""
        if self.mode == "thread":
            with self._log.lines_lock:
                return "\n".join(self._log.lines[since:])
        if not self._stderr_path or not os.path.exists(self._stderr_path):
            return ""
        with open(self._stderr_path, "rb") as f:
            f.seek(since)
            return f.read().decode(errors="replace")

    # --- in-process ------------------------------------------------------------------------

    def _build_config(self):
        from trireme.server.config import Config
        config = Config(data_dir=self.data_dir or f"<memory:{self.name}>", listen_host=self.host,
                        listen_port=self.port)
        config.update(dict(self.config), source="TriremeBroker(config=...)")
        config.resolve_listeners((self.host, self.port))      # the fixture's address is the PLAINTEXT listener's
        return config

    def _start_thread(self) -> None:
        import trio

        from trireme.server.cli import run_broker
        from trireme.server.startup import startup_failure
        from trireme.state.storage import MemoryStorage
        config = self._build_config()
        if self.storage == "memory" and self._memory is None:
            self._memory = MemoryStorage()
        started = threading.Event()
        self._failure = None
        self._listener = None

        async def serve():
            self._token = trio.lowlevel.current_trio_token()
            async with trio.open_nursery() as nursery:
                self._listener, self.port = await nursery.start(
                    lambda task_status: run_broker(config, self._memory, self.topics, standalone=False,
                                                   task_status=task_status))
                self.listener_ports = {e.name: e.port for e in self._listener.endpoints}
                started.set()

        def main():
            self._log.thread_ident = threading.get_ident()
            try:
                trio.run(serve)
            except BaseException as e:           # reported by start() or stop()
                self._failure = e
                reason = startup_failure(e)
                if reason is not None:                  # the data directory in use, the port taken: one line
                    logging.getLogger("trireme").error("%s", reason)
                else:
                    logging.getLogger("trireme").exception("broker failed")
            finally:
                started.set()

        _LoggerUse.acquire(self._log, str(config["trireme.log.level"]))
        self._thread = threading.Thread(target=main, name=self.name, daemon=True)
        self._thread.start()
        if not started.wait(START_TIMEOUT_S) or self._listener is None:
            failure, self._failure = self._failure, None
            self._stop_thread()
            reason = startup_failure(failure) if failure is not None else None
            raise BrokerError(f"{self.name} did not start: {reason if reason is not None else repr(failure)}\n"
                              f"{self.log_text()[-4000:]}") from failure

    def _stop_thread(self) -> None:
        import trio
        thread = self._thread
        if thread is None:
            return
        try:
            if thread.is_alive() and self._listener is not None:
                try:
                    trio.from_thread.run_sync(self._listener.shutdown.set, trio_token=self._token)
                except trio.RunFinishedError:
                    pass
            thread.join(STOP_TIMEOUT_S)
            if thread.is_alive():
                raise BrokerError(f"{self.name} did not stop within {STOP_TIMEOUT_S}s")
        finally:
            self._thread = self._listener = self._token = None
            _LoggerUse.release(self._log)
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise BrokerError(f"{self.name} failed: {failure!r}\n{self.log_text()[-4000:]}") from failure

    # --- subprocess ------------------------------------------------------------------------

    def _command(self) -> list[str]:
        argv = [sys.executable, "-m", "trireme", "serve", "--data-dir", self.data_dir,
                "--listen", f"{self.host}:{self.port}"]
        for name, value in self.config.items():
            argv += ["--set", f"{name}={str(value).lower() if isinstance(value, bool) else value}"]
        for name, partitions, configs in self.topics:
            spec = f"{name}:{partitions if partitions > 0 else ''}"
            if configs:
                spec += ":" + ",".join(f"{k}={v}" for k, v in configs.items())
            argv += ["--topic", spec]
        return argv

    def _log_file(self) -> str:
        """Where the subprocess's stderr goes (appended to across starts)."""
        return os.path.join(self.data_dir, "broker.log")

    def _start_subprocess(self) -> None:
        self._stderr_path = self._log_file()
        argv = self._command()
        with open(self._stderr_path, "ab") as err:
            err.write(f"\n===== start #{self.starts}: {' '.join(argv)}\n".encode())
            err.flush()
            self._proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
                                          cwd=self._cwd, preexec_fn=self._preexec_fn,
                                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
        proc = self._proc
        try:
            names = [spec.name for spec in self._build_config().listeners]
        except ValueError:          # a refused configuration: the broker says so itself, in its one line
            names = ["PLAINTEXT"]
        first: list[bytes] = []

        def read_lines():
            for _ in names:
                first.append(proc.stdout.readline())
                if not first[-1]:
                    return

        reader = threading.Thread(target=read_lines, daemon=True)
        reader.start()
        reader.join(START_TIMEOUT_S)
        line = first[0].decode(errors="replace").strip() if first else ""
        if not line.startswith("listening on "):
            self.kill()
            said = self.log_text().strip().rpartition("\n")[2]     # its one line when start-up failed (trireme: ...)
            raise BrokerError(f"{self.name} did not start (exit {proc.poll()}): {said}\n"
                              f"{self.log_text()[-4000:]}")
        host, _, port = line[len("listening on "):].rpartition(":")
        self.host, self.port = host or self.host, int(port)
        self.listener_ports = {names[0]: self.port}
        for raw in first[1:]:
            m = LISTENING_LINE.match(raw.decode(errors="replace").strip())
            if m is not None:
                self.listener_ports[m.group(3)] = int(m.group(2))
        # Keep reading stdout so the broker never blocks on a full pipe.
        threading.Thread(target=self._drain_stdout, args=(proc, self._stdout_path), daemon=True).start()

    @staticmethod
    def _drain_stdout(proc: subprocess.Popen, path: str | None) -> None:
        if path is None:
            proc.stdout.read()
            return
        with open(path, "ab") as out:
            for line in proc.stdout:
                out.write(line)
                out.flush()

    def _terminate(self, timeout: float) -> tuple[int | None, bool]:
        """SIGTERM the subprocess and wait up to ``timeout``, SIGKILL if it has not exited by then
        → (exit code, whether it stopped by itself); (None, True) when it was not running."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return None, True
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout=timeout), True
        except subprocess.TimeoutExpired:
            with open(self._stderr_path, "ab") as err:
                err.write(f"\n===== did not stop within {timeout}s of SIGTERM; killing\n".encode())
            proc.kill()
            return proc.wait(), False

    def _stop_subprocess(self) -> None:
        code, stopped = self._terminate(STOP_TIMEOUT_S)
        if not stopped:
            raise BrokerError(f"{self.name} did not stop within {STOP_TIMEOUT_S}s of SIGTERM")
        if code not in (None, 0):
            raise BrokerError(f"{self.name} exited with {code}\n{self.log_text()[-4000:]}")
