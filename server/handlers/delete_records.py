"""DeleteRecords: advance partitions' log start offsets, making the records below them unreadable and their segments deletable.

Behaviour / version notes:
- v0-2.  timeout_ms is irrelevant: with a single replica the new low watermark is reached at once.
- Per partition: offset -1 means the high watermark; an offset < -1 or above the high watermark
  → OFFSET_OUT_OF_RANGE; an offset at or below the current log start offset changes nothing.
  The answer's low_watermark is the log start offset afterwards (-1 on error).  Segments wholly
  below it are removed at once; the new start offset is checkpointed durably.
- A topic whose cleanup.policy lacks "delete" (compact only) → POLICY_VIOLATION, as Kafka.
- An internal topic (`__consumer_offsets`, `__transaction_state`) → INVALID_TOPIC_EXCEPTION, as Kafka.
- Unknown topic or partition → UNKNOWN_TOPIC_OR_PARTITION; a partition that exists but that this
  broker does not lead (another broker does, or none at the moment: server/routing.py over
  ``broker.cluster``) → NOT_LEADER_OR_FOLLOWER, as Kafka's ReplicaManager (low watermark -1).  With
  the local engine every partition is led here.
- The new start offset cannot be checkpointed (disk full) → KAFKA_STORAGE_ERROR; nothing changes.
- Authorization (Kafka's handleDeleteRecordsRequest): Delete on each topic, asked once per topic; a
  topic without it answers TOPIC_AUTHORIZATION_FAILED in each of its partitions (low watermark -1),
  before its existence or an internal topic is checked; nothing of it moves.
"""
from __future__ import annotations

import logging

from trireme.server.dispatch import handles
from trireme.server.handlers import unauthorized
from trireme.server.routing import NotLeader, led_partition_named
from trireme.state.acls import Operation, ResourceType
from trireme.state.log import OffsetOutOfRange
from trireme.wire import error_codes as E

log = logging.getLogger("trireme.handlers")


@handles("DeleteRecords", 0, 2)
def delete_records(ctx, request):
    broker = ctx.broker
    response = ctx.response()
    tcls = type(response).DeleteRecordsTopicResult
    pcls = tcls.DeleteRecordsPartitionResult
    denied = unauthorized(ctx, Operation.DELETE, ResourceType.TOPIC, (t.name for t in request.topics))
    for t in request.topics:
        out = tcls(name=t.name)
        response.topics.append(out)
        for p in t.partitions:
            result = pcls(partition_index=p.partition_index, low_watermark=-1, error_code=0)
            out.partitions.append(result)
            if t.name in denied:
                result.error_code = E.TOPIC_AUTHORIZATION_FAILED.code
                continue
            partition = led_partition_named(broker, t.name, p.partition_index)
            if partition is None or type(partition) is NotLeader:
                result.error_code = E.UNKNOWN_TOPIC_OR_PARTITION.code if partition is None else partition.error_code
                continue
            if partition.topic.is_internal:
                result.error_code = E.INVALID_TOPIC_EXCEPTION.code
                continue
            policy = broker.topic_config(partition.topic)["cleanup.policy"]
            if "delete" not in (item.strip() for item in policy.split(",")):
                result.error_code = E.POLICY_VIOLATION.code
                continue
            try:
                result.low_watermark = partition.log.delete_records(p.offset)
            except OffsetOutOfRange:
                result.error_code = E.OFFSET_OUT_OF_RANGE.code
            except OSError as e:        # the log start checkpoint could not be written (disk full): nothing moved
                result.error_code = E.KAFKA_STORAGE_ERROR.code
                log.warning("DeleteRecords on %s-%d not done: %r", t.name, p.partition_index, e)
    return response
