"""The data and transaction APIs' ACL checks against a real broker: SASL_PLAINTEXT with PLAIN users from JAAS and Kafka's authorizer class configured.

A principal without Write on a topic cannot produce to it (confluent-kafka's delivery report says
TOPIC_AUTHORIZATION_FAILED), one with it can; a rogue WriteTxnMarkers from a client without ClusterAction is
refused and the open transaction stays intact (the producer still commits it, read_committed consumers see it);
a read_committed consumer without Read on the topic is refused, one with it reads.  ``admin`` is a super user.
"""
from __future__ import annotations

import confluent_kafka
import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType, AdminClient, NewTopic,
                                   ResourcePatternType, ResourceType)

from compat_tests.test_bad_input import RawConn, req, unique
from compat_tests.test_bad_transactions import lso, markers
from trireme.wire import error_codes as E

LISTENER = "SASL_PLAINTEXT"
USERS = {"admin": "admin-secret", "alice": "alice-secret", "bob": "bob-secret"}
JAAS = ("org.apache.kafka.common.security.plain.PlainLoginModule required "
        'username="admin" password="admin-secret" '
        + " ".join(f'user_{name}="{secret}"' for name, secret in USERS.items()) + ";")

pytestmark = pytest.mark.server_config({
    "listeners": f"{LISTENER}://127.0.0.1:0",
    "sasl.enabled.mechanisms": "PLAIN",
    "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
    "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "super.users": "User:admin",
})


def settings(server, user: str, **extra) -> dict:
    return {"bootstrap.servers": server.bootstrap_for(LISTENER), "security.protocol": LISTENER,
            "sasl.mechanism": "PLAIN", "sasl.username": user, "sasl.password": USERS[user], **extra}


def allow(admin: AdminClient, user: str, resource_type, name: str, *operations) -> None:
    bindings = [AclBinding(resource_type, name, ResourcePatternType.LITERAL, f"User:{user}", "*", op,
                           AclPermissionType.ALLOW) for op in operations]
    for future in admin.create_acls(bindings).values():
        future.result(30)


@pytest.fixture(scope="module")
def admin(module_server):
    return AdminClient(settings(module_server, "admin"))


def new_topic(admin: AdminClient) -> str:
    name = unique("acl")
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(30)
    return name


def raw_as(server, user: str) -> RawConn:
    """A raw connection to the SASL listener, authenticated as ``user`` with PLAIN."""
    conn = RawConn(server.bootstrap_for(LISTENER))
    assert conn.request("SaslHandshake", 1, req("SaslHandshake", mechanism="PLAIN")).error_code == 0
    token = b"\0" + user.encode() + b"\0" + USERS[user].encode()
    assert conn.request("SaslAuthenticate", 2, req("SaslAuthenticate", auth_bytes=token)).error_code == 0
    return conn


def produce_one(server, user: str, topic: str, **extra) -> int:
    """Produce one record as ``user`` → the delivery report's error code (0: delivered)."""
    reports = []
    producer = Producer(settings(server, user, **extra))
    producer.produce(topic, b"v", on_delivery=lambda err, msg: reports.append(err))
    assert producer.flush(30) == 0
    [err] = reports
    return 0 if err is None else err.code()


def high_watermark(admin_settings: dict, topic: str) -> int:
    consumer = Consumer({**admin_settings, "group.id": unique("hw")})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)[1]
    finally:
        consumer.close()


def test_produce_needs_write_on_the_topic(module_server, admin):
    topic = new_topic(admin)
    allow(admin, "bob", ResourceType.TOPIC, topic, AclOperation.DESCRIBE)      # metadata, not Write
    allow(admin, "alice", ResourceType.TOPIC, topic, AclOperation.WRITE)
    assert produce_one(module_server, "bob", topic) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert high_watermark(settings(module_server, "admin"), topic) == 0          # nothing was appended
    assert produce_one(module_server, "alice", topic) == 0
    assert high_watermark(settings(module_server, "admin"), topic) == 1


