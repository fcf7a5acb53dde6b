"""Start-up and shutdown of real `trireme serve` processes (issue 20, items 5 and 9): the data-directory lock, signals
from the first moment, and one line for each common start-up failure.

- Two brokers on one data directory: the second is refused with one line naming the holder; the first keeps
  serving, and 100 + 100 + 100 acknowledged records are all there after a restart.  The same for in-process
  brokers (trireme.testing, storage on disk), which share a process and so must lock per open file.
- SIGTERM at random moments right after `listening on`, and while the logs are loading: every exit is clean
  (code 0, the "stopped" line) and the data is intact.
- Port in use, a data directory that cannot be written (read-only mount, under a file, a file itself), a
  meta.properties of another node or unreadable: one line naming the address or the path, exit code non-zero.
"""
from __future__ import annotations

import os
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from compat_tests.conftest import ServerProcess, server_command
from trireme.testing import BrokerError, TriremeBroker

pytestmark = [pytest.mark.trireme_only("starts and signals its own trireme serve processes"),
              pytest.mark.timeout(600)]

SEED = int(os.environ.get("TRIREME_STARTUP_SEED", "2020"))
TOPIC = "t"
# A line of the broker's log (server/cli.py's logging format); anything else on stderr is the one error line.
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ trireme")
RUN_TIMEOUT_S = 60


