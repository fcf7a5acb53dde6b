"""Every stock client over SASL_SSL with SCRAM-SHA-512 and over SSL with client certificates (mTLS), and
OAUTHBEARER (unsecured tokens) with confluent-kafka and the Java client, against one ``trireme serve`` with
those listeners (conftest.py ``secured_server``: certificates made for the module with trustme).

For each client (confluent-kafka, kafka-python, aiokafka, kafkajs, kcat, Java 3.9 and 4.3) and each of the two
ways in, with the client's own security settings (compat_tests/security.py turns one description into each
client's names):

* produce records to 3 partitions, then consume them all in a consumer group and commit;
* a committed, an aborted and a committed transaction on one partition, read back read_committed: exactly the
  committed records (kcat has no transactional producer: confluent-kafka writes them over the same listener and
  kcat reads them);
* a wrong SCRAM password ends in the client's authentication error, within a bound (no hang);
* a client certificate from a CA the broker does not trust is refused.
"""
from __future__ import annotations

import asyncio
import subprocess
import time
import uuid
from typing import Any, Callable, Iterator

import pytest

from compat_tests import clients
from compat_tests.python_clients import create_topics
from compat_tests.security import ClientSecurity, SecuredListeners

CLIENTS = ("confluent-kafka", "kafka-python", "aiokafka", "kafkajs", "kcat", "java-3.9.0", "java-4.3.0")
MODES = ("sasl_ssl", "mtls")
PARTITIONS = 3
N = 60
DEADLINE_S = 60.0           # hang guard of each wait below
AUTH_DEADLINE_S = 45.0      # a refused login must be reported well within this


def uid() -> str:
    return uuid.uuid4().hex[:8]


def way_in(listeners: SecuredListeners, mode: str, client: str) -> tuple[str, ClientSecurity]:
    """The bootstrap address and client settings of ``mode`` for ``client``.  kcat logs in to SASL_SSL with
    OAUTHBEARER: its librdkafka 2.0.2 cannot do SCRAM with Kafka 4 (test_kcat_scram_login_refused_as_by_kafka_4)."""
    if mode == "sasl_ssl":
        if client == "kcat":
            return listeners.sasl_ssl, listeners.oauthbearer("kcat")
        return listeners.sasl_ssl, listeners.scram
    return listeners.ssl, listeners.mtls


def logged_in(listeners: SecuredListeners, since: int, mode: str, sec: ClientSecurity) -> str | None:
    """The broker's log line (from ``since``) saying a connection of ``sec`` was authenticated: the SCRAM or
    OAUTHBEARER principal on SASL_SSL, the client certificate's subject (Kafka's default principal) on SSL."""
    if mode == "mtls":
        needles = ["listener=SSL ", f"tls_principal=User:{listeners.tls.client_dn}"]
    else:
        user = sec.oauth_principal if sec.mechanism == "OAUTHBEARER" else sec.username
        needles = [f"authenticated principal=User:{user} mechanism={sec.mechanism} listener=SASL_SSL "]
    return next((line for line in listeners.server.log_text(since).splitlines()
                 if all(n in line for n in needles)), None)


def records(tag: str, n: int = N) -> list[tuple[bytes, bytes, int]]:
    """(key, value, partition), round-robin over the partitions."""
    return [(f"{tag}-k{i}".encode(), f"{tag}-v{i}".encode(), i % PARTITIONS) for i in range(n)]


def deadline_passed(start: float, what: str, limit: float = DEADLINE_S) -> None:
    assert time.monotonic() - start < limit, what


# ------------------------------------------------------------------ confluent-kafka (and kcat's librdkafka)

def cf_conf(bootstrap: str, sec: ClientSecurity, **extra: Any) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap, **sec.librdkafka(), **extra}


def cf_produce(bootstrap, sec, topic, recs, **extra) -> None:
    from confluent_kafka import Producer
    p = Producer(cf_conf(bootstrap, sec, **extra))
    errors: list = []
    for k, v, part in recs:
        p.produce(topic, key=k, value=v, partition=part, on_delivery=lambda err, msg: errors.append(err))
    assert p.flush(30) == 0, "records left unsent"
    assert len(errors) == len(recs) and not any(errors), errors[:3]


