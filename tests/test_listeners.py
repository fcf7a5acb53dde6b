"""Kafka's ``listeners`` / ``advertised.listeners`` / ``listener.security.protocol.map`` beside --listen / --advertised."""
import subprocess
import sys

import pytest
from kafka import KafkaAdminClient

from trireme.server.cli import build_parser, load_config
from trireme.server.config import ConfigError, parse_listener_list


def _config(tmp_path, *argv):
    return load_config(build_parser().parse_args(["serve", "--data-dir", str(tmp_path), *argv]))


def test_listener_properties_set_the_addresses(tmp_path):
    path = tmp_path / "server.properties"
    path.write_text("listeners=PLAINTEXT://:19092\nadvertised.listeners=PLAINTEXT://broker.example:29092\n")
    config = _config(tmp_path, "--config", str(path))
    assert (config.listen_host, config.listen_port) == ("0.0.0.0", 19092)       # empty host: every interface
    assert (config.advertised_host, config.advertised_port) == ("broker.example", 29092)
    config = _config(tmp_path, "--config", str(path), "--listen", "127.0.0.1:0", "--advertised", "other:1")
    assert (config.listen_host, config.listen_port, config.advertised_host, config.advertised_port) == (
        "127.0.0.1", 0, "other", 1)                                              # the flags win
    config = _config(tmp_path, "--set", "listeners=plaintext://[::1]:9093")
    assert (config.listen_host, config.listen_port) == ("::1", 9093)


@pytest.mark.parametrize("name, value, says", [
    ("listeners", "PLAINTEXT://:9092,PLAINTEXT://:9094", "different name"),
    ("listeners", "PLAINTEXT://:9092,SSL://:9092", "different port"),
    ("listeners", "localhost:9092", "NAME://HOST:PORT"),
    ("listeners", "PLAINTEXT://host", "HOST:PORT"),
])
def test_malformed_listener_lists_are_refused(name, value, says):
    with pytest.raises(ConfigError, match=says):
        parse_listener_list(name, value)


def test_several_listeners_with_their_protocols_and_advertised_addresses(tmp_path):
    path = tmp_path / "server.properties"
    path.write_text("listeners=PLAINTEXT://127.0.0.1:0,SSL://:9093,INTERNAL://127.0.0.1:9094,CONTROLLER://:9095\n"
                    "controller.listener.names=CONTROLLER\n"
                    "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,SSL:SSL,INTERNAL:SASL_SSL,"
                    "CONTROLLER:PLAINTEXT\n"
                    "advertised.listeners=SSL://broker.example:19093,INTERNAL://internal.example:9094\n"
                    "inter.broker.listener.name=INTERNAL\n")
    config = _config(tmp_path, "--config", str(path))
    assert [(s.name, s.security_protocol, s.host, s.port, s.advertised_host, s.advertised_port)
            for s in config.listeners] == [
        ("PLAINTEXT", "PLAINTEXT", "127.0.0.1", 0, None, None),
        ("SSL", "SSL", "0.0.0.0", 9093, "broker.example", 19093),
        ("INTERNAL", "SASL_SSL", "127.0.0.1", 9094, "internal.example", 9094)]
    assert config.inter_broker_listener == "INTERNAL"
    # --listen takes the PLAINTEXT listener and puts it first; without one in the list it is added
    config = _config(tmp_path, "--set", "listeners=SSL://:9093,PLAINTEXT://:9092", "--listen", "127.0.0.1:0")
    assert [(s.name, s.host, s.port) for s in config.listeners] == [("PLAINTEXT", "127.0.0.1", 0), ("SSL", "0.0.0.0", 9093)]
    config = _config(tmp_path, "--set", "listeners=SASL_SSL://:9094", "--listen", "127.0.0.1:0")
    assert [(s.name, s.security_protocol) for s in config.listeners] == [("PLAINTEXT", "PLAINTEXT"),
                                                                         ("SASL_SSL", "SASL_SSL")]


@pytest.mark.parametrize("settings, says", [
    (["listeners=CLIENTS://:9092"], "no security protocol for listener CLIENTS"),
    (["listeners=SSL://:9093", "listener.security.protocol.map=SSL:TLS"], "must be one of"),
    (["listeners=SSL://:9093", "advertised.listeners=OTHER://h:1"], "OTHER is not in listeners"),
    (["listeners=SSL://:9093", "advertised.listeners=SSL://:9093"], "needs a host"),
    (["listeners=SSL://:9093", "inter.broker.listener.name=INTERNAL"], "must be a listener name"),
    (["listeners=SSL://:9093", "inter.broker.listener.name=SSL", "security.inter.broker.protocol=SSL"],
     "Only one of"),
    (["listeners=SSL://:9093", "security.inter.broker.protocol=SASL_SSL"], "needs a listener named SASL_SSL"),
])
def test_inconsistent_listener_settings_are_refused_in_one_line(tmp_path, settings, says):
    argv = [a for setting in settings for a in ("--set", setting)]
    with pytest.raises(ConfigError, match=f"^--set: .*{says}"):
        _config(tmp_path, *argv)


