"""A Kafka 4.x server.properties pasted as is starts `trireme serve`: the names Kafka's broker defines are used or
reported once as having no effect, and log.retention.hours sets the topics' retention (docs/operations.md)."""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource, NewTopic, ResourceType

from compat_tests.conftest import ServerProcess

TIMEOUT_S = 30

# Kafka 4.x's config/server.properties (combined broker and controller, KRaft), with retention set in hours.
KAFKA_SERVER_PROPERTIES = """\
# Server Basics
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=localhost:9093
controller.quorum.voters=1@localhost:9093

# Socket Server Settings
listeners=PLAINTEXT://:9092,CONTROLLER://:9093
inter.broker.listener.name=PLAINTEXT
advertised.listeners=PLAINTEXT://localhost:9092,CONTROLLER://localhost:9093
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL
num.network.threads=3
num.io.threads=8
socket.send.buffer.bytes=102400
socket.receive.buffer.bytes=102400
socket.request.max.bytes=104857600

# Log Basics
log.dirs=/tmp/kraft-combined-logs
num.partitions=3
num.recovery.threads.per.data.dir=1

# Internal Topic Settings
offsets.topic.replication.factor=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1

# Log Retention Policy
log.retention.hours=1
log.segment.bytes=1073741824
log.retention.check.interval.ms=300000
"""

NO_EFFECT = ["controller.quorum.bootstrap.servers", "controller.quorum.voters", "log.dirs", "num.io.threads",
             "num.network.threads", "num.recovery.threads.per.data.dir", "offsets.topic.replication.factor",
             "process.roles", "share.coordinator.state.topic.min.isr",
             "share.coordinator.state.topic.replication.factor", "socket.receive.buffer.bytes",
             "socket.send.buffer.bytes", "transaction.state.log.min.isr",
             "transaction.state.log.replication.factor"]


@pytest.fixture
def pasted_server():
    workdir = Path(tempfile.mkdtemp(prefix="trireme-properties-"))
    (workdir / "server.properties").write_text(KAFKA_SERVER_PROPERTIES)
    # The suite's --listen (a free port) and --advertised win over the file's listeners, as the flags always do.
    srv = ServerProcess(workdir, extra_args=["--config", str(workdir / "server.properties"),
                                             "--advertised", "127.0.0.1:0"])
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def test_pasted_kafka_server_properties_starts_and_honours_retention_hours(pasted_server):
    log = pasted_server.stderr_path.read_text()
    reported = [line for line in log.splitlines() if "no effect here" in line]
    assert len(reported) == 1, log
    assert reported[0].endswith("no effect here (Kafka properties Trireme does not use): " + ", ".join(NO_EFFECT))

    admin = AdminClient({"bootstrap.servers": pasted_server.bootstrap})
    topic = "pasted-properties"
    admin.create_topics([NewTopic(topic, -1)], request_timeout=TIMEOUT_S)[topic].result(timeout=TIMEOUT_S)
    assert len(admin.list_topics(topic, timeout=TIMEOUT_S).topics[topic].partitions) == 3      # num.partitions

    res = ConfigResource(ResourceType.TOPIC, topic)
    retention = admin.describe_configs([res], request_timeout=TIMEOUT_S)[res].result(timeout=TIMEOUT_S)["retention.ms"]
    assert (retention.value, retention.source) == ("3600000", ConfigSource.STATIC_BROKER_CONFIG.value)

    broker = ConfigResource(ResourceType.BROKER, "1")
    configs = admin.describe_configs([broker], request_timeout=TIMEOUT_S)[broker].result(timeout=TIMEOUT_S)
    assert (configs["log.retention.hours"].value, configs["log.retention.hours"].source) == \
        ("1", ConfigSource.STATIC_BROKER_CONFIG.value)
    assert configs["log.retention.ms"].value == "3600000"
    assert configs["log.retention.minutes"].value is None
