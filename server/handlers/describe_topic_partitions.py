"""DescribeTopicPartitions: topics and their partitions, in pages bounded by a partition limit and resumed by a cursor.

Behaviour / version notes:
- v0.  An empty topic list means every topic; named topics are deduplicated.  Topics are taken
  in name order (Java string order), starting at the cursor's topic when a cursor is given
  (names sorting before it are skipped).
- The page holds at most max(min(response_partition_limit, 2000), 1) partitions (2000 is
  Kafka's max.request.partition.size.limit).  The cursor's partition index applies to the
  cursor's topic only.  When a topic is cut short, next_cursor = (that topic, first partition
  left out); when the limit is used up exactly and more topics follow, next_cursor = (next
  topic, 0) — that topic need not exist.  A cursor index past a topic's end answers the topic
  with no partitions.
- Named topics that don't exist answer UNKNOWN_TOPIC_OR_PARTITION (INVALID_TOPIC_EXCEPTION for
  an illegal name) with no partitions and use none of the limit; with an empty topic list only
  existing topics appear.
- A cursor whose topic is not among the named topics, or whose partition index is negative,
  fails the request as Kafka does: every named topic answers INVALID_REQUEST.
- Partitions, as Metadata's (server/routing.py's DescribedCluster over ``broker.cluster``): the
  leader and leader epoch, replicas = ISR = the brokers the cluster lists for it (with the local
  engine: this node), eligible_leader_replicas and last_known_elr empty, no offline replicas; no
  leader → LEADER_NOT_AVAILABLE with leader -1 (LISTENER_NOT_FOUND for a live leader without the
  request's listener), as Kafka.  Every topic carries
  its id, is_internal and authorized operations (Kafka's bit set of the topic operations the
  principal may do; every one without an authorizer).  The internal topics are described like any
  other, as in Metadata.
- Authorization (Kafka's DescribeTopicPartitionsRequestHandler): Describe on each topic, asked as
  the page is filled, in name order, up to the topic the page stops at (as Kafka's lazy filter): a
  topic without it uses none of the limit and is never the next cursor; with an empty topic list it
  is left out, named it is answered after the page with TOPIC_AUTHORIZATION_FAILED, a zero topic
  id, is_internal false and no partitions, whether or not it exists.
"""
from __future__ import annotations

import uuid

from trireme.server.dispatch import handles
from trireme.server.authorized_operations import authorized_operations
from trireme.server.routing import DescribedCluster
from trireme.state.acls import Operation, ResourceType
from trireme.state.topics import validate_topic_name
from trireme.wire import error_codes as E

MAX_PARTITION_LIMIT = 2000       # Kafka's max.request.partition.size.limit default
ZERO_UUID = uuid.UUID(int=0)


def _java_order(name: str) -> bytes:
    """Sort key giving Java's String.compareTo order (UTF-16 code units)."""
    return name.encode("utf-16-be", "surrogatepass")


@handles("DescribeTopicPartitions", 0, 0)
def describe_topic_partitions(ctx, request):
    broker = ctx.broker
    response = ctx.response()
    tcls = type(response).DescribeTopicPartitionsResponseTopic
    pcls = tcls.DescribeTopicPartitionsResponsePartition
    cursor = request.cursor
    fetch_all = not request.topics
    start = _java_order(cursor.topic_name) if cursor is not None else b""
    if fetch_all:
        names = {t.name for t in broker.described_topics()}
    else:
        names = {t.name for t in request.topics}
    names = {n for n in names if _java_order(n) >= start}
    refusal = None
    if cursor is not None and not fetch_all and cursor.topic_name not in names:
        refusal = f"DescribeTopicPartitionsRequest topic list should contain the cursor topic: {cursor.topic_name}"
    elif cursor is not None and cursor.partition_index < 0:
        refusal = (f"Invalid cursor: partition index must be non-negative. Received: "
                   f"Cursor(topicName='{cursor.topic_name}', partitionIndex={cursor.partition_index})")
    if refusal is not None:
        response.topics = [tcls(error_code=E.INVALID_REQUEST.code, name=t.name, topic_id=ZERO_UUID, is_internal=False)
                           for t in request.topics]
        return response

    remaining = max(min(MAX_PARTITION_LIMIT, request.response_partition_limit), 1)
    described = DescribedCluster(ctx)
    refused = []
    for name in sorted(names, key=_java_order):
        if not ctx.authorize(Operation.DESCRIBE, ResourceType.TOPIC, name):
            if not fetch_all:
                refused.append(tcls(error_code=E.TOPIC_AUTHORIZATION_FAILED.code, name=name, topic_id=ZERO_UUID,
                                    is_internal=False))
            continue
        if remaining == 0:
            response.next_cursor = type(response).Cursor(topic_name=name, partition_index=0)
            break
        topic = broker.described_topic(name)
        if topic is None:
            if not fetch_all:
                error = E.UNKNOWN_TOPIC_OR_PARTITION if validate_topic_name(name) is None else E.INVALID_TOPIC_EXCEPTION
                response.topics.append(tcls(error_code=error.code, name=name, topic_id=ZERO_UUID,
                                            is_internal=False, topic_authorized_operations=authorized_operations(
                                                ctx, ResourceType.TOPIC, name)))
            continue
        first = cursor.partition_index if cursor is not None and name == cursor.topic_name else 0
        upper = min(topic.partitions, first + remaining)
        out = tcls(error_code=0, name=name, topic_id=topic.topic_id, is_internal=topic.is_internal,
                   topic_authorized_operations=authorized_operations(ctx, ResourceType.TOPIC, name))
        out.partitions = [_partition(pcls, i, *described.partition(topic, i)) for i in range(first, upper)]
        response.topics.append(out)
        if upper < topic.partitions:
            response.next_cursor = type(response).Cursor(topic_name=name, partition_index=upper)
            break
        remaining -= len(out.partitions)
    response.topics += refused
    return response


def _partition(pcls, index: int, error: int, leader: int, epoch: int, replicas: list[int]):
    return pcls(error_code=error, partition_index=index, leader_id=leader, leader_epoch=epoch,
                replica_nodes=replicas, isr_nodes=list(replicas), eligible_leader_replicas=[], last_known_elr=[],
                offline_replicas=[])
