"""Handlers answering as one broker of several (server/routing.py over ``broker.cluster``), with a stand-in cluster.

A real in-process broker (node 1) gets a :class:`FakeCluster`: brokers 1, 2 and 3 live on PLAINTEXT, broker 4 live
on INTERNAL only, controller 2; partition t-0 is led here, t-1 by node 2 at epoch 7, t-2 by nobody, t-3 by node 5
(not live), t-4 by node 4 (live, not on PLAINTEXT).  Each call goes through the codec at the version under test.
"""
from __future__ import annotations

import types

import pytest
import trio

from trireme.server.broker import Broker
from trireme.server.cluster import ClusterBroker, PartitionLeadership
from trireme.server.config import Config
from trireme.server.deferred import Deferred
from trireme.server.dispatch import API_KEYS, HANDLERS, NOT_HANDLED, RequestContext, load_handlers
from trireme.server.groups import OFFSETS_TOPIC
from trireme.server.peers import PeerUnavailable
from tests.test_admin_handlers import wait_deferred
from trireme.server.routing import coordinator_partition, java_string_hash
from trireme.server.transactions import TRANSACTION_STATE_TOPIC
from trireme.state.storage import MemoryStorage
from trireme.wire import error_codes as E
from trireme.wire import records

load_handlers()

NOT_LEADER = E.NOT_LEADER_OR_FOLLOWER.code
LOCAL, ELSEWHERE, NO_LEADER, DEAD_LEADER, OTHER_LISTENER = range(5)


class FakeCluster:
    """Three live brokers on PLAINTEXT and one on INTERNAL only; the leaders of the module docstring."""

    controller_id = 2

    def __init__(self, broker, leaders: dict | None = None):
        me = broker.node_id
        self.members = {
            me: ClusterBroker(me, {"PLAINTEXT": (broker.advertised_host, broker.advertised_port),
                                   "INTERNAL": ("me-internal", 19091)}, "rack-a"),
            2: ClusterBroker(2, {"PLAINTEXT": ("b2", 9092), "INTERNAL": ("b2-internal", 19092)}, "rack-b"),
            3: ClusterBroker(3, {"PLAINTEXT": ("b3", 9093)}),
            4: ClusterBroker(4, {"INTERNAL": ("b4", 19094)}, "rack-c"),
        }
        self.leaders = {("t", LOCAL): PartitionLeadership(me, 0, (me, 2)),
                        ("t", ELSEWHERE): PartitionLeadership(2, 7, (2, 3, me)),
                        ("t", NO_LEADER): None,
                        ("t", DEAD_LEADER): PartitionLeadership(5, 4, (5, 3)),
                        ("t", OTHER_LISTENER): PartitionLeadership(4, 2, (4,)),
                        **(leaders or {})}
        self.me = me

    def brokers(self):
        return [self.members[n] for n in sorted(self.members)]

    def broker(self, node_id):
        return self.members.get(node_id)

    def leadership(self, topic, index):
        default = PartitionLeadership(self.me, topic.leader_epoch, (self.me,))
        return self.leaders.get((topic.name, index), default)


@pytest.fixture
def broker():
    b = Broker(Config(data_dir="/data"), MemoryStorage())
    b.ensure_topic("t", 5)
    b.cluster = FakeCluster(b)
    yield b
    b.close()


def handler(api):
    return HANDLERS[API_KEYS[api]]


def versions(api):
    h = handler(api)
    return range(h.min_version, h.max_version + 1)


def call(broker, api, version, request, connection=None):
    h = handler(api)
    frame = bytearray(h.request.encode_bytes(request, version))
    decoded, _ = h.request.decode(frame, version)
    ctx = RequestContext(broker=broker, api_key=h.api_key, api_version=version, correlation_id=7,
                         client_id="tests", principal="User:ANONYMOUS", connection=connection, frame=frame)
    response = h.fn(ctx, decoded)
    if isinstance(response, Deferred):      # CreateTopics and CreatePartitions wait for __cluster_metadata's records
        assert api in ("CreateTopics", "CreatePartitions"), api   # nothing else waits: led elsewhere, answered at once
        response = wait_deferred(broker, response)
    data = h.response.encode_bytes(response, version)
    out, end = h.response.decode(data, version)
    assert end == len(data)
    return out


def run_broker_while(broker, awaitable):
    """``await awaitable`` with the broker's tasks (its flush round) running."""
    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            await awaitable
            nursery.cancel_scope.cancel()
    trio.run(main)