def cf_group_consume(bootstrap, sec, topic, group, n, **extra) -> list[bytes]:
    from confluent_kafka import Consumer
    c = Consumer(cf_conf(bootstrap, sec, **{"group.id": group, "auto.offset.reset": "earliest",
                                            "enable.auto.commit": False, **extra}))
    got: list[bytes] = []
    try:
        c.subscribe([topic])
        start = time.monotonic()
        while len(got) < n:
            deadline_passed(start, f"consumed {len(got)} of {n}")
            m = c.poll(0.5)
            if m is not None:
                assert not m.error(), m.error()
                got.append(m.value())
        c.commit(asynchronous=False)
    finally:
        c.close()
    return got


def cf_transactions(bootstrap, sec, topic, plan) -> None:
    from confluent_kafka import Producer
    p = Producer(cf_conf(bootstrap, sec, **{"transactional.id": f"sec-{uid()}"}))
    p.init_transactions(30)
    for commit, recs in plan:
        p.begin_transaction()
        for k, v, part in recs:
            p.produce(topic, key=k, value=v, partition=part)
        p.flush(30)
        (p.commit_transaction if commit else p.abort_transaction)(30)


def cf_wrong_password(bootstrap, sec) -> str:
    """The error librdkafka reports through error_cb when the login is refused."""
    from confluent_kafka import KafkaError, Producer
    errors: list = []
    p = Producer(cf_conf(bootstrap, sec, error_cb=errors.append))
    p.produce("never-written", value=b"x")
    start = time.monotonic()
    while not any(e.code() == KafkaError._AUTHENTICATION for e in errors):
        deadline_passed(start, f"no authentication error, got {errors}", AUTH_DEADLINE_S)
        p.poll(0.5)
    p.purge()
    p.flush(0)
    return next(e for e in errors if e.code() == KafkaError._AUTHENTICATION).str()


# ------------------------------------------------------------------ kafka-python

def kp_produce(bootstrap, sec, topic, recs) -> None:
    from kafka import KafkaProducer
    p = KafkaProducer(bootstrap_servers=bootstrap, acks="all", **sec.kafka_python())
    try:
        for f in [p.send(topic, key=k, value=v, partition=part) for k, v, part in recs]:
            f.get(timeout=30)
    finally:
        p.close()


def kp_group_consume(bootstrap, sec, topic, group, n, isolation="read_uncommitted") -> list[bytes]:
    from kafka import KafkaConsumer
    c = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
                      enable_auto_commit=False, isolation_level=isolation, **sec.kafka_python())
    got: list[bytes] = []
    try:
        start = time.monotonic()
        while len(got) < n:
            deadline_passed(start, f"consumed {len(got)} of {n}")
            for msgs in c.poll(timeout_ms=500).values():
                got += [m.value for m in msgs]
        c.commit()
    finally:
        c.close()
    return got


def kp_transactions(bootstrap, sec, topic, plan) -> None:
    from kafka import KafkaProducer
    p = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"sec-{uid()}", **sec.kafka_python())
    try:
        p.init_transactions()
        for commit, recs in plan:
            p.begin_transaction()
            for k, v, part in recs:
                p.send(topic, key=k, value=v, partition=part)
            p.flush()
            (p.commit_transaction if commit else p.abort_transaction)()
    finally:
        p.close()


def kp_wrong_password(bootstrap, sec) -> None:
    """kafka-python 3 takes a refused login as a failed bootstrap connection and tries again until its bootstrap
    timeout: the constructor raises KafkaTimeoutError.  (It logs SaslAuthenticationFailedError only for the attempts
    where it read the answer before the connection's end: like Kafka, the broker answers a failed login after
    connection.failed.authentication.delay.ms and closes right after, and kafka-python drops data that arrives
    together with the end of the stream.)"""
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaTimeoutError
    with pytest.raises(KafkaTimeoutError, match="Unable to bootstrap"):
        KafkaAdminClient(bootstrap_servers=bootstrap, bootstrap_timeout_ms=10_000, **sec.kafka_python())


