"""ListGroups: every group this coordinator knows, optionally filtered by state (v4+) and type (v5+).

Behaviour / version notes:
- v0-5.  States are Kafka's names ("Empty", "PreparingRebalance", "CompletingRebalance",
  "Stable", "Dead"); the filter is case-insensitive as in Kafka.  Every group is "classic".
- ACLs (as Kafka's KafkaApis): Describe on the cluster lists every group; otherwise only the groups
  the principal may Describe are listed.  Never an authorization error, and neither check counts as
  a denial (Kafka's logIfDenied false).
- Only this broker's groups: none (no error) on a broker that does not lead ``__consumer_offsets``'
  partition, as Kafka lists the partitions a broker leads; COORDINATOR_LOAD_IN_PROGRESS while it
  opens it.
"""
from trireme.server.dispatch import handles
from trireme.state.acls import CLUSTER_NAME, Operation, ResourceType


def _list_groups(ctx, request):
    coordinator = ctx.broker.groups.coordinator
    response = ctx.response()
    every_group = ctx.authorize(Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME, log_if_denied=False)
    states = list(request.states_filter) if ctx.api_version >= 4 and request.states_filter else None
    types = list(request.types_filter) if ctx.api_version >= 5 and request.types_filter else None
    error, groups = coordinator.list_groups(states, types)
    if not every_group:
        groups = [g for g in groups
                  if ctx.authorize(Operation.DESCRIBE, ResourceType.GROUP, g.group_id, log_if_denied=False)]
    response.error_code = error
    cls = type(response).ListedGroup
    response.groups = [cls(group_id=g.group_id, protocol_type=g.protocol_type or "", group_state=g.state,
                           group_type=g.group_type) for g in groups]
    return response


@handles("ListGroups", 0, 5)
def list_groups(ctx, request):
    # Commits answered before this request may still be on their way to disk: wait for them, so a
    # pipelined read sees what was acknowledged (Kafka handles one request per connection at a time).
    return ctx.broker.groups.after_staged_writes(lambda: _list_groups(ctx, request))
