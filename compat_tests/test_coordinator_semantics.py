"""Kafka semantics that a careful client can observe: internal topics, offsets of deleted topics,
read-your-writes on one connection, acks=0 failures, batch offset ranges, deleted-topic files."""
import os
import struct
import time

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


UNKNOWN_MEMBER_ID = 25
MEMBER_ID_REQUIRED = 79


def _join(conn, group, member_id="", *, send_only=False):
    """JoinGroup v5 of a consumer with one "range" protocol; → the response (or the correlation id)."""
    cls = message("JoinGroupRequest").cls
    body = cls(group_id=group, session_timeout_ms=30_000, rebalance_timeout_ms=60_000, member_id=member_id,
               protocol_type="consumer", protocols=[cls.JoinGroupRequestProtocol(name="range", metadata=b"m")])
    if send_only:
        return conn.send_request("JoinGroup", 5, body)
    return conn.request("JoinGroup", 5, body, timeout=10)


def _new_member(conn, group) -> str:
    first = _join(conn, group)
    assert first.error_code == MEMBER_ID_REQUIRED
    return first.member_id


def test_leave_group_pipelined_behind_a_parked_join_answers_both(module_server):
    """A member whose JoinGroup waits for the others to rejoin leaves on the same connection (kafka-python's
    close() does this when a rebalance starts as it closes).  The leave ends the join: both are answered at
    once, the join with UNKNOWN_MEMBER_ID as Kafka answers a join of a member removed while it waited, instead
    of the join's answer waiting for the leave's and the leave's for the join's."""
    group = unique("g")
    a, b = _conn(module_server), _conn(module_server)
    a_id = _new_member(a, group)
    joined = _join(a, group, a_id)                          # alone: the join phase ends at once
    assert (joined.error_code, joined.leader) == (NONE, a_id)
    synced = a.request("SyncGroup", 3, req("SyncGroup", group_id=group, generation_id=joined.generation_id,
                                            member_id=a_id, assignments=[]), timeout=10)
    assert synced.error_code == NONE
    b_id = _new_member(b, group)
    join_id = _join(b, group, b_id, send_only=True)        # parked until a rejoins (up to 60 s)
    time.sleep(0.3)                                         # the join is parked before the leave arrives
    leave_id = b.send_request("LeaveGroup", 3, req("LeaveGroup", group_id=group, members=[
        message("LeaveGroupRequest").cls.MemberIdentity(member_id=b_id)]))
    assert b.read_response("JoinGroup", 5, join_id, timeout=10).error_code == UNKNOWN_MEMBER_ID
    left = b.read_response("LeaveGroup", 3, leave_id, timeout=10)
    assert (left.error_code, [m.error_code for m in left.members]) == (NONE, [NONE])
    rejoined = _join(a, group, a_id)                        # a rejoins the rebalance b started: alone again
    assert (rejoined.error_code, [m.member_id for m in rejoined.members]) == (NONE, [a_id])


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
