"""AddPartitionsToTxn: a transactional producer names the partitions it is about to write; the answer comes once that is durable.

Behaviour / version notes:
- v0-3 are the client form (one transaction; librdkafka sends v0, Java 3.9 and kafka-python up
  to v3).  v4-5 are the broker form: several transactions, each with VerifyOnly; Trireme's own
  produce path sends v5 VerifyOnly to the coordinator's broker (server/local_peer.py when that is
  this one; transactions.ask_coordinator) to check that a transactional
  batch's partition is in the producer's ongoing transaction (KIP-890 part 1), and v5 without
  VerifyOnly to add it (Produce v12+ and TxnOffsetCommit v5+ of a transactions V2 client, KIP-890
  part 2); such an add marks the transaction as a V2 one.
- Errors: unknown transactional id or another producer id → INVALID_PRODUCER_ID_MAPPING; another
  epoch → PRODUCER_FENCED (v2+; INVALID_PRODUCER_EPOCH below v2); a transition still being written
  or a transaction being committed/aborted → CONCURRENT_TRANSACTIONS (the client retries); a
  topic or partition that does not exist → UNKNOWN_TOPIC_OR_PARTITION for it and
  OPERATION_NOT_ATTEMPTED for the others, as Kafka.  A partition led by another broker exists:
  the coordinator checks the cluster's topics (Kafka's metadata cache), not who leads them.  v4+ put per-transaction errors in each result.
- Authorization (Kafka's handleAddPartitionsToTxnRequest).  The client form (v0-3) needs Write on
  the TransactionalId (else every partition → TRANSACTIONAL_ID_AUTHORIZATION_FAILED) and Write on each
  topic, asked once per topic: a topic without it → TOPIC_AUTHORIZATION_FAILED in each of its
  partitions (before any existence check), the other partitions OPERATION_NOT_ATTEMPTED, nothing
  added.  An internal topic (``__consumer_offsets``, ``__transaction_state``) is never among those a
  client may write (Kafka leaves them out of the check): always TOPIC_AUTHORIZATION_FAILED.  A client
  adds the offsets partition with AddOffsetsToTxn; the broker form (v4+) adds it for TxnOffsetCommit
  v5.  The broker form (v4+, several transactions) comes only from brokers: it needs ClusterAction on
  the cluster, else the response's ErrorCode is CLUSTER_AUTHORIZATION_FAILED with no results.
- Adding partitions starts the transaction (Empty/Complete → Ongoing, the start time is set).
- Answered once the record is staged and written to the OS (a process crash keeps it), not once
  it is fsynced (data partitions; the offsets partition of TxnOffsetCommit v5 waits): produce
  verification accepts a staged add, the producer's Produce waits for its own fsync, and at
  start-up a transaction whose data survived a power loss but whose add did not is aborted
  (TransactionService.abort_orphans).  One fsync less on every transaction's critical path.
- On a broker that does not lead ``__transaction_state``'s partition: NOT_COORDINATOR for every
  partition (COORDINATOR_LOAD_IN_PROGRESS while it opens it), the verification too.
"""
from trireme.server.deferred import Deferred
from trireme.server.dispatch import handles
from trireme.server.groups import OFFSETS_TOPIC
from trireme.server.handlers import unauthorized
from trireme.server.routing import led_partition_named
from trireme.server.transactions import error_for_version
from trireme.state.acls import CLUSTER_NAME, Operation, ResourceType
from trireme.state.topics import INTERNAL_TOPICS
from trireme.wire import error_codes as E

FENCED_SINCE = 2


@handles("AddPartitionsToTxn", 0, 5)
def add_partitions_to_txn(ctx, request):
    broker = ctx.broker
    response = ctx.response()
    rcls = type(response).AddPartitionsToTxnTopicResult
    pcls = rcls.AddPartitionsToTxnPartitionResult
    version = ctx.api_version

    def results(topics, errors):
        return [rcls(name=t.name, results_by_partition=[
            pcls(partition_index=p, partition_error_code=error_for_version(errors[(t.name, p)], version, FENCED_SINCE))
            for p in t.partitions]) for t in topics]

    def unknown(topics, denied=frozenset()) -> dict | None:
        """Errors for partitions that cannot be added (and OPERATION_NOT_ATTEMPTED for the rest), or None.
        ``denied``: the topics the client may not write."""
        def refused(topic: str, index: int) -> int:
            if topic in denied:
                return E.TOPIC_AUTHORIZATION_FAILED.code
            # as Kafka's coordinator (its metadata cache): the partition exists, whichever broker leads it
            return E.UNKNOWN_TOPIC_OR_PARTITION.code if led_partition_named(broker, topic, index) is None else 0
        errors = {(t.name, p): refused(t.name, p) for t in topics for p in t.partitions}
        if not any(errors.values()):
            return None
        return {tp: error or E.OPERATION_NOT_ATTEMPTED.code for tp, error in errors.items()}

    txns = broker.transactions
    if version <= 3:
        topics = request.v3_and_below_topics
        tid = request.v3_and_below_transactional_id
        if not ctx.authorize(Operation.WRITE, ResourceType.TRANSACTIONAL_ID, tid):
            denied = E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED.code
            response.results_by_topic_v3_and_below = results(topics, {(t.name, p): denied for t in topics
                                                                      for p in t.partitions})
            return response
        names = {t.name for t in topics}
        errors = unknown(topics, unauthorized(ctx, Operation.WRITE, ResourceType.TOPIC, names - INTERNAL_TOPICS)
                         | (names & INTERNAL_TOPICS))
        if errors is not None:
            response.results_by_topic_v3_and_below = results(topics, errors)
            return response

        async def add():
            outcome = await txns.add_partitions(request.v3_and_below_transactional_id,
                                                request.v3_and_below_producer_id,
                                                request.v3_and_below_producer_epoch,
                                                [(t.name, p) for t in topics for p in t.partitions],
                                                answer_when_staged=True)
            response.results_by_topic_v3_and_below = results(topics, outcome.partition_errors)
            return response
        return Deferred(add)

    if not ctx.authorize(Operation.CLUSTER_ACTION, ResourceType.CLUSTER, CLUSTER_NAME):
        response.error_code = E.CLUSTER_AUTHORIZATION_FAILED.code
        return response
    xcls = type(response).AddPartitionsToTxnResult
    if all(txn.verify_only for txn in request.transactions):
        for txn in request.transactions:
            errors = unknown(txn.topics) or txns.coordinator.verify_partitions(
                txn.transactional_id, txn.producer_id, txn.producer_epoch,
                [(t.name, p) for t in txn.topics for p in t.partitions])
            response.results_by_transaction.append(xcls(transactional_id=txn.transactional_id,
                                                        topic_results=results(txn.topics, errors)))
        return response

    async def add_all():
        for txn in request.transactions:
            pairs = [(t.name, p) for t in txn.topics for p in t.partitions]
            errors = unknown(txn.topics)
            if errors is None and txn.verify_only:
                errors = txns.coordinator.verify_partitions(txn.transactional_id, txn.producer_id,
                                                            txn.producer_epoch, pairs)
            elif errors is None:
                errors = (await txns.add_partitions(txn.transactional_id, txn.producer_id, txn.producer_epoch,
                                                    pairs, implicit=True,
                                                    answer_when_staged=OFFSETS_TOPIC not in {t for t, _ in pairs})
                          ).partition_errors
            response.results_by_transaction.append(xcls(transactional_id=txn.transactional_id,
                                                        topic_results=results(txn.topics, errors)))
        return response
    return Deferred(add_all)