def req(api):
    return handler(api).request.cls


def internal_connection():
    """A connection that came in on the INTERNAL listener."""
    return types.SimpleNamespace(listener=types.SimpleNamespace(name="INTERNAL", advertised_host="me-internal",
                                                                advertised_port=19091), response_bytes=0)


# --- Metadata, DescribeCluster, DescribeTopicPartitions ----------------------------------------------------------

@pytest.mark.parametrize("version", versions("Metadata"))
def test_metadata_lists_the_cluster(broker, version):
    cls = req("Metadata")
    out = call(broker, "Metadata", version, cls(topics=[cls.MetadataRequestTopic(name="t")],
                                                allow_auto_topic_creation=False))
    brokers = [(b.node_id, b.host, b.port) for b in out.brokers]
    assert brokers == [(1, "127.0.0.1", 9092), (2, "b2", 9092), (3, "b3", 9093)]     # 4 is not on PLAINTEXT
    if version >= 1:
        assert [b.rack for b in out.brokers] == ["rack-a", "rack-b", None]
        assert out.controller_id == 2
    [topic] = out.topics
    got = [(p.partition_index, p.error_code, p.leader_id, p.replica_nodes, p.isr_nodes, p.offline_replicas)
           for p in topic.partitions]
    assert got == [(LOCAL, 0, 1, [1, 2], [1, 2], []),
                   (ELSEWHERE, 0, 2, [2, 3, 1], [2, 3, 1], []),
                   (NO_LEADER, E.LEADER_NOT_AVAILABLE.code, -1, [], [], []),
                   (DEAD_LEADER, E.LEADER_NOT_AVAILABLE.code, -1, [5, 3], [5, 3], []),
                   (OTHER_LISTENER, E.LISTENER_NOT_FOUND.code, -1, [4], [4], [])]
    if version >= 7:
        assert [p.leader_epoch for p in topic.partitions] == [0, 7, -1, 4, 2]


def test_metadata_answers_per_listener(broker):
    cls = req("Metadata")
    out = call(broker, "Metadata", 12, cls(topics=[cls.MetadataRequestTopic(name="t")]),
               connection=internal_connection())
    assert [(b.node_id, b.host, b.port) for b in out.brokers] == [
        (1, "me-internal", 19091), (2, "b2-internal", 19092), (4, "b4", 19094)]      # 3 is not on INTERNAL
    errors = [p.error_code for p in out.topics[0].partitions]
    assert errors == [0, 0, E.LEADER_NOT_AVAILABLE.code, E.LEADER_NOT_AVAILABLE.code, 0]


@pytest.mark.parametrize("version", versions("DescribeCluster"))
def test_describe_cluster_lists_the_cluster(broker, version):
    out = call(broker, "DescribeCluster", version, req("DescribeCluster")(endpoint_type=1))
    assert out.controller_id == 2
    assert [(b.broker_id, b.host, b.port, b.rack) for b in out.brokers] == [
        (1, "127.0.0.1", 9092, "rack-a"), (2, "b2", 9092, "rack-b"), (3, "b3", 9093, None)]


def test_describe_topic_partitions_leaders(broker):
    cls = req("DescribeTopicPartitions")
    out = call(broker, "DescribeTopicPartitions", 0, cls(topics=[cls.TopicRequest(name="t")],
                                                         response_partition_limit=100))
    got = [(p.error_code, p.leader_id, p.leader_epoch, p.replica_nodes, p.isr_nodes) for p in out.topics[0].partitions]
    assert got == [(0, 1, 0, [1, 2], [1, 2]), (0, 2, 7, [2, 3, 1], [2, 3, 1]),
                   (E.LEADER_NOT_AVAILABLE.code, -1, -1, [], []), (E.LEADER_NOT_AVAILABLE.code, -1, 4, [5, 3], [5, 3]),
                   (E.LISTENER_NOT_FOUND.code, -1, 2, [4], [4])]


def test_local_cluster_lists_this_broker_with_its_rack():
    config = Config(data_dir="/data")
    config.set("broker.rack", "r1")
    b = Broker(config, MemoryStorage())
    try:
        cls = req("Metadata")
        out = call(b, "Metadata", 12, cls(topics=None))
        assert [(n.node_id, n.host, n.port, n.rack) for n in out.brokers] == [(1, "127.0.0.1", 9092, "r1")]
        out = call(b, "DescribeCluster", 1, req("DescribeCluster")(endpoint_type=1))
        assert [(n.broker_id, n.rack) for n in out.brokers] == [(1, "r1")]
    finally:
        b.close()


