"""AlterReplicaLogDirs: move partitions between log directories; with one directory, only to where they are.

Behaviour / version notes:
- v1-2, as Kafka 4 brokers list it (v0 went in 4.0).  Per partition, Kafka's answers on a broker with
  one log directory: a path other than the directory DescribeLogDirs reports (the same string, as Kafka
  compares it) → LOG_DIR_NOT_FOUND, checked first as Kafka does; then a partition this broker
  does not have → UNKNOWN_TOPIC_OR_PARTITION; otherwise NONE with nothing to move (the replica is
  already in that directory), as Kafka answers a move to the current directory.
- Results are grouped by topic in the order the request names them; a partition named twice is
  answered once, for the last directory naming it (Kafka keeps one destination per partition).
- ACLs (as Kafka's KafkaApis): Alter on the cluster, else every partition named (as the request
  names them, per directory and topic) answers CLUSTER_AUTHORIZATION_FAILED and nothing is looked at.
"""
from __future__ import annotations

from trireme.server.dispatch import handles
from trireme.state.acls import CLUSTER_NAME, Operation, ResourceType
from trireme.wire import error_codes as E

from .describe_log_dirs import log_dir


@handles("AlterReplicaLogDirs", 1, 2)
def alter_replica_log_dirs(ctx, request):
    broker = ctx.broker
    if not ctx.authorize(Operation.ALTER, ResourceType.CLUSTER, CLUSTER_NAME):
        response = ctx.response()
        tcls = type(response).AlterReplicaLogDirTopicResult
        pcls = tcls.AlterReplicaLogDirPartitionResult
        response.results = [tcls(topic_name=t.name, partitions=[
            pcls(partition_index=index, error_code=E.CLUSTER_AUTHORIZATION_FAILED.code) for index in t.partitions])
            for d in request.dirs for t in d.topics]
        return response
    ours = log_dir(broker)
    destination: dict[tuple[str, int], str] = {}
    for d in request.dirs:
        for t in d.topics:
            for index in t.partitions:
                destination.pop((t.name, index), None)         # keep first-seen order of the last naming
                destination[(t.name, index)] = d.path
    response = ctx.response()
    tcls = type(response).AlterReplicaLogDirTopicResult
    pcls = tcls.AlterReplicaLogDirPartitionResult
    by_topic: dict[str, list] = {}
    for (topic, index), path in destination.items():
        if path != ours:
            error = E.LOG_DIR_NOT_FOUND
        elif (topic, index) not in broker.partitions:
            error = E.UNKNOWN_TOPIC_OR_PARTITION
        else:
            error = E.NONE
        by_topic.setdefault(topic, []).append(pcls(partition_index=index, error_code=error.code))
    response.results = [tcls(topic_name=name, partitions=parts) for name, parts in by_topic.items()]
    return response
