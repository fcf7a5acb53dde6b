"""TLS listeners against a real ``trireme serve``: stock clients over SSL and mTLS, the client certificate's principal,
per-listener advertised addresses, bad and slow handshakes, and certificates reloaded through AlterConfigs.

Certificates are made by ``trustme`` for each run (never committed key material).  The broker has a PLAINTEXT listener
(the suite's --listen), ``SSL`` (server authentication only), ``MTLS`` (ssl.client.auth=required) and ``OPTIONAL``
(requested), all SSL, with ssl.principal.mapping.rules taking the CN of certificates issued to OU=Clients.  The
principal is observed through the broker's "TLS established" log line (the authorizer is not this module's).
"""
from __future__ import annotations

import os
import shutil
import socket
import ssl
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest
import trio
import trustme
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource)
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer

from compat_tests.conftest import ServerProcess
from compat_tests.test_bad_input import Closed, LogWatch, RawConn, api_versions, metadata
from trireme.wire.codec import message

pytestmark = pytest.mark.trireme_only("TLS listeners configured with trustme certificates made by the test")

RULES = "RULE:^CN=([^,]+),OU=Clients,.*$/$1/L,DEFAULT"


class Certificates:
    """A CA, the broker's PEM keystore (PKCS#8 key + chain) and client certificates, in a temporary directory."""

    def __init__(self, directory: Path):
        self.dir = directory
        self.ca = trustme.CA()
        self.ca_path = str(directory / "ca.pem")
        self.ca.cert_pem.write_to_path(self.ca_path)
        self.keystore = self.broker_keystore("broker.keystore.pem")
        self.alice = self.client("alice", "Clients")
        self.bob = self.client("Bob", "Staff")

    def broker_keystore(self, name: str) -> str:
        from cryptography.hazmat.primitives import serialization
        cert = self.ca.issue_cert("localhost", "127.0.0.1", common_name="localhost", organization_unit_name="Brokers")
        key = serialization.load_pem_private_key(cert.private_key_pem.bytes(), None).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        path = self.dir / name
        path.write_bytes(key + b"".join(c.bytes() for c in cert.cert_chain_pems))
        return str(path)

    def client(self, name: str, unit: str) -> str:
        cert = self.ca.issue_cert(f"{name.lower()}@clients.example", common_name=name, organization_unit_name=unit)
        path = str(self.dir / f"{name}.pem")
        cert.private_key_and_cert_chain_pem.write_to_path(path)
        return path

    def context(self, client: str | None = None) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.ca_path)
        if client is not None:
            ctx.load_cert_chain(client)
        return ctx


@pytest.fixture(scope="module")
def certs():
    directory = Path(tempfile.mkdtemp(prefix="trireme-tls-certs-"))
    try:
        yield Certificates(directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def tls_config(certs: Certificates, **extra) -> dict:
    return {"listeners": "SSL://127.0.0.1:0,MTLS://127.0.0.1:0,OPTIONAL://127.0.0.1:0",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SSL:SSL,MTLS:SSL,OPTIONAL:SSL",
            "ssl.keystore.location": certs.keystore, "ssl.truststore.location": certs.ca_path,
            "listener.name.mtls.ssl.client.auth": "required", "listener.name.optional.ssl.client.auth": "requested",
            "ssl.principal.mapping.rules": RULES, "trireme.ssl.handshake.timeout.ms": 3000, **extra}


def start_server(certs: Certificates, **extra) -> ServerProcess:
    workdir = Path(tempfile.mkdtemp(prefix="trireme-tls-"))
    srv = ServerProcess(workdir, config=tls_config(certs, **extra))
    srv.start()
    return srv


def stop_server(srv: ServerProcess) -> None:
    try:
        code = srv.stop()
        assert code == 0, srv.stderr_tail()
        assert "Traceback" not in srv.stderr_path.read_text(), srv.stderr_tail()
    finally:
        shutil.rmtree(srv.workdir, ignore_errors=True)


JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="admin-pw" '
        'user_alice="alice-secret";')


@pytest.fixture(scope="module")
def tls_server(certs):
    srv = start_server(certs, **{
        "message.max.bytes": 8 << 20,
        "listeners": "SSL://127.0.0.1:0,MTLS://127.0.0.1:0,OPTIONAL://127.0.0.1:0,SASL_SSL://127.0.0.1:0",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SSL:SSL,MTLS:SSL,OPTIONAL:SSL,SASL_SSL:SASL_SSL",
        "sasl.enabled.mechanisms": "PLAIN", "listener.name.sasl_ssl.plain.sasl.jaas.config": JAAS,
        "listener.name.optional.ssl.enabled.protocols": "TLSv1.3"})
    try:
        yield srv
    finally:
        stop_server(srv)


