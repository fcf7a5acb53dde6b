"""Unit tests of SASL authentication: JAAS parsing, the PLAIN credentials file, each mechanism's server, and the
per-connection state machine (server/authentication.py) driven through the handlers with stand-in connections."""
from __future__ import annotations

import base64
import json
import time
import types

import pytest
import scramp
import trio

from trireme.server import authentication, dispatch, jaas, oauthbearer, plain_credentials, sasl_mechanisms
from trireme.server.config import Config
from trireme.server.dispatch import CloseConnection
from trireme.server.deferred import Deferred
from trireme.server.dispatch import API_KEYS, HANDLERS, RequestContext
from trireme.server.metrics import Metrics
from trireme.wire import error_codes as E
from trireme.wire import headers

dispatch.load_handlers()


def run(coro_fn, *args):
    return trio.run(coro_fn, *args)


# --------------------------------------------------------------------------- JAAS

def test_jaas_plain_users_as_kafka_parses_them():
    text = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" '
            'password="admin-secret" user_admin="admin-secret" user_alice=\'al;ice\' /* a comment */ '
            'user_bob=bob-pw // to the end of the line\n ;')
    module = jaas.parse_one(text)
    assert module.name == "org.apache.kafka.common.security.plain.PlainLoginModule"
    assert module.control_flag == "REQUIRED"
    assert module.options == {"username": "admin", "password": "admin-secret", "user_admin": "admin-secret",
                              "user_alice": "al;ice", "user_bob": "bob-pw"}


def test_jaas_escapes_and_unterminated_quote():
    assert jaas.parse_one(r'M optional k="a\"b\tc\101";').options == {"k": 'a"b\tcA'}
    # a quoted string ends at the end of the line, as Java's StreamTokenizer
    assert jaas.parse_one('M required k="abc\n;').options == {"k": "abc"}


@pytest.mark.parametrize("text, message", [
    ("", "Login module not specified in JAAS config"),
    ("M", "Login module control flag not specified in JAAS config"),
    ("M maybe;", "Invalid login module control flag 'maybe' in JAAS config"),
    ("M required k=;", "Value not specified for key 'k' in JAAS config"),
    ("M required k", "Value not specified for key 'k' in JAAS config"),
    ("M required k=v", "JAAS config entry not terminated by semi-colon"),
    ("M required; N required;", "JAAS config property contains 2 login modules, should be 1 module"),
    ("M required k=/etc/x;", "Value not specified for key 'k' in JAAS config"),      # '/' starts a comment
])
def test_jaas_refusals_have_kafkas_messages(text, message):
    with pytest.raises(jaas.JaasError) as e:
        jaas.parse_one(text)
    assert str(e.value) == message


