"""Drivers for the stock (non-Python) Kafka clients used by the compat tests.

* ``HarnessProcess`` runs compat_tests/java/Harness.java (Apache Kafka Java
  client 3.9.0 or 4.3.0) or compat_tests/js/harness.js (kafkajs) as a
  long-lived child process speaking one JSON object per line:
  ``h.call("produce", topic="t", records=[...])`` -> response dict.
  The same protocol drives compat_tests/spark_harness.py (a PySpark
  session, kind ``"spark"``, under the interpreter that has PySpark).
* ``kcat_produce`` / ``kcat_consume`` wrap the kcat CLI (librdkafka).

Everything is installed by ``make clients`` (see the Makefile); tests that
need a client that is missing must fail, so use ``require_*`` helpers.

Security: ``security=`` (a compat_tests.security.ClientSecurity) gives a
harness or a kcat call the settings of a secured listener; without it they
use ``DEFAULT_SECURITY`` (set for a whole run by ``--command-config``, see
compat_tests/README.md), None: PLAINTEXT.
"""
from __future__ import annotations

import base64
import json
import os
import queue
import re
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from compat_tests.security import ClientSecurity
from tools.java_clients import harness_dir

REPO = Path(__file__).resolve().parent.parent
CACHE = REPO / ".cache"
JAVA_VERSIONS = ("3.9.0", "4.3.0")
JS_DIR = REPO / "compat_tests" / "js"

DEFAULT_CALL_TIMEOUT = 60.0

# The security settings every harness and kcat call gets unless given its own (a run against a secured
# listener: conftest.py's --command-config); None: PLAINTEXT.
DEFAULT_SECURITY: ClientSecurity | None = None


class HarnessError(RuntimeError):
    """The harness process died, hung, or wrote something that is not JSON."""


# ------------------------------------------------------------------ helpers

def segment_batches(data: bytes, *, active: bool) -> tuple[list, int]:
    """(position, header) of each whole batch in a segment file's bytes, and how many zero bytes follow the last one.
    Only the active (last) segment of a partition may end in zeros: with fsync on the broker writes zeros ahead of
    its appends (docs/architecture.md, "How a produce flows"); whatever else follows the batches is left to the
    caller's check (its size is not counted)."""
    from trireme.wire import records

    batches, end = [], 0
    try:
        for pos, header in records.iter_batch_headers(data):
            batches.append((pos, header))
            end = pos + header.size
    except records.CodecError:
        if not active:
            raise
    zeros = len(data) - end if active and data.count(0, end) == len(data) - end else 0
    return batches, zeros


def b64(data: bytes | str | None) -> str | None:
    if data is None:
        return None
    if isinstance(data, str):
        data = data.encode()
    return base64.b64encode(data).decode("ascii")


def unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def record(value: bytes | str | None, key: bytes | str | None = None, partition: int | None = 0,
           headers: Sequence[tuple[str, bytes | str | None]] = (), timestamp: int | None = None) -> dict:
    """Build one record for the harness ``produce`` command."""
    return {
        "partition": partition,
        "key_b64": b64(key),
        "value_b64": b64(value),
        "headers": [[k, b64(v)] for k, v in headers],
        "timestamp": timestamp,
    }


def decoded(rec: dict) -> dict:
    """A harness record with key/value/headers decoded to bytes (adds
    ``key``, ``value`` and ``headers_raw`` fields)."""
    out = dict(rec)
    out["key"] = unb64(rec.get("key_b64"))
    out["value"] = unb64(rec.get("value_b64"))
    out["headers_raw"] = [(k, unb64(v)) for k, v in rec.get("headers") or []]
    return out


# ------------------------------------------------------- availability probes

def java_classpath(version: str) -> str | None:
    built = harness_dir(version)
    cp_file = built / "classpath.txt"
    if not (built / ".complete").exists() or not cp_file.exists():
        return None
    return cp_file.read_text().strip()