# --- Produce -----------------------------------------------------------------------------------------------------

def produce_request(broker, version, partitions):
    cls = req("Produce")
    tcls = cls.TopicProduceData
    batch = records.build_batch([(None, b"v")])
    topic = broker.topics.get("t")
    return cls(acks=-1, timeout_ms=1000, topic_data=[tcls(
        name="t", topic_id=topic.topic_id, partition_data=[tcls.PartitionProduceData(index=p, records=batch)
                                                           for p in partitions])])


@pytest.mark.parametrize("version", versions("Produce"))
def test_produce_to_a_partition_led_elsewhere(broker, version):
    out = call(broker, "Produce", version, produce_request(broker, version, [ELSEWHERE, NO_LEADER, DEAD_LEADER]))
    parts = out.responses[0].partition_responses
    assert [(p.index, p.error_code, p.base_offset) for p in parts] == [
        (ELSEWHERE, NOT_LEADER, -1), (NO_LEADER, NOT_LEADER, -1), (DEAD_LEADER, NOT_LEADER, -1)]
    assert all(p.error_message is None for p in parts)
    leaders = [(p.current_leader.leader_id, p.current_leader.leader_epoch) for p in parts]
    if version >= 10:           # KIP-951: the current leader, and the endpoint of each live one
        assert leaders == [(2, 7), (-1, -1), (5, 4)]
        assert [(n.node_id, n.host, n.port, n.rack) for n in out.node_endpoints] == [(2, "b2", 9092, "rack-b")]
    else:
        assert leaders == [(-1, -1)] * 3
        assert list(out.node_endpoints) == []
    assert all(broker.partition("t", i).log.log_end_offset == 0 for i in range(5))


def test_produce_fast_path_leaves_a_partition_led_elsewhere_to_the_handler(broker):
    h = handler("Produce")
    for index in (LOCAL, ELSEWHERE):
        request = produce_request(broker, 9, [index])
        frame = bytearray(h.request.encode_bytes(request, 9))
        ctx = RequestContext(broker=broker, api_key=h.api_key, api_version=9, correlation_id=7, client_id="tests",
                             principal="User:ANONYMOUS", connection=None, frame=frame)
        result = h.fast(ctx, frame, 0)
        assert (result is NOT_HANDLED) == (index == ELSEWHERE)


# --- Fetch -------------------------------------------------------------------------------------------------------

def fetch_request(broker, partitions, *, current_leader_epoch=-1, max_wait_ms=0, topic="t"):
    cls = req("Fetch")
    tcls = cls.FetchTopic
    name, topic = topic, broker.topics.get(topic)
    return cls(replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=1 << 20, isolation_level=0,
               topics=[tcls(topic=name, topic_id=topic.topic_id, partitions=[tcls.FetchPartition(
                   partition=p, fetch_offset=0, partition_max_bytes=1 << 20,
                   current_leader_epoch=current_leader_epoch) for p in partitions])])


@pytest.mark.parametrize("version", versions("Fetch"))
def test_fetch_from_a_partition_led_elsewhere(broker, version):
    out = call(broker, "Fetch", version, fetch_request(broker, [ELSEWHERE, NO_LEADER, OTHER_LISTENER]))
    parts = out.responses[0].partitions
    assert [(p.partition_index, p.error_code, p.high_watermark, p.records) for p in parts] == [
        (ELSEWHERE, NOT_LEADER, -1, b""), (NO_LEADER, NOT_LEADER, -1, b""), (OTHER_LISTENER, NOT_LEADER, -1, b"")]
    leaders = [(p.current_leader.leader_id, p.current_leader.leader_epoch) for p in parts]
    if version >= 16:
        assert leaders == [(2, 7), (-1, -1), (4, 2)]
        assert [(n.node_id, n.host, n.port, n.rack) for n in out.node_endpoints] == [(2, "b2", 9092, "rack-b")]
    else:
        assert leaders == [(-1, -1)] * 3
        assert list(out.node_endpoints) == []


def test_fetch_answers_at_once_when_a_partition_is_led_elsewhere(broker):
    """A long poll would wait for the local partition's data; a partition led elsewhere answers it at once."""
    out = call(broker, "Fetch", 12, fetch_request(broker, [LOCAL, ELSEWHERE], max_wait_ms=500))
    assert [p.error_code for p in out.responses[0].partitions] == [0, NOT_LEADER]


