"""LeaveGroup: members leave a group, which then rebalances without them.

Behaviour / version notes:
- v0-5.  v0-2 carry one member id; v3+ a batch of members (member id and/or group instance id),
  each answered on its own; v5 adds a reason (logged only).
- ACLs (as Kafka's KafkaApis): Read on the group, else GROUP_AUTHORIZATION_FAILED at the top level
  with no member results, and nobody leaves.
- On a broker that does not lead ``__consumer_offsets``' partition: NOT_COORDINATOR at the top level
  (COORDINATOR_LOAD_IN_PROGRESS while it opens it).
"""
from trireme.server.deferred import Deferred
from trireme.server.dispatch import handles
from trireme.state.acls import Operation, ResourceType
from trireme.wire import error_codes as E


@handles("LeaveGroup", 0, 5)
def leave_group(ctx, request):
    groups = ctx.broker.groups
    if not ctx.authorize(Operation.READ, ResourceType.GROUP, request.group_id):
        return ctx.response(error_code=E.GROUP_AUTHORIZATION_FAILED.code, members=[])
    if ctx.api_version >= 3:
        members = [(m.member_id, m.group_instance_id, m.reason) for m in request.members]
    else:
        members = [(request.member_id, None, None)]
    results, error, effects = groups.coordinator.leave_group(request.group_id, members, ctx.now_ms())
    response = ctx.response(error_code=error)
    if ctx.api_version >= 3:
        cls = type(response).MemberResponse
        response.members = [cls(member_id=r.member_id, group_instance_id=r.group_instance_id, error_code=r.error)
                            for r in results]
    elif not error and results:
        response.error_code = results[0].error

    staged = groups.stage(effects)

    async def wait():
        if not await groups.complete(staged) and not response.error_code:
            response.error_code = E.NOT_COORDINATOR.code
        return response
    return Deferred(wait)