class TlsConn(RawConn):
    """RawConn over TLS (Python's ssl client), verifying the broker's certificate."""

    def __init__(self, bootstrap: str, context: ssl.SSLContext, timeout: float = 10.0):
        super().__init__(bootstrap, timeout)
        self.sock = context.wrap_socket(self.sock, server_hostname="localhost")


def confluent_ssl(certs: Certificates, bootstrap: str, client: str | None = None) -> dict:
    conf = {"bootstrap.servers": bootstrap, "security.protocol": "SSL", "ssl.ca.location": certs.ca_path}
    if client is not None:
        conf.update({"ssl.certificate.location": client, "ssl.key.location": client})
    return conf


def confluent_round_trip(conf: dict, values: list[bytes], max_bytes: int = 1 << 20) -> list[bytes]:
    topic = f"tls-{uuid.uuid4().hex[:10]}"
    producer = Producer({**conf, "message.max.bytes": max_bytes + 4096})
    for value in values:
        producer.produce(topic, value)
    assert producer.flush(30) == 0
    consumer = Consumer({**conf, "group.id": f"g-{topic}", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    consumer.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + 60
    try:
        while len(got) < len(values) and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is not None and not msg.error():
                got.append(msg.value())
    finally:
        consumer.close()
    return got


def test_confluent_kafka_over_ssl_and_mtls(tls_server, certs):
    values = [f"v{i}".encode() * 50 for i in range(200)]
    assert confluent_round_trip(confluent_ssl(certs, tls_server.bootstrap_for("SSL")), values) == values
    assert confluent_round_trip(confluent_ssl(certs, tls_server.bootstrap_for("MTLS"), certs.alice), values) == values


def test_sasl_plain_over_ssl(tls_server, certs):
    """SASL_SSL: the SASL exchange and the requests after it over the TLS transport."""
    conf = {**confluent_ssl(certs, tls_server.bootstrap_for("SASL_SSL")), "security.protocol": "SASL_SSL",
            "sasl.mechanism": "PLAIN", "sasl.username": "alice", "sasl.password": "alice-secret"}
    values = [f"s{i}".encode() for i in range(100)]
    assert confluent_round_trip(conf, values) == values


def test_large_frames_both_ways_over_tls(tls_server, certs):
    """A 5 MiB record: the request frame grows in FrameReader._receive, the Fetch answer goes out in chunks."""
    big = os.urandom(5 << 20)
    got = confluent_round_trip(confluent_ssl(certs, tls_server.bootstrap_for("SSL")), [big, b"after"], 6 << 20)
    assert got == [big, b"after"]


def test_kafka_python_over_mtls(tls_server, certs):
    topic = f"tls-kp-{uuid.uuid4().hex[:8]}"
    ssl_args = dict(security_protocol="SSL", ssl_cafile=certs.ca_path, ssl_certfile=certs.alice,
                    ssl_keyfile=certs.alice)
    producer = KafkaProducer(bootstrap_servers=tls_server.bootstrap_for("MTLS"), **ssl_args)
    for i in range(50):
        producer.send(topic, f"m{i}".encode())
    producer.flush(30)
    producer.close()
    consumer = KafkaConsumer(topic, bootstrap_servers=tls_server.bootstrap_for("MTLS"), group_id=f"g-{topic}",
                             auto_offset_reset="earliest", consumer_timeout_ms=20000, **ssl_args)
    got = []
    for msg in consumer:
        got.append(msg.value)
        if len(got) == 50:
            break
    consumer.close()
    assert got == [f"m{i}".encode() for i in range(50)]


def test_each_listener_advertises_its_own_address(tls_server, certs):
    """DescribeCluster (and Metadata, which the clients above followed) name the listener the request came in on."""
    seen = {}
    for name in ("PLAINTEXT", "SSL"):
        ssl_args = dict(security_protocol="SSL", ssl_cafile=certs.ca_path) if name == "SSL" else {}
        admin = KafkaAdminClient(bootstrap_servers=tls_server.bootstrap_for(name), request_timeout_ms=30000, **ssl_args)
        try:
            seen[name] = [(b["host"], b["port"]) for b in admin.describe_cluster()["brokers"]]
        finally:
            admin.close()
    assert seen == {name: [("127.0.0.1", tls_server.listener_ports[name])] for name in ("PLAINTEXT", "SSL")}
    with TlsConn(tls_server.bootstrap_for("OPTIONAL"), certs.context()) as conn:
        brokers = metadata(conn).brokers
    assert [(b.host, b.port) for b in brokers] == [("127.0.0.1", tls_server.listener_ports["OPTIONAL"])]


def test_principal_from_the_client_certificate(tls_server, certs):
    watch = LogWatch(tls_server)
    for client, listener in ((certs.alice, "MTLS"), (certs.bob, "OPTIONAL"), (None, "OPTIONAL")):
        with TlsConn(tls_server.bootstrap_for(listener), certs.context(client)) as conn:
            assert api_versions(conn).error_code == 0
    lines = [line for line in watch.text().splitlines() if "TLS established" in line]
    principals = [line.rpartition("tls_principal=")[2] for line in lines]
    assert principals == ["User:alice",                                     # RULE: the CN of OU=Clients, lower case
                          "User:CN=Bob,OU=Staff,O=trustme v1.2.1",          # DEFAULT: the DN as Java renders it
                          "User:ANONYMOUS"], lines                          # requested, none given


def test_tls_versions_per_listener(tls_server, certs):
    """TLS 1.2 and 1.3 by default; a listener's ssl.enabled.protocols=TLSv1.3 refuses a TLS 1.2 client."""
    def version(listener: str, highest: ssl.TLSVersion) -> str:
        context = certs.context()
        context.maximum_version = highest
        with TlsConn(tls_server.bootstrap_for(listener), context) as conn:
            assert api_versions(conn).error_code == 0
            return conn.sock.version()
    assert version("SSL", ssl.TLSVersion.TLSv1_2) == "TLSv1.2"
    assert version("SSL", ssl.TLSVersion.TLSv1_3) == "TLSv1.3"
    assert version("OPTIONAL", ssl.TLSVersion.TLSv1_3) == "TLSv1.3"
    with pytest.raises(ssl.SSLError):
        version("OPTIONAL", ssl.TLSVersion.TLSv1_2)


def test_mtls_refuses_a_client_without_certificate(tls_server, certs):
    watch = LogWatch(tls_server)
    with pytest.raises((ssl.SSLError, Closed, ConnectionError)):
        with TlsConn(tls_server.bootstrap_for("MTLS"), certs.context()) as conn:
            api_versions(conn)              # TLS 1.3: the refusal arrives with the first read
    line = watch.wait_for("TLS handshake failed", "listener=MTLS")
    assert "WARNING" in line and "CERTIFICATE" in line.upper()
    with RawConn(tls_server.bootstrap) as witness:
        assert api_versions(witness).error_code == 0


def test_garbage_and_truncated_tls_records_close_only_that_connection(tls_server, certs):
    watch = LogWatch(tls_server)
    port = tls_server.listener_ports["SSL"]
    # 1. not TLS at all
    with RawConn(tls_server.bootstrap_for("SSL")) as plain:
        plain.send(b"\x00\x00\x00\x12" + b"\x00" * 18)
        plain.expect_closed(timeout=10)
    watch.wait_for("TLS handshake failed", "listener=SSL")
    # 2. a record with a bad MAC after the handshake, sent under the TLS layer
    tls = certs.context().wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10),
                                      server_hostname="localhost")
    raw = socket.socket(fileno=os.dup(tls.fileno()))
    raw.sendall(b"\x17\x03\x03\x00\x20" + os.urandom(32))
    raw.settimeout(10)
    try:
        while raw.recv(4096):
            pass
    except OSError:
        pass
    raw.close()
    tls.close()
    watch.wait_for("closing connection: TLS error")
    # 3. a record cut short by the client's close
    tls = certs.context().wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10),
                                      server_hostname="localhost")
    raw = socket.socket(fileno=os.dup(tls.fileno()))
    raw.sendall(b"\x17\x03\x03\x40\x00" + os.urandom(100))
    raw.close()
    tls.close()
    with TlsConn(tls_server.bootstrap_for("SSL"), certs.context()) as conn:
        assert api_versions(conn).error_code == 0
    assert "Traceback" not in watch.text()


