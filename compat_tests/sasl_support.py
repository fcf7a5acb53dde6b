"""A real broker with a SASL_PLAINTEXT listener (besides the fixture's PLAINTEXT one), its first SCRAM users created
by trireme.storage.add.scram, and raw SASL exchanges, for the SASL tests."""
from __future__ import annotations

import socket
import ssl
from pathlib import Path

import pytest

from compat_tests.conftest import ServerProcess
from compat_tests.security import make_tls_files
from compat_tests.test_bad_input import RawConn, req

USERS = {"alice": "alice-secret", "bob": "bob-secret"}
JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="admin-pw" '
        'user_alice="alice-secret" user_bob="bob-secret";')
BASE = {
    "listeners": "SASL_PLAINTEXT://127.0.0.1:0",
    "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512,OAUTHBEARER",
    "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
    "trireme.storage.add.scram": ";".join(f"{m}=[name={u},password={p}]" for u, p in USERS.items()
                                          for m in ("SCRAM-SHA-256", "SCRAM-SHA-512")),
}


class SaslServer(ServerProcess):
    @property
    def sasl_bootstrap(self) -> str:
        return self.bootstrap_for("SASL_PLAINTEXT")


class Certificates:
    """The run's CA and the broker's PEM keystore (compat_tests/security.make_tls_files), as a SASL_SSL listener
    takes them."""

    def __init__(self, directory: Path):
        files = make_tls_files(directory)
        self.ca_path = str(files.ca)
        self.keystore = str(files.server_keystore)

    def listener_config(self) -> dict:
        """A SASL_SSL listener besides the SASL_PLAINTEXT one."""
        return {"listeners": "SASL_PLAINTEXT://127.0.0.1:0,SASL_SSL://127.0.0.1:0",
                "ssl.keystore.type": "PEM", "ssl.keystore.location": self.keystore,
                "listener.name.sasl_ssl.plain.sasl.jaas.config": JAAS}

    def context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=self.ca_path)


class TlsRawConn(RawConn):
    """RawConn over TLS (a SASL_SSL listener)."""

    def __init__(self, bootstrap: str, context: ssl.SSLContext, timeout: float = 10.0):
        host, _, port = bootstrap.rpartition(":")
        raw = socket.create_connection((host, int(port)), timeout=timeout)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = context.wrap_socket(raw, server_hostname="localhost")
        self.timeout = timeout
        import itertools
        self._ids = itertools.count(1)
        self.buf = bytearray()


def start_sasl_server(tmp_path, **props) -> SaslServer:
    tmp_path.mkdir(parents=True, exist_ok=True)
    srv = SaslServer(tmp_path, config={**BASE, **props})
    srv.start()
    return srv


@pytest.fixture
def sasl_server(tmp_path):
    """Factory: ``sasl_server(**properties)`` starts a broker with a SASL_PLAINTEXT listener (``.sasl_bootstrap``);
    afterwards its log must hold no traceback and no internal error."""
    started = []

    def start(**props):
        srv = start_sasl_server(tmp_path / f"broker{len(started)}", **props)
        started.append(srv)
        return srv
    yield start
    for srv in started:
        srv.stop()
        log = srv.stderr_path.read_text(errors="replace")
        assert "Traceback" not in log and "internal error" not in log, log[-4000:]


def plain_login(conn: RawConn, user: str = "alice", password: str = "alice-secret", version: int = 2):
    r = conn.request("SaslHandshake", 1, req("SaslHandshake", mechanism="PLAIN"))
    assert r.error_code == 0, r
    return conn.request("SaslAuthenticate", version, req("SaslAuthenticate", auth_bytes=f"\0{user}\0{password}".encode()))
