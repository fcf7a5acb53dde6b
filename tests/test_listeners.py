"""Kafka's ``listeners`` / ``advertised.listeners`` properties beside --listen / --advertised: PLAINTEXT only."""
import subprocess
import sys

import pytest
from kafka import KafkaAdminClient

from trireme.server.cli import build_parser, load_config
from trireme.server.config import ConfigError, listener_address


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
    ("listeners", "SSL://:9093", "not supported"),
    ("listeners", "SASL_PLAINTEXT://host:9093", "not supported"),
    ("listeners", "PLAINTEXT://:9092,CONTROLLER://:9093", "not supported"),
    ("listeners", "PLAINTEXT://:9092,PLAINTEXT://:9094", "exactly one"),
    ("listeners", "localhost:9092", "NAME://HOST:PORT"),
    ("listeners", "PLAINTEXT://host", "HOST:PORT"),
    ("advertised.listeners", "PLAINTEXT://:9092", "needs a host"),
])
def test_other_listeners_are_refused(name, value, says):
    with pytest.raises(ConfigError, match=says):
        listener_address(name, value)


def test_serve_refuses_an_ssl_listener_with_a_message(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "trireme", "serve", "--data-dir", str(tmp_path / "data"),
                           "--set", "listeners=SSL://:9093"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "SSL://:9093" in proc.stderr and "PLAINTEXT" in proc.stderr


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
