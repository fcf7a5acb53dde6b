"""DescribeQuorum: the KRaft metadata quorum as `kafka-metadata-quorum.sh` sees it: this node, the single voter and leader.

Behaviour / version notes:
- v0-2, as a Kafka 4 broker lists it (it forwards the request to the controller; this node is both).
- The request must name exactly the topic ``__cluster_metadata`` with exactly partition 0, as Kafka's
  Raft client requires; anything else → top-level NONE and UNKNOWN_TOPIC_OR_PARTITION for each
  partition named (the other fields at their defaults, as Kafka leaves them).
- The answer: leader = this node; leader epoch 1 (one election, never another); high watermark = log
  end offset = the finalized-features epoch (state/features.py), the one metadata change counter this
  node keeps, so it never goes down; current voters = [this node] with last fetch / caught-up time =
  now (Kafka reports the leader so); no observers.  v2: replica directory id ZERO_UUID (a static
  quorum, as Kafka reports voters configured by controller.quorum.voters) and ``nodes`` = this node
  with the listener the request came in on and its advertised address (there is no separate controller
  listener).
- ACLs (as Kafka's controller): Describe on the cluster, else top-level CLUSTER_AUTHORIZATION_FAILED
  "Cluster authorization failed." and no topics or nodes.
"""
from __future__ import annotations

from trireme.server.dispatch import handles
from trireme.server.listener import advertised_address, listener_name
from trireme.state.acls import CLUSTER_NAME, Operation, ResourceType
from trireme.wire import error_codes as E
from trireme.wire.primitives import ZERO_UUID

METADATA_TOPIC = "__cluster_metadata"
LEADER_EPOCH = 1
UNKNOWN_PARTITION_MESSAGE = "This server does not host this topic-partition."


@handles("DescribeQuorum", 0, 2)
def describe_quorum(ctx, request):
    broker = ctx.broker
    if not ctx.authorize(Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME):
        return ctx.response(error_code=E.CLUSTER_AUTHORIZATION_FAILED.code,
                            error_message="Cluster authorization failed.", topics=[], nodes=[])
    response = ctx.response(error_code=0, error_message=None)
    tcls = type(response).TopicData
    pcls = tcls.PartitionData
    asked = [(t.topic_name, p.partition_index) for t in request.topics for p in t.partitions]
    if asked != [(METADATA_TOPIC, 0)]:
        response.topics = [tcls(topic_name=t.topic_name, partitions=[
            pcls(partition_index=p.partition_index, error_code=E.UNKNOWN_TOPIC_OR_PARTITION.code,
                 error_message=UNKNOWN_PARTITION_MESSAGE) for p in t.partitions])
            for t in request.topics]
        return response
    offset = max(broker.features.epoch, 0)
    now = ctx.now_ms()
    voter = pcls.ReplicaState(replica_id=broker.node_id, replica_directory_id=ZERO_UUID, log_end_offset=offset,
                              last_fetch_timestamp=now, last_caught_up_timestamp=now)
    response.topics = [tcls(topic_name=METADATA_TOPIC, partitions=[pcls(
        partition_index=0, error_code=0, error_message=None, leader_id=broker.node_id, leader_epoch=LEADER_EPOCH,
        high_watermark=offset, current_voters=[voter], observers=[])])]
    ncls = type(response).Node
    host, port = advertised_address(ctx)
    response.nodes = [ncls(node_id=broker.node_id, listeners=[ncls.Listener(
        name=listener_name(ctx), host=host, port=port)])]
    return response
