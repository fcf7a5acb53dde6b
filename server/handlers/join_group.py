"""JoinGroup: a member joins (or rejoins) a classic group; the answer waits for the rebalance's join phase.

Behaviour / version notes:
- v0-9.  v0 has no rebalance timeout (the session timeout is used); v4+ members must first get
  their member id (MEMBER_ID_REQUIRED, then rejoin with it); v5+ static membership
  (group.instance.id); v7+ protocol type in the answer; v9 SkipAssignment for a static leader
  replaced without a rebalance.  Every decision is the coordinator's (state/groups.py); this
  module only translates, and the answer is deferred while the group rebalances.
- ACLs (as Kafka's KafkaApis): Read on the group, else GROUP_AUTHORIZATION_FAILED with generation -1,
  empty leader and member id, no members (protocol name null v7+, "" before), and the group is not
  touched.
- On a broker that does not lead ``__consumer_offsets``' partition: NOT_COORDINATOR
  (COORDINATOR_LOAD_IN_PROGRESS while it opens it); a JoinGroup parked when the coordinator moves
  away is answered NOT_COORDINATOR (docs/architecture.md, "Coordinators").
"""
from trireme.server.deferred import Deferred
from trireme.server.dispatch import handles
from trireme.state.acls import Operation, ResourceType
from trireme.state.groups import JoinGroupResult
from trireme.wire import error_codes as E


@handles("JoinGroup", 0, 9)
def join_group(ctx, request):
    groups = ctx.broker.groups
    version = ctx.api_version
    rebalance_timeout = request.rebalance_timeout_ms if version >= 1 else request.session_timeout_ms
    if not ctx.authorize(Operation.READ, ResourceType.GROUP, request.group_id):
        return ctx.response(error_code=E.GROUP_AUTHORIZATION_FAILED.code, generation_id=-1,
                            protocol_name=None if version >= 7 else "", leader="", member_id="", members=[])

    answer = groups.call(
        groups.coordinator.join_group, request.group_id, request.member_id, request.group_instance_id,
        request.protocol_type, [(p.name, p.metadata) for p in request.protocols],
        request.session_timeout_ms, rebalance_timeout, ctx.now_ms(),
        require_known_member_id=version >= 4, supports_skip_assignment=version >= 9,
        client_id=ctx.client_id or "", client_host="/" + ctx.connection.peer.rsplit(":", 1)[0],
        reason=request.reason, if_moved=JoinGroupResult(E.NOT_COORDINATOR.code))

    async def wait():
        result = await answer()
        response = ctx.response(
            error_code=result.error, generation_id=result.generation_id, protocol_type=result.protocol_type,
            protocol_name=result.protocol_name if version >= 7 else (result.protocol_name or ""),
            leader=result.leader or "", skip_assignment=result.skip_assignment, member_id=result.member_id or "")
        member_cls = type(response).JoinGroupResponseMember
        response.members = [member_cls(member_id=m.member_id, group_instance_id=m.group_instance_id,
                                       metadata=m.metadata) for m in result.members]
        return response
    return Deferred(wait)