def test_jaas_is_bounded():
    with pytest.raises(jaas.JaasError):
        jaas.parse("M required " + "k=v " * (jaas.MAX_JAAS_CHARS // 4) + ";")


# --------------------------------------------------------------------------- PLAIN credentials file

def test_credentials_file_holds_hashes_only(tmp_path):
    path = str(tmp_path / "plain.credentials")
    plain_credentials.set_user(path, "alice", "wonderland", iterations=10_000)
    plain_credentials.set_user(path, "b:o:b", "builder", iterations=10_000)
    text = open(path).read()
    assert "wonderland" not in text and "builder" not in text
    assert (tmp_path / "plain.credentials").stat().st_mode & 0o777 == 0o600
    users = plain_credentials.read(path)
    assert set(users) == {"alice", "b:o:b"}
    assert plain_credentials.verify(users["alice"], "wonderland")
    assert not plain_credentials.verify(users["alice"], "wonderlanD")
    plain_credentials.set_user(path, "alice", None)
    assert set(plain_credentials.read(path)) == {"b:o:b"}


def test_unknown_users_decoy_costs_the_files_usual_iterations():
    """An unknown PLAIN user's password is checked against a decoy with the iterations most of the file's users have
    (review finding 4); no password matches it."""
    users = {name: plain_credentials.hash_password("pw", iterations) for name, iterations in
             (("a", 20_000), ("b", 20_000), ("c", 30_000))}
    decoy = plain_credentials.decoy_hash(users)
    assert decoy.split(":")[1] == "20000" and not plain_credentials.verify(decoy, "pw")
    assert plain_credentials.decoy_hash({}).split(":")[1] == str(plain_credentials.DEFAULT_ITERATIONS)


@pytest.mark.parametrize("line", ["alice:md5:1:AA==:AA==", "alice:pbkdf2-sha512:1:AA==:" + "A" * 88,
                                  "alice:pbkdf2-sha512:99999999999:AA==:" + base64.b64encode(bytes(64)).decode(),
                                  "no-colons"])
def test_credentials_file_refuses_bad_lines(line):
    with pytest.raises(plain_credentials.CredentialsError):
        plain_credentials.parse(line + "\n")


# --------------------------------------------------------------------------- mechanisms

def plain_server(users=None, file=None):
    return sasl_mechanisms.PlainServer(users or {}, file)


def test_plain_against_jaas_users():
    server = plain_server({"alice": "pw"})
    assert run(server.evaluate, b"\0alice\0pw") == b""
    assert server.complete and server.user == "alice"
    for token, message in ((b"\0alice\0bad", "Authentication failed: Invalid username or password"),
                           (b"\0nobody\0pw", "Authentication failed: Invalid username or password"),
                           (b"bob\0alice\0pw", "Authentication failed: Client requested an authorization id "
                                               "that is different from username")):
        with pytest.raises(sasl_mechanisms.SaslFailure) as e:
            run(plain_server({"alice": "pw"}).evaluate, token)
        assert e.value.client_message == message
    for token in (b"", b"\0\0pw", b"\0alice\0", b"garbage"):
        with pytest.raises(sasl_mechanisms.SaslFailure) as e:
            run(plain_server({"alice": "pw"}).evaluate, token)
        assert e.value.client_message is None              # Kafka's SaslException: the standard message


def test_plain_against_the_credentials_file(tmp_path):
    path = str(tmp_path / "creds")
    plain_credentials.set_user(path, "carol", "s3cret", iterations=10_000)
    file = plain_credentials.CredentialsFile(path)
    server = plain_server(file=file)
    run(server.evaluate, b"\0carol\0s3cret")
    assert server.user == "carol"
    with pytest.raises(sasl_mechanisms.SaslFailure):
        run(plain_server(file=file).evaluate, b"\0carol\0wrong")
    plain_credentials.set_user(path, "carol", "changed", iterations=10_000)      # read again when it changes
    run(plain_server(file=file).evaluate, b"\0carol\0changed")


class Credential:
    def __init__(self, mechanism, password, iterations=4096):
        salt, stored, server, i = scramp.ScramMechanism(mechanism).make_auth_info(password, iteration_count=iterations)
        self.salt, self.stored_key, self.server_key, self.iterations = salt, stored, server, i


class StandInSecurity:
    """broker.security with SCRAM credentials set in-process (until the acls engineer's storage is on main)."""

    def __init__(self, **users):
        self.credentials = {}
        for user, password in users.items():
            for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
                self.credentials[(user, mechanism)] = Credential(mechanism, password)

    def scram_credential(self, user, mechanism):
        return self.credentials.get((user, mechanism))


def scram_login(server, user, password, mechanism="SCRAM-SHA-512"):
    client = scramp.ScramClient([mechanism], user, password)
    first = run(server.evaluate, client.get_client_first().encode())
    client.set_server_first(first.decode())
    final = run(server.evaluate, client.get_client_final().encode())
    client.set_server_final(final.decode())         # raises unless the server proved it knows the key


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram(mechanism):
    security = StandInSecurity(alice="pw")
    server = sasl_mechanisms.ScramServer(mechanism, security)
    scram_login(server, "alice", "pw", mechanism)
    assert server.complete and server.user == "alice"
    for user, password in (("alice", "wrong"), ("nobody", "pw")):
        with pytest.raises(sasl_mechanisms.SaslFailure) as e:
            scram_login(sasl_mechanisms.ScramServer(mechanism, security), user, password, mechanism)
        assert e.value.client_message is None


def test_scram_refuses_tokenauth_and_other_authzid():
    security = StandInSecurity(alice="pw")
    with pytest.raises(sasl_mechanisms.SaslFailure) as e:
        run(sasl_mechanisms.ScramServer("SCRAM-SHA-512", security).evaluate,
            b"n,,n=alice,r=abcdefghijklmnop,tokenauth=true")
    assert "tokenauth" in e.value.reason
    with pytest.raises(sasl_mechanisms.SaslFailure) as e:
        run(sasl_mechanisms.ScramServer("SCRAM-SHA-512", security).evaluate, b"n,a=bob,n=alice,r=abcdefghijklmnop")
    assert e.value.client_message == ("Authentication failed: Client requested an authorization id that is "
                                      "different from username")


def b64(obj) -> str:
    return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()


def unsecured(claims, header=None) -> str:
    return f"{b64(header or {'alg': 'none'})}.{b64(claims)}."


def initial_response(token: str, authzid: str = "", extensions: str = "") -> bytes:
    return f"n,{'a=' + authzid if authzid else ''},\x01auth=Bearer {token}\x01{extensions}\x01".encode()


def oauth(token_bytes, options=None):
    server = sasl_mechanisms.OAuthBearerServer(oauthbearer.UnsecuredValidator(options or {}))
    return server, run(server.evaluate, token_bytes)


def test_oauthbearer_unsecured_accepts_as_kafka_does():
    now = int(time.time())
    server, answer = oauth(initial_response(unsecured({"sub": "alice", "exp": now + 60, "iat": now}),
                                            extensions="traceId=123\x01"))
    assert answer == b"" and server.complete and server.user == "alice"
    assert abs(server.lifetime_ms - (now + 60) * 1000) < 2


@pytest.mark.parametrize("claims, options, status", [
    ({"sub": "alice"}, {}, "invalid_token"),                                       # no exp
    ({"sub": "alice", "exp": 1}, {}, "invalid_token"),                              # expired
    ({"exp": 4e9}, {}, "invalid_token"),                                            # no sub
    ({"sub": "alice", "exp": 4e9, "iat": 3.9e9}, {}, "invalid_token"),              # issued in the future
    ({"sub": "alice", "exp": 4e9, "scope": "read"}, {"unsecuredValidatorRequiredScope": "write"},
     "insufficient_scope"),
    ({"sub": "alice", "exp": float("inf")}, {}, "invalid_token"),                   # exp beyond any NumericDate
    ({"sub": "alice", "exp": float("nan")}, {}, "invalid_token"),
    ({"sub": "alice", "exp": 1e300}, {}, "invalid_token"),                          # ms beyond int64
    ({"sub": "alice", "exp": 10**30}, {}, "invalid_token"),
    ({"sub": "alice", "exp": 4e9, "iat": float("nan")}, {}, "invalid_token"),
])
def test_oauthbearer_unsecured_refusals_answer_the_json_error_then_fail(claims, options, status):
    server, answer = oauth(initial_response(unsecured(claims)), options)
    error = json.loads(answer)
    assert error["status"] == status and not server.complete
    with pytest.raises(sasl_mechanisms.SaslFailure) as e:
        run(server.evaluate, b"\x01")
    assert e.value.client_message == answer.decode()


def test_oauthbearer_refuses_signed_tokens_without_jwks_and_bad_messages():
    _, answer = oauth(initial_response(unsecured({"sub": "a", "exp": 4e9}, {"alg": "RS256"})))
    assert json.loads(answer) == {"status": "invalid_token"}
    for token in (b"", b"n,,\x01auth=Basic abc\x01\x01", b"n,,\x01\x01", b"y,,\x01auth=Bearer x\x01\x01",
                  b"\xff" * 10, b"n,,\x01auth=Bearer " + b"a" * 10 + b"\x01"):
        with pytest.raises(sasl_mechanisms.SaslFailure) as e:
            oauth(token)
        assert e.value.client_message is None
    with pytest.raises(sasl_mechanisms.SaslFailure) as e:
        oauth(initial_response(unsecured({"sub": "alice", "exp": 4e9}), authzid="bob"))
    assert "(bob)" in e.value.client_message and "(alice)" in e.value.client_message


def rsa_jwks(tmp_path, kid="k1"):
    import jwt
    from cryptography.hazmat.primitives.asymmetric import rsa
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    public.update(kid=kid, use="sig", alg="RS256")
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps({"keys": [public]}))
    return key, f"file://{path}"


def test_oauthbearer_jwks_validation(tmp_path):
    import jwt
    key, url = rsa_jwks(tmp_path)
    validator = oauthbearer.JwtValidator(oauthbearer.JwksCache(url, 3600000), issuer="https://issuer",
                                         audience=["kafka"], sub_claim="sub", skew_seconds=30)
    now = int(time.time())
    good = {"sub": "svc", "iss": "https://issuer", "aud": "kafka", "exp": now + 60, "iat": now}

    def signed(claims, kid="k1", signing_key=key):
        return jwt.encode(claims, signing_key, algorithm="RS256", headers={"kid": kid})

    async def check(token):
        server = sasl_mechanisms.OAuthBearerServer(validator)
        answer = await server.evaluate(initial_response(token))
        return server, answer

    server, answer = run(check, signed(good))
    assert answer == b"" and server.user == "svc" and server.lifetime_ms == (now + 60) * 1000
    from cryptography.hazmat.primitives.asymmetric import rsa
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    for token in (signed({**good, "iss": "https://evil"}), signed({**good, "aud": "other"}),
                  signed({**good, "exp": now - 100}), signed({k: v for k, v in good.items() if k != "iat"}),
                  signed({k: v for k, v in good.items() if k != "sub"}), signed(good, signing_key=other),
                  signed(good, kid="unknown"), unsecured(good), signed({**good, "exp": float("inf")}),
                  signed({**good, "exp": float("nan")}), signed({**good, "exp": 1e300})):
        server, answer = run(check, token)
        assert json.loads(answer) == {"status": "invalid_token"} and not server.complete, token


# --------------------------------------------------------------------------- the state machine

class StandInConnection:
    """What the authenticator reads of a connection; ``listener`` as the tls engineer's conn.listener."""

    def __init__(self, broker, protocol="SASL_PLAINTEXT", name="SASL_PLAINTEXT"):
        self.broker = broker
        self.listener = types.SimpleNamespace(name=name, security_protocol=protocol)
        self.host = "10.0.0.1"
        self.peer = "10.0.0.1:5555"
        self.principal = "User:ANONYMOUS"
        self.unstable_api_versions = False
        self.authentication = authentication.for_connection(self)


def stand_in_broker(tmp_path=None, **props):
    config = Config(data_dir="/nonexistent")
    props = {"sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-512,OAUTHBEARER",
             "listener.name.sasl_plaintext.plain.sasl.jaas.config":
                 'org.apache.kafka.common.security.plain.PlainLoginModule required user_alice="pw" user_bob="pw2";',
             "connection.failed.authentication.delay.ms": 0, **props}
    for name, value in props.items():
        config.set(name, value)
    return types.SimpleNamespace(config=config, metrics=Metrics(), security=StandInSecurity(alice="pw"))


def request_frame(api, version, **fields) -> bytearray:
    from trireme.server.admin.client import encode_request
    h = HANDLERS[API_KEYS[api]]
    return bytearray(encode_request(api, version, h.request.cls(**fields), 1, "t")[4:])


def call(conn, api, version, **fields):
    """Gate the request as the connection does, then run its handler → (gate verdict, response)."""
    data = request_frame(api, version, **fields)

    async def go():
        verdict = await conn.authentication.gate(data)
        if verdict is not None or api not in ("ApiVersions", "SaslHandshake", "SaslAuthenticate"):
            return verdict, None            # (other APIs: only whether the gate lets them through)
        h = HANDLERS[API_KEYS[api]]
        header = headers.decode_request_header(data, h.request.is_flexible(version))
        decoded, _ = h.request.decode(memoryview(data), version, header.size)
        ctx = RequestContext(conn.broker, h.api_key, version, 1, "t", conn.principal, conn, data)
        result = h.fn(ctx, decoded)
        if hasattr(result, "__await__"):
            result = await result
        if isinstance(result, Deferred):
            result = await result.wait()
        return None, result
    return trio.run(go)


def test_plaintext_listener_has_no_authenticator():
    assert StandInConnection(stand_in_broker(), protocol="PLAINTEXT").authentication is None


def test_plain_login_then_requests_pass():
    conn = StandInConnection(stand_in_broker())
    assert call(conn, "ApiVersions", 2)[0] is None
    _, r = call(conn, "SaslHandshake", 1, mechanism="PLAIN")
    assert (r.error_code, sorted(r.mechanisms)) == (0, ["OAUTHBEARER", "PLAIN", "SCRAM-SHA-512"])
    _, r = call(conn, "SaslAuthenticate", 2, auth_bytes=b"\0alice\0pw")
    assert (r.error_code, r.session_lifetime_ms) == (0, 0)
    assert conn.principal == "User:alice"
    assert call(conn, "Metadata", 12, topics=[])[0] is None          # passes the gate
    _, r = call(conn, "SaslAuthenticate", 2, auth_bytes=b"\0alice\0pw")     # Kafka's request handler answers
    assert r.error_code == E.ILLEGAL_SASL_STATE.code
    _, r = call(conn, "SaslHandshake", 1, mechanism="PLAIN")
    assert (r.error_code, r.mechanisms) == (E.ILLEGAL_SASL_STATE.code, [])
    assert conn.broker.metrics.authentications[("SASL_PLAINTEXT", "PLAIN", "success")] == 1


@pytest.mark.parametrize("api, version, fields", [("Metadata", 12, {"topics": []}),
                                                  ("SaslAuthenticate", 1, {"auth_bytes": b"x"}),
                                                  ("Produce", 9, {"acks": 1, "timeout_ms": 1, "topic_data": []})])
def test_requests_before_authentication_close_the_connection(api, version, fields):
    conn = StandInConnection(stand_in_broker())
    with pytest.raises(CloseConnection):
        call(conn, api, version, **fields)


def test_second_api_versions_and_requests_mid_exchange_close():
    conn = StandInConnection(stand_in_broker())
    call(conn, "ApiVersions", 2)
    with pytest.raises(CloseConnection):
        call(conn, "ApiVersions", 2)
    conn = StandInConnection(stand_in_broker())
    call(conn, "SaslHandshake", 1, mechanism="SCRAM-SHA-512")
    with pytest.raises(CloseConnection):
        call(conn, "Metadata", 12, topics=[])


def test_unsupported_mechanism_lists_the_enabled_ones_and_closes():
    conn = StandInConnection(stand_in_broker())
    _, r = call(conn, "SaslHandshake", 1, mechanism="GSSAPI")
    assert r.error_code == E.UNSUPPORTED_SASL_MECHANISM.code
    assert sorted(r.mechanisms) == ["OAUTHBEARER", "PLAIN", "SCRAM-SHA-512"]
    assert conn.authentication.closing is not None


def test_handshake_during_the_exchange_is_illegal_sasl_state():
    conn = StandInConnection(stand_in_broker())
    call(conn, "SaslHandshake", 1, mechanism="PLAIN")
    _, r = call(conn, "SaslHandshake", 1, mechanism="PLAIN")
    assert r.error_code == E.ILLEGAL_SASL_STATE.code and conn.authentication.closing is not None


def test_failed_login_answers_kafkas_message_counts_and_rate_limits():
    broker = stand_in_broker(**{"trireme.sasl.failed.authentications.per.minute": 2})
    for _ in range(2):
        conn = StandInConnection(broker)
        call(conn, "SaslHandshake", 1, mechanism="PLAIN")
        _, r = call(conn, "SaslAuthenticate", 2, auth_bytes=b"\0alice\0wrong")
        assert (r.error_code, r.error_message) == (E.SASL_AUTHENTICATION_FAILED.code,
                                                   "Authentication failed: Invalid username or password")
        assert conn.authentication.closing and conn.principal == "User:ANONYMOUS"
    conn = StandInConnection(broker)                 # over the limit: refused without looking at the password
    call(conn, "SaslHandshake", 1, mechanism="PLAIN")
    _, r = call(conn, "SaslAuthenticate", 2, auth_bytes=b"\0alice\0pw")
    assert r.error_code == E.SASL_AUTHENTICATION_FAILED.code and "too many" in r.error_message
    assert broker.metrics.authentications[("SASL_PLAINTEXT", "PLAIN", "failure")] == 3
    assert len(broker._sasl_service.failed_logins._failures["10.0.0.1"]) == 2     # a refusal is no new failure


def test_failed_logins_table_is_bounded():
    table = authentication.FailedLogins(limit=3, max_addresses=100)
    for i in range(10_000):
        table.record(f"10.0.{i // 256}.{i % 256}", 0.0)
    assert len(table._failures) == 100


def test_failed_logins_checks_under_way_hold_the_limit():
    """Review finding 5: a reserved attempt counts against the limit until it settles; a round finding the limit
    taken up by checks under way waits for one, a success releases its attempt, a failure is recorded."""
    table = authentication.FailedLogins(limit=2)
    log = []

    async def attempt(name, fails, took):
        if not await table.reserve("h", clock=lambda: 0.0):
            log.append((name, "refused"))
            return
        log.append((name, "checking"))
        await trio.sleep(took)
        table.settle("h", fails, 0.0)
        log.append((name, "failed" if fails else "passed"))

    async def main():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(attempt, "a", True, 1)
            await trio.sleep(0.1)
            nursery.start_soon(attempt, "b", False, 2)
            await trio.sleep(0.4)
            nursery.start_soon(attempt, "c", True, 1)        # two under way: waits until a failure and b are not
            await trio.sleep(3)
            nursery.start_soon(attempt, "d", True, 1)        # a's and c's failures: the limit is reached
    import trio.testing
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))      # (the sleeps only order the attempts)
    assert log == [("a", "checking"), ("b", "checking"), ("a", "failed"), ("b", "passed"), ("c", "checking"),
                   ("c", "failed"), ("d", "refused")]
    assert len(table._failures["h"]) == 2 and not table._pending and not table._settled


