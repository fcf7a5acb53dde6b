"""WriteTxnMarkers: append COMMIT/ABORT control batches that end a producer's transaction in each partition.

Behaviour / version notes:
- v1-2 (Kafka 4 serves no v0).  The one way markers are written: the transaction coordinator sends
  these through the same encode → handler → decode path as a network peer (server/local_peer.py,
  whose requests carry ClusterAction: ``ctx.cluster_action``), and admin clients send them to abort
  a hanging transaction (KIP-664), with the producer id, epoch and coordinator epoch they read from
  DescribeProducers.
- Per partition: unknown → UNKNOWN_TOPIC_OR_PARTITION; led by another broker (or by none, or not
  open here: server/routing.py) → NOT_LEADER_OR_FOLLOWER, as Kafka's append (the coordinator sends
  each partition's markers to its leader, ``broker.partition_leader``, and retries this error);
  offline → KAFKA_STORAGE_ERROR.  The
  partition's checks are Kafka's: an older producer epoch → INVALID_PRODUCER_EPOCH, an older
  coordinator epoch → TRANSACTION_COORDINATOR_FENCED; v2's TransactionVersion >= 2 means the marker
  carries the bumped epoch, which must then be strictly newer than the producer's.  A producer the
  partition does not know (its state expired) counts as one at epoch -1 and coordinator epoch -1,
  as on Kafka: its marker is written (that is what lets an admin abort work), but an epoch or
  coordinator epoch below -1 is refused, and a producer id below 0 is INVALID_REQUEST — all before
  anything is appended.
- Authorization first (Kafka's handleWriteTxnMarkersRequest): Alter on the cluster (asked first, a
  denial not counted: KIP-664's admin abort) or else ClusterAction on the cluster (what a broker
  sends); without either every partition answers CLUSTER_AUTHORIZATION_FAILED and nothing is
  written.  The coordinator's own requests (server/local_peer.py) always pass.
- Markers from another broker (the transaction coordinator elsewhere in the cluster sends each
  partition's markers to its leader over the wire, authenticated as the inter-broker principal): a
  principal with ClusterAction — any principal when no authorizer is on, as in Kafka — is a broker,
  and its markers are the coordinator's, trusted as the local peer's.  On the coordinator's own broker
  no coordinator sends markers over the wire, so there every marker that is not its own is a client's.
- A marker that does not come from this broker (a client's, whatever its permissions) is also
  checked against the transaction coordinator (Kafka without an authorizer lets any client tear a
  transaction here):
  * into ``__consumer_offsets`` / ``__transaction_state``: CLUSTER_AUTHORIZATION_FAILED, always;
  * for a producer id the coordinator has a transaction for
    (:meth:`~trireme.state.transactions.TransactionCoordinator.producer_transactions`): on a
    partition of its open transaction only the coordinator's own marker — its prepared result
    (a marker while the transaction is Ongoing, or of the other result: INVALID_TXN_STATE), its
    producer epoch (INVALID_PRODUCER_EPOCH), its coordinator epoch (TRANSACTION_COORDINATOR_FENCED);
    on any other partition only an ABORT (a COMMIT: INVALID_TXN_STATE) at an epoch the coordinator
    gave the producer (above it: INVALID_PRODUCER_EPOCH) and a coordinator epoch not above its own
    (TRANSACTION_COORDINATOR_FENCED), which ends a hanging transaction there;
  * for a producer id this broker never handed out: UNKNOWN_PRODUCER_ID (no transaction can be open
    under it, and a marker would leave an epoch or coordinator epoch for a producer yet to get it);
  * for any other producer id the coordinator does not know, nothing more (KIP-664's admin abort).
  The coordinator's own markers (its transactions, and the ABORTs of ``abort_orphans`` for
  transactions it never recorded on a partition) skip this check: they are what it checks against.
  A coordinator's V2 marker that finds the producer at its epoch with nothing open (a client's exact
  copy came first, or an fsync failed after the append) is answered as written once the partition is
  durable, instead of INVALID_PRODUCER_EPOCH, which would leave the transaction prepared for good.
- A marker completes the producer's transaction in producer state (the last stable offset moves),
  and an ABORT adds the transaction to the partition's aborted-transaction index, which
  read_committed fetches return.  In a coordinator's own log (``__consumer_offsets``) the marker goes
  through that coordinator's runtime, so it makes the transaction's pending offsets visible (COMMIT)
  or drops them (ABORT) when it is replayed.
- Answered once every marker of the request is durable (fsynced).
"""
from trireme.server.deferred import Deferred
from trireme.server.dispatch import handles
from trireme.server.routing import NotLeader, led_partition_named
from trireme.server.transactions import coordinator_here
from trireme.state.acls import CLUSTER_NAME, Operation, ResourceType
from trireme.state.log import AbortedTxn
from trireme.state.topics import INTERNAL_TOPICS
from trireme.wire import error_codes as E
from trireme.wire import records


