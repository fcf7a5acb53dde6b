"""ListPartitionReassignments: none is ever in progress on one node, so the list is always empty.

Behaviour / version notes:
- v0.  Topics null (all) or named: no topics in the answer, ErrorCode 0, ErrorMessage null —
  what Kafka answers when nothing is reassigning (named topics that don't exist are left out
  there too).  AlterPartitionReassignments to [this node] completes at once, and any other
  target is refused, so there is never anything to list.  In a cluster (PostgreSQL engine) a
  reassignment only names the partition's preferred leaders (the data is in the database, nothing is
  copied), so it is complete once stored: the list is empty there too.
- ACLs (as Kafka's controller): Describe on the cluster, else CLUSTER_AUTHORIZATION_FAILED with
  "Cluster authorization failed." and each named topic listed with its named partitions (no
  replicas), as Kafka's error answer echoes them.
"""
from __future__ import annotations

from trireme.server.dispatch import handles
from trireme.state.acls import CLUSTER_NAME, Operation, ResourceType
from trireme.wire import error_codes as E

from .elect_leaders import CLUSTER_AUTHORIZATION_MESSAGE


@handles("ListPartitionReassignments", 0, 0)
def list_partition_reassignments(ctx, request):
    if not ctx.authorize(Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME):
        response = ctx.response(error_code=E.CLUSTER_AUTHORIZATION_FAILED.code,
                                error_message=CLUSTER_AUTHORIZATION_MESSAGE)
        tcls = type(response).OngoingTopicReassignment
        pcls = tcls.OngoingPartitionReassignment
        response.topics = [tcls(name=t.name, partitions=[pcls(partition_index=i) for i in t.partition_indexes])
                           for t in request.topics or ()]
        return response
    return ctx.response(topics=[], error_message=None)