def java_available(version: str) -> bool:
    return shutil.which("java") is not None and java_classpath(version) is not None


def kafkajs_available() -> bool:
    return shutil.which("node") is not None and (JS_DIR / "node_modules" / "kafkajs" / "package.json").exists()


def kcat_path() -> str | None:
    return shutil.which("kcat") or shutil.which("kafkacat")


def _missing(what: str) -> None:
    # Missing clients are failures, not skips: the suite must prove
    # compatibility with every stock client.
    import pytest

    pytest.fail(f"{what} is not installed; run `make clients`", pytrace=False)


def require_java(version: str) -> None:
    if not java_available(version):
        _missing(f"Java Kafka client {version} harness")


def require_kafkajs() -> None:
    if not kafkajs_available():
        _missing("kafkajs harness")


def require_kcat() -> str:
    path = kcat_path()
    if path is None:
        _missing("kcat")
    security = DEFAULT_SECURITY
    if security is not None and (security.mechanism or "").startswith("SCRAM") and \
            kcat_librdkafka_version(path) < (2, 6, 1):
        import pytest
        pytest.skip("this machine's kcat links librdkafka %s, which cannot log in with SCRAM to Kafka 4 (it sends "
                    "its client nonce twice, fixed in librdkafka 2.6.1: confluentinc/librdkafka#4895)"
                    % ".".join(map(str, kcat_librdkafka_version(path))))
    return path  # type: ignore[return-value]


def kcat_librdkafka_version(path: str) -> tuple[int, ...]:
    """The version of the librdkafka kcat links (``kcat -V``)."""
    out = subprocess.run([path, "-V"], capture_output=True, text=True, timeout=30).stdout
    m = re.search(r"librdkafka (\d+(?:\.\d+)*)", out)
    return tuple(int(x) for x in m.group(1).split(".")) if m else (0,)


# ----------------------------------------------------------------- harness