# ------------------------------------------------------------------ aiokafka

def ak_produce(bootstrap, sec, topic, recs) -> None:
    from aiokafka import AIOKafkaProducer

    async def go():
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", **sec.aiokafka())
        await p.start()
        try:
            for k, v, part in recs:
                await p.send_and_wait(topic, key=k, value=v, partition=part)
        finally:
            await p.stop()
    asyncio.run(go())


def ak_group_consume(bootstrap, sec, topic, group, n, isolation="read_uncommitted") -> list[bytes]:
    from aiokafka import AIOKafkaConsumer

    async def go():
        c = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
                             enable_auto_commit=False, isolation_level=isolation, **sec.aiokafka())
        await c.start()
        got: list[bytes] = []
        try:
            start = time.monotonic()
            while len(got) < n:
                deadline_passed(start, f"consumed {len(got)} of {n}")
                for msgs in (await c.getmany(timeout_ms=500)).values():
                    got += [m.value for m in msgs]
            await c.commit()
        finally:
            await c.stop()
        return got
    return asyncio.run(go())


def ak_transactions(bootstrap, sec, topic, plan) -> None:
    from aiokafka import AIOKafkaProducer

    async def go():
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"sec-{uid()}", **sec.aiokafka())
        await p.start()
        try:
            for commit, recs in plan:
                await p.begin_transaction()
                for k, v, part in recs:
                    await p.send_and_wait(topic, key=k, value=v, partition=part)
                await (p.commit_transaction() if commit else p.abort_transaction())
        finally:
            await p.stop()
    asyncio.run(go())


def ak_wrong_password(bootstrap, sec, caplog) -> list[str]:
    """aiokafka: start() fails with KafkaConnectionError ("Unable to bootstrap"); the refusal is logged as
    SaslAuthenticationFailed."""
    import logging

    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import KafkaConnectionError

    async def go():
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, request_timeout_ms=int(AUTH_DEADLINE_S * 1000),
                             **sec.aiokafka())
        try:
            await asyncio.wait_for(p.start(), AUTH_DEADLINE_S)
        finally:
            await p.stop()
    with caplog.at_level(logging.WARNING, logger="aiokafka"), \
            pytest.raises(KafkaConnectionError, match="Unable to bootstrap"):
        asyncio.run(go())
    return [r.getMessage() for r in caplog.records]


# ------------------------------------------------------------------ the harnesses (Java, kafkajs)

def h_produce(h: clients.HarnessProcess, topic, recs, config=None, txn=None) -> None:
    h.ok("produce", topic=topic, records=[clients.record(v, key=k, partition=p) for k, v, p in recs],
         config=config or {}, **({"txn": txn} if txn else {}))


def h_group_consume(h: clients.HarnessProcess, topic, group, n, config=None) -> list[bytes]:
    handle = f"g-{uid()}"
    h.ok("subscribe", topic=topic, group=group, handle=handle, config=config or {})
    got: list[bytes] = []
    try:
        start = time.monotonic()
        while len(got) < n:
            deadline_passed(start, f"consumed {len(got)} of {n}")
            got += [clients.unb64(r["value_b64"]) for r in h.ok("poll", handle=handle, timeout_ms=500)["records"]]
        h.ok("commit", handle=handle)
    finally:
        h.call("close_consumer", handle=handle)
    return got


def h_transactions(h: clients.HarnessProcess, topic, plan) -> None:
    config = {"transactional.id": f"sec-{uid()}", "acks": "all"}
    if h.kind == "kafkajs":
        config["enable.idempotence"] = True
    for commit, recs in plan:
        h_produce(h, topic, recs, config=config, txn="commit" if commit else "abort")


def h_read_committed(h: clients.HarnessProcess, topic) -> list[bytes]:
    r = h.consume(topic, partitions=[0], offset="earliest", count=10_000, until_end=True, timeout_ms=15_000,
                  config={"isolation.level": "read_committed"})
    assert r["ok"] and r["timed_out"] is False, r
    return [clients.unb64(x["value_b64"]) for x in r["records"]]


# ------------------------------------------------------------------ kcat

