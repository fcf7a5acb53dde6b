"""Which broker serves a partition or a coordinator key, and where clients of a listener reach each live broker.

A partition is served here when this broker leads it and has it open; otherwise handlers answer
NOT_LEADER_OR_FOLLOWER with its current leader (KIP-951).

Every handler of a partition's data (Produce, Fetch, ListOffsets, OffsetForLeaderEpoch, DeleteRecords,
DescribeProducers, WriteTxnMarkers, the coordinator's AddPartitionsToTxn check) looks the partition up with
:func:`led_partition`, and every answer naming brokers (Metadata, DescribeCluster, DescribeTopicPartitions,
FindCoordinator, KIP-951's NodeEndpoints) takes their addresses from :func:`broker_endpoint` /
:func:`listed_brokers`, both over ``broker.cluster`` (server/cluster.py).
"""
from __future__ import annotations

import dataclasses

from trireme.wire import error_codes as E

from .listener import advertised_address, listener_name


@dataclasses.dataclass(frozen=True, slots=True)
class NotLeader:
    """A partition that exists but is not served here: led by another broker, by none at the moment, or not open
    here (yet).  Answered NOT_LEADER_OR_FOLLOWER in every case, as Kafka's ReplicaManager answers a partition it
    does not host or only follows (never LEADER_NOT_AVAILABLE, which is Metadata's), with the current leader and
    its epoch (-1, -1 while none) for KIP-951's CurrentLeader."""

    leader_id: int
    leader_epoch: int

    error_code = E.NOT_LEADER_OR_FOLLOWER.code


@dataclasses.dataclass(frozen=True, slots=True)
class Endpoint:
    """A live broker as an answer names it to a client of one listener."""

    node_id: int
    host: str
    port: int
    rack: str | None


def led_partition(broker, topic, index: int):
    """Partition ``index`` of ``topic`` (a state/topics.Topic, internal ones too; None: unknown) → the local
    Partition when this broker leads it; a :class:`NotLeader` when the partition exists but this broker does not
    lead it or has it not open; None when there is no such partition (UNKNOWN_TOPIC_OR_PARTITION)."""
    if topic is None or not 0 <= index < topic.partitions:
        return None
    leadership = broker.cluster.leadership(topic, index)
    if leadership is None:
        return NotLeader(-1, -1)
    if leadership.leader_id == broker.node_id:
        partition = broker.partition(topic.name, index)
        if partition is not None:
            return partition
    return NotLeader(leadership.leader_id, leadership.leader_epoch)


def led_partition_named(broker, name: str, index: int):
    """:func:`led_partition` for a topic named by the request (``__cluster_metadata`` stays unknown to clients)."""
    return led_partition(broker, broker.described_topic(name), index)


def current_leader(broker, topic, index: int) -> tuple[int, int]:
    """(leader id, leader epoch) of a partition as KIP-951's CurrentLeader names it; (-1, -1) while none leads it."""
    leadership = broker.cluster.leadership(topic, index)
    return (-1, -1) if leadership is None else (leadership.leader_id, leadership.leader_epoch)


def broker_endpoint(ctx, node_id: int) -> Endpoint | None:
    """Where a client of the listener ``ctx``'s request came in on reaches live broker ``node_id``; None when it
    is not live or not on that listener (Kafka's getAliveBrokerNode).  This broker is at that listener's
    advertised address."""
    broker = ctx.broker
    member = broker.cluster.broker(node_id)
    if member is None:
        return None
    if node_id == broker.node_id:
        host, port = advertised_address(ctx)
    else:
        address = member.address(listener_name(ctx))
        if address is None:
            return None
        host, port = address
    return Endpoint(node_id, host, port, member.rack)


def listed_brokers(ctx) -> list[Endpoint]:
    """The live brokers, by node id, as Metadata, DescribeCluster and DescribeTopicPartitions list them: each at its
    address on the request's listener; one without that listener is left out, as Kafka does."""
    return [e for e in (broker_endpoint(ctx, b.node_id) for b in ctx.broker.cluster.brokers()) if e is not None]