@pytest.mark.parametrize("version", [15, 16, 18])
def test_fetch_fenced_leader_epoch_names_the_current_leader(broker, version):
    """As Kafka from v16: FENCED_LEADER_EPOCH carries the current leader (this broker) and its endpoint too."""
    broker.ensure_topic("e", 1)
    run_broker_while(broker, broker.delete_topic("e"))
    broker.ensure_topic("e", 1)                     # leader epoch 1
    out = call(broker, "Fetch", version, fetch_request(broker, [0], current_leader_epoch=0, topic="e"))
    [p] = out.responses[0].partitions
    assert p.error_code == E.FENCED_LEADER_EPOCH.code
    if version >= 16:
        assert (p.current_leader.leader_id, p.current_leader.leader_epoch) == (1, 1)
        assert [(n.node_id, n.host, n.port, n.rack) for n in out.node_endpoints] == [(1, "127.0.0.1", 9092, "rack-a")]
    else:
        assert (p.current_leader.leader_id, p.current_leader.leader_epoch) == (-1, -1)
        assert list(out.node_endpoints) == []


# --- the other partition handlers -------------------------------------------------------------------------------

@pytest.mark.parametrize("version", versions("ListOffsets"))
def test_list_offsets(broker, version):
    cls = req("ListOffsets")
    tcls = cls.ListOffsetsTopic
    out = call(broker, "ListOffsets", version, cls(replica_id=-1, topics=[tcls(name="t", partitions=[
        tcls.ListOffsetsPartition(partition_index=i, timestamp=-1, current_leader_epoch=-1)
        for i in (LOCAL, ELSEWHERE, NO_LEADER, 9)])]))
    assert [(p.error_code, p.offset) for p in out.topics[0].partitions] == [
        (0, 0), (NOT_LEADER, -1), (NOT_LEADER, -1), (E.UNKNOWN_TOPIC_OR_PARTITION.code, -1)]


@pytest.mark.parametrize("version", versions("OffsetForLeaderEpoch"))
def test_offset_for_leader_epoch(broker, version):
    cls = req("OffsetForLeaderEpoch")
    tcls = cls.OffsetForLeaderTopic
    out = call(broker, "OffsetForLeaderEpoch", version, cls(replica_id=-1, topics=[tcls(topic="t", partitions=[
        tcls.OffsetForLeaderPartition(partition=i, current_leader_epoch=-1, leader_epoch=0)
        for i in (LOCAL, ELSEWHERE, NO_LEADER, 9)])]))
    assert [(p.error_code, p.leader_epoch, p.end_offset) for p in out.topics[0].partitions] == [
        (0, 0, 0), (NOT_LEADER, -1, -1), (NOT_LEADER, -1, -1), (E.UNKNOWN_TOPIC_OR_PARTITION.code, -1, -1)]


@pytest.mark.parametrize("version", versions("DeleteRecords"))
def test_delete_records(broker, version):
    cls = req("DeleteRecords")
    tcls = cls.DeleteRecordsTopic
    out = call(broker, "DeleteRecords", version, cls(timeout_ms=1000, topics=[tcls(name="t", partitions=[
        tcls.DeleteRecordsPartition(partition_index=i, offset=0) for i in (LOCAL, ELSEWHERE, NO_LEADER, 9)])]))
    assert [(p.error_code, p.low_watermark) for p in out.topics[0].partitions] == [
        (0, 0), (NOT_LEADER, -1), (NOT_LEADER, -1), (E.UNKNOWN_TOPIC_OR_PARTITION.code, -1)]


def test_describe_producers(broker):
    cls = req("DescribeProducers")
    out = call(broker, "DescribeProducers", 0, cls(topics=[cls.TopicRequest(
        name="t", partition_indexes=[LOCAL, ELSEWHERE, NO_LEADER, 9])]))
    assert [(p.partition_index, p.error_code, p.error_message) for p in out.topics[0].partitions] == [
        (LOCAL, 0, None), (ELSEWHERE, NOT_LEADER, None), (NO_LEADER, NOT_LEADER, None),
        (9, E.UNKNOWN_TOPIC_OR_PARTITION.code, "t-9 does not exist")]


