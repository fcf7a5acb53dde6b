"""ListOffsets: earliest, latest, max-timestamp and by-timestamp offsets of partitions.

Behaviour / version notes:
- v1-11.  At read_committed (v2+) every lookup is bounded by the last stable offset instead of the
  high watermark, as on Kafka.  -2 earliest → log start offset; -1 latest → high watermark
  (read_uncommitted) or last stable offset (read_committed); -3 max timestamp (v7+) → offset and timestamp of the
  first record holding the largest timestamp; -4 earliest local (v8+) → log start offset; -5 earliest
  pending upload (v9+) → -1 (no tiered storage).  A timestamp ≥ 0 → the first record whose
  timestamp is ≥ it, or -1 when none (the time index finds the batch; that batch is decoded).
- Leader epoch in answers, as Kafka's: the partition's current epoch for latest, else the epoch the
  offset found was written in (the partition's leader-epoch cache, state/leader_epochs.py; with the
  local engine a topic has one epoch, the current one).  CurrentLeaderEpoch (v4+) newer than ours →
  UNKNOWN_LEADER_EPOCH, older → FENCED_LEADER_EPOCH.
- Unknown topic or partition → UNKNOWN_TOPIC_OR_PARTITION; a partition that exists but that this
  broker does not lead (another broker does, or none at the moment: server/routing.py over
  ``broker.cluster``) → NOT_LEADER_OR_FOLLOWER, as Kafka's ReplicaManager (timestamp and offset -1).
  With the local engine every partition is led here.
- Authorization (Kafka's handleListOffsetRequest): Describe on each topic, asked once per topic; a topic
  without it answers TOPIC_AUTHORIZATION_FAILED in each of its partitions (timestamp and offset -1),
  before its existence is checked.
"""
from trireme.server.dispatch import handles
from trireme.server.handlers import unauthorized
from trireme.server.routing import NotLeader, led_partition_named
from trireme.state.acls import Operation, ResourceType
from trireme.wire import error_codes as E

LATEST, EARLIEST, MAX_TIMESTAMP, EARLIEST_LOCAL, EARLIEST_PENDING_UPLOAD = -1, -2, -3, -4, -5


@handles("ListOffsets", 1, 11)
def list_offsets(ctx, request):
    broker = ctx.broker
    response = ctx.response()
    tcls = type(response).ListOffsetsTopicResponse
    pcls = tcls.ListOffsetsPartitionResponse
    read_committed = ctx.api_version >= 2 and request.isolation_level == 1
    denied = unauthorized(ctx, Operation.DESCRIBE, ResourceType.TOPIC, (t.name for t in request.topics))
    for t in request.topics:
        out = tcls(name=t.name)
        response.topics.append(out)
        for p in t.partitions:
            result = pcls(partition_index=p.partition_index, timestamp=-1, offset=-1, leader_epoch=-1)
            out.partitions.append(result)
            if t.name in denied:
                result.error_code = E.TOPIC_AUTHORIZATION_FAILED.code
                continue
            partition = led_partition_named(broker, t.name, p.partition_index)
            if partition is None or type(partition) is NotLeader:
                result.error_code = E.UNKNOWN_TOPIC_OR_PARTITION.code if partition is None else partition.error_code
                continue
            epoch = partition.leader_epoch
            result.error_code = partition.leader_epoch_error(p.current_leader_epoch)
            if result.error_code:
                continue
            plog = partition.log
            ts = p.timestamp
            # What a consumer of this isolation level may read: every lookup below stays under it, as on Kafka.
            bound = partition.last_stable_offset() if read_committed else plog.high_watermark
            if ts == LATEST:
                result.offset, result.leader_epoch = bound, epoch
            elif ts in (EARLIEST, EARLIEST_LOCAL):
                result.offset = plog.log_start_offset
                result.leader_epoch = partition.epoch_at(result.offset)
            elif ts == EARLIEST_PENDING_UPLOAD:
                pass
            elif ts == MAX_TIMESTAMP:
                offset, stamp = plog.max_timestamp()
                if 0 <= offset < bound:
                    exact = plog.first_record_at_or_after(offset, stamp, bound)
                    if exact is not None:
                        result.offset, result.timestamp = exact
                        result.leader_epoch = partition.epoch_at(result.offset)
            else:
                found = plog.offset_for_timestamp(ts)
                if found is not None and found[0] < bound:
                    exact = plog.first_record_at_or_after(found[0], ts, bound)
                    if exact is not None:
                        result.offset, result.timestamp = exact
                        result.leader_epoch = partition.epoch_at(result.offset)
    return response