def test_idempotent_producer_needs_write_on_some_topic_or_idempotent_write(module_server, admin):
    """InitProducerId without a transactional id: IdempotentWrite on the cluster, or (Kafka 3+) Write on at least one
    topic; bob, who may only describe the topic, gets CLUSTER_AUTHORIZATION_FAILED, which is fatal to the producer."""
    topic = new_topic(admin)
    allow(admin, "bob", ResourceType.TOPIC, topic, AclOperation.DESCRIBE)
    allow(admin, "alice", ResourceType.TOPIC, topic, AclOperation.WRITE)
    assert produce_one(module_server, "alice", topic, **{"enable.idempotence": True}) == 0
    producer = Producer(settings(module_server, "bob", **{"enable.idempotence": True}))
    producer.produce(topic, b"v")
    with pytest.raises(KafkaException) as raised:       # confluent-kafka raises the fatal error from poll()
        for _ in range(30):
            producer.poll(1)
    error = raised.value.args[0]
    assert (error.code(), error.fatal()) == (KafkaError.CLUSTER_AUTHORIZATION_FAILED, True)
    assert high_watermark(settings(module_server, "admin"), topic) == 1


def test_rogue_markers_without_cluster_action_leave_the_transaction_intact(module_server, admin):
    topic = new_topic(admin)
    tid = unique("tx")
    allow(admin, "alice", ResourceType.TOPIC, topic, AclOperation.WRITE)
    allow(admin, "alice", ResourceType.TRANSACTIONAL_ID, tid, AclOperation.WRITE)
    producer = Producer(settings(module_server, "alice", **{"transactional.id": tid}))
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(3):
        producer.produce(topic, b"committed-%d" % i)
    assert producer.flush(30) == 0
    with raw_as(module_server, "admin") as watcher, raw_as(module_server, "bob") as rogue:
        [state] = watcher.request("DescribeTransactions", 0, req("DescribeTransactions",
                                                                 transactional_ids=[tid])).transaction_states
        assert (state.error_code, state.transaction_state) == (0, "Ongoing")
        stable = lso(watcher, topic, 0)
        for commit in (True, False):
            assert markers(rogue, state.producer_id, state.producer_epoch, topic, 0, 0,
                           commit=commit) == E.CLUSTER_AUTHORIZATION_FAILED.code
        # A principal with ClusterAction (the super user) passes the ACL check and still meets the coordinator's.
        assert markers(watcher, state.producer_id, state.producer_epoch, topic, 0, 0) == E.INVALID_TXN_STATE.code
        [after] = watcher.request("DescribeTransactions", 0, req("DescribeTransactions",
                                                                 transactional_ids=[tid])).transaction_states
        assert (after.transaction_state, after.producer_epoch) == ("Ongoing", state.producer_epoch)
        assert lso(watcher, topic, 0) == stable
    producer.commit_transaction(30)
    values = read_committed(module_server, "admin", topic, 3)
    assert values == [b"committed-%d" % i for i in range(3)]


def read_committed(server, user: str, topic: str, count: int) -> list:
    """Up to ``count`` values a read_committed consumer of ``user`` gets from partition 0, or the first error."""
    consumer = Consumer(settings(server, user, **{"group.id": unique("g"), "isolation.level": "read_committed",
                                                  "enable.auto.commit": False}))
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        values = []
        for _ in range(60):
            message = consumer.poll(1)
            if message is None:
                continue
            if message.error() is not None:
                if message.error().code() == KafkaError._PARTITION_EOF:
                    continue
                return [message.error().code()]
            values.append(message.value())
            if len(values) == count:
                break
        return values
    finally:
        consumer.close()


def test_read_committed_consumer_needs_read_on_the_topic(module_server, admin):
    topic = new_topic(admin)
    assert produce_one(module_server, "admin", topic) == 0
    for user in ("alice", "bob"):
        allow(admin, user, ResourceType.TOPIC, topic, AclOperation.DESCRIBE)
        allow(admin, user, ResourceType.GROUP, "*", AclOperation.READ)
    allow(admin, "alice", ResourceType.TOPIC, topic, AclOperation.READ)
    assert read_committed(module_server, "bob", topic, 1) == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    assert read_committed(module_server, "alice", topic, 1) == [b"v"]
