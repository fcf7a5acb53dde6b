"""ElectLeaders: on one node every partition already has its preferred (and only) replica as leader.

Behaviour / version notes:
- v0-2.  ElectionType (v1+; v0 means preferred): 0 preferred, 1 unclean; anything else fails
  the request with INVALID_REQUEST (top-level ErrorCode in v1+, and on every named partition).
- Named partitions: ELECTION_NOT_NEEDED for each that exists (both election types: the leader
  is this node and it is the preferred replica); UNKNOWN_TOPIC_OR_PARTITION otherwise.
- TopicPartitions null means every partition: each topic (internal ones included) is listed
  with no partition results, because Kafka leaves out partitions whose election was not needed.
- TimeoutMs is irrelevant: nothing is ever waited for.
- ACLs (as Kafka's controller): Alter on the cluster, else CLUSTER_AUTHORIZATION_FAILED at the top
  level (v1+) and on every named partition, with Kafka's message "Cluster authorization failed.".
"""
from __future__ import annotations

from trireme.server.dispatch import handles
from trireme.state.acls import CLUSTER_NAME, Operation, ResourceType
from trireme.wire import error_codes as E

ELECTION_TYPES = (0, 1)      # PREFERRED, UNCLEAN
CLUSTER_AUTHORIZATION_MESSAGE = "Cluster authorization failed."


@handles("ElectLeaders", 0, 2)
def elect_leaders(ctx, request):
    broker = ctx.broker
    response = ctx.response()
    tcls = type(response).ReplicaElectionResult
    pcls = tcls.PartitionResult
    election_type = request.election_type if ctx.api_version >= 1 else 0
    if not ctx.authorize(Operation.ALTER, ResourceType.CLUSTER, CLUSTER_NAME):
        response.error_code = E.CLUSTER_AUTHORIZATION_FAILED.code
        response.replica_election_results = [tcls(topic=t.topic, partition_result=[
            pcls(partition_id=index, error_code=E.CLUSTER_AUTHORIZATION_FAILED.code,
                 error_message=CLUSTER_AUTHORIZATION_MESSAGE) for index in t.partitions])
            for t in request.topic_partitions or ()]
        return response
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