def _handshake_storm(port: int, ca_path: str, complete: int, stalled: int, out: dict) -> None:
    """``complete`` TLS handshakes and ``stalled`` connections that never finish theirs (silent, or half a
    ClientHello), all at once; counts those done and those the broker closed."""
    context = ssl.create_default_context(cafile=ca_path)

    async def full():
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        tls = trio.SSLStream(stream, context, server_hostname="localhost")
        await tls.do_handshake()
        out["handshakes"] += 1
        await tls.aclose()

    async def stall(i: int):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        if i % 2:
            await stream.send_all(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")      # half a ClientHello
        try:
            while await stream.receive_some(4096):
                pass
        except trio.BrokenResourceError:
            pass
        out["closed by broker"] += 1
        await stream.aclose()

    async def main():
        async with trio.open_nursery() as nursery:
            for i in range(max(complete, stalled)):
                if i < stalled:
                    nursery.start_soon(stall, i)
                if i < complete:
                    nursery.start_soon(full)

    try:
        trio.run(main)
    except BaseException as e:          # reported by the test
        out["error"] = repr(e)


@pytest.mark.timeout(300)
def test_a_thousand_concurrent_handshakes_leave_other_clients_served(certs):
    srv = start_server(certs)
    try:
        out = {"handshakes": 0, "closed by broker": 0}
        storm = threading.Thread(target=_handshake_storm,
                                 args=(srv.listener_ports["SSL"], certs.ca_path, 800, 200, out), daemon=True)
        with RawConn(srv.bootstrap, timeout=60) as plain, \
                TlsConn(srv.bootstrap_for("SSL"), certs.context(), timeout=60) as secure:
            storm.start()
            answered = 0
            while storm.is_alive() or answered < 20:        # requests keep being answered during the storm
                assert metadata(plain).brokers and api_versions(secure).error_code == 0
                answered += 1
                time.sleep(0.01)
            storm.join()
        assert out == {"handshakes": 800, "closed by broker": 200}
        # each stalled handshake closed with one line (on a loaded machine a complete one may be cut off too: the
        # client counts its own side done before the broker has read its Finished)
        text = srv.stderr_path.read_text()
        assert text.count("TLS handshake failed: not finished within trireme.ssl.handshake.timeout.ms=3000") >= 200
    finally:
        stop_server(srv)


def test_idle_tls_connection_is_closed(certs):
    srv = start_server(certs, **{"connections.max.idle.ms": 1000})
    try:
        watch = LogWatch(srv)
        with TlsConn(srv.bootstrap_for("SSL"), certs.context(), timeout=30) as conn:
            assert api_versions(conn).error_code == 0
            conn.expect_closed(timeout=30)
        watch.wait_for("connection close", "idle for connections.max.idle.ms=1000")
    finally:
        stop_server(srv)


def _served_certificate(port: int, certs: Certificates) -> bytes:
    with certs.context().wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10),
                                     server_hostname="localhost") as tls:
        return tls.getpeercert(binary_form=True)


