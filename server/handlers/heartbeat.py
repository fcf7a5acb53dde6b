"""Heartbeat: a member says it is alive; the answer tells it whether a rebalance is under way.

Behaviour / version notes:
- v0-4.  REBALANCE_IN_PROGRESS while the group prepares a rebalance; UNKNOWN_MEMBER_ID,
  ILLEGAL_GENERATION, FENCED_INSTANCE_ID (v3+ static members) as Kafka answers them.
- ACLs (as Kafka's KafkaApis): Read on the group, else GROUP_AUTHORIZATION_FAILED and the member's
  session is not extended.
- On a broker that does not lead ``__consumer_offsets``' partition: NOT_COORDINATOR; while it opens
  it, NONE (Kafka answers a heartbeat blindly while the group loads).
"""
from trireme.server.deferred import Deferred
from trireme.server.dispatch import handles
from trireme.state.acls import Operation, ResourceType
from trireme.wire import error_codes as E


@handles("Heartbeat", 0, 4)
def heartbeat(ctx, request):
    groups = ctx.broker.groups
    if not ctx.authorize(Operation.READ, ResourceType.GROUP, request.group_id):
        return ctx.response(error_code=E.GROUP_AUTHORIZATION_FAILED.code)
    error, effects = groups.coordinator.heartbeat(request.group_id, request.generation_id, request.member_id,
                                                  request.group_instance_id, ctx.now_ms())
    response = ctx.response(error_code=error)
    staged = groups.stage(effects)           # usually just a new session deadline
    if groups.settled():
        return response

    async def wait():
        await groups.complete(staged)
        return response
    return Deferred(wait)