def test_scram_generic_failure_message():
    conn = StandInConnection(stand_in_broker())
    call(conn, "SaslHandshake", 1, mechanism="SCRAM-SHA-512")
    client = scramp.ScramClient(["SCRAM-SHA-512"], "nobody", "pw")
    _, r = call(conn, "SaslAuthenticate", 1, auth_bytes=client.get_client_first().encode())
    assert (r.error_code, r.error_message) == (E.SASL_AUTHENTICATION_FAILED.code,
                                               "Authentication failed during authentication due to invalid "
                                               "credentials with SASL mechanism SCRAM-SHA-512")


def test_v0_unframed_exchange():
    conn = StandInConnection(stand_in_broker())
    _, r = call(conn, "SaslHandshake", 0, mechanism="SCRAM-SHA-512")
    assert r.error_code == 0
    client = scramp.ScramClient(["SCRAM-SHA-512"], "alice", "pw")
    first = run(conn.authentication.gate, bytearray(client.get_client_first().encode()))
    client.set_server_first(first.decode())
    final = run(conn.authentication.gate, bytearray(client.get_client_final().encode()))
    client.set_server_final(final.decode())
    assert conn.principal == "User:alice"
    conn = StandInConnection(stand_in_broker())
    call(conn, "SaslHandshake", 0, mechanism="PLAIN")
    assert run(conn.authentication.gate, bytearray(b"\0alice\0nope")) is authentication.NO_ANSWER
    assert conn.authentication.closing and conn.authentication.delay_in_reader


