"""Security review of issue 21 (TLS, SASL, authorizer, quotas) against a real broker: each test is one finding of the
review, xfail(strict) while the finding is open, so main stays green and the fix turns it into a plain pass.

Clients are raw frames (compat_tests/test_bad_input.RawConn) on a SASL_PLAINTEXT listener with PLAIN users from JAAS
(as compat_tests/test_acls_server.py sets one up) or on the PLAINTEXT listener (principal User:ANONYMOUS)."""
from __future__ import annotations

import pytest

from compat_tests.test_bad_input import RawConn, req, unique
from trireme.wire import error_codes as E
from trireme.wire.codec import message

STANDARD = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="admin-pw" '
        'user_admin="admin-pw" user_alice="alice-secret" user_bob="bob-secret";')
SASL = {"listeners": "SASL_PLAINTEXT://127.0.0.1:0", "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS, "connection.failed.authentication.delay.ms": 0,
        "authorizer.class.name": STANDARD, "super.users": "User:admin"}
BROKER = 4                  # DescribeConfigs resource type


def login(server, user="alice", password=None):
    """A raw connection on the SASL_PLAINTEXT listener, logged in with PLAIN."""
    conn = RawConn(server.bootstrap_for("SASL_PLAINTEXT"))
    r = conn.request("SaslHandshake", 1, req("SaslHandshake", mechanism="PLAIN"))
    assert r.error_code == 0, r
    secret = password if password is not None else f"{user}-secret" if user != "admin" else "admin-pw"
    r = conn.request("SaslAuthenticate", 2, req("SaslAuthenticate", auth_bytes=f"\0{user}\0{secret}".encode()))
    assert r.error_code == 0, r
    return conn


def broker_configs(conn) -> dict:
    cls = message("DescribeConfigsRequest").cls
    r = conn.request("DescribeConfigs", 4, cls(resources=[cls.DescribeConfigsResource(
        resource_type=BROKER, resource_name="1", configuration_keys=None)], include_synonyms=True,
        include_documentation=False))
    [resource] = r.results
    assert resource.error_code == 0, resource
    return {c.name: c for c in resource.configs}


# --- finding 1: DescribeConfigs tells the TLS private key and its password -----------------------------------------

SECRET_KEY_PASSWORD = "key-pass-review-1"
SECRET_KEY = "-----BEGIN ENCRYPTED PRIVATE KEY-----review-1-----END ENCRYPTED PRIVATE KEY-----"


@pytest.mark.server_config({"ssl.key.password": SECRET_KEY_PASSWORD, "ssl.keystore.key": SECRET_KEY})
def test_describe_configs_never_tells_key_material(server):
    """Kafka's ssl.key.password, ssl.keystore.key (and every PASSWORD config) are described with a null value and
    is_sensitive true; here any client (no authorizer: everyone may DescribeConfigs) read them."""
    with RawConn(server.bootstrap) as conn:
        configs = broker_configs(conn)
    for name in ("ssl.key.password", "ssl.keystore.key"):
        entry = configs[name]
        assert entry.value is None and entry.is_sensitive, (name, entry.value)
        assert all(s.value is None for s in entry.synonyms), (name, entry.synonyms)


# --- finding 3: an OAUTHBEARER token's exp is trusted as any number ------------------------------------------------

OAUTH = {**SASL, "sasl.enabled.mechanisms": "PLAIN,OAUTHBEARER"}


def unsecured_token(claims_json: str) -> bytes:
    import base64

    def b64(text: str) -> str:
        return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")
    token = b64('{"alg":"none"}') + "." + b64(claims_json) + "."
    return f"n,,\x01auth=Bearer {token}\x01\x01".encode()


@pytest.mark.server_config(OAUTH)
@pytest.mark.parametrize("exp", ["1e300", "1e400", "NaN", "-1e400", "1" + "0" * 30])
def test_oauthbearer_absurd_exp_is_refused_not_an_internal_error(server, exp):
    """A JWT's exp is a NumericDate (RFC 7519): a float beyond int64 milliseconds, infinity (1e400 parses as inf) or
    NaN must be refused as an invalid token (SASL_AUTHENTICATION_FAILED) or at worst answered with a lifetime in
    range; here the answer cannot be encoded or the validator raises, the handler fails with a traceback
    ('internal error in SaslAuthenticate') and the client gets a closed connection."""
    from compat_tests.test_bad_input import Closed, LogWatch
    watch = LogWatch(server)
    with RawConn(server.bootstrap_for("SASL_PLAINTEXT")) as conn:
        r = conn.request("SaslHandshake", 1, req("SaslHandshake", mechanism="OAUTHBEARER"))
        assert r.error_code == 0
        try:
            r = conn.request("SaslAuthenticate", 2, req("SaslAuthenticate", auth_bytes=unsecured_token(
                '{"sub":"alice","exp":%s}' % exp)))
        except Closed:
            r = None
    assert "internal error" not in watch.text() and "Traceback" not in watch.text(), watch.text()[-2000:]
    assert r is not None, "the broker closed the connection without an answer"
    if r.error_code == 0:
        assert 0 <= r.session_lifetime_ms < 2**63
    else:
        assert r.error_code == E.SASL_AUTHENTICATION_FAILED.code


