"""confluent-kafka (librdkafka) against a real Trireme process: admin,
produce/consume round trips per codec, ListOffsets, idempotence.

Client limits met here: a librdkafka Consumer cannot be created without a
``group.id`` even when it only uses assign(); the tests give it one and never
subscribe or commit.
"""
from __future__ import annotations

import time

import pytest
from confluent_kafka import (OFFSET_BEGINNING, OFFSET_END, TIMESTAMP_CREATE_TIME, Consumer,
                             KafkaError, KafkaException, Producer, TopicCollection,
                             TopicPartition)
from confluent_kafka.admin import (AclOperation, AdminClient, AlterConfigOpType, ConfigEntry,
                                   ConfigResource, ConfigSource, NewPartitions, NewTopic,
                                   OffsetSpec, ResourceType)

from compat_tests.broker_probe import bootstrap_addresses, broker_info
from compat_tests.clients import wait_until
from compat_tests.python_clients import (CODECS, N_PARTITIONS, OFFSETS_PER_PARTITION,
                                         OFFSETS_SPIKE, OP_TIMEOUT_S, Collected, Got, Rec,
                                         check_read_from, check_roundtrip, make_records,
                                         partition_counts, produce_offsets_records, spike_ts,
                                         timestamp_cases, unique_topic)

pytestmark = pytest.mark.timeout(180)

CLUSTER_OPS = {AclOperation.CREATE, AclOperation.ALTER, AclOperation.DESCRIBE,
               AclOperation.CLUSTER_ACTION, AclOperation.DESCRIBE_CONFIGS,
               AclOperation.ALTER_CONFIGS, AclOperation.IDEMPOTENT_WRITE}
TOPIC_OPS = {AclOperation.READ, AclOperation.WRITE, AclOperation.CREATE, AclOperation.DELETE,
             AclOperation.ALTER, AclOperation.DESCRIBE, AclOperation.DESCRIBE_CONFIGS,
             AclOperation.ALTER_CONFIGS}


# ------------------------------------------------------------------ helpers

def common(server) -> dict:
    return {"bootstrap.servers": server.bootstrap, "socket.timeout.ms": 20000,
            "broker.address.family": "v4"}


@pytest.fixture(scope="module")
def admin(module_server) -> AdminClient:
    return AdminClient(common(module_server))


def create_topic(admin: AdminClient, name: str, partitions: int = N_PARTITIONS,
                 config: dict | None = None) -> None:
    fs = admin.create_topics([NewTopic(name, partitions, 1, config=config or {})],
                             request_timeout=OP_TIMEOUT_S, operation_timeout=OP_TIMEOUT_S)
    assert fs[name].result(timeout=OP_TIMEOUT_S) is None


def check_topic_metadata(admin: AdminClient, server, name: str, partitions: int) -> None:
    """The client sees the brokers (one, or a cluster's: those of the bootstrap list) and each partition's leader
    as the broker's own Metadata gives them; replication factor 1: the leader is the only replica."""
    probe = broker_info(server.bootstrap)
    md = admin.list_topics(name, timeout=OP_TIMEOUT_S)
    assert {b.id: (b.host, b.port) for b in md.brokers.values()} == probe.brokers
    assert sorted(probe.addresses()) == sorted(bootstrap_addresses(server.bootstrap))
    leaders = probe.leaders(name)
    tmd = md.topics[name]
    assert tmd.error is None
    assert sorted(tmd.partitions) == list(range(partitions))
    for p, pmd in tmd.partitions.items():
        assert pmd.id == p and pmd.error is None
        assert pmd.leader == leaders[p]
        assert pmd.replicas == [pmd.leader] and pmd.isrs == [pmd.leader]


def future_error(fut) -> KafkaError:
    with pytest.raises(KafkaException) as ei:
        fut.result(timeout=OP_TIMEOUT_S)
    return ei.value.args[0]