def test_session_lifetime_reauthentication_and_expiry():
    broker = stand_in_broker(**{"connections.max.reauth.ms": 60_000})
    conn = StandInConnection(broker)
    call(conn, "SaslHandshake", 1, mechanism="PLAIN")
    _, r = call(conn, "SaslAuthenticate", 1, auth_bytes=b"\0alice\0pw")
    assert 0 < r.session_lifetime_ms <= 60_000
    conn.authentication.reauth_started = -1e18
    _, r = call(conn, "SaslHandshake", 1, mechanism="PLAIN")             # re-authentication begins
    assert r.error_code == 0
    _, r = call(conn, "SaslAuthenticate", 1, auth_bytes=b"\0bob\0pw2")   # another principal: refused
    assert r.error_code == E.SASL_AUTHENTICATION_FAILED.code
    assert r.error_message == "Cannot change principals during re-authentication from User.alice: User.bob"

    conn = StandInConnection(broker)
    call(conn, "SaslHandshake", 1, mechanism="PLAIN")
    call(conn, "SaslAuthenticate", 1, auth_bytes=b"\0alice\0pw")
    call(conn, "SaslHandshake", 1, mechanism="PLAIN")
    _, r = call(conn, "SaslAuthenticate", 1, auth_bytes=b"\0alice\0pw")
    assert r.error_code == 0 and conn.principal == "User:alice"
    conn.authentication.expires_at = time.monotonic() - 1                  # the session is over
    with pytest.raises(CloseConnection, match="expired"):
        call(conn, "Metadata", 12, topics=[])


