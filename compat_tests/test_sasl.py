"""SASL over a SASL_PLAINTEXT listener against a real broker: stock clients (confluent-kafka, kafka-python) with PLAIN,
SCRAM-SHA-256/512, OAUTHBEARER (unsecured JWS, and JWTs against a JWKS), PLAIN from the hashed credentials file, librdkafka's
re-authentication, and raw frames for the pre-authentication gate, the v0 unframed
exchange, the failure delay and KIP-368 re-authentication and expiry.

SCRAM users come from trireme.storage.add.scram (stored durably by the broker)."""
from __future__ import annotations

import struct
import time

import pytest
from confluent_kafka import Consumer, KafkaError, Producer

from compat_tests.sasl_support import plain_login, sasl_server  # noqa: F401  (fixture)
from compat_tests.test_bad_input import LogWatch, RawConn, req, unique
from trireme.wire import error_codes as E

pytestmark = pytest.mark.trireme_only("reads the broker's log")

MECHANISM_SETTINGS = {
    "PLAIN": {"sasl.username": "alice", "sasl.password": "alice-secret"},
    "SCRAM-SHA-256": {"sasl.username": "alice", "sasl.password": "alice-secret"},
    "SCRAM-SHA-512": {"sasl.username": "alice", "sasl.password": "alice-secret"},
    "OAUTHBEARER": {"enable.sasl.oauthbearer.unsecure.jwt": True, "sasl.oauthbearer.config": "principal=alice"},
}


def confluent(bootstrap, mechanism, **extra):
    return {"bootstrap.servers": bootstrap, "security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": mechanism,
            **MECHANISM_SETTINGS[mechanism], **extra}