def produce(server, topic: str, records, **config) -> dict[int, tuple[int, int]]:
    """Produce ``records`` (explicit partition, key, value, headers,
    timestamp) with acks=all; returns {index: (partition, offset)} from the
    delivery reports and checks the reports' own fields."""
    conf = {**common(server), "acks": "all", "linger.ms": 5, "message.timeout.ms": 60000,
            **config}
    producer = Producer(conf)
    acked: dict[int, tuple[int, int]] = {}
    errors: list = []

    def on_delivery(rec):
        def cb(err, msg):
            if err is not None:
                errors.append((rec.index, err))
                return
            assert msg.topic() == topic
            assert msg.key() == rec.key and msg.value() == rec.value
            assert msg.timestamp() == (TIMESTAMP_CREATE_TIME, rec.timestamp), (rec.index, msg.timestamp())
            acked[rec.index] = (msg.partition(), msg.offset())
        return cb

    for rec in records:
        producer.produce(topic, value=rec.value, key=rec.key, partition=rec.partition,
                         timestamp=rec.timestamp, headers=list(rec.headers),
                         on_delivery=on_delivery(rec))
        producer.poll(0)
    remaining = producer.flush(60)
    assert remaining == 0, f"{remaining} messages still undelivered"
    assert not errors, f"{len(errors)} delivery errors, first: {errors[:3]}"
    return acked


def to_got(msg) -> Got:
    ts_type, ts = msg.timestamp()
    return Got(msg.partition(), msg.offset(), msg.key(), msg.value(), tuple(msg.headers() or ()),
               ts, ts_type == TIMESTAMP_CREATE_TIME)


def consume(server, topic: str, counts: dict[int, int], start: dict[int, int] | None = None,
            **config) -> list[Got]:
    """assign() every partition at ``start`` (default 0) and read until
    ``counts[p]`` records came from each partition."""
    start = start or {}
    conf = {**common(server), "group.id": unique_topic("unused-group"),
            "enable.auto.commit": False, "enable.auto.offset.store": False, **config}
    consumer = Consumer(conf)
    try:
        consumer.assign([TopicPartition(topic, p, start.get(p, 0)) for p in counts])
        c = Collected(counts)
        while c.want_more():
            for msg in consumer.consume(num_messages=2000, timeout=0.5):
                assert msg.error() is None, msg.error()
                assert msg.topic() == topic
                assert msg.leader_epoch() == 0, msg.leader_epoch()
                c.add(to_got(msg))
        # Nothing beyond what we expect shows up.
        for msg in consumer.consume(num_messages=100, timeout=0.3):
            assert msg.error() is None, msg.error()
            c.got.append(to_got(msg))
        return c.got
    finally:
        consumer.close()


# -------------------------------------------------------------------- tests

def test_admin_create_delete_topic(module_server, admin):
    topic = unique_topic("ck-admin")
    create_topic(admin, topic)
    check_topic_metadata(admin, module_server, topic, 3)
    assert topic in admin.list_topics(timeout=OP_TIMEOUT_S).topics

    again = admin.create_topics([NewTopic(topic, 3, 1)], request_timeout=OP_TIMEOUT_S)
    assert future_error(again[topic]).code() == KafkaError.TOPIC_ALREADY_EXISTS

    acked = produce(module_server, topic, make_records(30))
    assert len(acked) == 30

    fs = admin.delete_topics([topic], request_timeout=OP_TIMEOUT_S, operation_timeout=OP_TIMEOUT_S)
    assert fs[topic].result(timeout=OP_TIMEOUT_S) is None
    wait_until(lambda: topic not in admin.list_topics(timeout=OP_TIMEOUT_S).topics,
               timeout=15, what=f"{topic} to disappear from metadata")
    gone = admin.describe_topics(TopicCollection([topic]), request_timeout=OP_TIMEOUT_S)
    assert future_error(gone[topic]).code() == KafkaError.UNKNOWN_TOPIC_OR_PART

    again = admin.delete_topics([topic], request_timeout=OP_TIMEOUT_S)
    assert future_error(again[topic]).code() == KafkaError.UNKNOWN_TOPIC_OR_PART

    # The name is free again: a new topic with it starts empty.
    create_topic(admin, topic, partitions=2)
    check_topic_metadata(admin, module_server, topic, 2)
    c = Consumer({**common(module_server), "group.id": "unused"})
    try:
        for p in range(2):
            assert c.get_watermark_offsets(TopicPartition(topic, p), timeout=OP_TIMEOUT_S,
                                           cached=False) == (0, 0)
    finally:
        c.close()


@pytest.mark.parametrize("codec", CODECS)
def test_produce_consume_roundtrip(module_server, admin, codec):
    topic = unique_topic(f"ck-rt-{codec}")
    create_topic(admin, topic)
    check_topic_metadata(admin, module_server, topic, 3)
    records = make_records()
    acked = produce(module_server, topic, records, **{"compression.type": codec})
    counts = partition_counts(records)
    got = consume(module_server, topic, counts)
    check_roundtrip(records, acked, got)

    # Seek into the middle of a partition: the same record comes back.
    mid = consume(module_server, topic, {1: 5}, start={1: 1234})
    check_read_from(records, acked, mid, 1, 1234)