class HarnessProcess:
    """A running Java or kafkajs harness bound to one bootstrap address.

    ``kind`` is ``"java"`` (then ``version`` is 3.9.0 or 4.3.0) or
    ``"kafkajs"``.  stderr (client logs) goes to a temp file, see
    ``stderr_tail()``.  Use as a context manager or call ``close()``.
    """

    def __init__(self, kind: str, bootstrap: str, version: str | None = None, *,
                 log_level: str | None = None, stderr_path: str | os.PathLike | None = None,
                 env: dict[str, str] | None = None, python: str | None = None,
                 security: ClientSecurity | None = None):
        self.kind = kind
        self.security = security if security is not None else DEFAULT_SECURITY
        self.version = version
        self.bootstrap = bootstrap
        if kind == "java":
            if version is None:
                raise ValueError("java harness needs a version")
            cp = java_classpath(version)
            if cp is None or shutil.which("java") is None:
                raise HarnessError(f"Java harness {version} not built; run `make clients`")
            argv = ["java", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto",
                    "-cp", cp, "Harness", bootstrap]
        elif kind in ("kafkajs", "node", "js"):
            self.kind = "kafkajs"
            if not kafkajs_available():
                raise HarnessError("kafkajs not installed; run `make clients`")
            argv = ["node", str(JS_DIR / "harness.js"), bootstrap]
        elif kind == "spark":
            argv = [python or "python3", str(REPO / "compat_tests" / "spark_harness.py"), bootstrap]
        else:
            raise ValueError(f"unknown harness kind {kind!r}")
        self.argv = argv
        child_env = dict(os.environ)
        if log_level:
            child_env["HARNESS_LOG_LEVEL"] = log_level
        if self.security is not None:
            if self.kind == "kafkajs":
                child_env["HARNESS_KAFKAJS_SECURITY"] = json.dumps(self.security.kafkajs())
            else:                   # the Java harness; the Spark harness gives them kafka.-prefixed to its source
                child_env["HARNESS_CLIENT_CONFIG"] = json.dumps(self.security.java())
        if env:
            child_env.update(env)
        self._own_log = stderr_path is None
        if stderr_path is None:
            fd, stderr_path = tempfile.mkstemp(prefix=f"harness-{self.name}-", suffix=".log")
            os.close(fd)
        self.stderr_path = Path(stderr_path)
        self._stderr = open(self.stderr_path, "ab")
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._stderr, cwd=str(REPO), env=child_env)
        self._lines: queue.Queue[bytes | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read_stdout, daemon=True,
                                        name=f"harness-{self.name}-stdout")
        self._reader.start()
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return f"java-{self.version}" if self.kind == "java" else self.kind

    def __repr__(self) -> str:
        return f"<HarnessProcess {self.name} pid={self.proc.pid} bootstrap={self.bootstrap}>"

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def stderr_tail(self, n: int = 60) -> str:
        try:
            self._stderr.flush()
            lines = self.stderr_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def send_raw(self, line: str, timeout: float = DEFAULT_CALL_TIMEOUT) -> dict:
        """Send one raw line (not necessarily valid JSON) and return the
        parsed response."""
        with self._lock:
            if self.proc.poll() is not None:
                raise HarnessError(f"{self.name} harness exited with {self.proc.returncode}\n"
                                   f"{self.stderr_tail()}")
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.write(line.encode() + b"\n")
                self.proc.stdin.flush()
            except BrokenPipeError as e:
                raise HarnessError(f"{self.name} harness stdin closed\n{self.stderr_tail()}") from e
            try:
                out = self._lines.get(timeout=timeout)
            except queue.Empty:
                self.kill()
                raise HarnessError(f"{self.name} harness gave no answer within {timeout}s to "
                                   f"{line[:200]}\n{self.stderr_tail()}") from None
            if out is None:
                self.proc.wait(timeout=5)
                raise HarnessError(f"{self.name} harness exited ({self.proc.returncode}) while "
                                   f"handling {line[:200]}\n{self.stderr_tail()}")
            try:
                return json.loads(out)
            except ValueError as e:
                raise HarnessError(f"{self.name} harness wrote non-JSON {out[:200]!r}") from e

    def call(self, op: str, timeout: float = DEFAULT_CALL_TIMEOUT, **args: Any) -> dict:
        """Run one command; returns the response dict (check ``["ok"]``)."""
        return self.send_raw(json.dumps({"op": op, **args}), timeout=timeout)

    def ok(self, op: str, timeout: float = DEFAULT_CALL_TIMEOUT, **args: Any) -> dict:
        """Like call() but raises AssertionError unless the response is ok."""
        res = self.call(op, timeout=timeout, **args)
        if not res.get("ok"):
            raise AssertionError(f"{self.name} {op} failed: {res.get('error')}\n"
                                 f"response: {res}\nharness stderr:\n{self.stderr_tail(30)}")
        return res

    # Convenience wrappers -------------------------------------------------

    def produce(self, topic: str, records: Iterable[dict], config: dict | None = None, **kw: Any) -> dict:
        return self.call("produce", topic=topic, records=list(records), config=config or {}, **kw)

    def consume(self, topic: str, partition: int = 0, offset: int | str = 0, count: int = 1,
                config: dict | None = None, timeout_ms: int = 10_000, **kw: Any) -> dict:
        return self.call("consume", topic=topic, partition=partition, offset=offset, count=count,
                         config=config or {}, timeout_ms=timeout_ms,
                         timeout=timeout_ms / 1000 + DEFAULT_CALL_TIMEOUT, **kw)

    # Lifecycle --------------------------------------------------------------

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def close(self, timeout: float = 20.0, keep_log: bool = False) -> None:
        """Send ``exit`` (kill if it does not go).  A temp stderr log made by
        us is deleted unless ``keep_log`` or TRIREME_KEEP_LOGS=1."""
        if self.proc.poll() is None:
            try:
                self.call("exit", timeout=timeout)
            except (HarnessError, OSError, ValueError):
                pass
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                if f:
                    f.close()
            except OSError:
                pass
        self._stderr.close()
        if self._own_log and not keep_log and os.environ.get("TRIREME_KEEP_LOGS") != "1":
            try:
                os.unlink(self.stderr_path)
            except OSError:
                pass

    def __enter__(self) -> "HarnessProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def java_harness(version: str, bootstrap: str, **kw: Any) -> HarnessProcess:
    return HarnessProcess("java", bootstrap, version, **kw)