@handles("WriteTxnMarkers", 1, 2)
def write_txn_markers(ctx, request):
    broker = ctx.broker
    response = ctx.response()
    mcls = type(response).WritableTxnMarkerResult
    tcls = mcls.WritableTxnMarkerTopicResult
    pcls = tcls.WritableTxnMarkerPartitionResult
    if not (ctx.authorize(Operation.ALTER, ResourceType.CLUSTER, CLUSTER_NAME, log_if_denied=False)
            or ctx.authorize(Operation.CLUSTER_ACTION, ResourceType.CLUSTER, CLUSTER_NAME)):
        refused = E.CLUSTER_AUTHORIZATION_FAILED.code
        response.markers = [mcls(producer_id=m.producer_id, topics=[tcls(name=t.name, partitions=[
            pcls(partition_index=i, error_code=refused) for i in t.partition_indexes]) for t in m.topics])
            for m in request.markers]
        return response
    waits = []          # (result, awaitable returning durable?)
    now = ctx.now_ms()
    # A broker's markers are the coordinator's own: this broker's (the local peer), or, when the transaction
    # coordinator is on another broker, those of a principal with ClusterAction (any principal without an
    # authorizer, as Kafka): a broker (docs/security.md).  Over the wire to the coordinator's own broker no
    # coordinator sends markers (it uses its local peer), so there they are a client's and checked.
    trusted = ctx.cluster_action or (not coordinator_here(broker) and ctx.authorize(
        Operation.CLUSTER_ACTION, ResourceType.CLUSTER, CLUSTER_NAME, log_if_denied=False))
    # What the coordinator holds for the producer ids of a client's markers: one pass over its transactions.
    known = {} if trusted else broker.transactions.coordinator.producer_transactions(
        {m.producer_id for m in request.markers})
    for marker in request.markers:
        out = mcls(producer_id=marker.producer_id)
        response.markers.append(out)
        strict = ctx.api_version >= 2 and marker.transaction_version >= 2
        never_handed_out = not trusted and not broker.producer_ids.handed_out(marker.producer_id)
        txn = known.get(marker.producer_id)
        for t in marker.topics:
            out_topic = tcls(name=t.name)
            out.topics.append(out_topic)
            for index in t.partition_indexes:
                result = pcls(partition_index=index)
                out_topic.partitions.append(result)
                if t.name in INTERNAL_TOPICS and not trusted:
                    result.error_code = E.CLUSTER_AUTHORIZATION_FAILED.code
                    continue
                partition = led_partition_named(broker, t.name, index)
                if partition is None or type(partition) is NotLeader:
                    result.error_code = E.UNKNOWN_TOPIC_OR_PARTITION.code if partition is None else partition.error_code
                    continue
                if partition.storage_error:
                    result.error_code = E.KAFKA_STORAGE_ERROR.code
                    continue
                error, _ = partition.producers.check_marker(marker.producer_id, marker.producer_epoch,
                                                            marker.coordinator_epoch, strict_epoch=strict)
                if not error and never_handed_out:
                    error = E.UNKNOWN_PRODUCER_ID.code
                if not error and txn is not None:
                    error, _ = txn.check_marker(marker.producer_epoch, marker.transaction_result,
                                                marker.coordinator_epoch, (t.name, index))
                if error and trusted and strict and partition.runtime is None \
                        and partition.producers.marker_applied(marker.producer_id, marker.producer_epoch):
                    # The coordinator's V2 marker is already there (a client sent an exact copy of it first, or an
                    # fsync failed after the append): written, once what the partition holds is durable.
                    waits.append((result, _durable_through(broker, partition, partition.log.log_end_offset - 1)))
                    continue
                if error:
                    result.error_code = error
                    continue
                wait = _append_marker(broker, partition, marker, now)
                if wait is None:
                    result.error_code = E.KAFKA_STORAGE_ERROR.code
                else:
                    waits.append((result, wait))
    if not waits:
        return response

    async def wait_durable():
        for result, wait in waits:
            if not await wait():
                result.error_code = E.KAFKA_STORAGE_ERROR.code
        return response
    return Deferred(wait_durable)


def _durable_through(broker, partition, offset: int):
    """An async callable: True once ``partition`` is durable through ``offset``."""
    async def wait():
        return await broker.wait_durable(partition, offset)
    return wait


def _append_marker(broker, partition, marker, now: int):
    """Append one marker and apply it to producer state → an async callable: True once durable; None if not written."""
    commit = marker.transaction_result
    runtime = partition.runtime
    if runtime is not None:          # a coordinator's log: the runtime appends it and replays it in log order
        staged = runtime.stage_marker(marker.producer_id, marker.producer_epoch, commit, marker.coordinator_epoch)
        target, failed = staged
        if failed:
            return None
        offset = target

        async def wait():
            return await runtime.complete(staged)
    else:
        batch = bytearray(records.build_control_batch(
            commit, producer_id=marker.producer_id, producer_epoch=marker.producer_epoch,
            coordinator_epoch=marker.coordinator_epoch, timestamp=now,
            partition_leader_epoch=partition.leader_epoch))
        try:
            offset, _, _ = partition.log.append(batch, records.validate_batches(batch), now)
        except OSError as e:
            broker.storage_failed(partition, e)
            return None
        broker.appended(partition)
        wait = _durable_through(broker, partition, offset)
    first_offset = partition.producers.commit_end_txn(marker.producer_id, marker.producer_epoch, offset, now,
                                                      marker.coordinator_epoch)
    if not commit and first_offset is not None:
        partition.log.add_aborted_txn(AbortedTxn(marker.producer_id, first_offset, offset,
                                                 partition.last_stable_offset()))
    return wait