def test_certificate_reload_through_alter_configs(certs, tmp_path):
    srv = start_server(certs)
    try:
        port = srv.listener_ports["SSL"]
        before = _served_certificate(port, certs)
        kept = TlsConn(srv.bootstrap_for("SSL"), certs.context())
        admin = AdminClient({"bootstrap.servers": srv.bootstrap})
        resource = lambda name, value: ConfigResource(       # noqa: E731
            ConfigResource.Type.BROKER, "1",
            incremental_configs=[ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)])
        renewed = certs.broker_keystore("renewed.keystore.pem")
        futures = admin.incremental_alter_configs([resource("listener.name.ssl.ssl.keystore.location", renewed)])
        for future in futures.values():
            future.result(30)
        after = _served_certificate(port, certs)
        assert after != before                              # new connections: the new certificate
        assert api_versions(kept).error_code == 0           # an open one goes on with its own
        kept.close()
        # a file that is no keystore: refused as Kafka refuses it, and the context in use stays
        bad = tmp_path / "bad.pem"
        bad.write_text("not a certificate\n")
        futures = admin.incremental_alter_configs([resource("listener.name.ssl.ssl.keystore.location", str(bad))])
        with pytest.raises(KafkaException) as refused:
            for future in futures.values():
                future.result(30)
        assert refused.value.args[0].name() == "INVALID_REQUEST", refused.value
        assert "Invalid config value for resource" in refused.value.args[0].str()
        assert _served_certificate(port, certs) == after
        # the legacy AlterConfigs: the configs given are the listener's whole dynamic set (kafka-python's
        # alter_configs only sets names DescribeConfigs lists, so the request goes raw)
        cls = message("AlterConfigsRequest").cls
        third = certs.broker_keystore("third.keystore.pem")
        with RawConn(srv.bootstrap) as conn:
            answer = conn.request("AlterConfigs", 2, cls(validate_only=False, resources=[cls.AlterConfigsResource(
                resource_type=4, resource_name="1", configs=[cls.AlterConfigsResource.AlterableConfig(
                    name="listener.name.ssl.ssl.keystore.location", value=third)])]))
        assert [(r.error_code, r.error_message) for r in answer.responses] == [(0, None)]
        assert _served_certificate(port, certs) not in (before, after)
        described = admin.describe_configs([ConfigResource(ConfigResource.Type.BROKER, "1")])
        configs = next(iter(described.values())).result(30)
        dynamic = configs["listener.name.ssl.ssl.keystore.location"]
        assert (dynamic.value, dynamic.source, dynamic.is_read_only) == (third, 2, False)   # DYNAMIC_BROKER_CONFIG
        # the listener prefix is needed, as in Kafka
        futures = admin.incremental_alter_configs([resource("ssl.keystore.location", renewed)])
        with pytest.raises(KafkaException, match="per-listener"):
            for future in futures.values():
                future.result(30)
    finally:
        stop_server(srv)


