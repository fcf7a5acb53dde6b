"""ListPartitionReassignments: none is ever in progress on one node, so the list is always empty.

Behaviour / version notes:
- v0.  Topics null (all) or named: no topics in the answer, ErrorCode 0, ErrorMessage null —
  what Kafka answers when nothing is reassigning (named topics that don't exist are left out
  there too).  AlterPartitionReassignments to [this node] completes at once, and any other
  target is refused, so there is never anything to list.
"""
from __future__ import annotations

from trireme.server.dispatch import handles


@handles("ListPartitionReassignments", 0, 0)
def list_partition_reassignments(ctx, request):
    return ctx.response(topics=[], error_message=None)
