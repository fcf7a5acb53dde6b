"""Kafka semantics that a careful client can observe: internal topics, offsets of deleted topics,
read-your-writes on one connection, acks=0 failures, batch offset ranges, deleted-topic files."""
import os
import struct

import crc32c
from confluent_kafka import Consumer, TopicPartition

from compat_tests.test_bad_input import (INVALID_RECORD, NONE, RawConn, assert_healthy, batch, create_topic,
                                         list_offset, metadata, produce, produce_request, req, stored_values, unique)
from trireme.wire import records
from trireme.wire.codec import message

TOPIC_ALREADY_EXISTS = 36
INVALID_TOPIC_EXCEPTION = 17


def _conn(server) -> RawConn:
    return RawConn(server.bootstrap)


def _commit(conn, group, topic, offsets: dict[int, int], *, send_only=False):
    cls = message("OffsetCommitRequest").cls
    body = cls(group_id=group, generation_id_or_member_epoch=-1, member_id="", topics=[cls.OffsetCommitRequestTopic(
        name=topic, partitions=[cls.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
            partition_index=p, committed_offset=o) for p, o in offsets.items()])])
    if send_only:
        return conn.send_request("OffsetCommit", 8, body)
    resp = conn.request("OffsetCommit", 8, body)
    assert [p.error_code for t in resp.topics for p in t.partitions] == [0] * len(offsets)


def _fetch_request(group, topic=None, partitions=()):
    cls = message("OffsetFetchRequest").cls
    topics = None if topic is None else [cls.OffsetFetchRequestTopic(name=topic, partition_indexes=list(partitions))]
    return cls(group_id=group, topics=topics)


def _committed(conn, group) -> dict:
    resp = conn.request("OffsetFetch", 7, _fetch_request(group))
    return {(t.name, p.partition_index): p.committed_offset for t in resp.topics for p in t.partitions}


def test_internal_topic_names_are_reserved(module_server):
    conn = _conn(module_server)
    group, topic = unique("g"), unique("t")
    create_topic(conn, topic)
    _commit(conn, group, topic, {0: 1})
    cls = message("CreateTopicsRequest").cls
    resp = conn.request("CreateTopics", 7, cls(topics=[cls.CreatableTopic(
        name="__consumer_offsets", num_partitions=1, replication_factor=1)], timeout_ms=5000))
    assert resp.topics[0].error_code == TOPIC_ALREADY_EXISTS
    md = conn.request("Metadata", 9, message("MetadataRequest").cls(topics=[
        message("MetadataRequest").cls.MetadataRequestTopic(name="__consumer_offsets")], allow_auto_topic_creation=True))
    [t] = md.topics                                                  # described as Kafka does: internal
    assert (t.error_code, t.is_internal, [p.partition_index for p in t.partitions]) == (0, True, [0])
    [r] = produce(conn, "__consumer_offsets", {0: batch([b"x"])})
    assert r.error_code == INVALID_TOPIC_EXCEPTION                   # clients cannot write to it (Kafka's code)
    _commit(conn, group, topic, {0: 5})
    assert _committed(conn, group) == {(topic, 0): 5}
    module_server.restart()                                          # and it still loads
    assert _committed(_conn(module_server), group) == {(topic, 0): 5}


def test_pipelined_offset_fetch_sees_the_commit_before_it(module_server):
    conn = _conn(module_server)
    group, topic = unique("g"), unique("t")
    create_topic(conn, topic)
    for i in range(1, 16):
        commit_id = _commit(conn, group, topic, {0: i}, send_only=True)
        fetch_id = conn.send_request("OffsetFetch", 7, _fetch_request(group, topic, [0]))
        commit = conn.read_response("OffsetCommit", 8, commit_id)
        fetched = conn.read_response("OffsetFetch", 7, fetch_id)
        assert commit.topics[0].partitions[0].error_code == 0
        assert fetched.topics[0].partitions[0].committed_offset == i