def test_list_offsets(module_server, admin):
    topic = unique_topic("ck-offsets")
    create_topic(admin, topic)
    base, _ = produce_offsets_records(lambda batch: produce(module_server, topic, batch))
    end = OFFSETS_PER_PARTITION
    parts = range(N_PARTITIONS)

    c = Consumer({**common(module_server), "group.id": "unused"})
    try:
        for p in parts:
            assert c.get_watermark_offsets(TopicPartition(topic, p), timeout=OP_TIMEOUT_S,
                                           cached=False) == (0, end)
        for case in timestamp_cases(base):
            res = c.offsets_for_times([TopicPartition(topic, p, case[p][0]) for p in parts],
                                      timeout=OP_TIMEOUT_S)
            assert all(tp.error is None for tp in res), res
            # librdkafka reports "no such record" as OFFSET_END (-1).
            assert {tp.partition: tp.offset for tp in res} == \
                {p: OFFSET_END if case[p][1] is None else case[p][1][0] for p in parts}, case
    finally:
        c.close()

    def list_offsets(spec_for) -> dict:
        fs = admin.list_offsets({TopicPartition(topic, p): spec_for(p) for p in parts},
                                request_timeout=OP_TIMEOUT_S)
        return {tp.partition: f.result(timeout=OP_TIMEOUT_S) for tp, f in fs.items()}

    res = list_offsets(lambda p: OffsetSpec.earliest())
    assert {p: (r.offset, r.timestamp) for p, r in res.items()} == {p: (0, -1) for p in parts}
    res = list_offsets(lambda p: OffsetSpec.latest())
    assert {p: (r.offset, r.timestamp) for p, r in res.items()} == {p: (end, -1) for p in parts}
    res = list_offsets(lambda p: OffsetSpec.max_timestamp())
    assert {p: (r.offset, r.timestamp) for p, r in res.items()} == \
        {p: (OFFSETS_SPIKE, spike_ts(base, p)) for p in parts}
    for case in timestamp_cases(base):
        res = list_offsets(lambda p: OffsetSpec.for_timestamp(case[p][0]))
        assert {p: (r.offset, r.timestamp) for p, r in res.items()} == \
            {p: (-1, -1) if case[p][1] is None else case[p][1] for p in parts}, case
        for p, r in res.items():
            if case[p][1] is not None:
                assert r.leader_epoch == 0


def test_idempotent_produce(module_server, admin):
    topic = unique_topic("ck-idem")
    create_topic(admin, topic)
    records = make_records(3000, seed=11)
    # Small batches and 5 in flight: many sequence-numbered batches per partition.
    config = {"enable.idempotence": True, "compression.type": "lz4",
              "batch.num.messages": 100, "max.in.flight.requests.per.connection": 5}
    acked = produce(module_server, topic, records[:1500], **config)
    # A second idempotent producer (new producer id) continues the same partitions.
    acked.update(produce(module_server, topic, records[1500:], **config))
    got = consume(module_server, topic, partition_counts(records))
    check_roundtrip(records, acked, got)


def test_admin_describe_alter_configs(module_server, admin):
    topic = unique_topic("ck-configs")
    create_topic(admin, topic, config={"segment.bytes": "10485760"})
    res = ConfigResource(ResourceType.TOPIC, topic)

    def describe() -> dict:
        fs = admin.describe_configs([res], request_timeout=OP_TIMEOUT_S)
        return fs[res].result(timeout=OP_TIMEOUT_S)

    cfg = describe()
    r = cfg["retention.ms"]
    assert (r.value, r.source, r.is_default, r.is_read_only, r.is_sensitive) == \
        ("604800000", ConfigSource.DEFAULT_CONFIG.value, True, False, False)
    s = cfg["segment.bytes"]
    assert (s.value, s.source, s.is_default) == \
        ("10485760", ConfigSource.DYNAMIC_TOPIC_CONFIG.value, False)
    assert cfg["cleanup.policy"].value == "delete"

    def alter(entries) -> dict:
        target = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=entries)
        fs = admin.incremental_alter_configs([target], request_timeout=OP_TIMEOUT_S)
        return fs

    fs = alter([ConfigEntry("retention.ms", "3600000",
                            incremental_operation=AlterConfigOpType.SET)])
    (fut,) = fs.values()
    assert fut.result(timeout=OP_TIMEOUT_S) is None
    r = describe()["retention.ms"]
    assert (r.value, r.source, r.is_default) == \
        ("3600000", ConfigSource.DYNAMIC_TOPIC_CONFIG.value, False)
    assert describe()["segment.bytes"].value == "10485760"   # untouched by the incremental SET

    # An invalid value is refused and changes nothing.
    fs = alter([ConfigEntry("retention.ms", "not-a-number",
                            incremental_operation=AlterConfigOpType.SET)])
    (fut,) = fs.values()
    assert future_error(fut).code() == KafkaError.INVALID_CONFIG
    assert describe()["retention.ms"].value == "3600000"

    # DELETE reverts to the default.
    fs = alter([ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE)])
    (fut,) = fs.values()
    assert fut.result(timeout=OP_TIMEOUT_S) is None
    r = describe()["retention.ms"]
    assert (r.value, r.source) == ("604800000", ConfigSource.DEFAULT_CONFIG.value)