def test_oauthbearer_session_lifetime_is_the_tokens():
    conn = StandInConnection(stand_in_broker())
    call(conn, "SaslHandshake", 1, mechanism="OAUTHBEARER")
    token = unsecured({"sub": "svc", "exp": time.time() + 30})
    _, r = call(conn, "SaslAuthenticate", 2, auth_bytes=initial_response(token))
    assert r.error_code == 0 and 25_000 < r.session_lifetime_ms <= 30_000 and conn.principal == "User:svc"
    conn = StandInConnection(stand_in_broker())                            # the latest exp whose ms fit an int64
    call(conn, "SaslHandshake", 1, mechanism="OAUTHBEARER")
    _, r = call(conn, "SaslAuthenticate", 2, auth_bytes=initial_response(unsecured({"sub": "svc",
                                                                                    "exp": (2**63 - 1) // 1000})))
    assert r.error_code == 0 and 0 < r.session_lifetime_ms < 2**63


def test_reauthentication_with_another_mechanism_fails():
    broker = stand_in_broker(**{"connections.max.reauth.ms": 60_000})
    conn = StandInConnection(broker)
    call(conn, "SaslHandshake", 1, mechanism="PLAIN")
    call(conn, "SaslAuthenticate", 1, auth_bytes=b"\0alice\0pw")
    conn.authentication.reauth_started = -1e18
    _, r = call(conn, "SaslHandshake", 1, mechanism="SCRAM-SHA-512")
    assert r.error_code == 0
    verdict, _ = call(conn, "SaslAuthenticate", 1, auth_bytes=b"x")
    assert verdict is authentication.NO_ANSWER and conn.authentication.closing


def test_misconfigured_listener_closes_with_the_reason():
    conn = StandInConnection(stand_in_broker(**{"sasl.enabled.mechanisms": "GSSAPI"}))
    with pytest.raises(CloseConnection, match="GSSAPI"):
        call(conn, "SaslHandshake", 1, mechanism="GSSAPI")


def test_jwks_cache_fetches_once_keeps_keys_on_failure_and_retries_unknown_kids(tmp_path):
    _, url = rsa_jwks(tmp_path)
    calls = []

    def fetch(u):
        calls.append(u)
        if len(calls) == 2:
            raise OSError("network down")
        return oauthbearer._read_limited(u)
    cache = oauthbearer.JwksCache(url, 3600000, fetch=fetch)

    async def go():
        first = await cache.keys()
        assert await cache.keys() is first and len(calls) == 1          # cached
        cache._fetched -= oauthbearer.JWKS_RETRY_S
        assert await cache.keys(unknown_kid=True) is first and len(calls) == 2     # refreshed, failed: kept
        assert await cache.keys(unknown_kid=True) is first and len(calls) == 2     # not again at once
    trio.run(go)


def test_jwks_is_bounded(tmp_path):
    path = tmp_path / "big.json"
    path.write_bytes(b" " * (oauthbearer.MAX_JWKS_BYTES + 1))
    with pytest.raises(ValueError):
        oauthbearer._read_limited(f"file://{path}")
    with pytest.raises(ValueError):
        oauthbearer.parse_jwks(json.dumps({"keys": [{}] * (oauthbearer.MAX_JWKS_KEYS + 1)}).encode())


def test_check_listeners_refuses_what_cannot_work():
    listeners = [types.SimpleNamespace(name="PLAINTEXT", security_protocol="PLAINTEXT"),
                 types.SimpleNamespace(name="SASL_PLAINTEXT", security_protocol="SASL_PLAINTEXT")]
    authentication.check_listeners(stand_in_broker().config, listeners)
    for props, needle in (({"sasl.enabled.mechanisms": "GSSAPI"}, "GSSAPI"),
                          ({"listener.name.sasl_plaintext.plain.sasl.jaas.config": "M required user_a=b"},
                           "terminated by semi-colon"),
                          ({"sasl.enabled.mechanisms": "PLAIN",
                            "listener.name.sasl_plaintext.plain.sasl.jaas.config": "M required;"}, "no users")):
        with pytest.raises(authentication.SaslConfigError, match=needle):
            authentication.check_listeners(stand_in_broker(**props).config, listeners)


def test_jaas_lines_are_not_reported_as_without_effect(caplog):
    config = stand_in_broker(**{"sasl.jaas.config": "M required user_x=\"y\";",
                                "listener.name.sasl_ssl.oauthbearer.sasl.oauthbearer.expected.issuer": "https://i",
                                "num.network.threads": 3}).config
    with caplog.at_level("INFO", logger="trireme.config"):
        config.report_no_effect()
    assert "jaas" not in caplog.text and "expected.issuer" not in caplog.text
    assert "num.network.threads" in caplog.text            # what has no effect is still said


def test_jwks_over_https_is_fetched_off_the_event_loop(tmp_path, monkeypatch):
    import http.server
    import ssl
    import threading

    import trustme
    _, url = rsa_jwks(tmp_path)
    body = open(url[len("file://"):], "rb").read()
    ca = trustme.CA()
    ca_path = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_path))
    monkeypatch.setenv("SSL_CERT_FILE", str(ca_path))

    class Slow(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            time.sleep(0.5)                         # a slow identity provider
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass
    server = http.server.HTTPServer(("127.0.0.1", 0), Slow)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    cache = oauthbearer.JwksCache(f"https://127.0.0.1:{server.server_address[1]}/jwks.json", 3600000)
    ticks = 0

    async def go():
        nonlocal ticks

        async def ticker():
            nonlocal ticks
            while True:
                ticks += 1
                await trio.sleep(0.01)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ticker)
            keys = await cache.keys()
            nursery.cancel_scope.cancel()
        return keys
    try:
        keys = trio.run(go)
    finally:
        server.shutdown()
    assert [k.key_id for k in keys] == ["k1"]
    assert ticks >= 3                               # the event loop ran while the fetch waited
