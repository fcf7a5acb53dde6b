"""A real broker whose connections are on a SASL_PLAINTEXT listener (compat_tests/sasl_standin.py), and raw SASL
exchanges for the SASL tests."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from compat_tests.conftest import ServerProcess
from compat_tests.test_bad_input import RawConn, req

REPO = Path(__file__).resolve().parent.parent
USERS = {"alice": "alice-secret", "bob": "bob-secret"}
JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="admin-pw" '
        'user_alice="alice-secret" user_bob="bob-secret";')
BASE = {
    "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512,OAUTHBEARER",
    "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
}


class SaslServerProcess(ServerProcess):
    def _command(self) -> list[str]:
        return [sys.executable, str(REPO / "compat_tests" / "sasl_standin.py"), "serve", "--data-dir",
                str(self.data_dir), "--listen", f"{self.host}:{self.port}", "--config", str(self.config_path),
                *self.extra_args]


def start_sasl_server(tmp_path, monkeypatch, **props):
    monkeypatch.setenv("TRIREME_TEST_SCRAM_USERS", json.dumps(USERS))
    tmp_path.mkdir(parents=True, exist_ok=True)
    srv = SaslServerProcess(tmp_path, config={**BASE, **props})
    srv.start()
    return srv


@pytest.fixture
def sasl_server(tmp_path, monkeypatch):
    """Factory: ``sasl_server(**properties)`` starts a broker whose connections are SASL_PLAINTEXT; afterwards its log
    must hold no traceback and no internal error."""
    started = []

    def start(**props):
        srv = start_sasl_server(tmp_path / f"broker{len(started)}", monkeypatch, **props)
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
