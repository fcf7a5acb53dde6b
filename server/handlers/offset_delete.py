"""OffsetDelete: removes a group's committed offsets for some partitions.

Behaviour / version notes:
- v0.  Refused per partition with GROUP_SUBSCRIBED_TO_TOPIC while a member of the (non-empty)
  group subscribes to the topic; GROUP_ID_NOT_FOUND, NON_EMPTY_GROUP (groups not using the
  consumer protocol) at the top level, as Kafka answers.
"""
from trireme.server.deferred import Deferred
from trireme.server.dispatch import handles
from trireme.wire import error_codes as E


@handles("OffsetDelete", 0, 0)
def offset_delete(ctx, request):
    groups = ctx.broker.groups
    partitions = [(t.name, p.partition_index) for t in request.topics for p in t.partitions]
    error, results, records = groups.coordinator.delete_offsets(request.group_id, partitions)
    response = ctx.response(error_code=error)
    tcls = type(response).OffsetDeleteResponseTopic
    errors = {(r.topic, r.partition): r.error for r in results}
    if not error:
        response.topics = [tcls(name=t.name, partitions=[
            tcls.OffsetDeleteResponsePartition(partition_index=p.partition_index,
                                               error_code=errors.get((t.name, p.partition_index), 0))
            for p in t.partitions]) for t in request.topics]

    staged = groups.stage(records)

    async def wait():
        if not await groups.complete(staged) and not response.error_code:
            response.error_code = E.NOT_COORDINATOR.code
        return response
    return Deferred(wait)
