"""OffsetDelete: removes a group's committed offsets for some partitions.

Behaviour / version notes:
- v0.  Refused per partition with GROUP_SUBSCRIBED_TO_TOPIC while a member of the (non-empty)
  group subscribes to the topic; GROUP_ID_NOT_FOUND, NON_EMPTY_GROUP (groups not using the
  consumer protocol) at the top level, as Kafka answers.
- ACLs (as Kafka's KafkaApis): Delete on the group, else GROUP_AUTHORIZATION_FAILED at the top level
  and nothing deleted; then Read on each topic, else TOPIC_AUTHORIZATION_FAILED for each of its
  partitions (left out of the deletion; the group's own checks still answer the rest).
- On a broker that does not lead ``__consumer_offsets``' partition: NOT_COORDINATOR at the top level
  (COORDINATOR_LOAD_IN_PROGRESS while it opens it).
"""
from trireme.server.deferred import Deferred
from trireme.server.dispatch import handles
from trireme.state.acls import Operation, ResourceType
from trireme.wire import error_codes as E


@handles("OffsetDelete", 0, 0)
def offset_delete(ctx, request):
    groups = ctx.broker.groups
    if not ctx.authorize(Operation.DELETE, ResourceType.GROUP, request.group_id):
        return ctx.response(error_code=E.GROUP_AUTHORIZATION_FAILED.code)
    readable = {name: ctx.authorize(Operation.READ, ResourceType.TOPIC, name)
                for name in dict.fromkeys(t.name for t in request.topics)}
    partitions = [(t.name, p.partition_index) for t in request.topics if readable[t.name] for p in t.partitions]
    error, results, records = groups.coordinator.delete_offsets(request.group_id, partitions)
    response = ctx.response(error_code=error)
    tcls = type(response).OffsetDeleteResponseTopic
    errors = {(r.topic, r.partition): r.error for r in results}
    errors.update({(t.name, p.partition_index): E.TOPIC_AUTHORIZATION_FAILED.code
                   for t in request.topics if not readable[t.name] for p in t.partitions})
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