@pytest.mark.parametrize("version", versions("WriteTxnMarkers"))
def test_write_txn_markers(broker, version):
    cls = req("WriteTxnMarkers")
    mcls = cls.WritableTxnMarker
    out = call(broker, "WriteTxnMarkers", version, cls(markers=[mcls(
        producer_id=0, producer_epoch=0, transaction_result=False, coordinator_epoch=0,
        topics=[mcls.WritableTxnMarkerTopic(name="t", partition_indexes=[ELSEWHERE, NO_LEADER, 9])])]))
    assert [p.error_code for p in out.markers[0].topics[0].partitions] == [
        NOT_LEADER, NOT_LEADER, E.UNKNOWN_TOPIC_OR_PARTITION.code]


def test_add_partitions_to_txn_takes_a_partition_led_elsewhere_as_existing(broker):
    """The transaction coordinator checks that a partition exists, as Kafka's (its metadata cache), not who leads
    it: a partition led by another broker is not UNKNOWN_TOPIC_OR_PARTITION."""
    cls = req("AddPartitionsToTxn")
    xcls = cls.AddPartitionsToTxnTransaction
    tcls = xcls.AddPartitionsToTxnTopic

    def verify(indexes):
        out = call(broker, "AddPartitionsToTxn", 5, cls(transactions=[xcls(
            transactional_id="tx", producer_id=0, producer_epoch=0, verify_only=True,
            topics=[tcls(name="t", partitions=indexes)])]))
        return {r.partition_index: r.partition_error_code
                for r in out.results_by_transaction[0].topic_results[0].results_by_partition}
    assert verify([ELSEWHERE, 9]) == {ELSEWHERE: E.OPERATION_NOT_ATTEMPTED.code, 9: E.UNKNOWN_TOPIC_OR_PARTITION.code}
    assert verify([ELSEWHERE])[ELSEWHERE] != E.UNKNOWN_TOPIC_OR_PARTITION.code


# --- FindCoordinator ---------------------------------------------------------------------------------------------

def test_java_string_hash():
    assert java_string_hash("") == 0
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("polygenelubricants") == -2**31
    assert java_string_hash("\U0001F600") == 0xD83D * 31 + 0xDE00          # a surrogate pair: two code units
    assert coordinator_partition("polygenelubricants", 50) == 0               # Kafka's Utils.abs(MIN_VALUE) is 0
    assert coordinator_partition("hello", 50) == 99162322 % 50
    assert coordinator_partition("hello", 1) == 0


@pytest.mark.parametrize("version", versions("FindCoordinator"))
def test_find_coordinator_is_the_leader_of_the_internal_partition(broker, version):
    groups = broker.described_topic(OFFSETS_TOPIC)
    broker.cluster.leaders[(OFFSETS_TOPIC, coordinator_partition("g", groups.partitions))] = \
        PartitionLeadership(3, 1, (3,))
    broker.cluster.leaders[(TRANSACTION_STATE_TOPIC, 0)] = None
    cls = req("FindCoordinator")

    def find(key_type, key):
        if version >= 4:
            out = call(broker, "FindCoordinator", version, cls(key_type=key_type, coordinator_keys=[key]))
            [c] = out.coordinators
            assert c.error_message is None
            return c.error_code, c.node_id, c.host, c.port
        out = call(broker, "FindCoordinator", version, cls(key_type=key_type, key=key))
        if out.error_code:
            assert out.error_message == "The coordinator is not available."
        return out.error_code, out.node_id, out.host, out.port
    assert find(0, "g") == (0, 3, "b3", 9093)
    if version >= 1:
        assert find(1, "tx") == (E.COORDINATOR_NOT_AVAILABLE.code, -1, "", -1)


def test_find_coordinator_on_another_listener(broker):
    broker.cluster.leaders[(OFFSETS_TOPIC, 0)] = PartitionLeadership(3, 1, (3,))     # 3 is not on INTERNAL
    broker.cluster.leaders[(TRANSACTION_STATE_TOPIC, 0)] = PartitionLeadership(2, 1, (2,))
    cls = req("FindCoordinator")
    out = call(broker, "FindCoordinator", 6, cls(key_type=0, coordinator_keys=["g"]),
               connection=internal_connection())
    assert (out.coordinators[0].error_code, out.coordinators[0].node_id) == (E.COORDINATOR_NOT_AVAILABLE.code, -1)
    out = call(broker, "FindCoordinator", 6, cls(key_type=1, coordinator_keys=["tx"]),
               connection=internal_connection())
    c = out.coordinators[0]
    assert (c.error_code, c.node_id, c.host, c.port) == (0, 2, "b2-internal", 19092)