def kafkajs_harness(bootstrap: str, **kw: Any) -> HarnessProcess:
    return HarnessProcess("kafkajs", bootstrap, **kw)


# -------------------------------------------------------------------- kcat

@dataclass
class KcatRecord:
    partition: int
    offset: int
    timestamp: int | None          # None when kcat prints -1
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, str]] = field(default_factory=list)


_MSG_DELIM = b"\x1e"   # ASCII record separator
_KEY_DELIM = b"\x1f"   # ASCII unit separator


def kcat_produce(bootstrap: str, topic: str, values: Sequence[bytes | str | None], *,
                 keys: Sequence[bytes | str | None] | None = None, partition: int | None = 0,
                 headers: Sequence[tuple[str, str]] = (), codec: str | None = None,
                 config: dict[str, Any] | None = None, extra_args: Sequence[str] = (),
                 timeout: float = 60.0, security: ClientSecurity | None = None) -> subprocess.CompletedProcess:
    """Produce ``values`` with ``kcat -P``.

    Messages are separated by 0x1E and keys by 0x1F (so values may contain
    newlines; they must not contain those two bytes).  ``None`` values are
    sent as NULL (``-Z``: kcat turns empty values/keys into NULL - so b""
    and None are the same thing here).  ``headers`` (``-H k=v``) apply to
    every message.  ``codec`` sets ``-z`` (gzip/snappy/lz4/zstd).  Raises
    CalledProcessError on failure (stderr included).
    """
    kcat = require_kcat()
    argv = [kcat, "-P", "-b", bootstrap, "-t", topic, "-D", "\\x1e", "-Z"]
    if partition is not None:
        argv += ["-p", str(partition)]
    if keys is not None:
        argv += ["-K", "\\x1f"]
        if len(keys) != len(values):
            raise ValueError("keys and values differ in length")
    for k, v in headers:
        argv += ["-H", f"{k}={v}"]
    if codec:
        argv += ["-z", codec]
    argv += kcat_security_args(security)
    for k, v in (config or {}).items():
        argv += ["-X", f"{k}={v}"]
    argv += list(extra_args)
    payload = bytearray()
    for i, v in enumerate(values):
        vb = b"" if v is None else (v.encode() if isinstance(v, str) else bytes(v))
        if keys is not None:
            k = keys[i]
            kb = b"" if k is None else (k.encode() if isinstance(k, str) else bytes(k))
            if _KEY_DELIM in kb or _MSG_DELIM in kb:
                raise ValueError("key contains a kcat delimiter byte")
            payload += kb + _KEY_DELIM
        if _MSG_DELIM in vb:
            raise ValueError("value contains the kcat message delimiter 0x1e")
        payload += vb + _MSG_DELIM
    return subprocess.run(argv, input=bytes(payload), capture_output=True, timeout=timeout, check=True)


# One record = a text header line with lengths, then the raw key and value
# bytes, then the header list and a newline:
#   "#<partition> <offset> <timestamp> <keylen> <valuelen>\n<key><value> <headers>\n"
# %K/%S print -1 for NULL.  Headers (%h) are "k=v,k2=v2": header values
# containing ',' or newlines cannot be parsed back reliably.
_KCAT_FORMAT = "#%p %o %T %K %S\\n%k%s %h\\n"


