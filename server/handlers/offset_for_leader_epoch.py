"""OffsetForLeaderEpoch: the end offset of a leader epoch, so consumers (KIP-320) can detect log truncation.

Behaviour / version notes:
- v2-4.  replica_id (v3+) is not checked: consumers send -1, debugging tools -2, and there are no
  followers (the partition's leader answers; a follower id gets the same answer).
- The answer comes from the partition's leader-epoch cache (state/leader_epochs.py, Kafka's
  LeaderEpochFileCache: (epoch, start offset) entries, the first cut at the log start offset), as Kafka's
  leader answers (UnifiedLog.endOffsetForEpoch), for the requested epoch R and the latest epoch L:
    R == -1 (undefined)  → leader_epoch -1, end_offset -1
    R == L               → leader_epoch L, end_offset = log end offset
    R > L                → leader_epoch -1, end_offset -1 (no such epoch)
    R < L                → the largest epoch ≤ R (R itself when the cache has none), ending at the start
                           of the first epoch after R
  The error code is NONE in all four cases.
  With the local engine a topic has a single leader epoch E (partition.leader_epoch) for its whole life, so
  the cache is the one entry (E, log start offset): R < E answers (R, log start offset).
  With the PostgreSQL engine the cache is rebuilt from the batches' partition_leader_epoch when a broker
  takes the partition, and gets (the new epoch, the log end offset) then: each time a broker takes the
  partition its epoch rises (server/postgresql/engine.py) and what it appends carries that epoch.
- current_leader_epoch other than -1: newer than the partition's leader epoch → UNKNOWN_LEADER_EPOCH, older →
  FENCED_LEADER_EPOCH (leader_epoch and end_offset -1).
- Unknown topic or partition → UNKNOWN_TOPIC_OR_PARTITION; a partition that exists but that this
  broker does not lead (another broker does, or none at the moment: server/routing.py over
  ``broker.cluster``) → NOT_LEADER_OR_FOLLOWER, as Kafka's ReplicaManager (leader_epoch and
  end_offset -1).  With the local engine every partition is led here.
- Authorization (Kafka's handleOffsetForLeaderEpochRequest): ClusterAction on the cluster (a follower's)
  allows every topic; without it, Describe on each topic (KIP-320 consumers), asked once per topic: a
  topic without it answers TOPIC_AUTHORIZATION_FAILED in each of its partitions, before its existence
  is checked.
"""
from __future__ import annotations

from trireme.server.dispatch import handles
from trireme.server.handlers import unauthorized
from trireme.server.routing import NotLeader, led_partition_named
from trireme.state.acls import CLUSTER_NAME, Operation, ResourceType
from trireme.wire import error_codes as E

UNDEFINED = -1


@handles("OffsetForLeaderEpoch", 2, 4)
def offset_for_leader_epoch(ctx, request):
    broker = ctx.broker
    response = ctx.response()
    tcls = type(response).OffsetForLeaderTopicResult
    pcls = tcls.EpochEndOffset
    denied = set() if ctx.authorize(Operation.CLUSTER_ACTION, ResourceType.CLUSTER, CLUSTER_NAME, log_if_denied=False) \
        else unauthorized(ctx, Operation.DESCRIBE, ResourceType.TOPIC, (t.topic for t in request.topics))
    for t in request.topics:
        out = tcls(topic=t.topic)
        response.topics.append(out)
        for p in t.partitions:
            result = pcls(error_code=0, partition=p.partition, leader_epoch=UNDEFINED, end_offset=UNDEFINED)
            out.partitions.append(result)
            if t.topic in denied:
                result.error_code = E.TOPIC_AUTHORIZATION_FAILED.code
                continue
            partition = led_partition_named(broker, t.topic, p.partition)
            if partition is None or type(partition) is NotLeader:
                result.error_code = E.UNKNOWN_TOPIC_OR_PARTITION.code if partition is None else partition.error_code
                continue
            result.error_code = partition.leader_epoch_error(p.current_leader_epoch)
            if not result.error_code:
                result.leader_epoch, result.end_offset = partition.end_offset_for(p.leader_epoch)
    return response