# --- durability: an acknowledged ACL / SCRAM change survives kill -9, whatever the flush policy --------------------

def create_acl(conn, name: str, principal: str = "User:alice") -> None:
    cls = message("CreateAclsRequest").cls
    r = conn.request("CreateAcls", 3, cls(creations=[cls.AclCreation(
        resource_type=2, resource_name=name, resource_pattern_type=3, principal=principal, host="*", operation=3,
        permission_type=3)]))
    assert [x.error_code for x in r.results] == [0], r


def described_acl_names(conn) -> set:
    cls = message("DescribeAclsRequest").cls
    r = conn.request("DescribeAcls", 3, cls(resource_type_filter=1, resource_name_filter=None, pattern_type_filter=1,
                                            principal_filter=None, host_filter=None, operation=1, permission_type=1))
    assert r.error_code == 0, r
    return {res.resource_name for res in r.resources}


def upsert_scram(conn, user: str) -> None:
    import hashlib
    import os
    salt = os.urandom(16)
    salted = hashlib.pbkdf2_hmac("sha256", b"pw", salt, 4096)
    cls = message("AlterUserScramCredentialsRequest").cls
    r = conn.request("AlterUserScramCredentials", 0, cls(deletions=[], upsertions=[cls.ScramCredentialUpsertion(
        name=user, mechanism=1, iterations=4096, salt=salt, salted_password=salted)]))
    assert [x.error_code for x in r.results] == [0], r


def scram_users(conn) -> set:
    cls = message("DescribeUserScramCredentialsRequest").cls
    r = conn.request("DescribeUserScramCredentials", 0, cls(users=None))
    assert r.error_code == 0, r
    return {x.user for x in r.results}


@pytest.mark.server_config({"authorizer.class.name": STANDARD, "super.users": "User:ANONYMOUS",
                            "log.flush.interval.messages": 1_000_000, "log.flush.interval.ms": 600_000})
def test_security_metadata_survives_kill9_under_a_lazy_flush_policy(server):
    """Kafka's flush policy (log.flush.interval.*) lets Produce be acknowledged before its fsync; an acknowledged
    CreateAcls / AlterUserScramCredentials must still survive kill -9 (Kafka's metadata log is not under it)."""
    names = [unique("durable") for _ in range(3)]
    with RawConn(server.bootstrap) as conn:
        for name in names:
            create_acl(conn, name)
        upsert_scram(conn, "durable-user")
    server.kill9()
    with RawConn(server.bootstrap) as conn:
        assert set(names) <= described_acl_names(conn)
        assert "durable-user" in scram_users(conn)


# --- the pre-authentication gate with pipelined frames (regression checks, passing) -------------------------------

def _frames(*requests) -> bytes:
    from compat_tests.test_bad_input import encode_request
    return b"".join(encode_request(api, version, obj, cid) for cid, (api, version, obj) in enumerate(requests, 1))


@pytest.mark.server_config(SASL)
@pytest.mark.parametrize("password", ["alice-secret", "wrong", ""])
def test_frames_pipelined_behind_a_login_run_only_if_it_succeeds(server, password):
    """SaslHandshake, SaslAuthenticate and a Metadata in one write: the Metadata is answered only when the login
    succeeded; after a failed one the connection closes with the failure answer only (Kafka's authenticator reads no
    further request from a connection whose authentication failed)."""
    from compat_tests.test_bad_input import Closed, decode_response
    topic = unique("pipelined")
    with RawConn(server.bootstrap_for("SASL_PLAINTEXT")) as conn:
        conn.send(_frames(("SaslHandshake", 1, req("SaslHandshake", mechanism="PLAIN")),
                          ("SaslAuthenticate", 2, req("SaslAuthenticate",
                                                      auth_bytes=f"\0alice\0{password}".encode())),
                          ("Metadata", 12, req("Metadata", topics=[req("Metadata").MetadataRequestTopic(name=topic)],
                                               allow_auto_topic_creation=True))))
        _, hs = decode_response("SaslHandshake", 1, conn.read_frame())
        assert hs.error_code == 0
        _, auth = decode_response("SaslAuthenticate", 2, conn.read_frame())
        if password == "alice-secret":
            assert auth.error_code == 0
            _, md = decode_response("Metadata", 12, conn.read_frame())
            assert [t.error_code for t in md.topics] == [E.TOPIC_AUTHORIZATION_FAILED.code]
        else:
            assert auth.error_code == E.SASL_AUTHENTICATION_FAILED.code
            with pytest.raises(Closed):
                conn.read_frame()


