"""A real broker with a SASL_PLAINTEXT listener (besides the fixture's PLAINTEXT one), its first SCRAM users created
by trireme.storage.add.scram, and raw SASL exchanges, for the SASL tests."""
from __future__ import annotations

import pytest

from compat_tests.conftest import ServerProcess
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
