"""OffsetCommit: a consumer stores its positions; the answer comes once the records are durable.

Behaviour / version notes:
- v2-10.  v2-4 RetentionTimeMs sets an explicit expiry; v6+ committed leader epoch; v7+ static
  members; v9+ GROUP_ID_NOT_FOUND for an unknown group with a generation; v10 names topics by id
  (UNKNOWN_TOPIC_ID).  Generation -1 with an empty member id is a standalone ("simple") commit,
  allowed while the group is Empty or unknown.
- Unknown topics or partitions → UNKNOWN_TOPIC_OR_PARTITION for that partition (as Kafka checks
  its metadata cache); metadata longer than 4096 characters → OFFSET_METADATA_TOO_LARGE.
  The internal topics Metadata lists are known topics here too (a consumer may read them).
- The commit becomes visible to OffsetFetch once its __consumer_offsets record is fsynced and
  replayed into the coordinator, which happens before this answer is sent; if the record cannot
  be made durable the partitions answer NOT_COORDINATOR (as Kafka maps a storage error).
- ACLs (as Kafka's KafkaApis): Read on the group, else every partition answers
  GROUP_AUTHORIZATION_FAILED and nothing is committed.  Then, per topic (v10: after an unknown
  topic id's UNKNOWN_TOPIC_ID), Read on the topic, else TOPIC_AUTHORIZATION_FAILED for each of its
  partitions (before the existence check, so an unauthorized name reveals nothing).  When no
  partition is left to commit, the coordinator is not asked (as Kafka).
- On a broker that does not lead ``__consumer_offsets``' partition: NOT_COORDINATOR for every
  partition (COORDINATOR_LOAD_IN_PROGRESS while it opens it).
"""
from trireme.server.deferred import Deferred
from trireme.server.dispatch import handles
from trireme.state.acls import Operation, ResourceType
from trireme.wire import error_codes as E


@handles("OffsetCommit", 2, 10)
def offset_commit(ctx, request):
    broker = ctx.broker
    groups = broker.groups
    version = ctx.api_version
    response = ctx.response()
    tcls = type(response).OffsetCommitResponseTopic
    pcls = tcls.OffsetCommitResponsePartition
    if not ctx.authorize(Operation.READ, ResourceType.GROUP, request.group_id):
        response.topics = [tcls(name=t.name, topic_id=t.topic_id, partitions=[
            pcls(partition_index=p.partition_index, error_code=E.GROUP_AUTHORIZATION_FAILED.code)
            for p in t.partitions]) for t in request.topics]
        return response
    offsets, rejected = [], {}
    out_topics = {}
    readable: dict[str, bool] = {}
    for t in request.topics:
        topic = broker.described_topic(None if version >= 10 else t.name, t.topic_id)
        name = topic.name if topic is not None else t.name
        out = out_topics[id(t)] = tcls(name=t.name, topic_id=t.topic_id)
        response.topics.append(out)
        denied = False
        if not (version >= 10 and topic is None):
            if name not in readable:
                readable[name] = ctx.authorize(Operation.READ, ResourceType.TOPIC, name)
            denied = not readable[name]
        for p in t.partitions:
            if denied:
                rejected[(id(t), p.partition_index)] = E.TOPIC_AUTHORIZATION_FAILED.code
                continue
            if topic is None or not 0 <= p.partition_index < topic.partitions:
                rejected[(id(t), p.partition_index)] = E.UNKNOWN_TOPIC_ID.code if version >= 10 and topic is None \
                    else E.UNKNOWN_TOPIC_OR_PARTITION.code
                continue
            offsets.append((name, p.partition_index, p.committed_offset, p.committed_leader_epoch,
                            p.committed_metadata))
    if not offsets:                    # nothing authorized and known is left: Kafka answers without the coordinator
        for t in request.topics:
            out_topics[id(t)].partitions = [pcls(partition_index=p.partition_index,
                                                 error_code=rejected[(id(t), p.partition_index)])
                                            for p in t.partitions]
        return response
    results, effects = groups.coordinator.commit_offsets(
        request.group_id, request.generation_id_or_member_epoch, request.member_id, request.group_instance_id,
        offsets, ctx.now_ms(), retention_time_ms=request.retention_time_ms if version <= 4 else -1,
        api_version=version)
    errors = {(r.topic, r.partition): r.error for r in results}
    for t in request.topics:
        topic = broker.described_topic(None if version >= 10 else t.name, t.topic_id)
        name = topic.name if topic is not None else t.name
        out_topics[id(t)].partitions = [
            pcls(partition_index=p.partition_index,
                 error_code=rejected.get((id(t), p.partition_index), errors.get((name, p.partition_index), 0)))
            for p in t.partitions]

    staged = groups.stage(effects)       # appended now, so a pipelined OffsetFetch waits for it

    async def wait():
        if not await groups.complete(staged):
            for topic in response.topics:
                for p in topic.partitions:
                    if p.error_code == 0:
                        p.error_code = E.NOT_COORDINATOR.code     # not durable: Kafka's answer to a storage error
        return response
    return Deferred(wait)
