"""ElectLeaders: on one node every partition already has its preferred (and only) replica as leader.

Behaviour / version notes:
- v0-2.  ElectionType (v1+; v0 means preferred): 0 preferred, 1 unclean; anything else fails
  the request with INVALID_REQUEST (top-level ErrorCode in v1+, and on every named partition).
- Named partitions: ELECTION_NOT_NEEDED for each that exists (both election types: the leader
  is this node and it is the preferred replica); UNKNOWN_TOPIC_OR_PARTITION otherwise.
- TopicPartitions null means every partition: each topic (internal ones included) is listed
  with no partition results, because Kafka leaves out partitions whose election was not needed.
- TimeoutMs is irrelevant: nothing is ever waited for.
- With the PostgreSQL engine (a cluster): a partition's preferred leader is the first live broker of
  its reassignment's replicas (AlterPartitionReassignments), else the first live one in rendezvous
  order (the first replica Metadata lists).  PREFERRED: led by it → ELECTION_NOT_NEEDED, else it is
  named the leader now (fenced by the leader and epoch seen; it takes the partition at once) → NONE.
  UNCLEAN: a live leader → ELECTION_NOT_NEEDED, else the same move.  A partition without a row yet
  → LEADER_NOT_AVAILABLE; moved meanwhile → ELIGIBLE_LEADERS_NOT_AVAILABLE (retriable); the
  database unreachable → REQUEST_TIMED_OUT.  Null TopicPartitions lists only the partitions moved.
- ACLs (as Kafka's controller): Alter on the cluster, else CLUSTER_AUTHORIZATION_FAILED at the top
  level (v1+) and on every named partition, with Kafka's message "Cluster authorization failed.".
"""
from __future__ import annotations

import trio

from trireme.server.deferred import Deferred
from trireme.server.dispatch import handles
from trireme.server.postgresql.engine import DatabaseUnavailable
from trireme.state.acls import CLUSTER_NAME, Operation, ResourceType
from trireme.wire import error_codes as E

ELECTION_TYPES = (0, 1)      # PREFERRED, UNCLEAN
CLUSTER_AUTHORIZATION_MESSAGE = "Cluster authorization failed."


def refuse_all(response, request, code: int, message: str | None):
    """The answer refusing every partition of ``request`` with ``code`` (also a forwarded request's,
    server/forwarding.py)."""
    tcls = type(response).ReplicaElectionResult
    response.error_code = code
    response.replica_election_results = [tcls(topic=t.topic, partition_result=[
        tcls.PartitionResult(partition_id=index, error_code=code, error_message=message) for index in t.partitions])
        for t in request.topic_partitions or ()]
    return response


@handles("ElectLeaders", 0, 2)
def elect_leaders(ctx, request):
    broker = ctx.broker
    response = ctx.response()
    tcls = type(response).ReplicaElectionResult
    pcls = tcls.PartitionResult
    election_type = request.election_type if ctx.api_version >= 1 else 0
    if not ctx.authorize(Operation.ALTER, ResourceType.CLUSTER, CLUSTER_NAME):
        return refuse_all(response, request, E.CLUSTER_AUTHORIZATION_FAILED.code, CLUSTER_AUTHORIZATION_MESSAGE)
    if broker.membership is not None and election_type in ELECTION_TYPES:
        return _elect_in_cluster(broker, request, response, election_type)
    if request.topic_partitions is None:
        if election_type in ELECTION_TYPES:
            response.replica_election_results = [tcls(topic=t.name) for t in broker.described_topics()]
        else:
            response.error_code = E.INVALID_REQUEST.code
        return response
    for t in request.topic_partitions:
        out = tcls(topic=t.topic)
        response.replica_election_results.append(out)
        topic = broker.described_topic(t.topic)
        for index in t.partitions:
            if election_type not in ELECTION_TYPES:
                error, message = E.INVALID_REQUEST, f"unknown election type {election_type}"
            elif topic is None or not 0 <= index < topic.partitions:
                error, message = E.UNKNOWN_TOPIC_OR_PARTITION, f"no partition {t.topic}-{index}"
            else:
                error, message = E.ELECTION_NOT_NEEDED, None
            out.partition_result.append(pcls(partition_id=index, error_code=error.code, error_message=message))
    if election_type not in ELECTION_TYPES:
        response.error_code = E.INVALID_REQUEST.code
    return response


def _elect_in_cluster(broker, request, response, election_type: int):
    """ElectLeaders with the PostgreSQL engine: on the cluster as the database has it now (not this broker's last
    poll), name each partition's preferred leader its leader, where needed."""
    async def elect():
        failed = None
        try:
            view = await trio.to_thread.run_sync(broker.membership.poll)
        except DatabaseUnavailable as e:
            view, failed = broker.cluster.view, e        # answered from the last poll, nothing moved
        moves = _answers(broker, request, response, election_type, view)
        done = set()
        if moves and failed is None:
            try:
                done = await trio.to_thread.run_sync(broker.membership.move, {k: m for k, (m, _) in moves.items()})
            except DatabaseUnavailable as e:
                failed = e
        if failed is not None:
            error, message = E.REQUEST_TIMED_OUT, f"the cluster's database: {failed}"
        else:
            error, message = E.ELIGIBLE_LEADERS_NOT_AVAILABLE, "the partition's leader changed meanwhile"
        for key, (_, answer) in moves.items():
            if key not in done:
                answer.error_code, answer.error_message = error.code, message
        return response
    return Deferred(elect)


def _answers(broker, request, response, election_type: int, view) -> dict:
    """Fill ``response`` with each partition's answer as ``view`` has the cluster → the moves to make: (topic id,
    index) → ((leader seen, leader epoch seen, new leader), its answer)."""
    tcls = type(response).ReplicaElectionResult
    pcls = tcls.PartitionResult
    moves = {}
    if request.topic_partitions is None:
        wanted = [(t.name, range(t.partitions)) for t in broker.topics.all()]
    else:
        wanted = [(t.topic, t.partitions) for t in request.topic_partitions]
    for name, indexes in wanted:
        out = tcls(topic=name)
        response.replica_election_results.append(out)
        topic = broker.described_topic(name)
        for index in indexes:
            key = None if topic is None else (topic.topic_id, index)
            found = None if key is None else view.leaders.get(key)
            if topic is None or not 0 <= index < topic.partitions:
                error, message = E.UNKNOWN_TOPIC_OR_PARTITION, f"no partition {name}-{index}"
            elif topic.is_internal:
                error, message = E.ELECTION_NOT_NEEDED, None        # led by whoever opened it (its coordinator)
            elif found is None:
                error, message = E.LEADER_NOT_AVAILABLE, f"partition {name}-{index} has no leader yet"
            else:
                target = view.preferred_leader(key)
                if found[0] == target or (election_type == 1 and found[0] in view.brokers):
                    error, message = E.ELECTION_NOT_NEEDED, None
                else:
                    error, message = E.NONE, None
            answer = pcls(partition_id=index, error_code=error.code, error_message=message)
            if error is E.NONE:
                moves[key] = ((found[0], found[1], target), answer)
            if request.topic_partitions is not None or error is E.NONE:
                out.partition_result.append(answer)
    return moves