@pytest.mark.filterwarnings("ignore:alter_configs has been deprecated:DeprecationWarning")
def test_admin_legacy_alter_configs(module_server, admin):
    """librdkafka's alter_configs sends the legacy AlterConfigs: the configs given become the topic's whole set
    of overrides, the ones left out revert to their defaults."""
    topic = unique_topic("ck-legacy-configs")
    create_topic(admin, topic, config={"segment.bytes": "10485760"})

    def overrides() -> dict:
        res = ConfigResource(ResourceType.TOPIC, topic)
        cfg = admin.describe_configs([res], request_timeout=OP_TIMEOUT_S)[res].result(timeout=OP_TIMEOUT_S)
        return {k: e.value for k, e in cfg.items() if e.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value}

    def alter(configs: dict, **kw):
        (fut,) = admin.alter_configs([ConfigResource(ResourceType.TOPIC, topic, set_config=configs)],
                                     request_timeout=OP_TIMEOUT_S, **kw).values()
        return fut

    assert overrides() == {"segment.bytes": "10485760"}
    assert alter({"retention.ms": "3600000"}, validate_only=True).result(timeout=OP_TIMEOUT_S) is None
    assert overrides() == {"segment.bytes": "10485760"}
    assert alter({"retention.ms": "3600000"}).result(timeout=OP_TIMEOUT_S) is None
    assert overrides() == {"retention.ms": "3600000"}
    assert future_error(alter({"retention.ms": "soon"})).code() == KafkaError.INVALID_CONFIG
    assert overrides() == {"retention.ms": "3600000"}


def test_admin_create_partitions(module_server, admin):
    topic = unique_topic("ck-parts")
    create_topic(admin, topic)

    fs = admin.create_partitions([NewPartitions(topic, 8)], validate_only=True,
                                 request_timeout=OP_TIMEOUT_S)
    assert fs[topic].result(timeout=OP_TIMEOUT_S) is None
    check_topic_metadata(admin, module_server, topic, 3)   # validate_only changed nothing

    fs = admin.create_partitions([NewPartitions(topic, 5)], request_timeout=OP_TIMEOUT_S,
                                 operation_timeout=OP_TIMEOUT_S)
    assert fs[topic].result(timeout=OP_TIMEOUT_S) is None
    check_topic_metadata(admin, module_server, topic, 5)
    desc = admin.describe_topics(TopicCollection([topic]), request_timeout=OP_TIMEOUT_S)
    assert [p.id for p in desc[topic].result(timeout=OP_TIMEOUT_S).partitions] == [0, 1, 2, 3, 4]

    fs = admin.create_partitions([NewPartitions(topic, 4)], request_timeout=OP_TIMEOUT_S)
    assert future_error(fs[topic]).code() == KafkaError.INVALID_PARTITIONS
    check_topic_metadata(admin, module_server, topic, 5)

    # The new partitions take records.
    recs = [Rec(i, 3 + i % 2, b"k%d" % i, b"v%d" % i, (("h", b"x"),), 1_700_000_000_000 + i)
            for i in range(10)]
    acked = produce(module_server, topic, recs)
    got = consume(module_server, topic, {3: 5, 4: 5})
    check_roundtrip(recs, acked, got)