# --- finding 5: the failed-login limit is checked before, and counted after, a slow check -------------------------

def test_failed_login_limit_holds_for_guesses_sent_in_parallel(server_factory_plain_file):
    """trireme.sasl.failed.authentications.per.minute=3: twelve wrong passwords for a credentials-file user sent at
    once on twelve connections must get at most three checked ('Invalid username or password'); the rest are refused
    as rate-limited without a check.  (Every one was checked before the fix: each passed the limit while the first
    was still in its worker thread, so parallel connections multiplied the guesses an address got per minute; now a
    check under way holds a reservation in the limit.)"""
    server = server_factory_plain_file
    conns = []
    try:
        for _ in range(12):
            conn = RawConn(server.bootstrap_for("SASL_PLAINTEXT"), timeout=60)
            assert conn.request("SaslHandshake", 1, req("SaslHandshake", mechanism="PLAIN")).error_code == 0
            conns.append(conn)
        cids = [c.send_request("SaslAuthenticate", 2, req("SaslAuthenticate", auth_bytes=b"\0carol\0guess"))
                for c in conns]
        answers = [c.read_response("SaslAuthenticate", 2, cid) for c, cid in zip(conns, cids)]
    finally:
        for c in conns:
            c.close()
    assert {a.error_code for a in answers} == {E.SASL_AUTHENTICATION_FAILED.code}
    checked = [a for a in answers if "too many failed" not in (a.error_message or "")]
    assert len(checked) <= 3, [a.error_message for a in answers]


SCRAM_LIMITED = {**SASL, "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256",
                 "trireme.storage.add.scram": "SCRAM-SHA-256=[name=carol,password=carol-secret]",
                 "trireme.sasl.failed.authentications.per.minute": 3}


@pytest.mark.server_config(SCRAM_LIMITED)
def test_failed_login_limit_holds_for_scram_exchanges_opened_together(server):
    """trireme.sasl.failed.authentications.per.minute=3 with SCRAM-SHA-256: twelve exchanges opened (client-first
    answered on each) before any proof is sent, then twelve wrong proofs: at most three may be checked.  No timing is
    involved: the limit used to be asked only at an exchange's first round; now every round asks it."""
    import scramp
    conns, clients = [], []
    try:
        for _ in range(12):
            conn = RawConn(server.bootstrap_for("SASL_PLAINTEXT"))
            conns.append(conn)
            assert conn.request("SaslHandshake", 1, req("SaslHandshake", mechanism="SCRAM-SHA-256")).error_code == 0
            client = scramp.ScramClient(["SCRAM-SHA-256"], "carol", "a-guess")
            r = conn.request("SaslAuthenticate", 2, req("SaslAuthenticate",
                                                        auth_bytes=client.get_client_first().encode()))
            assert r.error_code == 0, r
            client.set_server_first(r.auth_bytes.decode())
            clients.append(client)
        answers = [conn.request("SaslAuthenticate", 2, req("SaslAuthenticate",
                                                           auth_bytes=client.get_client_final().encode()))
                   for conn, client in zip(conns, clients)]
    finally:
        for c in conns:
            c.close()
    assert {a.error_code for a in answers} == {E.SASL_AUTHENTICATION_FAILED.code}
    checked = [a for a in answers if "too many failed" not in (a.error_message or "")]
    assert len(checked) <= 3, [a.error_message for a in answers]


