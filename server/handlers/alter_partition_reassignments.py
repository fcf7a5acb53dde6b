"""AlterPartitionReassignments: a partition of one node can only be "moved" to that node, which is done at once.

Behaviour / version notes:
- v0-1.  Per partition, as Kafka's controller decides it:
  - unknown topic or partition → UNKNOWN_TOPIC_OR_PARTITION;
  - Replicas null (cancel) → NO_REASSIGNMENT_IN_PROGRESS: no reassignment is ever in progress;
  - an empty replica list, a broker that is not this node, or a broker named twice →
    INVALID_REPLICA_ASSIGNMENT, with a message saying which;
  - [this node] → success: the partition already has exactly that replica set, so the
    reassignment is complete as soon as it is accepted (ListPartitionReassignments never
    shows it).
- AllowReplicationFactorChange (v1) is echoed in the response; the only valid target has the
  current replication factor (1), so it never changes an answer.
- Top-level ErrorCode 0, ErrorMessage null; TimeoutMs is irrelevant.
- With the PostgreSQL engine (a cluster, docs/architecture.md "The cluster"): any live broker may be
  named; the list is stored as the partition's preferred leaders, in order (``assigned_replicas``),
  and the controller has the first live one lead it (the data is in the database: nothing is copied,
  so the reassignment is complete once stored and ListPartitionReassignments never shows it).  A
  broker that is not live → INVALID_REPLICA_ASSIGNMENT; a partition without a row yet →
  LEADER_NOT_AVAILABLE; the database unreachable → REQUEST_TIMED_OUT.
- ACLs (as Kafka's controller): Alter on the cluster, else CLUSTER_AUTHORIZATION_FAILED with
  "Cluster authorization failed." at the top level and on every partition named; nothing changes.
"""
from __future__ import annotations

import trio

from trireme.server.deferred import Deferred
from trireme.server.dispatch import handles
from trireme.server.postgresql.engine import DatabaseUnavailable
from trireme.state.acls import CLUSTER_NAME, Operation, ResourceType
from trireme.wire import error_codes as E

from .elect_leaders import CLUSTER_AUTHORIZATION_MESSAGE


def _check(broker, name: str, index: int, replicas) -> tuple[E.KafkaError, str | None]:
    topic = broker.described_topic(name)
    if topic is None or not 0 <= index < topic.partitions:
        return E.UNKNOWN_TOPIC_OR_PARTITION, f"no partition {name}-{index}"
    if replicas is None:
        return E.NO_REASSIGNMENT_IN_PROGRESS, f"no reassignment is in progress for {name}-{index}"
    if not replicas:
        return E.INVALID_REPLICA_ASSIGNMENT, "the replica list is empty"
    previous = None
    for node in sorted(replicas):            # in Kafka's order: the smallest offending broker id is named
        if broker.membership is not None and broker.cluster.broker(node) is None:
            return E.INVALID_REPLICA_ASSIGNMENT, f"broker {node} is not a live broker of this cluster"
        if broker.membership is None and node != broker.node_id:
            return E.INVALID_REPLICA_ASSIGNMENT, f"broker {node} is not registered (this cluster is broker {broker.node_id})"
        if node == previous:
            return E.INVALID_REPLICA_ASSIGNMENT, f"broker {node} appears more than once in the replica list"
        previous = node
    return E.NONE, None


def refuse_all(response, request, code: int, message: str | None, version: int):
    """The answer refusing every partition of ``request`` (of ``version``) with ``code`` (also a forwarded
    request's, server/forwarding.py)."""
    tcls = type(response).ReassignableTopicResponse
    response.error_code, response.error_message = code, message
    if version >= 1:
        response.allow_replication_factor_change = request.allow_replication_factor_change
    response.responses = [tcls(name=t.name, partitions=[
        tcls.ReassignablePartitionResponse(partition_index=p.partition_index, error_code=code, error_message=message)
        for p in t.partitions]) for t in request.topics]
    return response


@handles("AlterPartitionReassignments", 0, 1)
def alter_partition_reassignments(ctx, request):
    broker = ctx.broker
    response = ctx.response(error_message=None)
    tcls = type(response).ReassignableTopicResponse
    pcls = tcls.ReassignablePartitionResponse
    if ctx.api_version >= 1:
        response.allow_replication_factor_change = request.allow_replication_factor_change
    if not ctx.authorize(Operation.ALTER, ResourceType.CLUSTER, CLUSTER_NAME):
        return refuse_all(response, request, E.CLUSTER_AUTHORIZATION_FAILED.code, CLUSTER_AUTHORIZATION_MESSAGE,
                          ctx.api_version)
    stored = {}                                 # (topic id, index) → its answer, once the database has the list
    for t in request.topics:
        out = tcls(name=t.name)
        response.responses.append(out)
        for p in t.partitions:
            error, message = _check(broker, t.name, p.partition_index, p.replicas)
            answer = pcls(partition_index=p.partition_index, error_code=error.code, error_message=message)
            out.partitions.append(answer)
            if error is E.NONE and broker.membership is not None:
                stored[(broker.described_topic(t.name).topic_id, p.partition_index)] = (answer, list(p.replicas))
    if not stored:
        return response

    async def store():
        try:
            done = await trio.to_thread.run_sync(broker.membership.reassign,
                                                 {key: replicas for key, (_, replicas) in stored.items()})
        except DatabaseUnavailable as e:
            done, error, message = set(), E.REQUEST_TIMED_OUT, f"the cluster's database: {e}"
        else:
            error, message = E.LEADER_NOT_AVAILABLE, "the partition has no leader yet"
        for key, (answer, _) in stored.items():
            if key not in done:
                answer.error_code, answer.error_message = error.code, message
        return response
    return Deferred(store)
