"""SASL over a SASL_PLAINTEXT listener against a real broker: stock clients (confluent-kafka, kafka-python) with PLAIN,
SCRAM-SHA-512 and OAUTHBEARER (unsecured JWS), and raw frames for the pre-authentication gate, the v0 unframed
exchange, the failure delay and KIP-368 re-authentication and expiry.

The listener is a stand-in (compat_tests/sasl_standin.py) until SASL_PLAINTEXT listeners and stored SCRAM credentials
are on main."""
from __future__ import annotations

import struct
import time

import pytest
from confluent_kafka import Consumer, KafkaError, Producer

from compat_tests.sasl_support import plain_login, sasl_server  # noqa: F401  (fixture)
from compat_tests.test_bad_input import Closed, LogWatch, RawConn, req, unique
from trireme.wire import error_codes as E

pytestmark = pytest.mark.trireme_only("a SASL_PLAINTEXT listener stand-in")

MECHANISM_SETTINGS = {
    "PLAIN": {"sasl.username": "alice", "sasl.password": "alice-secret"},
    "SCRAM-SHA-512": {"sasl.username": "alice", "sasl.password": "alice-secret"},
    "OAUTHBEARER": {"enable.sasl.oauthbearer.unsecure.jwt": True, "sasl.oauthbearer.config": "principal=alice"},
}


def confluent(bootstrap, mechanism, **extra):
    return {"bootstrap.servers": bootstrap, "security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": mechanism,
            **MECHANISM_SETTINGS[mechanism], **extra}


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512", "OAUTHBEARER"])
def test_confluent_kafka_produces_and_consumes(sasl_server, mechanism):
    srv = sasl_server()
    topic = unique("sasl")
    producer = Producer(confluent(srv.bootstrap, mechanism, **{"enable.idempotence": True}))
    for i in range(5):
        producer.produce(topic, value=b"m%d" % i)
    assert producer.flush(30) == 0
    consumer = Consumer(confluent(srv.bootstrap, mechanism, **{"group.id": unique("g"),
                                                                "auto.offset.reset": "earliest"}))
    consumer.subscribe([topic])
    got = []
    deadline = time.monotonic() + 30
    while len(got) < 5 and time.monotonic() < deadline:
        m = consumer.poll(0.5)
        if m is not None and m.error() is None:
            got.append(m.value())
    consumer.close()
    assert got == [b"m%d" % i for i in range(5)]
    log = srv.stderr_path.read_text()
    assert f"authenticated principal=User:alice mechanism={mechanism}" in log
    assert "alice-secret" not in log


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
def test_confluent_kafka_wrong_password_fails_with_kafkas_error(sasl_server, mechanism):
    srv = sasl_server()
    errors = []
    producer = Producer({**confluent(srv.bootstrap, mechanism), "sasl.password": "not-it",
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


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
def test_kafka_python_produces_and_consumes(sasl_server, mechanism):
    from kafka import KafkaConsumer, KafkaProducer
    srv = sasl_server()
    topic = unique("sasl-kp")
    common = {"bootstrap_servers": srv.bootstrap, "security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": mechanism,
              "sasl_plain_username": "bob", "sasl_plain_password": "bob-secret"}
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
    with RawConn(srv.bootstrap) as conn:
        conn.send_request("Metadata", 12, req("Metadata", topics=[], allow_auto_topic_creation=False))
        conn.expect_closed()
    line = watch.wait_for("Metadata before SASL authentication completed")
    assert line.count("closing connection") == 1
    with RawConn(srv.bootstrap) as conn:           # ApiVersions may come first; then SaslHandshake
        assert conn.request("ApiVersions", 3, req("ApiVersions", client_software_name="raw",
                                                  client_software_version="1")).error_code == 0
        assert plain_login(conn).error_code == 0
        r = conn.request("Metadata", 12, req("Metadata", topics=[], allow_auto_topic_creation=False))
        assert r.brokers


def test_unsupported_mechanism_answers_the_enabled_list_then_closes(sasl_server):
    srv = sasl_server(**{"connection.failed.authentication.delay.ms": 0})
    with RawConn(srv.bootstrap) as conn:
        r = conn.request("SaslHandshake", 1, req("SaslHandshake", mechanism="GSSAPI"))
        assert r.error_code == E.UNSUPPORTED_SASL_MECHANISM.code
        assert sorted(r.mechanisms) == ["OAUTHBEARER", "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
        conn.expect_closed()


def read_raw(conn: RawConn, timeout: float = 10.0) -> bytes:
    return conn.read_frame(timeout)


def test_v0_unframed_plain_exchange(sasl_server):
    srv = sasl_server(**{"connection.failed.authentication.delay.ms": 0})
    with RawConn(srv.bootstrap) as conn:
        r = conn.request("SaslHandshake", 0, req("SaslHandshake", mechanism="PLAIN"))
        assert r.error_code == 0 and "PLAIN" in r.mechanisms
        token = b"\0alice\0alice-secret"
        conn.send(struct.pack(">i", len(token)) + token)         # no Kafka header: the raw token
        assert read_raw(conn) == b""                              # PLAIN's empty answer, size-prefixed
        r = conn.request("Metadata", 12, req("Metadata", topics=[], allow_auto_topic_creation=False))
        assert r.brokers
    with RawConn(srv.bootstrap) as conn:                          # a wrong password: nothing, then closed
        conn.request("SaslHandshake", 0, req("SaslHandshake", mechanism="PLAIN"))
        token = b"\0alice\0wrong"
        conn.send(struct.pack(">i", len(token)) + token)
        conn.expect_closed()


def test_failed_login_is_answered_after_the_delay_then_closed(sasl_server):
    srv = sasl_server(**{"connection.failed.authentication.delay.ms": 1500})
    with RawConn(srv.bootstrap) as conn:
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
    with RawConn(srv.bootstrap) as conn:
        conn.send(struct.pack(">i", 4096) + b"\0" * 16)
        conn.expect_closed()
    watch.wait_for("over sasl.server.max.receive.size=1024")


def test_reauthentication_and_session_expiry(sasl_server):
    srv = sasl_server(**{"connections.max.reauth.ms": 2000, "connection.failed.authentication.delay.ms": 0})
    with RawConn(srv.bootstrap) as conn:
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
    with RawConn(srv.bootstrap) as conn:                          # another principal may not take over
        assert plain_login(conn, version=1).error_code == 0
        time.sleep(1.1)
        r = plain_login(conn, "bob", "bob-secret", version=1)
        assert r.error_code == E.SASL_AUTHENTICATION_FAILED.code
        assert r.error_message == "Cannot change principals during re-authentication from User.alice: User.bob"
        conn.expect_closed()
