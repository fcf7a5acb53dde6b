"""SyncGroup: the leader hands out assignments; every member waits for its own.

Behaviour / version notes:
- v0-5.  v3+ static membership; v5+ protocol type/name are checked against the group's
  (INCONSISTENT_GROUP_PROTOCOL) and echoed back.  Followers' answers wait until the leader's
  SyncGroup has been made durable as a GroupMetadata record in __consumer_offsets.
- ACLs (as Kafka's KafkaApis): after v5's check that protocol type and name are present
  (INCONSISTENT_GROUP_PROTOCOL), Read on the group, else GROUP_AUTHORIZATION_FAILED with an empty
  assignment, and the group is not touched.
- On a broker that does not lead ``__consumer_offsets``' partition: NOT_COORDINATOR
  (COORDINATOR_LOAD_IN_PROGRESS while it opens it); a SyncGroup waiting when the coordinator moves
  away is answered NOT_COORDINATOR.
"""
from trireme.server.deferred import Deferred
from trireme.server.dispatch import handles
from trireme.state.acls import Operation, ResourceType
from trireme.state.groups import SyncGroupResult
from trireme.wire import error_codes as E


@handles("SyncGroup", 0, 5)
def sync_group(ctx, request):
    groups = ctx.broker.groups
    version = ctx.api_version
    if version >= 5 and (request.protocol_type is None or request.protocol_name is None):
        return ctx.response(error_code=E.INCONSISTENT_GROUP_PROTOCOL.code, assignment=b"")
    if not ctx.authorize(Operation.READ, ResourceType.GROUP, request.group_id):
        return ctx.response(error_code=E.GROUP_AUTHORIZATION_FAILED.code, assignment=b"")

    answer = groups.call(
        groups.coordinator.sync_group, request.group_id, request.generation_id, request.member_id,
        request.group_instance_id, request.protocol_type if version >= 5 else None,
        request.protocol_name if version >= 5 else None,
        [(a.member_id, a.assignment) for a in request.assignments], ctx.now_ms(),
        if_moved=SyncGroupResult(E.NOT_COORDINATOR.code))

    async def wait():
        result = await answer()
        return ctx.response(error_code=result.error, protocol_type=result.protocol_type,
                            protocol_name=result.protocol_name, assignment=result.assignment or b"")
    return Deferred(wait)