@pytest.fixture
def server_factory_plain_file(tmp_path):
    """A broker whose SASL_PLAINTEXT listener checks PLAIN against a credentials file (carol, 1,000,000 PBKDF2
    iterations: about a second a check, so twelve parallel guesses are all in flight together)."""
    from compat_tests.conftest import ServerProcess
    from trireme.server import plain_credentials
    path = tmp_path / "plain.credentials"
    path.write_text("carol:" + plain_credentials.hash_password("carol-secret", 1_000_000) + "\n")
    props = {**SASL, "trireme.sasl.plain.credentials.file": str(path),
             "trireme.sasl.failed.authentications.per.minute": 3}
    srv = ServerProcess(tmp_path / "broker", config=props)
    srv.start()
    yield srv
    srv.stop()


# --- finding 6 (fixed in server/security.py): ACL hosts of IPv6 clients compared as Kafka writes them ---------------

V6 = {"listeners": "PLAINTEXT://127.0.0.1:0,V6://[::1]:0",
      "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,V6:PLAINTEXT",
      "authorizer.class.name": STANDARD, "allow.everyone.if.no.acl.found": True}


@pytest.mark.server_config(V6)
def test_deny_acl_for_an_ipv6_host_applies_as_in_kafka(server):
    """kafka-acls --deny-host takes the address as Kafka compares it: InetAddress.getHostAddress(), which for IPv6 is
    eight uncompressed hex groups.  ALLOW Describe on every topic for User:ANONYMOUS from any host, DENY it from
    0:0:0:0:0:0:0:1: a client on [::1] is refused (TOPIC_AUTHORIZATION_FAILED) as on Kafka (the DENY never matched
    the compressed '::1' before)."""
    topic = unique("v6")
    cls = message("CreateAclsRequest").cls
    with RawConn(server.bootstrap) as admin:                      # no ACL on the cluster yet: allowed to everyone
        r = admin.request("CreateAcls", 3, cls(creations=[
            cls.AclCreation(resource_type=2, resource_name="*", resource_pattern_type=3, principal="User:ANONYMOUS",
                            host="*", operation=8, permission_type=3),
            cls.AclCreation(resource_type=2, resource_name="*", resource_pattern_type=3, principal="User:ANONYMOUS",
                            host="0:0:0:0:0:0:0:1", operation=8, permission_type=2)]))
        assert [x.error_code for x in r.results] == [0, 0], r
    with RawConn(f"::1:{server.listener_ports['V6']}") as conn:
        r = conn.request("Metadata", 12, req("Metadata", topics=[req("Metadata").MetadataRequestTopic(name=topic)],
                                             allow_auto_topic_creation=False))
    assert [t.error_code for t in r.topics] == [E.TOPIC_AUTHORIZATION_FAILED.code]


# --- finding 8: TRIREME_CAPTURE_DIR writes passwords to disk ------------------------------------------------------

def test_capture_dir_never_holds_a_secret(tmp_path, monkeypatch):
    """The test-vector capture (TRIREME_CAPTURE_DIR) is a debugging aid someone may turn on against real clients;
    what it writes must hold no password (secrets never reach a log line, nor a file): not a SaslAuthenticate's
    PLAIN password, a SaslHandshake v0 raw token's, nor AlterUserScramCredentials' salted password."""
    import struct

    from compat_tests.conftest import ServerProcess
    capture = tmp_path / "capture"
    monkeypatch.setenv("TRIREME_CAPTURE_DIR", str(capture))
    srv = ServerProcess(tmp_path / "broker", config=SASL)
    srv.start()
    salted = b"salted-password-review-8".ljust(32, b"!")
    try:
        with login(srv, "admin") as conn:
            cls = message("AlterUserScramCredentialsRequest").cls
            r = conn.request("AlterUserScramCredentials", 0, cls(deletions=[], upsertions=[
                cls.ScramCredentialUpsertion(name="dave", mechanism=1, iterations=4096, salt=b"salt-review-8",
                                             salted_password=salted)]))
            assert [x.error_code for x in r.results] == [0], r
        login(srv, "alice").close()
        with RawConn(srv.bootstrap_for("SASL_PLAINTEXT")) as conn:      # v0: the token travels unframed
            assert conn.request("SaslHandshake", 0, req("SaslHandshake", mechanism="PLAIN")).error_code == 0
            token = b"\0bob\0bob-secret"
            conn.send(struct.pack(">i", len(token)) + token)
            assert conn.read_frame() == b""
    finally:
        srv.stop()
    written = b"".join(bytes.fromhex(p.read_text().strip()) for p in capture.rglob("*.hex"))
    assert written, "nothing captured: the test no longer exercises the capture"
    for secret in (b"alice-secret", b"bob-secret", b"admin-pw", salted):
        assert secret not in written, secret