class DescribedCluster:
    """The cluster as one Metadata or DescribeTopicPartitions answer describes it: the live brokers on the request's
    listener (:func:`listed_brokers`) and each partition's leader, as Kafka's metadata cache answers."""

    def __init__(self, ctx):
        self.cluster = ctx.broker.cluster
        self.brokers = listed_brokers(ctx)
        self._listed = {e.node_id for e in self.brokers}

    def partition(self, topic, index: int) -> tuple[int, int, int, list[int]]:
        """(error, leader id, leader epoch, replicas) of a partition; the replicas are also its ISR, none offline.
        No leader → LEADER_NOT_AVAILABLE, leader -1 and epoch -1 (no replicas); a leader that is not live keeps its
        epoch and replicas with LEADER_NOT_AVAILABLE, one live but not on the request's listener LISTENER_NOT_FOUND,
        leader -1 in both, as Kafka."""
        leadership = self.cluster.leadership(topic, index)
        if leadership is None:
            return E.LEADER_NOT_AVAILABLE.code, -1, -1, []
        replicas = list(leadership.replicas)
        leader = leadership.leader_id
        if leader in self._listed:
            return 0, leader, leadership.leader_epoch, replicas
        error = E.LEADER_NOT_AVAILABLE.code if self.cluster.broker(leader) is None else E.LISTENER_NOT_FOUND.code
        return error, -1, leadership.leader_epoch, replicas


class LeaderEndpoints:
    """KIP-951's NodeEndpoints of one answer: the endpoint of each current leader its partitions name (each once,
    by node id), on the request's listener; a leader not live there is named without an endpoint, as Kafka."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.nodes: dict[int, Endpoint] = {}

    def current_leader(self, cls, leader_id: int, leader_epoch: int):
        """A ``cls`` (the answer's LeaderIdAndEpoch) naming the leader, whose endpoint this answer will list."""
        if leader_id >= 0 and leader_id not in self.nodes:
            endpoint = broker_endpoint(self.ctx, leader_id)
            if endpoint is not None:
                self.nodes[leader_id] = endpoint
        return cls(leader_id=leader_id, leader_epoch=leader_epoch)

    def node_endpoints(self, cls) -> list:
        """The answer's NodeEndpoints, as ``cls`` (its NodeEndpoint), by node id."""
        return [cls(node_id=e.node_id, host=e.host, port=e.port, rack=e.rack)
                for _, e in sorted(self.nodes.items())]


def coordinator_endpoint(ctx, internal_topic: str, key: str) -> Endpoint | None:
    """Where a client of the request's listener finds the coordinator of ``key`` (a group id in
    ``__consumer_offsets``, a transactional id in ``__transaction_state``): the leader of the internal topic's
    partition for the key (:func:`coordinator_partition`); None while it has no live leader on that listener."""
    broker = ctx.broker
    topic = broker.described_topic(internal_topic)
    if topic is None:
        return None
    leadership = broker.cluster.leadership(topic, coordinator_partition(key, topic.partitions))
    return None if leadership is None else broker_endpoint(ctx, leadership.leader_id)


def java_string_hash(s: str) -> int:
    """Java's String.hashCode (over UTF-16 code units, as a signed 32-bit int): what Kafka hashes coordinator keys
    with."""
    h = 0
    data = s.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] << 8 | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def coordinator_partition(key: str, partitions: int) -> int:
    """The partition of an internal topic of ``partitions`` partitions whose leader coordinates ``key`` (a group
    id, a transactional id): Kafka's ``Utils.abs(key.hashCode()) % partitions`` (abs of the smallest int is 0)."""
    h = java_string_hash(key)
    return (0 if h == -(1 << 31) else abs(h)) % partitions