def test_admin_delete_records(module_server, admin):
    topic = unique_topic("ck-delrec")
    create_topic(admin, topic)
    base = int(time.time() * 1000) - 60_000
    recs = [Rec(i, 0 if i < 30 else 1, b"k%d" % i, b"v%d" % i, (), base + i) for i in range(40)]
    acked = produce(module_server, topic, recs)

    fs = admin.delete_records([TopicPartition(topic, 0, 10)], request_timeout=OP_TIMEOUT_S,
                              operation_timeout=OP_TIMEOUT_S)
    (fut,) = fs.values()
    assert fut.result(timeout=OP_TIMEOUT_S).low_watermark == 10

    c = Consumer({**common(module_server), "group.id": "unused"})
    try:
        assert c.get_watermark_offsets(TopicPartition(topic, 0), timeout=OP_TIMEOUT_S,
                                       cached=False) == (10, 30)
        # A timestamp of a deleted record resolves to the new log start.
        (tp,) = c.offsets_for_times([TopicPartition(topic, 0, base + 3)], timeout=OP_TIMEOUT_S)
        assert tp.offset == 10
    finally:
        c.close()
    fs = admin.list_offsets({TopicPartition(topic, 0): OffsetSpec.earliest()},
                            request_timeout=OP_TIMEOUT_S)
    (fut,) = fs.values()
    assert fut.result(timeout=OP_TIMEOUT_S).offset == 10

    got = consume(module_server, topic, {0: 20}, start={0: OFFSET_BEGINNING})
    assert [(g.offset, g.key) for g in got] == [(10 + i, b"k%d" % (10 + i)) for i in range(20)]

    # OFFSET_END deletes everything; beyond the high watermark is an error.
    fs = admin.delete_records([TopicPartition(topic, 1, OFFSET_END)], request_timeout=OP_TIMEOUT_S)
    (fut,) = fs.values()
    assert fut.result(timeout=OP_TIMEOUT_S).low_watermark == 10
    fs = admin.delete_records([TopicPartition(topic, 2, 5)], request_timeout=OP_TIMEOUT_S)
    (fut,) = fs.values()
    assert future_error(fut).code() == KafkaError.OFFSET_OUT_OF_RANGE
    c = Consumer({**common(module_server), "group.id": "unused"})
    try:
        assert c.get_watermark_offsets(TopicPartition(topic, 1), timeout=OP_TIMEOUT_S,
                                       cached=False) == (10, 10)
        assert c.get_watermark_offsets(TopicPartition(topic, 2), timeout=OP_TIMEOUT_S,
                                       cached=False) == (0, 0)
    finally:
        c.close()
    assert len(acked) == 40


def test_admin_describe_cluster(module_server, admin):
    """The brokers (one, or a cluster's: those of the bootstrap list) and the controller as the broker's own
    Metadata gives them."""
    probe = broker_info(module_server.bootstrap)
    md = admin.list_topics(timeout=OP_TIMEOUT_S)
    desc = admin.describe_cluster(include_authorized_operations=True,
                                  request_timeout=OP_TIMEOUT_S).result(timeout=OP_TIMEOUT_S)
    assert desc.cluster_id and desc.cluster_id == md.cluster_id
    assert desc.controller.id == probe.controller_id == md.controller_id
    assert [(n.id, n.host, n.port) for n in desc.nodes] == [(n, h, p) for n, (h, p) in probe.brokers.items()]
    assert sorted(probe.addresses()) == sorted(bootstrap_addresses(module_server.bootstrap))
    assert set(desc.authorized_operations) == CLUSTER_OPS


def test_admin_describe_topics(module_server, admin):
    topic = unique_topic("ck-describe")
    create_topic(admin, topic)
    probe = broker_info(module_server.bootstrap)
    leaders = probe.leaders(topic)
    fs = admin.describe_topics(TopicCollection([topic]), include_authorized_operations=True,
                               request_timeout=OP_TIMEOUT_S)
    desc = fs[topic].result(timeout=OP_TIMEOUT_S)
    assert desc.name == topic and desc.is_internal is False
    assert desc.topic_id is not None and str(desc.topic_id) != "AAAAAAAAAAAAAAAAAAAAAA"
    assert sorted(p.id for p in desc.partitions) == [0, 1, 2]
    for p in desc.partitions:
        assert p.leader.id == leaders[p.id]
        assert (p.leader.host, p.leader.port) == probe.brokers[p.leader.id]
        assert [n.id for n in p.replicas] == [p.leader.id] and [n.id for n in p.isr] == [p.leader.id]
    assert set(desc.authorized_operations) == TOPIC_OPS
    missing = unique_topic("ck-missing")
    fs = admin.describe_topics(TopicCollection([missing]), request_timeout=OP_TIMEOUT_S)
    assert future_error(fs[missing]).code() == KafkaError.UNKNOWN_TOPIC_OR_PART
