"""The admin command line on a secured listener of a real broker (``--command-config``), and what the metrics endpoint and status page then show of it.

Certificates are made by the test (trustme); none is committed.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import trustme

from trireme.testing import TriremeBroker

_SCRIPT = Path(sys.executable).parent / "trireme"
TRIREME = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "trireme"]


def cli(*args: str, expect: int = 0, stdin: str | None = None) -> subprocess.CompletedProcess:
    out = subprocess.run(TRIREME + list(args), capture_output=True, text=True, timeout=120, input=stdin)
    assert out.returncode == expect, (out.returncode, out.stdout, out.stderr)
    return out


def _address(broker: TriremeBroker, what: str) -> str:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        m = re.search(rf"{what} on (http://\S+)", broker.log_text())
        if m:
            return m.group(1)
        time.sleep(0.05)
    raise AssertionError(f"the broker never logged its {what} address")


@pytest.fixture
def pki(tmp_path):
    """A CA, the broker's PEM keystore (key, then chain) and the admin's, as files."""
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    for name, identity in (("broker", "127.0.0.1"), ("admin", "admin.example")):
        cert = ca.issue_cert(identity)
        (tmp_path / f"{name}.keystore.pem").write_bytes(
            cert.private_key_pem.bytes() + b"".join(c.bytes() for c in cert.cert_chain_pems))
    return tmp_path


def test_cli_over_an_mtls_listener_and_the_security_counters(pki):
    config = {"listeners": "SSL://127.0.0.1:0", "ssl.keystore.type": "PEM",
              "ssl.keystore.location": str(pki / "broker.keystore.pem"), "ssl.truststore.type": "PEM",
              "ssl.truststore.location": str(pki / "ca.pem"), "ssl.client.auth": "required",
              "trireme.metrics.listen": "127.0.0.1:0", "trireme.status.listen": "127.0.0.1:0"}
    with TriremeBroker(topics={"orders": 2}, config=config, storage="disk") as broker:
        bootstrap = broker.bootstrap_for("SSL")
        (pki / "mtls.properties").write_text(
            "security.protocol=SSL\nssl.truststore.type=PEM\n"
            f"ssl.truststore.location={pki / 'ca.pem'}\n"
            f"ssl.keystore.type=PEM\nssl.keystore.location={pki / 'admin.keystore.pem'}\n")
        out = cli("topics", "--list", "--bootstrap-server", bootstrap, "--command-config", str(pki / "mtls.properties"))
        assert ["orders", "2", "false"] in [line.split() for line in out.stdout.splitlines()]
        # No client certificate: the broker refuses the handshake, the tool says so and exits 1.
        (pki / "no-cert.properties").write_text(f"security.protocol=SSL\nssl.ca.location={pki / 'ca.pem'}\n")
        out = cli("topics", "--list", "--bootstrap-server", bootstrap, "--command-config",
                  str(pki / "no-cert.properties"), expect=1)
        assert out.stdout == "" and out.stderr.startswith("trireme topics: ")
        # Plain TCP to the TLS port: no answer the tool can read, and a message (not a traceback).
        out = cli("topics", "--list", "--bootstrap-server", bootstrap, "--timeout", "5", expect=1)
        assert "Traceback" not in out.stderr
        text = urllib.request.urlopen(_address(broker, "metrics"), timeout=10).read().decode()
        counts = dict(re.findall(r'trireme_authentications_total\{listener="SSL",mechanism="SSL",outcome="(\w+)"\} '
                                 r'(\d+)', text))
        assert int(counts["success"]) >= 1 and int(counts["failure"]) >= 1
        page = urllib.request.urlopen(_address(broker, "status page"), timeout=10).read().decode()
        section = page[page.index('<section id="security">'):]
        assert re.search(r"<td>SSL</td><td>SSL</td><td>127\.0\.0\.1:\d+</td><td></td><td>required</td>", section)
        assert "<td>PLAINTEXT</td><td>PLAINTEXT</td>" in section


def test_cli_over_a_sasl_ssl_listener_with_plain(pki):
    """SASL_SSL with PLAIN users from the listener's JAAS line: the tool logs in with a Java sasl.jaas.config line or
    librdkafka's sasl.username/sasl.password; a wrong password exits 1 with the broker's message and is not shown."""
    jaas = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" '
            'password="admin-secret" user_admin="admin-secret";')
    config = {"listeners": "SASL_SSL://127.0.0.1:0", "ssl.keystore.type": "PEM",
              "ssl.keystore.location": str(pki / "broker.keystore.pem"), "sasl.enabled.mechanisms": "PLAIN",
              "listener.name.sasl_ssl.plain.sasl.jaas.config": jaas, "trireme.metrics.listen": "127.0.0.1:0"}
    with TriremeBroker(topics={"orders": 1}, config=config, storage="disk") as broker:
        bootstrap = broker.bootstrap_for("SASL_SSL")
        (pki / "java.properties").write_text(
            "security.protocol=SASL_SSL\nsasl.mechanism=PLAIN\n"
            "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required \\\n"
            '    username="admin" password="admin-secret";\n'
            f"ssl.truststore.type=PEM\nssl.truststore.location={pki / 'ca.pem'}\n")
        out = cli("topics", "--list", "--bootstrap-server", bootstrap, "--command-config", str(pki / "java.properties"))
        assert ["orders", "1", "false"] in [line.split() for line in out.stdout.splitlines()]
        (pki / "wrong.properties").write_text(
            "security.protocol=SASL_SSL\nsasl.mechanisms=PLAIN\nsasl.username=admin\nsasl.password=guess-1\n"
            f"ssl.ca.location={pki / 'ca.pem'}\n")
        out = cli("topics", "--list", "--bootstrap-server", bootstrap, "--command-config",
                  str(pki / "wrong.properties"), expect=1)
        assert out.stdout == "" and "guess-1" not in out.stderr
        assert out.stderr.startswith(f"trireme topics: authentication as 'admin' with PLAIN at {bootstrap} failed: ")
        assert "Invalid username or password" in out.stderr
        assert "guess-1" not in broker.log_text() and "admin-secret" not in broker.log_text()
        text = urllib.request.urlopen(_address(broker, "metrics"), timeout=10).read().decode()
        counts = dict(re.findall(r'trireme_authentications_total\{listener="SASL_SSL",mechanism="PLAIN",'
                                 r'outcome="(\w+)"\} (\d+)', text))
        assert counts == {"success": "1", "failure": "1"}


def test_walk_through_scram_users_acls_and_a_denied_client(pki):
    """docs/security.md's walk-through against a real broker: SASL_SSL with SCRAM-SHA-512, the authorizer on, the
    first user from trireme.storage.add.scram; the CLI adds a user and ACLs, confluent-kafka logs in as that user with
    the password the CLI salted, produces where the ACLs allow and is refused elsewhere; the status page and the
    metrics show the denial; quotas are set, read and removed; deleting the ACLs and the user takes both away."""
    from confluent_kafka import KafkaError, Producer
    config = {"listeners": "SASL_SSL://127.0.0.1:0", "ssl.keystore.type": "PEM",
              "ssl.keystore.location": str(pki / "broker.keystore.pem"),
              "sasl.enabled.mechanisms": "SCRAM-SHA-512",
              "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
              "super.users": "User:admin", "trireme.storage.add.scram": "SCRAM-SHA-512=[name=admin,password=admin-secret]",
              "trireme.metrics.listen": "127.0.0.1:0", "trireme.status.listen": "127.0.0.1:0",
              # the walk-through's inter-broker lines, Kafka's: used by no single broker, and said so truthfully
              "inter.broker.listener.name": "SASL_SSL", "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
              "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config":
                  'org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" '
                  'password="admin-secret";'}
    with TriremeBroker(topics={"orders": 1, "payroll": 1}, config=config, storage="disk") as broker:
        assert "has no SASL or ACLs" not in broker.log_text()
        assert "admin-secret" not in broker.log_text()
        bootstrap = broker.bootstrap_for("SASL_SSL")
        (pki / "admin.properties").write_text(
            "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\n"
            'sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" '
            'password="admin-secret";\n'
            f"ssl.truststore.type=PEM\nssl.truststore.location={pki / 'ca.pem'}\n")
        b = ["--bootstrap-server", bootstrap, "--command-config", str(pki / "admin.properties")]
        cli("users", "add", *b, "--user", "alice", "--password-stdin", stdin="alice-secret\n")
        listed = [line.split() for line in cli("users", "list", *b).stdout.splitlines()[1:]]
        assert ["alice", "SCRAM-SHA-512", "4096"] in listed and ["admin", "SCRAM-SHA-512", "4096"] in listed
        out = cli("acls", "create", *b, "--allow-principal", "User:alice", "--producer", "--topic", "orders")
        assert out.stdout.startswith("Created 3 ACLs:")
        acls = [line.split() for line in cli("acls", "list", *b, "--topic", "orders").stdout.splitlines()[1:]]
        assert sorted(a[5] for a in acls) == ["CREATE", "DESCRIBE", "WRITE"]

        def produce(topic: str):
            producer = Producer({"bootstrap.servers": bootstrap, "security.protocol": "SASL_SSL",
                                 "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "alice",
                                 "sasl.password": "alice-secret", "ssl.ca.location": str(pki / "ca.pem"),
                                 "enable.idempotence": False, "message.timeout.ms": 5000, "log_level": 0})
            errors = []
            producer.produce(topic, value=b"x", on_delivery=lambda err, msg: errors.append(err))
            producer.flush(20)
            return errors

        assert produce("orders") == [None]
        (denied,) = produce("payroll")
        assert denied is not None and denied.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        text = urllib.request.urlopen(_address(broker, "metrics"), timeout=10).read().decode()
        assert re.search(r'trireme_authorization_denials_by_resource_total\{resource_type="TOPIC",'
                         r'resource="payroll"\} [1-9]', text)
        assert re.search(r'trireme_authentications_total\{listener="SASL_SSL",mechanism="SCRAM-SHA-512",'
                         r'outcome="success"\} [1-9]', text)
        page = urllib.request.urlopen(_address(broker, "status page"), timeout=10).read().decode()
        section = page[page.index('<section id="security">'):]
        assert "Authorizer: <span class=\"tag ok\">on</span>" in section and "super users: User:admin" in section
        assert re.search(r"<td>User:alice</td><td>\w+</td><td>TOPIC</td><td>payroll</td>", section)

        # Quotas through the same secured connection: set, read back as kafka-configs.sh shows them, remove.
        cli("quotas", "alter", *b, "--entity-type", "users", "--entity-name", "alice", "--entity-type", "clients",
            "--entity-default", "--add-config", "producer_byte_rate=1048576,consumer_byte_rate=2097152")
        cli("quotas", "alter", *b, "--user-defaults", "--add-config", "request_percentage=50")
        out = cli("quotas", "describe", *b, "--user", "alice", "--client-defaults", "--json")
        assert json.loads(out.stdout) == [{"entity": {"user": "alice", "client-id": None},
                                           "quotas": {"producer_byte_rate": 1048576.0,
                                                      "consumer_byte_rate": 2097152.0}}]
        rows = [line.split() for line in cli("quotas", "describe", *b).stdout.splitlines()[1:]]
        assert sorted(rows) == [["user=<default>", "request_percentage", "50.0"],
                                ["user=alice,client-id=<default>", "consumer_byte_rate", "2097152.0"],
                                ["user=alice,client-id=<default>", "producer_byte_rate", "1048576.0"]]
        out = cli("quotas", "alter", *b, "--client", "app", "--add-config", "producer_byte_rate=1.5", expect=1)
        assert "INVALID_REQUEST" in out.stderr
        cli("quotas", "alter", *b, "--user", "alice", "--client-defaults", "--delete-config",
            "producer_byte_rate,consumer_byte_rate")
        assert [line.split()[0] for line in cli("quotas", "describe", *b).stdout.splitlines()[1:]] == ["user=<default>"]

        out = cli("acls", "delete", *b, "--topic", "orders")
        assert out.stdout.startswith("Deleted 3 ACLs:")
        (denied,) = produce("orders")
        assert denied is not None and denied.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        cli("users", "delete", *b, "--user", "alice")
        (failed,) = produce("orders")
        assert failed is not None
        assert [line.split()[0] for line in cli("users", "list", *b).stdout.splitlines()[1:]] == ["admin"]


def test_server_properties_with_a_jaas_line_continued_over_lines(pki, tmp_path):
    """Kafka's docs write a broker's JAAS line over several lines with a backslash at each end (Java properties);
    pasted into server.properties it must start the broker, and the user defined on a continued line log in."""
    (tmp_path / "server.properties").write_text(
        "listeners=SASL_SSL://127.0.0.1:0\n"
        "ssl.keystore.type=PEM\n"
        f"ssl.keystore.location={pki / 'broker.keystore.pem'}\n"
        "sasl.enabled.mechanisms=PLAIN\n"
        "listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule "
        "required \\\n"
        '    username="admin" \\\n'
        '    password="admin-secret" \\\n'
        '    user_admin="admin-secret" \\\n'
        '    user_alice="alice-secret";\n')
    proc = subprocess.Popen(TRIREME + ["serve", "--data-dir", str(tmp_path / "data"), "--config",
                                       str(tmp_path / "server.properties")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("listening on "), (line, proc.stderr.read() if proc.poll() is not None else "")
        bootstrap = line.split()[-1]
        (tmp_path / "alice.properties").write_text(
            "security.protocol=SASL_SSL\nsasl.mechanism=PLAIN\nsasl.username=alice\nsasl.password=alice-secret\n"
            f"ssl.ca.location={pki / 'ca.pem'}\n")
        cli("topics", "--list", "--bootstrap-server", bootstrap, "--command-config", str(tmp_path / "alice.properties"))
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def test_a_throttled_client_on_the_metrics_and_the_status_page():
    """A quota set with the CLI throttles a confluent-kafka producer that sends past it; the throttle shows on
    /metrics (per user, client id and quota type) and in the status page's Security section."""
    from confluent_kafka import Producer
    config = {"trireme.metrics.listen": "127.0.0.1:0", "trireme.status.listen": "127.0.0.1:0"}
    with TriremeBroker(topics={"bulk": 1}, config=config, storage="disk") as broker:
        cli("quotas", "alter", "--bootstrap-server", broker.bootstrap, "--user-defaults", "--client-defaults",
            "--add-config", "producer_byte_rate=1024")
        producer = Producer({"bootstrap.servers": broker.bootstrap, "client.id": "bulk-loader", "linger.ms": 0,
                             "log_level": 0})
        for _ in range(40):
            producer.produce("bulk", value=b"x" * 4096)
            producer.poll(0)
        assert producer.flush(60) == 0
        text = urllib.request.urlopen(_address(broker, "metrics"), timeout=10).read().decode()
        m = re.search(r'trireme_client_throttles_total\{user="([^"]*)",client_id="([^"]*)",quota_type="Produce"\} '
                      r'(\d+)', text)
        assert m is not None and int(m.group(3)) >= 1, text[-3000:]
        assert re.search(r'trireme_client_throttle_seconds_total\{user="[^"]*",client_id="[^"]*",'
                         r'quota_type="Produce"\} [0-9.]*[1-9]', text)
        page = urllib.request.urlopen(_address(broker, "status page"), timeout=10).read().decode()
        section = page[page.index('<section id="security">'):]
        throttled = section[section.index("<h3>Throttled clients</h3>"):]
        assert "<td>Produce</td>" in throttled and "no client throttled" not in throttled


def test_denials_for_many_invented_names_keep_the_label_set_bounded():
    """A client asking for 60 topic names it may not use: every denial is counted, but the labelled denial
    metrics keep to trireme.metrics.security.max.series series (the client chooses the names)."""
    from confluent_kafka.admin import AdminClient
    config = {"authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
              "trireme.metrics.listen": "127.0.0.1:0", "trireme.metrics.security.max.series": 5}
    with TriremeBroker(config=config, storage="disk") as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap, "log_level": 0})
        for name in (f"probe-{i}" for i in range(60)):      # Metadata for each name on its own
            topic = admin.list_topics(name, timeout=10).topics[name]
            assert topic.error is not None and topic.error.code() == 29           # TOPIC_AUTHORIZATION_FAILED
        text = urllib.request.urlopen(_address(broker, "metrics"), timeout=10).read().decode()
        total = int(float(re.search(r"^trireme_authorization_denials_total (\S+)$", text, re.M).group(1)))
        assert total >= 60
        by_resource = re.findall(r"^trireme_authorization_denials_by_resource_total\{", text, re.M)
        assert len(by_resource) == 5
        assert len(re.findall(r"^trireme_authorization_denials_by_principal_total\{", text, re.M)) <= 5