@pytest.fixture
def workdir():
    path = Path(tempfile.mkdtemp(prefix="trireme-startup-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _broker(workdir: Path, name: str, data_dir: Path, topic_partitions: int = 1) -> ServerProcess:
    srv = ServerProcess(workdir / name, extra_args=["--topic", f"{TOPIC}:{topic_partitions}"])
    srv.data_dir = data_dir
    return srv


def _produce(bootstrap: str, values: list[bytes]) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", retries=0)
    try:
        for v in values:
            producer.send(TOPIC, v, partition=0).get(timeout=30)
    finally:
        producer.close()


def _read_all(bootstrap: str) -> list[bytes]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=5000)
    try:
        consumer.assign([TopicPartition(TOPIC, 0)])
        return [m.value for m in consumer]
    finally:
        consumer.close()


def _stop_all(*servers: ServerProcess) -> None:
    for srv in servers:
        srv.stop()


def _error_lines(stderr: str) -> list[str]:
    """What stderr says besides log records: the one error line (and nothing else, no traceback)."""
    return [line for line in stderr.splitlines() if line.strip() and not LOG_LINE.match(line)]


def _serve(args: list[str], *, prefix: list[str] | None = None) -> subprocess.CompletedProcess:
    """A `trireme serve` that is expected to fail at start-up: its exit code and output."""
    return subprocess.run([*(prefix or []), *server_command(), *args], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _assert_one_line(result: subprocess.CompletedProcess, *expected: str) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    lines = _error_lines(result.stderr)
    assert len(lines) == 1, result.stderr
    for text in expected:
        assert text in lines[0], lines[0]
    assert result.returncode not in (0, None), result
    assert "listening on" not in result.stdout
    return lines[0]


# --- item 5: one broker per data directory ----------------------------------------------------------------------

def test_second_broker_on_one_data_directory_is_refused(workdir):
    data = workdir / "data"
    first = _broker(workdir, "a", data)
    second = _broker(workdir, "b", data)
    try:
        first.start()
        _produce(first.bootstrap, [b"a%d" % i for i in range(100)])
        refused, holder = None, first.proc.pid
        try:
            second.start()
        except RuntimeError as e:
            refused = e
        # Before the lock both started: the second one's 100 records went to the same files from its own idea of
        # the log end, and after a restart 200 of the 300 acknowledged records were there.
        _produce(second.bootstrap if refused is None else first.bootstrap, [b"b%d" % i for i in range(100)])
        _produce(first.bootstrap, [b"c%d" % i for i in range(100)])
        _stop_all(first, second)
        first.start()
        got = _read_all(first.bootstrap)
        assert len(got) == 300 and sorted(got) == sorted([b"%s%d" % (p, i) for p in (b"a", b"b", b"c")
                                                          for i in range(100)]), len(got)
        assert refused is not None, "the second broker started on a data directory in use"
        assert second.proc.returncode not in (0, None)
        stderr = second.stderr_path.read_text()
        assert "Traceback" not in stderr, stderr
        line = [x for x in _error_lines(stderr) if not x.startswith("=====")]
        assert len(line) == 1, stderr
        assert str(data) in line[0] and f"pid={holder} " in line[0] and "listen=127.0.0.1:" in line[0], line
        # the holder is still serving while it was refused
        assert len(_read_all(first.bootstrap)) == 300
    finally:
        _stop_all(first, second)


def test_lock_is_released_at_exit_and_by_kill_9(workdir):
    data = workdir / "data"
    first = _broker(workdir, "a", data)
    second = _broker(workdir, "b", data)
    try:
        first.start()
        assert first.stop() == 0
        second.start()                       # a clean exit gave the directory up
        second.proc.send_signal(signal.SIGKILL)
        second.proc.wait(timeout=10)
        first.start()                        # so did kill -9 (the kernel drops the lock with the process)
        lock = (data / ".lock").read_text()
        assert f"pid={first.proc.pid} " in lock and f"listen=127.0.0.1:{first.port}" in lock, lock
    finally:
        _stop_all(first, second)


def test_in_process_brokers_on_one_data_directory(workdir):
    data = workdir / "data"
    with TriremeBroker(topics={TOPIC: 1}, data_dir=data) as first:
        # A second broker in the same process: flock is held per open file, so this open is refused too.
        with pytest.raises(BrokerError, match=r"in use.*this process") as refused:
            TriremeBroker(data_dir=data).start()
        assert str(data) in str(refused.value) and f"pid={os.getpid()}" in str(refused.value)
        # And a `trireme serve` process on it.
        result = _serve(["--data-dir", str(data), "--listen", "127.0.0.1:0"])
        _assert_one_line(result, str(data), f"pid={os.getpid()}", f"listen={first.bootstrap}")
        _produce(first.bootstrap, [b"x%d" % i for i in range(10)])
        first.restart()                      # its own restart takes the lock again
        assert len(_read_all(first.bootstrap)) == 10
    # and once it stopped, the directory is free
    with TriremeBroker(topics={TOPIC: 1}, mode="subprocess", data_dir=data) as again:
        assert len(_read_all(again.bootstrap)) == 10
        with pytest.raises(BrokerError, match="in use"):
            TriremeBroker(data_dir=data).start()


# --- item 9: signals from the first moment -----------------------------------------------------------------------

class Started:
    """A `trireme serve` whose stdout and stderr are read as they come, so a test can signal it at a chosen moment."""

    def __init__(self, data: Path):
        self.proc = subprocess.Popen(server_command() + ["--data-dir", str(data), "--listen", "127.0.0.1:0"],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self._seen = threading.Condition()
        self._readers = [threading.Thread(target=self._read, args=(stream, lines), daemon=True)
                         for stream, lines in ((self.proc.stdout, self.stdout), (self.proc.stderr, self.stderr))]
        for reader in self._readers:
            reader.start()

    def _read(self, stream, lines: list[str]) -> None:
        for raw in stream:
            with self._seen:
                lines.append(raw.decode(errors="replace"))
                self._seen.notify_all()
        with self._seen:
            lines.append("")                                # the end
            self._seen.notify_all()

    def wait_for(self, lines: list[str], *texts: str, timeout: float = RUN_TIMEOUT_S) -> str:
        """The first line holding any of ``texts`` (a hang guard: fails after ``timeout``)."""
        deadline = time.monotonic() + timeout
        with self._seen:
            while True:
                found = next((line for line in lines if any(text in line for text in texts)), None)
                if found is not None:
                    return found
                assert "" not in lines, f"exited before saying any of {texts}:\n{self.text()}"
                assert self._seen.wait(max(0.0, deadline - time.monotonic())), f"never said {texts}:\n{self.text()}"

    def finish(self) -> int:
        code = self.proc.wait(timeout=RUN_TIMEOUT_S)
        for reader in self._readers:
            reader.join(RUN_TIMEOUT_S)
        return code

    def text(self) -> str:
        return "".join(self.stderr)


def _loaded_broker(workdir: Path, partitions: int, values: list[bytes]) -> tuple[ServerProcess, Path]:
    data = workdir / "data"
    srv = _broker(workdir, "a", data, topic_partitions=partitions)
    srv.start()
    _produce(srv.bootstrap, values)
    assert srv.stop() == 0
    return srv, data


def _check_intact(srv: ServerProcess, values: list[bytes]) -> None:
    srv.start()
    try:
        assert _read_all(srv.bootstrap) == values
    finally:
        assert srv.stop() == 0


def test_sigterm_at_random_moments_of_start_up_is_a_clean_shutdown(workdir):
    """Ten starts, each signalled at a random moment: within the start-up from its first log line ("limits", before
    the data directory is opened) to serving, or right after `listening on` (before the fix the handler came a
    moment after that line, and not at all before it)."""
    rng = random.Random(f"{SEED}:sigterm")
    values = [b"v%d" % i for i in range(50)]
    srv, data = _loaded_broker(workdir, 50, values)
    outcomes = []
    for attempt in range(10):
        broker = Started(data)
        if attempt % 2 == 0:
            broker.wait_for(broker.stderr, "INFO trireme.limits limits ")
            delay = rng.uniform(0, 0.02)
        else:
            broker.wait_for(broker.stdout, "listening on")
            delay = rng.uniform(0, 0.005)
        time.sleep(delay)
        broker.proc.send_signal(signal.SIGTERM)
        code = broker.finish()
        text = broker.text()
        outcomes.append((attempt, round(delay, 4), code, "INFO trireme stopped" in text, "Traceback" in text,
                         "listening on" in "".join(broker.stdout)))
    assert all(code == 0 and stopped and not tb for _, _, code, stopped, tb, _ in outcomes), outcomes
    _check_intact(srv, values)


def test_sigterm_while_loading_the_logs_is_a_clean_exit(workdir):
    """Many partitions to load: SIGTERM as soon as the broker says it loads them (before the fix, at the first line
    that says so: "loaded topics")."""
    values = [b"v%d" % i for i in range(20)]
    srv, data = _loaded_broker(workdir, 400, values)
    interrupted = 0
    for _ in range(3):
        broker = Started(data)
        broker.wait_for(broker.stderr, "loading data directory", "loaded topics=")
        broker.proc.send_signal(signal.SIGTERM)
        code = broker.finish()
        text = broker.text()
        assert code == 0 and "INFO trireme stopped" in text and "Traceback" not in text, (code, text)
        if "stopped while loading the logs" in text:
            interrupted += 1
            assert "listening on" not in "".join(broker.stdout)
    # Loading 400 partitions takes ~90 ms here, the signal follows the line within a millisecond or so: at least one
    # of the three must have stopped the loading itself (not merely a broker that had finished it).
    assert interrupted >= 1
    _check_intact(srv, values)


def test_subprocess_fixture_stops_cleanly_right_after_start():
    """TriremeBroker(mode="subprocess") stops with SIGTERM and requires exit code 0: flaky before the handler came
    first."""
    for _ in range(5):
        with TriremeBroker(topics={TOPIC: 1}, mode="subprocess"):
            pass


# --- item 9: one line for each common start-up failure ------------------------------------------------------------

def test_port_in_use_is_one_line(workdir):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _serve(["--data-dir", str(workdir / "data"), "--listen", f"127.0.0.1:{port}"])
    line = _assert_one_line(result, f"127.0.0.1:{port}", "Address already in use")
    assert line.startswith("trireme: ")


def test_metrics_port_in_use_is_one_line(workdir):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _serve(["--data-dir", str(workdir / "data"), "--listen", "127.0.0.1:0",
                         "--set", f"trireme.metrics.listen=127.0.0.1:{port}"])
    _assert_one_line(result, f"127.0.0.1:{port}", "Address already in use")


def test_data_directory_under_a_file_is_one_line(workdir):
    (workdir / "file").write_text("x")
    result = _serve(["--data-dir", str(workdir / "file" / "data"), "--listen", "127.0.0.1:0"])
    _assert_one_line(result, str(workdir / "file" / "data"), "Not a directory")


def test_data_directory_that_is_a_file_is_one_line(workdir):
    (workdir / "data").write_text("x")
    result = _serve(["--data-dir", str(workdir / "data"), "--listen", "127.0.0.1:0"])
    _assert_one_line(result, str(workdir / "data"), "not a directory")


def test_read_only_data_directory_is_one_line(workdir):
    """As root, permissions do not bite: a read-only tmpfs in a mount namespace of the broker's own instead."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) for a private read-only mount")
    mnt = workdir / "mnt"
    mnt.mkdir()
    probe = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o ro tmpfs {mnt}"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs in a mount namespace here: {probe.stderr.strip()}")
    data = mnt / "data"
    # The directory exists (and holds a broker's files) but the file system is read-only.
    setup = (f"mount --make-rprivate / && mount -t tmpfs tmpfs {mnt} && mkdir {data} && "
             f"echo x > {data}/topics.json && mount -o remount,ro {mnt} && exec \"$0\" \"$@\"")
    result = _serve(["--data-dir", str(data), "--listen", "127.0.0.1:0"], prefix=["unshare", "-m", "sh", "-c", setup])
    _assert_one_line(result, str(data), "Read-only file system")


@pytest.mark.parametrize("damage", ["other node", "garbage", "bad topics.json"])
def test_unusable_data_directory_files_are_one_line(workdir, damage):
    data = workdir / "data"
    srv = _broker(workdir, "a", data)
    srv.start()
    assert srv.stop() == 0
    args = ["--data-dir", str(data), "--listen", "127.0.0.1:0"]
    if damage == "other node":
        args += ["--set", "node.id=7"]
        expected = "meta.properties"
    elif damage == "garbage":
        (data / "meta.properties").write_bytes(b"\xff\xfe\x00garbage")
        expected = "meta.properties"
    else:
        (data / "topics.json").write_text("{not json")
        expected = "topics.json"
    line = _assert_one_line(_serve(args), str(data), expected)
    assert line.startswith("trireme: ")


@pytest.mark.parametrize("args, expected", [
    (["--listen", "127.0.0.1:99999"], "port out of range"),                            # was: served on 34463
    (["--listen", "127.0.0.1:0", "--set", "trireme.status.listen=bad:port:x"], "trireme.status.listen"),
])
def test_bad_addresses_are_one_line_before_the_data_is_loaded(workdir, args, expected):
    result = _serve(["--data-dir", str(workdir / "data"), *args])
    _assert_one_line(result, expected)
    assert result.returncode == 2                       # a configuration error, as every other one
    assert not (workdir / "data").exists()