def test_deleted_group_does_not_get_offsets_back(module_server):
    conn = _conn(module_server)
    group, topic = unique("g"), unique("t")
    create_topic(conn, topic, partitions=2)
    commit_id = _commit(conn, group, topic, {0: 5}, send_only=True)
    delete_id = conn.send_request("DeleteGroups", 2, req("DeleteGroups", groups_names=[group]))
    conn.read_response("OffsetCommit", 8, commit_id)
    deleted = conn.read_response("DeleteGroups", 2, delete_id)
    assert deleted.results[0].error_code == NONE
    assert _committed(conn, group) == {}
    _commit(conn, group, topic, {1: 9})
    assert _committed(conn, group) == {(topic, 1): 9}


def test_deleting_a_topic_deletes_its_committed_offsets(module_server):
    conn = _conn(module_server)
    group, topic = unique("g"), unique("t")
    create_topic(conn, topic)
    produce(conn, topic, {0: batch([b"old-%d" % i for i in range(3)])})
    _commit(conn, group, topic, {0: 3})
    resp = conn.request("DeleteTopics", 6, message("DeleteTopicsRequest").cls(topics=[
        message("DeleteTopicsRequest").cls.DeleteTopicState(name=topic)], timeout_ms=5000))
    assert resp.responses[0].error_code == NONE
    create_topic(conn, topic)
    assert stored_values(conn, topic, 0) == []                        # no files of the old topic
    produce(conn, topic, {0: batch([b"new-%d" % i for i in range(5)])})
    consumer = Consumer({"bootstrap.servers": module_server.bootstrap, "group.id": group,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False, "log_level": 0})
    try:
        [tp] = consumer.committed([TopicPartition(topic, 0)], timeout=10)
        assert tp.offset < 0                                          # the old commit went with the topic
        consumer.assign([TopicPartition(topic, 0, tp.offset)])
        got = []
        while len(got) < 5:
            msg = consumer.poll(5)
            assert msg is not None, f"only {got} arrived"
            got.append(msg.value())
        assert got == [b"new-%d" % i for i in range(5)]
    finally:
        consumer.close()


def test_acks_zero_failure_closes_the_connection(module_server):
    conn = _conn(module_server)
    conn.send_request("Produce", 9, produce_request(unique("missing"), {0: batch([b"x"])}, acks=0))
    conn.expect_closed()
    assert_healthy(module_server, _conn(module_server))


def test_batch_offset_range_must_match_its_record_count(module_server):
    conn = _conn(module_server)
    topic = unique("t")
    create_topic(conn, topic)
    for delta in (-1, 0, 5):
        data = bytearray(batch([b"a", b"b"]))
        struct.pack_into(">i", data, 23, delta)                        # lastOffsetDelta
        struct.pack_into(">I", data, 17, crc32c.crc32c(bytes(data[21:])))
        [r] = produce(conn, topic, {0: bytes(data)})
        assert r.error_code == INVALID_RECORD, (delta, r)
    [r] = produce(conn, topic, {0: batch([b"a", b"b"])})
    assert (r.error_code, r.base_offset) == (NONE, 0)
    module_server.restart()
    assert list_offset(_conn(module_server), topic, 0) == 2


def test_orphaned_partition_files_are_swept_at_start(module_server):
    conn = _conn(module_server)
    topic = unique("t")
    create_topic(conn, topic)
    produce(conn, topic, {0: batch([b"keep"])})
    orphan = os.path.join(module_server.data_dir, "logs", unique("gone") + "-0")
    os.makedirs(orphan)
    with open(os.path.join(orphan, "00000000000000000000.log"), "wb") as f:
        f.write(records.build_batch([(None, b"stale")]))
    module_server.restart()
    assert not os.path.exists(orphan)
    assert stored_values(_conn(module_server), topic, 0) == [b"keep"]
    assert metadata(_conn(module_server), [topic]).topics[0].error_code == NONE
