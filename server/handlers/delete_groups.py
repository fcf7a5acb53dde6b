"""DeleteGroups: removes empty groups and all their committed offsets.

Behaviour / version notes:
- v0-2.  Only Empty (or Dead) groups can go: NON_EMPTY_GROUP otherwise, GROUP_ID_NOT_FOUND for
  unknown ones.  Tombstones for the group and its offsets are made durable before the answer.
- ACLs (as Kafka's KafkaApis): Delete on each group, else GROUP_AUTHORIZATION_FAILED for it (after the
  other results, as Kafka puts them) and it is not deleted.  A group named twice is answered once.
- On a broker that does not lead ``__consumer_offsets``' partition: NOT_COORDINATOR for each group
  (COORDINATOR_LOAD_IN_PROGRESS while it opens it).
"""
from trireme.server.deferred import Deferred
from trireme.server.dispatch import handles
from trireme.server.handlers import first_of_each
from trireme.state.acls import Operation, ResourceType
from trireme.wire import error_codes as E


@handles("DeleteGroups", 0, 2)
def delete_groups(ctx, request):
    groups = ctx.broker.groups
    allowed, denied = [], []
    for group_id in first_of_each(request.groups_names):
        (allowed if ctx.authorize(Operation.DELETE, ResourceType.GROUP, group_id) else denied).append(group_id)

    async def wait():
        await groups.wait_replayed()      # decide on every commit already answered, as Kafka does
        results, records = groups.coordinator.delete_groups(allowed, ctx.now_ms())
        results = list(results) + [(group_id, E.GROUP_AUTHORIZATION_FAILED.code) for group_id in denied]
        durable = await groups.write_records(records)
        response = ctx.response()
        cls = type(response).DeletableGroupResult
        response.results = [cls(group_id=group_id, error_code=error if error or durable else E.NOT_COORDINATOR.code)
                            for group_id, error in results]
        return response
    return Deferred(wait)
