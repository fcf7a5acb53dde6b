"""CreatePartitions: grow topics to a new partition count (or only validate that they could).

Behaviour / version notes:
- v0-3.  timeout_ms is irrelevant: new partitions exist (empty) at once; ``broker.cluster``
  decides who leads them (with the local engine: this node).
- Per topic, in Kafka's order: unknown → UNKNOWN_TOPIC_OR_PARTITION (null message, as Kafka);
  count equal to the current one or smaller → INVALID_PARTITIONS with Kafka's messages;
  assignments non-null but not one per new partition → INVALID_REPLICA_ASSIGNMENT; each
  assignment must list live brokers, each once, as many as the replicas the cluster lists for
  the topic's partition 0 (Kafka's "consistent with previous partitions"; any number while it has
  no leader; with the local engine exactly [this node]), else INVALID_REPLICA_ASSIGNMENT with
  Kafka's message (see create_topics.assignment_problem).  Null assignments means "place them":
  the cluster places them.  The registry keeps no replica lists: assignments are checked, not
  recorded.
- A name given more than once → one INVALID_REQUEST "Duplicate topic name." result, placed
  first as Kafka does, and nothing changed for it.
- validate_only: every check, the same answer, nothing created.
- ACLs (as Kafka's controller): Alter on each topic (after the duplicate check), else
  TOPIC_AUTHORIZATION_FAILED with a null message, placed after the duplicates and before the other
  results, whether the topic exists or not; nothing changes for it.
"""
from __future__ import annotations

from trireme.server.deferred import Deferred
from trireme.server.dispatch import handles
from trireme.state.acls import Operation, ResourceType
from trireme.state.topics import TopicError
from trireme.wire import error_codes as E

from .create_topics import assignment_problem, live_brokers


async def _grow(broker, t, validate_only: bool) -> None:
    topic = broker.topics.get(t.name)
    if topic is None:
        raise TopicError(E.UNKNOWN_TOPIC_OR_PARTITION.code, None)
    current = topic.partitions
    if t.count == current:
        raise TopicError(E.INVALID_PARTITIONS.code, f"Topic already has {current} partition(s).")
    if t.count < current:
        raise TopicError(E.INVALID_PARTITIONS.code, f"The topic {t.name} currently has {current} partition(s); "
                                                    f"{t.count} would not be an increase.")
    additional = t.count - current
    if t.assignments is not None:
        if len(t.assignments) != additional:
            raise TopicError(E.INVALID_REPLICA_ASSIGNMENT.code,
                             f"Attempted to add {additional} additional partition(s), but only "
                             f"{len(t.assignments)} assignment(s) were specified.")
        live = live_brokers(broker)
        leadership = broker.cluster.leadership(topic, 0)
        replicas = len(leadership.replicas) if leadership is not None else None
        for a in t.assignments:
            problem = assignment_problem(a.broker_ids, live, replicas)
            if problem is not None:
                raise TopicError(E.INVALID_REPLICA_ASSIGNMENT.code, problem)
    await broker.add_partitions(t.name, t.count, validate_only=validate_only)


@handles("CreatePartitions", 0, 3)
def create_partitions(ctx, request):
    response = ctx.response()
    rcls = type(response).CreatePartitionsTopicResult
    counts: dict[str, int] = {}
    for t in request.topics:
        counts[t.name] = counts.get(t.name, 0) + 1
    for name, count in counts.items():
        if count > 1:
            response.results.append(rcls(name=name, error_code=E.INVALID_REQUEST.code,
                                         error_message="Duplicate topic name."))
    alterable = {}
    for name, count in counts.items():
        if count == 1:
            alterable[name] = ctx.authorize(Operation.ALTER, ResourceType.TOPIC, name)
            if not alterable[name]:
                response.results.append(rcls(name=name, error_code=E.TOPIC_AUTHORIZATION_FAILED.code,
                                             error_message=None))

    async def grow():
        for t in request.topics:
            if counts[t.name] > 1 or not alterable[t.name]:
                continue
            try:
                await _grow(ctx.broker, t, request.validate_only)
            except TopicError as refused:
                response.results.append(rcls(name=t.name, error_code=refused.code, error_message=refused.message))
                continue
            response.results.append(rcls(name=t.name, error_code=0, error_message=None))
        return response
    return Deferred(grow)
