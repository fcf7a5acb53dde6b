"""OffsetFetch: the committed positions of a group (or of several groups, v8+).

Behaviour / version notes:
- v1-10.  v1 lists partitions explicitly; v2+ a null topic list means every committed
  partition; v5+ leader epoch; v7+ RequireStable: a partition with a transactional offset
  commit still pending answers UNSTABLE_OFFSET_COMMIT (the client retries); v8+ several groups
  in one request, each with its own error; v10 names topics by id.
- A partition without a committed offset answers offset -1, metadata "" and no error.
- v8+: a group named twice is answered once (its first entry): a repeat of a group asking for every
  committed offset would multiply the response (clients key the groups in a map and never repeat).
- COORDINATOR_LOAD_IN_PROGRESS while __consumer_offsets is being opened and replayed; NOT_COORDINATOR
  on a broker that does not lead its partition.
- ACLs (as Kafka's KafkaApis), per group: Describe on the group, else the group answers
  GROUP_AUTHORIZATION_FAILED (v2+: at the group level with no topics; v1, which has no group-level
  error, on each partition asked for, offset -1).  Topics asked for by name: those the principal may
  not Describe are not looked up and answer TOPIC_AUTHORIZATION_FAILED on each partition, offset -1,
  after the others (v10: an unknown topic id is UNKNOWN_TOPIC_ID first).  The all-topics form
  (null topics) leaves out the topics the principal may not Describe, as Kafka does.  A group-level
  error from the coordinator answers the group alone (v1: on each partition asked for).
"""
from trireme.server.dispatch import handles
from trireme.server.handlers import first_of_each
from trireme.state.acls import Operation, ResourceType
from trireme.wire import error_codes as E

NO_OFFSET = -1
NO_LEADER_EPOCH = -1


def _fetch_group(ctx, group_id, asked, require_stable, describable: dict[str, bool]):
    """One group's answer, authorized as Kafka does: ``asked`` is None (every committed offset) or a list of
    ``(name or None, topic_id, partitions)``; returns (group error, [(name, topic_id, [(partition, offset,
    leader_epoch, metadata, error)])]).  ``describable`` caches the topic answers across the request's groups."""
    broker = ctx.broker
    version = ctx.api_version
    if not ctx.authorize(Operation.DESCRIBE, ResourceType.GROUP, group_id):
        return _group_error(version, asked, E.GROUP_AUTHORIZATION_FAILED.code)

    def may_describe(name):
        if name not in describable:
            describable[name] = ctx.authorize(Operation.DESCRIBE, ResourceType.TOPIC, name)
        return describable[name]

    unknown, denied, partitions = [], [], None
    if asked is not None:
        partitions = []
        for name, topic_id, indexes in asked:
            if name is None:
                unknown.append((None, topic_id, [(p, NO_OFFSET, NO_LEADER_EPOCH, "", E.UNKNOWN_TOPIC_ID.code)
                                                 for p in indexes]))
            elif not may_describe(name):
                denied.append((name, topic_id, [(p, NO_OFFSET, NO_LEADER_EPOCH, "", E.TOPIC_AUTHORIZATION_FAILED.code)
                                                for p in indexes]))
            else:
                partitions += [(name, p) for p in indexes]
    error, fetched = broker.groups.coordinator.fetch_offsets(group_id, partitions, require_stable)
    if error:
        return _group_error(version, asked, error)
    topics, by_topic = list(unknown), {}
    for f in fetched:
        out = by_topic.get(f.topic)
        if out is None:
            if asked is None and not may_describe(f.topic):
                continue
            known = broker.described_topic(f.topic)
            out = by_topic[f.topic] = (f.topic, known.topic_id if known else None, [])
            topics.append(out)
        out[2].append((f.partition, f.offset, f.leader_epoch, f.metadata, f.error))
    return 0, topics + denied


def _group_error(version, asked, error):
    if version >= 2 or asked is None:
        return error, []
    return error, [(name, topic_id, [(p, NO_OFFSET, NO_LEADER_EPOCH, "", error) for p in indexes])
                   for name, topic_id, indexes in asked]      # v1 has no group-level error field


def _offset_fetch(ctx, request):
    broker = ctx.broker
    version = ctx.api_version
    response = ctx.response()
    require_stable = version >= 7 and request.require_stable
    if version < 8:
        asked = None if request.topics is None else [(t.name, None, t.partition_indexes) for t in request.topics]
        error, topics = _fetch_group(ctx, request.group_id, asked, require_stable, {})
        tcls = type(response).OffsetFetchResponseTopic
        pcls = tcls.OffsetFetchResponsePartition
        response.topics = [tcls(name=name, partitions=[
            pcls(partition_index=p, committed_offset=offset, committed_leader_epoch=epoch, metadata=metadata,
                 error_code=code) for p, offset, epoch, metadata, code in parts]) for name, _, parts in topics]
        response.error_code = error
        return response
    gcls = type(response).OffsetFetchResponseGroup
    tcls = gcls.OffsetFetchResponseTopics
    pcls = tcls.OffsetFetchResponsePartitions
    describable: dict[str, bool] = {}
    for g in first_of_each(request.groups, lambda g: g.group_id):     # a repeat is answered once (its first entry)
        if g.topics is None:
            asked = None
        elif version >= 10:
            asked = []
            for t in g.topics:
                topic = broker.described_topic(topic_id=t.topic_id)
                asked.append((topic.name if topic is not None else None, t.topic_id, t.partition_indexes))
        else:
            asked = [(t.name, None, t.partition_indexes) for t in g.topics]
        error, topics = _fetch_group(ctx, g.group_id, asked, require_stable, describable)
        response.groups.append(gcls(group_id=g.group_id, error_code=error, topics=[
            tcls(name=name or "", topic_id=topic_id, partitions=[
                pcls(partition_index=p, committed_offset=offset, committed_leader_epoch=epoch, metadata=metadata,
                     error_code=code) for p, offset, epoch, metadata, code in parts])
            for name, topic_id, parts in topics]))
    return response


@handles("OffsetFetch", 1, 10)
def offset_fetch(ctx, request):
    # Commits answered before this request may still be on their way to disk: wait for them, so a
    # pipelined read sees what was acknowledged (Kafka handles one request per connection at a time).
    return ctx.broker.groups.after_staged_writes(lambda: _offset_fetch(ctx, request))