def kcat_produce(bootstrap, sec, topic, recs) -> None:
    for part in range(PARTITIONS):
        mine = [(k, v) for k, v, p in recs if p == part]
        clients.kcat_produce(bootstrap, topic, [v for _, v in mine], keys=[k for k, _ in mine], partition=part,
                             security=sec)


def kcat_group_consume(kcat: str, bootstrap, sec, topic, group, n) -> list[bytes]:
    """kcat's balanced consumer (-G): joins the group, reads n records, commits (librdkafka's auto commit) and
    leaves."""
    argv = [kcat, "-b", bootstrap, "-G", group, "-c", str(n), "-f", "%s\\n", "-q",
            "-X", "auto.offset.reset=earliest", *clients.kcat_security_args(sec), topic]
    out = subprocess.run(argv, capture_output=True, timeout=DEADLINE_S)
    assert out.returncode == 0, out.stderr.decode(errors="replace")[-2000:]
    return out.stdout.splitlines()


def kcat_login_fails(kcat: str, bootstrap, sec) -> str:
    out = subprocess.run([kcat, "-L", "-b", bootstrap, "-m", "10", *clients.kcat_security_args(sec)],
                         capture_output=True, timeout=AUTH_DEADLINE_S)
    assert out.returncode != 0, out.stdout
    return out.stderr.decode(errors="replace")


# ------------------------------------------------------------------ fixtures

@pytest.fixture(scope="module")
def harnesses(secured_server) -> Iterator[dict]:
    pool: dict[tuple[str, str], clients.HarnessProcess] = {}
    yield pool
    for h in pool.values():
        h.close()


@pytest.fixture
def harness_for(request, harnesses, secured_server) -> Iterator[Callable[..., clients.HarnessProcess]]:
    """``harness_for(client, bootstrap, security, keep=True)``: a harness of that client for that way in; kept for
    the module's other tests (the produce and transaction tests share one per client and way in), else closed
    at the end of the test."""
    used: list[clients.HarnessProcess] = []
    once: list[clients.HarnessProcess] = []

    def get(client: str, bootstrap: str, sec: ClientSecurity, keep: bool = True) -> clients.HarnessProcess:
        key = (client, bootstrap, sec.to_json())
        h = harnesses.get(key) if keep else None
        if h is None or h.proc.poll() is not None:
            if client == "kafkajs":
                clients.require_kafkajs()
                h = clients.kafkajs_harness(bootstrap, security=sec)
            else:
                version = client.removeprefix("java-")
                clients.require_java(version)
                h = clients.java_harness(version, bootstrap, security=sec)
            if keep:
                harnesses[key] = h
            else:
                once.append(h)
        used.append(h)
        return h
    yield get
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        for h in used:
            print(f"\n----- {h.name} harness stderr tail ({h.stderr_path}) -----\n{h.stderr_tail(40)}")
        print(f"\n----- server stderr tail -----\n{secured_server.server.stderr_tail(60)}")
    for h in once:
        h.close()


PRODUCE = {"confluent-kafka": cf_produce, "kafka-python": kp_produce, "aiokafka": ak_produce}
GROUP = {"confluent-kafka": cf_group_consume, "kafka-python": kp_group_consume, "aiokafka": ak_group_consume}
TRANSACTIONS = {"confluent-kafka": cf_transactions, "kafka-python": kp_transactions, "aiokafka": ak_transactions}


def read_committed(client: str, bootstrap: str, sec: ClientSecurity, topic: str, n: int, h=None) -> list[bytes]:
    """The topic's partition 0 read with read_committed by ``client``, once ``n`` records came."""
    group = f"sec-rc-{uid()}"
    if client == "confluent-kafka":
        return cf_group_consume(bootstrap, sec, topic, group, n, **{"isolation.level": "read_committed"})
    if client == "kafka-python":
        return kp_group_consume(bootstrap, sec, topic, group, n, "read_committed")
    if client == "aiokafka":
        return ak_group_consume(bootstrap, sec, topic, group, n, "read_committed")
    if client == "kcat":
        return [r.value for r in clients.kcat_consume(bootstrap, topic, 0, "beginning", security=sec,
                                                      config={"isolation.level": "read_committed"})]
    return h_read_committed(h, topic)


