"""ListGroups: every group this coordinator knows, optionally filtered by state (v4+) and type (v5+).

Behaviour / version notes:
- v0-5.  States are Kafka's names ("Empty", "PreparingRebalance", "CompletingRebalance",
  "Stable", "Dead"); the filter is case-insensitive as in Kafka.  Every group is "classic".
"""
from trireme.server.dispatch import handles


def _list_groups(ctx, request):
    coordinator = ctx.broker.groups.coordinator
    response = ctx.response()
    states = list(request.states_filter) if ctx.api_version >= 4 and request.states_filter else None
    types = list(request.types_filter) if ctx.api_version >= 5 and request.types_filter else None
    error, groups = coordinator.list_groups(states, types)
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