def test_shutdown_with_handshakes_under_way(certs):
    """SIGTERM while clients sit in their handshakes: they are dropped at once and the broker exits cleanly."""
    srv = start_server(certs, **{"trireme.ssl.handshake.timeout.ms": 600000})
    silent = []
    try:
        for _ in range(20):
            silent.append(socket.create_connection(("127.0.0.1", srv.listener_ports["SSL"]), timeout=10))
        with TlsConn(srv.bootstrap_for("SSL"), certs.context()) as conn:      # all accepted by now
            assert api_versions(conn).error_code == 0
    finally:
        stop_server(srv)            # exit code 0, no traceback
    for sock in silent:
        assert sock.recv(1) == b""  # closed by the broker
        sock.close()


def test_mapped_certificate_principals_meet_the_authorizer(certs):
    """The mapped TLS principal is what ACLs name: the super user (CN=admin of OU=Clients → User:admin) grants
    User:alice Write on a topic; alice's certificate may produce to it, Bob's (DEFAULT: his whole DN) may not."""
    from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType, NewTopic, ResourcePatternType,
                                       ResourceType)
    admin_cert = certs.client("admin", "Clients")
    srv = start_server(certs, **{"authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                                 "super.users": "User:admin"})
    try:
        topic = f"acl-{uuid.uuid4().hex[:8]}"
        admin = AdminClient(confluent_ssl(certs, srv.bootstrap_for("MTLS"), admin_cert))
        for future in admin.create_topics([NewTopic(topic, 1, 1)]).values():
            future.result(30)
        for future in admin.create_acls([AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL,
                                                    "User:alice", "*", AclOperation.WRITE,
                                                    AclPermissionType.ALLOW)]).values():
            future.result(30)

        def produce(client: str):
            outcome = []
            producer = Producer({**confluent_ssl(certs, srv.bootstrap_for("MTLS"), client),
                                 "message.timeout.ms": 20000})
            producer.produce(topic, b"x", on_delivery=lambda err, msg: outcome.append(err))
            producer.flush(30)
            return outcome

        assert produce(certs.alice) == [None]
        refused = produce(certs.bob)
        assert len(refused) == 1 and refused[0].name() == "TOPIC_AUTHORIZATION_FAILED", refused
    finally:
        stop_server(srv)


def _client_hello(certs: Certificates) -> bytes:
    """A real ClientHello, as Python's ssl client writes it first."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = certs.context().wrap_bio(incoming, outgoing, server_hostname="localhost")
    with pytest.raises(ssl.SSLWantReadError):
        client.do_handshake()
    return outgoing.read()


def test_mutated_and_truncated_client_hellos(tls_server, certs):
    """300 connections sending a real ClientHello cut short, with bytes flipped, or followed by garbage: each is
    closed or left to its handshake deadline with one line, no traceback, and the broker keeps serving."""
    import random
    rng = random.Random(21)
    hello = _client_hello(certs)
    watch = LogWatch(tls_server)
    port = tls_server.listener_ports["SSL"]
    sockets = []
    for i in range(300):
        data = bytearray(hello)
        kind = i % 3
        if kind == 0:
            data = data[:rng.randrange(1, len(data))]
        elif kind == 1:
            for _ in range(rng.randrange(1, 8)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        else:
            data += os.urandom(rng.randrange(1, 20000))
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        try:
            sock.sendall(bytes(data))
        except OSError:
            pass                                    # already refused
        if rng.random() < 0.5:
            sock.close()                            # the client gives up at once
        else:
            sockets.append(sock)
    with TlsConn(tls_server.bootstrap_for("SSL"), certs.context()) as conn:
        assert api_versions(conn).error_code == 0
    for sock in sockets:                            # the broker closes every one (at the latest at the deadline)
        sock.settimeout(30)
        try:
            while sock.recv(65536):
                pass
        except OSError:
            pass
        sock.close()
    with RawConn(tls_server.bootstrap) as witness:
        assert api_versions(witness).error_code == 0
    text = watch.text()
    assert "Traceback" not in text and "internal error" not in text
    assert text.count("TLS handshake failed") >= len(sockets)