def kcat_consume(bootstrap: str, topic: str, partition: int = 0, offset: int | str = 0,
                 count: int | None = None, *, config: dict[str, Any] | None = None,
                 extra_args: Sequence[str] = (), timeout: float = 30.0,
                 exit_at_end: bool = True, security: ClientSecurity | None = None) -> list[KcatRecord]:
    """Consume with ``kcat -C`` (no group; -p/-o assign + seek) and parse.

    ``offset`` is anything kcat's -o takes (number, beginning, end, -N,
    s@ts).  With ``exit_at_end`` (-e) kcat stops at the end of the partition;
    otherwise pass ``count``.  ``config`` becomes ``-X k=v`` (e.g.
    ``{"isolation.level": "read_committed"}``).
    """
    kcat = require_kcat()
    argv = [kcat, "-C", "-q", "-b", bootstrap, "-t", topic, "-p", str(partition), "-o", str(offset),
            "-f", _KCAT_FORMAT]
    if count is not None:
        argv += ["-c", str(count)]
    if exit_at_end:
        argv.append("-e")
    argv += kcat_security_args(security)
    for k, v in (config or {}).items():
        argv += ["-X", f"{k}={v}"]
    argv += list(extra_args)
    proc = subprocess.run(argv, capture_output=True, timeout=timeout)
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, argv, proc.stdout, proc.stderr)
    return parse_kcat_output(proc.stdout)


def kcat_security_args(security: ClientSecurity | None) -> list[str]:
    """``-X`` arguments for ``security`` (given ones only: DEFAULT_SECURITY reaches every kcat through
    KCAT_CONFIG, see compat_tests/conftest.py)."""
    return [a for k, v in (security.librdkafka() if security else {}).items() for a in ("-X", f"{k}={v}")]


_HEAD = re.compile(rb"#(-?\d+) (-?\d+) (-?\d+) (-?\d+) (-?\d+)\n")


def parse_kcat_output(data: bytes) -> list[KcatRecord]:
    out: list[KcatRecord] = []
    pos = 0
    while pos < len(data):
        m = _HEAD.match(data, pos)
        if not m:
            raise ValueError(f"unparseable kcat output at {pos}: {data[pos:pos + 80]!r}")
        p, o, ts, klen, vlen = (int(x) for x in m.groups())
        pos = m.end()
        key = None if klen < 0 else data[pos:pos + klen]
        pos += max(klen, 0)
        value = None if vlen < 0 else data[pos:pos + vlen]
        pos += max(vlen, 0)
        if data[pos:pos + 1] != b" ":
            raise ValueError(f"kcat output: expected ' ' after payload at {pos}")
        end = data.index(b"\n", pos)
        hdr_text = data[pos + 1:end].decode("utf-8", errors="replace")
        pos = end + 1
        headers: list[tuple[str, str]] = []
        if hdr_text:
            for item in hdr_text.split(","):
                k, _, v = item.partition("=")
                headers.append((k, v))
        out.append(KcatRecord(partition=p, offset=o, timestamp=None if ts < 0 else ts,
                              key=key, value=value, headers=headers))
    return out


def kcat_metadata(bootstrap: str, topic: str | None = None, timeout: float = 30.0,
                  security: ClientSecurity | None = None) -> dict:
    """``kcat -L -J`` (broker/topic metadata as JSON)."""
    kcat = require_kcat()
    argv = [kcat, "-L", "-J", "-b", bootstrap, *kcat_security_args(security)]
    if topic:
        argv += ["-t", topic]
    proc = subprocess.run(argv, capture_output=True, timeout=timeout, check=True)
    return json.loads(proc.stdout)


def wait_until(pred, timeout: float = 10.0, interval: float = 0.1, what: str = "condition"):
    """Poll ``pred()`` until truthy; returns its value or raises AssertionError."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
