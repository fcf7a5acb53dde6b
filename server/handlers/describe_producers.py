"""DescribeProducers: the producer state of partitions, for finding hanging transactions (KIP-664).

Behaviour / version notes:
- v0.  Per partition, every producer id the partition's producer state knows: epoch, last
  sequence, last timestamp, the coordinator epoch of its last marker (-1 before any), and the
  first offset of its open transaction (CurrentTxnStartOffset, -1 when none).  An admin's abort of
  a hanging transaction sends WriteTxnMarkers with these values.
- Checks in Kafka's order (handleDescribeProducersRequest), per topic, answered in each of its
  partitions: an illegal topic name → INVALID_TOPIC_EXCEPTION; then Read on the topic (asked once
  per topic) → TOPIC_AUTHORIZATION_FAILED; then an unknown topic or partition →
  UNKNOWN_TOPIC_OR_PARTITION; then a partition that exists but that this broker does not lead
  (another broker does, or none at the moment; server/routing.py over ``broker.cluster``) →
  NOT_LEADER_OR_FOLLOWER with no message, as Kafka's ReplicaManager.activeProducerState.  Internal
  topics are described too.
- A partition named twice is described once (a repeat of one with many producers would add all of
  them again; the Java admin client asks for each partition once).
"""
from trireme.server.dispatch import handles
from trireme.server.routing import NotLeader, led_partition_named
from trireme.state.acls import Operation, ResourceType
from trireme.state.topics import validate_topic_name
from trireme.wire import error_codes as E


@handles("DescribeProducers", 0, 0)
def describe_producers(ctx, request):
    broker = ctx.broker
    response = ctx.response()
    tcls = type(response).TopicResponse
    pcls = tcls.PartitionResponse
    scls = pcls.ProducerState
    seen = set()
    topic_errors: dict[str, tuple[int, str | None]] = {}
    for t in request.topics:
        out = tcls(name=t.name)
        response.topics.append(out)
        if t.name not in topic_errors:
            topic_errors[t.name] = _topic_error(ctx, t.name)
        topic_error, message = topic_errors[t.name]
        for index in t.partition_indexes:
            if (t.name, index) in seen:
                continue
            seen.add((t.name, index))
            if topic_error:
                out.partitions.append(pcls(partition_index=index, error_code=topic_error, error_message=message))
                continue
            partition = led_partition_named(broker, t.name, index)      # __cluster_metadata stays hidden
            if partition is None:
                out.partitions.append(pcls(partition_index=index, error_code=E.UNKNOWN_TOPIC_OR_PARTITION.code,
                                           error_message=f"{t.name}-{index} does not exist"))
                continue
            if type(partition) is NotLeader:     # as Kafka's ReplicaManager.activeProducerState: no message
                out.partitions.append(pcls(partition_index=index, error_code=partition.error_code))
                continue
            out.partitions.append(pcls(partition_index=index, active_producers=[
                scls(producer_id=e.producer_id, producer_epoch=e.producer_epoch, last_sequence=e.last_seq,
                     last_timestamp=e.last_timestamp, coordinator_epoch=e.coordinator_epoch,
                     current_txn_start_offset=-1 if e.current_txn_first_offset is None
                     else e.current_txn_first_offset)
                for e in sorted(partition.producers.entries(), key=lambda e: e.producer_id)]))
    return response


def _topic_error(ctx, name: str) -> tuple[int, str | None]:
    """What every partition of topic ``name`` answers before its producers are looked at: (0, None) if nothing."""
    invalid = validate_topic_name(name)
    if invalid is not None:
        return E.INVALID_TOPIC_EXCEPTION.code, invalid
    if not ctx.authorize(Operation.READ, ResourceType.TOPIC, name):
        return E.TOPIC_AUTHORIZATION_FAILED.code, None
    return 0, None