# --- CreateTopics / CreatePartitions -----------------------------------------------------------------------------

def create(broker, version, name, *, replication_factor=-1, assignments=(), num_partitions=-1):
    cls = req("CreateTopics")
    tcls = cls.CreatableTopic
    out = call(broker, "CreateTopics", version, cls(timeout_ms=1000, topics=[tcls(
        name=name, num_partitions=num_partitions, replication_factor=replication_factor,
        assignments=[tcls.CreatableReplicaAssignment(partition_index=i, broker_ids=ids)
                     for i, ids in enumerate(assignments)])]))
    [result] = out.topics
    return result


@pytest.mark.parametrize("version", [2, 5, 7])
def test_create_topics_replication_factor_up_to_the_live_brokers(broker, version):
    result = create(broker, version, "four", replication_factor=4)
    assert result.error_code == 0
    if version >= 5:
        assert result.replication_factor == 4
    result = create(broker, version, "five", replication_factor=5)
    assert (result.error_code, result.error_message) == (
        E.INVALID_REPLICATION_FACTOR.code, "Unable to replicate the partition 5 time(s): The target replication "
        "factor of 5 cannot be reached because only 4 broker(s) are registered.")
    assert "five" not in broker.topics


def test_create_topics_default_replication_factor():
    config = Config(data_dir="/data")
    config.set("default.replication.factor", 3)
    b = Broker(config, MemoryStorage())
    try:
        result = create(b, 7, "x")
        assert (result.error_code, result.error_message) == (
            E.INVALID_REPLICATION_FACTOR.code, "Unable to replicate the partition 3 time(s): The target replication "
            "factor of 3 cannot be reached because only 1 broker(s) are registered.")
        b.cluster = FakeCluster(b)
        result = create(b, 7, "x")
        assert (result.error_code, result.replication_factor) == (0, 3)
    finally:
        b.close()


def test_create_topics_manual_assignment_names_live_brokers(broker):
    result = create(broker, 7, "placed", assignments=[[2, 3], [3, 1]])
    assert (result.error_code, result.num_partitions, result.replication_factor) == (0, 2, 2)
    result = create(broker, 7, "nowhere", assignments=[[2, 7]])
    assert (result.error_code, result.error_message) == (
        E.INVALID_REPLICA_ASSIGNMENT.code,
        "The manual partition assignment includes broker 7, but no such broker is registered.")


def test_create_partitions_assignment_as_many_as_the_cluster_lists(broker):
    cls = req("CreatePartitions")
    tcls = cls.CreatePartitionsTopic

    def grow(count, assignments):
        out = call(broker, "CreatePartitions", 3, cls(timeout_ms=1000, topics=[tcls(
            name="t", count=count, assignments=[tcls.CreatePartitionsAssignment(broker_ids=ids)
                                                for ids in assignments])]))
        return out.results[0].error_code, out.results[0].error_message
    assert grow(6, [[3]]) == (E.INVALID_REPLICA_ASSIGNMENT.code,
                              "The manual partition assignment includes a partition with 1 replica(s), but this is "
                              "not consistent with previous partitions, which have 2 replica(s).")
    assert grow(6, [[3, 9]]) == (E.INVALID_REPLICA_ASSIGNMENT.code,
                                 "The manual partition assignment includes broker 9, but no such broker is registered.")
    assert grow(6, [[3, 2]]) == (0, None)
    assert broker.topics.get("t").partitions == 6


# --- the broker's own lookups ------------------------------------------------------------------------------------

def test_partition_leader_and_peer_addresses(broker):
    assert broker.partition_leader("t", LOCAL) == 1
    assert broker.partition_leader("t", ELSEWHERE) == 2
    assert broker.partition_leader("t", NO_LEADER) == -1
    assert broker.partition_leader("gone", 0) == 1          # this broker's handlers answer UNKNOWN_TOPIC_OR_PARTITION
    with pytest.raises(PeerUnavailable):                    # the connections' task group is not running here
        broker.peer(2)
    assert broker.peers.addresses == {2: ("b2", 9092)}      # its inter-broker (PLAINTEXT) listener's address
    with pytest.raises(PeerUnavailable):
        broker.peer(4)                                      # no PLAINTEXT listener: no address
    assert 4 not in broker.peers.addresses
    assert broker.peer(1) is broker.local_peer