def roundtrip(bootstrap, settings, count=5) -> None:
    """Produce ``count`` records (idempotent) and read them back in a group, with these client settings."""
    topic = unique("sasl")
    producer = Producer({**settings, "bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(count):
        producer.produce(topic, value=b"m%d" % i)
    assert producer.flush(30) == 0
    consumer = Consumer({**settings, "bootstrap.servers": bootstrap, "group.id": unique("g"),
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    got = []
    deadline = time.monotonic() + 30
    while len(got) < count and time.monotonic() < deadline:
        m = consumer.poll(0.5)
        if m is not None and m.error() is None:
            got.append(m.value())
    consumer.close()
    assert got == [b"m%d" % i for i in range(count)]


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"])
def test_confluent_kafka_produces_and_consumes(sasl_server, mechanism):
    srv = sasl_server()
    roundtrip(srv.sasl_bootstrap, confluent(srv.sasl_bootstrap, mechanism))
    log = srv.stderr_path.read_text()
    assert f"authenticated principal=User:alice mechanism={mechanism}" in log
    assert "alice-secret" not in log


def test_plain_users_from_the_hashed_credentials_file(sasl_server, tmp_path):
    from trireme.server import plain_credentials
    path = tmp_path / "plain.credentials"
    plain_credentials.set_user(str(path), "carol", "carol-secret")
    srv = sasl_server(**{"trireme.sasl.plain.credentials.file": str(path)})
    roundtrip(srv.sasl_bootstrap, {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "PLAIN",
                              "sasl.username": "carol", "sasl.password": "carol-secret"})
    plain_credentials.set_user(str(path), "dave", "dave-secret")          # read again when it changes
    roundtrip(srv.sasl_bootstrap, {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "PLAIN",
                              "sasl.username": "dave", "sasl.password": "dave-secret"}, count=1)
    assert "carol-secret" not in path.read_text()
    assert "authenticated principal=User:dave mechanism=PLAIN" in srv.stderr_path.read_text()


def test_oauthbearer_jwt_validated_against_a_jwks(sasl_server, tmp_path):
    import json

    import jwt
    from cryptography.hazmat.primitives.asymmetric import rsa
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    public.update(kid="test-key", use="sig", alg="RS256")
    (tmp_path / "jwks.json").write_text(json.dumps({"keys": [public]}))
    srv = sasl_server(**{"sasl.oauthbearer.jwks.endpoint.url": f"file://{tmp_path / 'jwks.json'}",
                         "sasl.oauthbearer.expected.issuer": "https://idp.example",
                         "sasl.oauthbearer.expected.audience": "kafka"})

    def token_for(issuer):
        def oauth_cb(_config):
            now = time.time()
            claims = {"sub": "service-a", "iss": issuer, "aud": "kafka", "iat": int(now), "exp": int(now) + 300}
            return jwt.encode(claims, key, algorithm="RS256", headers={"kid": "test-key"}), now + 300
        return oauth_cb
    roundtrip(srv.sasl_bootstrap, {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "OAUTHBEARER",
                              "oauth_cb": token_for("https://idp.example")}, count=2)
    assert "authenticated principal=User:service-a mechanism=OAUTHBEARER" in srv.stderr_path.read_text()
    errors = []
    producer = Producer({"bootstrap.servers": srv.sasl_bootstrap, "security.protocol": "SASL_PLAINTEXT",
                         "sasl.mechanisms": "OAUTHBEARER", "oauth_cb": token_for("https://evil.example"),
                         "error_cb": errors.append})
    deadline = time.monotonic() + 20
    while not errors and time.monotonic() < deadline:
        producer.poll(0.2)
    assert errors and errors[0].code() == KafkaError._AUTHENTICATION, errors
    assert '{"status":"invalid_token"}' in errors[0].str(), errors[0]


def test_librdkafka_reauthenticates_within_the_session_lifetime(sasl_server):
    srv = sasl_server(**{"connections.max.reauth.ms": 3000})
    settings = confluent(srv.sasl_bootstrap, "SCRAM-SHA-512")
    producer = Producer({**settings, "enable.idempotence": True})
    topic = unique("reauth")
    deadline = time.monotonic() + 8                 # past two session lifetimes: the client re-authenticates
    sent = 0
    while time.monotonic() < deadline:
        producer.produce(topic, value=b"r%d" % sent)
        sent += 1
        assert producer.flush(10) == 0
        time.sleep(0.2)
    log = srv.stderr_path.read_text()
    assert "re-authenticated principal=User:alice mechanism=SCRAM-SHA-512" in log, log[-3000:]
    assert "expired" not in log


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
def test_confluent_kafka_wrong_password_fails_with_kafkas_error(sasl_server, mechanism):
    srv = sasl_server()
    errors = []
    producer = Producer({**confluent(srv.sasl_bootstrap, mechanism), "sasl.password": "not-it",
                         "error_cb": lambda e: errors.append(e)})
    deadline = time.monotonic() + 20
    while not errors and time.monotonic() < deadline:
        producer.poll(0.2)
    assert errors and errors[0].code() == KafkaError._AUTHENTICATION, errors
    assert ("Authentication failed: Invalid username or password" if mechanism == "PLAIN" else
            "Authentication failed during authentication due to invalid credentials with SASL mechanism "
            "SCRAM-SHA-512") in errors[0].str(), errors[0]
    log = srv.stderr_path.read_text()
    assert f"authentication failed listener=SASL_PLAINTEXT mechanism={mechanism} user=alice" in log
    assert "not-it" not in log


def unsecured_jws(sub: str, lifetime_s: int = 300) -> str:
    import base64
    import json

    def b64(obj):
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()
    now = int(time.time())
    return f"{b64({'alg': 'none'})}.{b64({'sub': sub, 'iat': now, 'exp': now + lifetime_s})}."


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512", "OAUTHBEARER"])
def test_kafka_python_produces_and_consumes(sasl_server, mechanism):
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.net.sasl.oauth import AbstractTokenProvider

    class Unsecured(AbstractTokenProvider):
        def token(self):
            return unsecured_jws("bob")
    srv = sasl_server()
    topic = unique("sasl-kp")
    common = {"bootstrap_servers": srv.sasl_bootstrap, "security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": mechanism}
    if mechanism == "OAUTHBEARER":
        common["sasl_oauth_token_provider"] = Unsecured()
    else:
        common.update(sasl_plain_username="bob", sasl_plain_password="bob-secret")
    producer = KafkaProducer(**common)
    for i in range(3):
        producer.send(topic, b"k%d" % i).get(timeout=30)
    producer.close()
    consumer = KafkaConsumer(topic, group_id=unique("g"), auto_offset_reset="earliest", consumer_timeout_ms=15000,
                             **common)
    got = [m.value for _, m in zip(range(3), consumer)]
    consumer.close()
    assert got == [b"k0", b"k1", b"k2"]
    assert f"authenticated principal=User:bob mechanism={mechanism}" in srv.stderr_path.read_text()


# --------------------------------------------------------------------------- raw frames

def test_request_before_authentication_closes_with_one_log_line(sasl_server):
    srv = sasl_server()
    watch = LogWatch(srv)
    with RawConn(srv.sasl_bootstrap) as conn:
        conn.send_request("Metadata", 12, req("Metadata", topics=[], allow_auto_topic_creation=False))
        conn.expect_closed()
    line = watch.wait_for("Metadata before SASL authentication completed")
    assert line.count("closing connection") == 1
    with RawConn(srv.sasl_bootstrap) as conn:           # ApiVersions may come first; then SaslHandshake
        assert conn.request("ApiVersions", 3, req("ApiVersions", client_software_name="raw",
                                                  client_software_version="1")).error_code == 0
        assert plain_login(conn).error_code == 0
        r = conn.request("Metadata", 12, req("Metadata", topics=[], allow_auto_topic_creation=False))
        assert r.brokers


def test_unsupported_mechanism_answers_the_enabled_list_then_closes(sasl_server):
    srv = sasl_server(**{"connection.failed.authentication.delay.ms": 0})
    with RawConn(srv.sasl_bootstrap) as conn:
        r = conn.request("SaslHandshake", 1, req("SaslHandshake", mechanism="GSSAPI"))
        assert r.error_code == E.UNSUPPORTED_SASL_MECHANISM.code
        assert sorted(r.mechanisms) == ["OAUTHBEARER", "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
        conn.expect_closed()


def read_raw(conn: RawConn, timeout: float = 10.0) -> bytes:
    return conn.read_frame(timeout)


def test_v0_unframed_plain_exchange(sasl_server):
    srv = sasl_server(**{"connection.failed.authentication.delay.ms": 0})
    with RawConn(srv.sasl_bootstrap) as conn:
        r = conn.request("SaslHandshake", 0, req("SaslHandshake", mechanism="PLAIN"))
        assert r.error_code == 0 and "PLAIN" in r.mechanisms
        token = b"\0alice\0alice-secret"
        conn.send(struct.pack(">i", len(token)) + token)         # no Kafka header: the raw token
        assert read_raw(conn) == b""                              # PLAIN's empty answer, size-prefixed
        r = conn.request("Metadata", 12, req("Metadata", topics=[], allow_auto_topic_creation=False))
        assert r.brokers
    with RawConn(srv.sasl_bootstrap) as conn:                          # a wrong password: nothing, then closed
        conn.request("SaslHandshake", 0, req("SaslHandshake", mechanism="PLAIN"))
        token = b"\0alice\0wrong"
        conn.send(struct.pack(">i", len(token)) + token)
        conn.expect_closed()


def test_failed_login_is_answered_after_the_delay_then_closed(sasl_server):
    srv = sasl_server(**{"connection.failed.authentication.delay.ms": 1500})
    with RawConn(srv.sasl_bootstrap) as conn:
        conn.request("SaslHandshake", 1, req("SaslHandshake", mechanism="PLAIN"))
        cid = conn.send_request("SaslAuthenticate", 2, req("SaslAuthenticate", auth_bytes=b"\0alice\0wrong"))
        with pytest.raises(TimeoutError):           # not before the delay (a lower bound: slowness only adds)
            conn.read_frame(timeout=0.7)
        r = conn.read_response("SaslAuthenticate", 2, cid, timeout=10)
        assert (r.error_code, r.error_message) == (E.SASL_AUTHENTICATION_FAILED.code,
                                                   "Authentication failed: Invalid username or password")
        conn.expect_closed()


def test_oversized_frame_before_authentication_closes(sasl_server):
    srv = sasl_server(**{"sasl.server.max.receive.size": 1024})
    watch = LogWatch(srv)
    with RawConn(srv.sasl_bootstrap) as conn:
        conn.send(struct.pack(">i", 4096) + b"\0" * 16)
        conn.expect_closed()
    watch.wait_for("over sasl.server.max.receive.size=1024")


def test_reauthentication_and_session_expiry(sasl_server):
    srv = sasl_server(**{"connections.max.reauth.ms": 2000, "connection.failed.authentication.delay.ms": 0})
    with RawConn(srv.sasl_bootstrap) as conn:
        r = plain_login(conn, version=1)
        assert r.error_code == 0 and 0 < r.session_lifetime_ms <= 2000
        time.sleep(1.1)                                            # Kafka: at most one re-authentication a second
        r = plain_login(conn, version=1)                          # re-authenticates on the same connection
        assert r.error_code == 0 and 0 < r.session_lifetime_ms <= 2000
        r = conn.request("Metadata", 12, req("Metadata", topics=[], allow_auto_topic_creation=False))
        assert r.brokers
        time.sleep(2.2)                                            # the session is over
        conn.send_request("Metadata", 12, req("Metadata", topics=[], allow_auto_topic_creation=False))
        conn.expect_closed()
    assert "expired" in srv.stderr_path.read_text()
    with RawConn(srv.sasl_bootstrap) as conn:                          # another principal may not take over
        assert plain_login(conn, version=1).error_code == 0
        time.sleep(1.1)
        r = plain_login(conn, "bob", "bob-secret", version=1)
        assert r.error_code == E.SASL_AUTHENTICATION_FAILED.code
        assert r.error_message == "Cannot change principals during re-authentication from User.alice: User.bob"
        conn.expect_closed()


def test_confluent_kafka_over_sasl_ssl(sasl_server, tmp_path):
    from compat_tests.sasl_support import Certificates
    certs = Certificates(tmp_path / "certs")
    srv = sasl_server(**certs.listener_config())
    bootstrap = srv.bootstrap_for("SASL_SSL")
    roundtrip(bootstrap, {**confluent(bootstrap, "SCRAM-SHA-512"), "security.protocol": "SASL_SSL",
                          "ssl.ca.location": certs.ca_path})
    assert "authenticated principal=User:alice mechanism=SCRAM-SHA-512 listener=SASL_SSL" in \
        srv.stderr_path.read_text()


@pytest.mark.parametrize("props, said", [
    ({"sasl.enabled.mechanisms": "GSSAPI"}, "GSSAPI not supported"),
    ({"listener.name.sasl_plaintext.plain.sasl.jaas.config": "PlainLoginModule required user_a=b"},
     "JAAS config entry not terminated by semi-colon"),
])
def test_a_sasl_listener_that_cannot_work_refuses_to_start(tmp_path, props, said):
    from compat_tests.sasl_support import start_sasl_server
    with pytest.raises(Exception) as e:
        start_sasl_server(tmp_path / "broker", **props)
    assert said in str(e.value)


def test_out_of_order_sasl_requests_get_illegal_sasl_state(sasl_server):
    srv = sasl_server(**{"connection.failed.authentication.delay.ms": 0})
    with RawConn(srv.sasl_bootstrap) as conn:       # after authentication: answered, and the connection goes on
        assert plain_login(conn).error_code == 0
        r = conn.request("SaslAuthenticate", 2, req("SaslAuthenticate", auth_bytes=b"\0alice\0alice-secret"))
        assert r.error_code == E.ILLEGAL_SASL_STATE.code
        r = conn.request("SaslHandshake", 1, req("SaslHandshake", mechanism="PLAIN"))
        assert (r.error_code, r.mechanisms) == (E.ILLEGAL_SASL_STATE.code, [])
        assert conn.request("Metadata", 12, req("Metadata", topics=[], allow_auto_topic_creation=False)).brokers
    with RawConn(srv.sasl_bootstrap) as conn:       # a second handshake during the exchange: answered, then closed
        assert conn.request("SaslHandshake", 1, req("SaslHandshake", mechanism="PLAIN")).error_code == 0
        r = conn.request("SaslHandshake", 1, req("SaslHandshake", mechanism="PLAIN"))
        assert r.error_code == E.ILLEGAL_SASL_STATE.code
        conn.expect_closed()
    with RawConn(srv.sasl_bootstrap) as conn:       # SaslAuthenticate before any handshake: closed, as Kafka
        conn.send_request("SaslAuthenticate", 2, req("SaslAuthenticate", auth_bytes=b"\0alice\0alice-secret"))
        conn.expect_closed()