def test_serve_refuses_a_jks_keystore_in_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "trireme", "serve", "--data-dir", str(tmp_path / "data"),
                           "--set", "listeners=SSL://127.0.0.1:0", "--set", "ssl.keystore.type=JKS",
                           "--set", "ssl.keystore.location=/x.jks"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.strip().splitlines()[-1] == (
        "trireme: listener SSL: ssl.keystore.type=JKS is not supported: Trireme reads PEM key material only "
        "(Python's ssl has no Java key stores); convert the store to PEM with keytool/openssl")


def test_serve_with_listener_properties(tmp_path):
    """A server.properties in Kafka's terms: the broker binds ``listeners`` and tells clients ``advertised.listeners``."""
    path = tmp_path / "server.properties"
    path.write_text("listeners=PLAINTEXT://127.0.0.1:0\nadvertised.listeners=PLAINTEXT://localhost:0\n")
    proc = subprocess.Popen([sys.executable, "-m", "trireme", "serve", "--data-dir", str(tmp_path / "data"),
                             "--config", str(path)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        first = proc.stdout.readline().strip()
        assert first.startswith("listening on 127.0.0.1:")
        port = int(first.rpartition(":")[2])
        admin = KafkaAdminClient(bootstrap_servers=f"127.0.0.1:{port}", request_timeout_ms=30000)
        try:
            brokers = admin.describe_cluster()["brokers"]
        finally:
            admin.close()
        assert [(b["host"], b["port"]) for b in brokers] == [("localhost", port)]
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0


def test_fixture_runs_extra_listeners_and_counts_client_certificate_handshakes(tmp_path):
    """TriremeBroker in this process: extra listeners from ``listeners``, each one's bound port, TLS on them, and
    metrics.authentication for client certificates."""
    import socket
    import ssl

    import trustme

    from trireme.testing import TriremeBroker
    ca = trustme.CA()
    server = ca.issue_cert("localhost", "127.0.0.1")
    keystore, ca_path, client = tmp_path / "ks.pem", tmp_path / "ca.pem", tmp_path / "client.pem"
    server.private_key_and_cert_chain_pem.write_to_path(str(keystore))
    ca.cert_pem.write_to_path(str(ca_path))
    ca.issue_cert("carol@example.com", common_name="carol").private_key_and_cert_chain_pem.write_to_path(str(client))
    with TriremeBroker(config={"listeners": "SSL://127.0.0.1:0,MTLS://127.0.0.1:0",
                               "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SSL:SSL,MTLS:SSL",
                               "ssl.keystore.location": str(keystore), "ssl.truststore.location": str(ca_path),
                               "listener.name.mtls.ssl.client.auth": "required"}) as broker:
        assert set(broker.listener_ports) == {"PLAINTEXT", "SSL", "MTLS"}
        assert broker.listener_ports["PLAINTEXT"] == broker.port and 0 not in broker.listener_ports.values()
        assert len(set(broker.listener_ports.values())) == 3

        def handshake(listener: str, with_certificate: bool) -> bool:
            context = ssl.create_default_context(cafile=str(ca_path))
            if with_certificate:
                context.load_cert_chain(str(client))
            host, _, port = broker.bootstrap_for(listener).rpartition(":")
            try:
                with context.wrap_socket(socket.create_connection((host, int(port)), timeout=10),
                                         server_hostname="localhost") as tls:
                    tls.sendall(b"\x00\x00\x00\x0a\x00\x12\x00\x00\x00\x00\x00\x01\xff\xff")    # ApiVersions v0
                    return len(tls.recv(4)) == 4                # its answer (TLS 1.3 reports a refusal here)
            except (ssl.SSLError, ConnectionError):
                return False

        assert handshake("SSL", False) and handshake("MTLS", True)
        assert not handshake("MTLS", False)
        metrics = broker._listener.broker.metrics
        assert dict(metrics.authentications) == {("MTLS", "SSL", "success"): 1, ("MTLS", "SSL", "failure"): 1}
        assert "tls_principal=User:CN=carol" in broker.log_text()


def test_a_listener_on_every_interface_advertises_the_host_name():
    import socket

    from trireme.server.config import ListenerSpec
    from trireme.server.listener import EndPoint
    assert EndPoint(ListenerSpec("PLAINTEXT", "PLAINTEXT", "0.0.0.0", 9092), []).advertised_host == socket.getfqdn()
    assert EndPoint(ListenerSpec("SSL", "SSL", "127.0.0.1", 9093, "kafka.example", 19093), []).advertised_port == 19093
    assert EndPoint(ListenerSpec("SSL", "SSL", "127.0.0.1", 9093), []).advertised_host == "127.0.0.1"
