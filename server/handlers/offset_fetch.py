"""OffsetFetch: the committed positions of a group (or of several groups, v8+).

Behaviour / version notes:
- v1-10.  v1 lists partitions explicitly; v2+ a null topic list means every committed
  partition; v5+ leader epoch; v7+ RequireStable: a partition with a transactional offset
  commit still pending answers UNSTABLE_OFFSET_COMMIT (the client retries); v8+ several groups
  in one request, each with its own error; v10 names topics by id.
- A partition without a committed offset answers offset -1, metadata "" and no error.
- v8+: a group named twice is answered once (its first entry): a repeat of a group asking for every
  committed offset would multiply the response (clients key the groups in a map and never repeat).
- COORDINATOR_LOAD_IN_PROGRESS while __consumer_offsets is being replayed at start-up.
"""
from trireme.server.dispatch import handles
from trireme.server.handlers import first_of_each
from trireme.wire import error_codes as E


def _offset_fetch(ctx, request):
    broker = ctx.broker
    coordinator = broker.groups.coordinator
    version = ctx.api_version
    response = ctx.response()
    require_stable = version >= 7 and request.require_stable
    if version < 8:
        partitions = None if request.topics is None else [
            (t.name, p) for t in request.topics for p in t.partition_indexes]
        error, fetched = coordinator.fetch_offsets(request.group_id, partitions, require_stable)
        tcls = type(response).OffsetFetchResponseTopic
        by_topic = {}
        for f in fetched:
            topic = by_topic.get(f.topic)
            if topic is None:
                topic = by_topic[f.topic] = tcls(name=f.topic)
                response.topics.append(topic)
            topic.partitions.append(tcls.OffsetFetchResponsePartition(
                partition_index=f.partition, committed_offset=f.offset, committed_leader_epoch=f.leader_epoch,
                metadata=f.metadata, error_code=f.error))
        response.error_code = error
        return response
    gcls = type(response).OffsetFetchResponseGroup
    tcls = gcls.OffsetFetchResponseTopics
    pcls = tcls.OffsetFetchResponsePartitions
    for g in first_of_each(request.groups, lambda g: g.group_id):     # a repeat is answered once (its first entry)
        out = gcls(group_id=g.group_id)
        response.groups.append(out)
        if g.topics is None:
            partitions = None
        else:
            partitions = []
            for t in g.topics:
                name = t.name
                if version >= 10:
                    topic = broker.described_topic(topic_id=t.topic_id)
                    name = topic.name if topic is not None else None
                    if name is None:
                        out.topics.append(tcls(topic_id=t.topic_id, partitions=[
                            pcls(partition_index=p, committed_offset=-1, error_code=E.UNKNOWN_TOPIC_ID.code)
                            for p in t.partition_indexes]))
                        continue
                partitions += [(name, p) for p in t.partition_indexes]
        error, fetched = coordinator.fetch_offsets(g.group_id, partitions, require_stable)
        out.error_code = error
        by_topic = {}
        for f in fetched:
            topic = by_topic.get(f.topic)
            if topic is None:
                known = broker.described_topic(f.topic)
                topic = by_topic[f.topic] = tcls(name=f.topic, topic_id=known.topic_id if known else None)
                out.topics.append(topic)
            topic.partitions.append(pcls(partition_index=f.partition, committed_offset=f.offset,
                                         committed_leader_epoch=f.leader_epoch, metadata=f.metadata,
                                         error_code=f.error))
    return response


@handles("OffsetFetch", 1, 10)
def offset_fetch(ctx, request):
    # Commits answered before this request may still be on their way to disk: wait for them, so a
    # pipelined read sees what was acknowledged (Kafka handles one request per connection at a time).
    return ctx.broker.groups.after_staged_writes(lambda: _offset_fetch(ctx, request))