# ------------------------------------------------------------------ tests

def ways_in() -> list:
    """(client, mode) for every client and way in; kcat's SASL_SSL login is OAUTHBEARER (see way_in)."""
    return [pytest.param(c, m, id=f"{c}-{m}" + ("_oauthbearer" if (c, m) == ("kcat", "sasl_ssl") else ""))
            for c in CLIENTS for m in MODES]


@pytest.mark.parametrize(("client", "mode"), ways_in())
def test_produce_and_consume_in_a_group(secured_server, harness_for, client, mode):
    bootstrap, sec = way_in(secured_server, mode, client)
    [topic] = create_topics(secured_server.plaintext, [f"sec-{client}-{mode}-{uid()}"], PARTITIONS)
    mark = secured_server.server.log_position()
    recs = records(f"{client}-{mode}")
    group = f"sec-g-{uid()}"
    if client in PRODUCE:
        PRODUCE[client](bootstrap, sec, topic, recs)
        got = GROUP[client](bootstrap, sec, topic, group, N)
    elif client == "kcat":
        kcat = clients.require_kcat()
        kcat_produce(bootstrap, sec, topic, recs)
        got = kcat_group_consume(kcat, bootstrap, sec, topic, group, N)
    else:
        h = harness_for(client, bootstrap, sec)
        h_produce(h, topic, recs)
        got = h_group_consume(h, topic, group, N)
    assert sorted(got) == sorted(v for _, v, _ in recs)
    assert logged_in(secured_server, mark, mode, sec) is not None, secured_server.server.log_text(mark)[-3000:]
    # The group's commit is where the records end: read over the PLAINTEXT listener.
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": secured_server.plaintext, "group.id": group})
    try:
        committed = c.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=30)
    finally:
        c.close()
    assert {tp.partition: tp.offset for tp in committed} == {p: N // PARTITIONS for p in range(PARTITIONS)}


@pytest.mark.parametrize(("client", "mode"), ways_in())
def test_transaction_read_committed(secured_server, harness_for, client, mode):
    bootstrap, sec = way_in(secured_server, mode, client)
    [topic] = create_topics(secured_server.plaintext, [f"sec-txn-{client}-{mode}-{uid()}"], 1)
    plan = [(commit, [(f"{n}-k{i}".encode(), f"{n}-v{i}".encode(), 0) for i in range(5)])
            for n, commit in (("first-commit", True), ("aborted", False), ("second-commit", True))]
    want = [v for commit, recs in plan if commit for _, v, _ in recs]
    h = None
    if client in TRANSACTIONS:
        TRANSACTIONS[client](bootstrap, sec, topic, plan)
    elif client == "kcat":          # kcat has no transactional producer: librdkafka's, over the same listener
        clients.require_kcat()
        cf_transactions(bootstrap, sec, topic, plan)
    else:
        h = harness_for(client, bootstrap, sec)
        h_transactions(h, topic, plan)
    # Partition 0 holds the aborted records between the two committed transactions: having read the second
    # transaction's records, a read_committed reader has passed the aborted ones.
    got = read_committed(client, bootstrap, sec, topic, len(want), h=h)
    assert got == want


@pytest.mark.parametrize("client", [c for c in CLIENTS if c != "kcat"])
def test_wrong_password_is_an_authentication_error(secured_server, harness_for, client, caplog):
    """SCRAM-SHA-512 with a wrong password: the client's own authentication error, soon (not a hang, not a
    retry loop without end).  kcat: test_kcat_scram_login_refused_as_by_kafka_4."""
    bootstrap = secured_server.sasl_ssl
    sec = secured_server.scram.replace(password="not-the-password")
    if client == "confluent-kafka":
        text = cf_wrong_password(bootstrap, sec)
        assert "authentication" in text.lower(), text
    elif client == "kafka-python":
        mark = secured_server.server.log_position()
        kp_wrong_password(bootstrap, sec)
        refused = [line for line in secured_server.server.log_text(mark).splitlines()
                   if "authentication failed listener=SASL_SSL mechanism=SCRAM-SHA-512 user=admin" in line]
        assert refused and all("invalid-proof" in line for line in refused), refused[:3]
        assert sec.password not in secured_server.server.log_text(mark)
    elif client == "aiokafka":
        logged = ak_wrong_password(bootstrap, sec, caplog)
        assert any("SaslAuthenticationFailed" in line and "invalid credentials" in line for line in logged), \
            logged[-5:]
    else:
        h = harness_for(client, bootstrap, sec, keep=False)
        r = h.call("produce", topic="never-written", records=[clients.record(b"x")],
                   timeout=AUTH_DEADLINE_S + 30)
        assert r["ok"] is False, r
        want = "KafkaJSSASLAuthenticationError" if client == "kafkajs" else "SaslAuthenticationException"
        assert want in r["error"] + " ".join(r.get("causes") or []), r


@pytest.mark.parametrize("client", ["confluent-kafka", "java-3.9.0", "java-4.3.0"])
def test_oauthbearer_unsecured_token(secured_server, harness_for, client):
    """OAUTHBEARER with an unsecured token (``sub``: the principal), as Kafka allows for development:
    confluent-kafka's built-in unsecured JWT and the Java client's OAuthBearerLoginModule."""
    bootstrap, sec = secured_server.sasl_ssl, secured_server.oauthbearer("alice")
    [topic] = create_topics(secured_server.plaintext, [f"sec-oauth-{client}-{uid()}"], PARTITIONS)
    recs = records(f"oauth-{client}")
    group = f"sec-oauth-g-{uid()}"
    mark = secured_server.server.log_position()
    if client == "confluent-kafka":
        cf_produce(bootstrap, sec, topic, recs)
        got = cf_group_consume(bootstrap, sec, topic, group, N)
    else:
        h = harness_for(client, bootstrap, sec, keep=False)
        h_produce(h, topic, recs)
        got = h_group_consume(h, topic, group, N)
    assert sorted(got) == sorted(v for _, v, _ in recs)
    assert logged_in(secured_server, mark, "sasl_ssl", sec) is not None, secured_server.server.log_text(mark)[-3000:]


def test_kcat_scram_login_refused_as_by_kafka_4(secured_server):
    """kcat's librdkafka 2.0.2 repeats its client nonce in the SCRAM client-final message (librdkafka before 2.6.1,
    confluentinc/librdkafka#4895); Kafka 4 compares the nonce exactly as RFC 5802 says and refuses that login, and
    so does Trireme, even with the right password (kcat issue edenhill/kcat#462).  confluent-kafka's librdkafka
    logs in (test_produce_and_consume_in_a_group[confluent-kafka-sasl_ssl])."""
    server = secured_server.server
    mark = server.log_position()
    text = kcat_login_fails(clients.require_kcat(), secured_server.sasl_ssl, secured_server.scram)
    assert "SASL authentication error: Authentication failed" in text, text
    log = server.log_text(mark)
    assert "mechanism=SCRAM-SHA-512 user=admin" in log and "nonce" in log, log[-2000:]
    assert secured_server.scram.password not in log


def untrusted_client_error(client: str, bootstrap: str, sec: ClientSecurity, harness_for, caplog) -> str:
    """What ``client`` reports when the SSL listener refuses its certificate (a produce that cannot succeed)."""
    import logging
    if client == "confluent-kafka":
        from confluent_kafka import Producer
        errors: list = []
        delivered: list = []
        p = Producer(cf_conf(bootstrap, sec, error_cb=errors.append, **{"message.timeout.ms": 5000}))
        p.produce("never-written", value=b"x", on_delivery=lambda err, msg: delivered.append(err))
        start = time.monotonic()
        while not delivered:
            deadline_passed(start, f"no delivery report; errors {errors}")
            p.poll(0.5)
        p.flush(0)
        return f"{delivered[0].name()} {' '.join(e.str() for e in errors)}"
    if client == "kafka-python":
        from kafka import KafkaAdminClient
        from kafka.errors import KafkaError
        with caplog.at_level(logging.WARNING, logger="kafka"), pytest.raises(KafkaError) as err:
            KafkaAdminClient(bootstrap_servers=bootstrap, bootstrap_timeout_ms=10_000, **sec.kafka_python())
        return f"{type(err.value).__name__} " + " ".join(r.getMessage() for r in caplog.records)
    if client == "aiokafka":
        from aiokafka import AIOKafkaProducer
        from aiokafka.errors import KafkaError

        async def go():
            p = AIOKafkaProducer(bootstrap_servers=bootstrap, **sec.aiokafka())
            try:
                await asyncio.wait_for(p.start(), AUTH_DEADLINE_S)
            finally:
                await p.stop()
        with caplog.at_level(logging.WARNING, logger="aiokafka"), pytest.raises(KafkaError) as err:
            asyncio.run(go())
        return f"{type(err.value).__name__} " + " ".join(r.getMessage() for r in caplog.records)
    if client == "kcat":
        return kcat_login_fails(clients.require_kcat(), bootstrap, sec)
    h = harness_for(client, bootstrap, sec, keep=False)
    r = h.call("produce", topic="never-written", records=[clients.record(b"x")], timeout=AUTH_DEADLINE_S + 30)
    assert r["ok"] is False, r
    return r["error"] + " " + " ".join(r.get("causes") or [])


@pytest.mark.parametrize("client", CLIENTS)
def test_untrusted_client_certificate_is_refused(secured_server, harness_for, client, caplog):
    """The SSL listener requires a client certificate its truststore vouches for: a client with one from another
    CA gets its TLS error and writes nothing."""
    [topic] = create_topics(secured_server.plaintext, [f"sec-stranger-{uid()}"], 1)
    stranger = ClientSecurity.mtls(secured_server.tls, stranger=True)
    mark = secured_server.server.log_position()
    untrusted_client_error(client, secured_server.ssl, stranger, harness_for, caplog)
    log = secured_server.server.log_text(mark)
    assert "TLS established" not in log and "TLS handshake failed" in log, log[-2000:]
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": secured_server.plaintext, "group.id": f"g-{uid()}"})
    try:
        assert c.get_watermark_offsets(TopicPartition(topic, 0), timeout=30) == (0, 0)
    finally:
        c.close()


@pytest.mark.parametrize("version", clients.JAVA_VERSIONS)
def test_untrusted_client_certificate_is_an_ssl_authentication_error_in_java(secured_server, harness_for, version):
    """As against Kafka: the Java client whose certificate the broker refuses gets SslAuthenticationException (the
    TLS alert), not a metadata timeout after reconnecting again and again."""
    stranger = ClientSecurity.mtls(secured_server.tls, stranger=True)
    text = untrusted_client_error(f"java-{version}", secured_server.ssl, stranger, harness_for, None)
    assert "SslAuthenticationException" in text, text


@pytest.mark.parametrize("way", ["scram", "mtls", "oauthbearer"])
@pytest.mark.parametrize("names", ["java", "librdkafka"])
def test_client_properties_read_back(tmp_path, way, names):
    """--command-config files in Kafka's or librdkafka's names (compat_tests/README.md) give back the settings they
    were written from; a librdkafka certificate + key pair becomes the Java client's PEM keystore (key first)."""
    from compat_tests.security import make_tls_files, read_properties
    tls = make_tls_files(tmp_path / "tls")
    sec = {"scram": ClientSecurity.scram(tls), "mtls": ClientSecurity.mtls(tls),
           "oauthbearer": ClientSecurity.oauthbearer(tls, "alice")}[way]
    path = tmp_path / "client.properties"
    path.write_text("# written by the test\n" + "".join(f"{k}={v}\n" for k, v in getattr(sec, names)().items()))
    back = ClientSecurity.from_properties(read_properties(path))
    assert (back.protocol, back.mechanism, back.username, back.password, back.oauth_principal, back.ca) == \
        (sec.protocol, sec.mechanism, sec.username, sec.password, sec.oauth_principal, sec.ca)
    if way == "mtls":
        keystore = open(back.keystore).read()
        assert keystore == open(sec.key).read() + open(sec.cert).read()
        assert open(back.cert).read() == open(sec.cert).read() and open(back.key).read() == open(sec.key).read()
    else:
        assert back.keystore is None and back.cert is None
