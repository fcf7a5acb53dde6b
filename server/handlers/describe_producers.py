"""DescribeProducers: the producer state of partitions, for finding hanging transactions (KIP-664).

Behaviour / version notes:
- v0.  Per partition, every producer id the partition's producer state knows: epoch, last
  sequence, last timestamp, the coordinator epoch of its last marker (-1 before any), and the
  first offset of its open transaction (CurrentTxnStartOffset, -1 when none).  An admin's abort of
  a hanging transaction sends WriteTxnMarkers with these values.
- Unknown topic or partition → UNKNOWN_TOPIC_OR_PARTITION for it.  Internal topics are described too.
- A partition named twice is described once (a repeat of one with many producers would add all of
  them again; the Java admin client asks for each partition once).
"""
from trireme.server.dispatch import handles
from trireme.wire import error_codes as E


@handles("DescribeProducers", 0, 0)
def describe_producers(ctx, request):
    broker = ctx.broker
    response = ctx.response()
    tcls = type(response).TopicResponse
    pcls = tcls.PartitionResponse
    scls = pcls.ProducerState
    seen = set()
    for t in request.topics:
        out = tcls(name=t.name)
        response.topics.append(out)
        for index in t.partition_indexes:
            if (t.name, index) in seen:
                continue
            seen.add((t.name, index))
            partition = broker.partitions.get((t.name, index))
            if partition is None:
                out.partitions.append(pcls(partition_index=index, error_code=E.UNKNOWN_TOPIC_OR_PARTITION.code,
                                           error_message=f"{t.name}-{index} does not exist"))
                continue
            out.partitions.append(pcls(partition_index=index, active_producers=[
                scls(producer_id=e.producer_id, producer_epoch=e.producer_epoch, last_sequence=e.last_seq,
                     last_timestamp=e.last_timestamp, coordinator_epoch=e.coordinator_epoch,
                     current_txn_start_offset=-1 if e.current_txn_first_offset is None
                     else e.current_txn_first_offset)
                for e in sorted(partition.producers.entries(), key=lambda e: e.producer_id)]))
    return response
