"""DescribeTransactions: the coordinator's state of transactional ids (KIP-664).

Behaviour / version notes:
- v0.  Per id: state (Kafka's names: Empty, Ongoing, PrepareCommit, PrepareAbort,
  CompleteCommit, CompleteAbort, Dead, PrepareEpochFence), timeout, start time (-1 when no
  transaction was started), producer id and epoch, and the partitions of the transaction.
  Unknown id → TRANSACTIONAL_ID_NOT_FOUND.  Answers after every staged coordinator write is replayed.
- A broker that does not lead ``__transaction_state``'s partition answers each (authorized) id
  NOT_COORDINATOR (COORDINATOR_LOAD_IN_PROGRESS while it opens it), as Kafka.
- An id named twice is described once: each repeat of a transaction holding thousands of
  partitions would add all of them to the response again (clients never repeat an id).
- Authorization (Kafka's handleDescribeTransactionsRequest): Describe on each TransactionalId → else
  that id answers TRANSACTIONAL_ID_AUTHORIZATION_FAILED with the schema's defaults (before whether it
  exists is looked at); the partitions of a described transaction list only the topics the principal
  may Describe (each topic asked once per request).
"""
from trireme.server.dispatch import handles
from trireme.server.handlers import first_of_each
from trireme.state.acls import Operation, ResourceType
from trireme.wire import error_codes as E


@handles("DescribeTransactions", 0, 0)
def describe_transactions(ctx, request):
    txns = ctx.broker.transactions
    response = ctx.response()
    scls = type(response).TransactionState
    dcls = scls.TopicData

    described: dict[str, bool] = {}

    def may_describe(topic: str) -> bool:
        if topic not in described:
            described[topic] = ctx.authorize(Operation.DESCRIBE, ResourceType.TOPIC, topic)
        return described[topic]

    def answer():
        for transactional_id in first_of_each(request.transactional_ids):
            if not ctx.authorize(Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, transactional_id):
                response.transaction_states.append(scls(
                    error_code=E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED.code, transactional_id=transactional_id))
                continue
            if txns.coordinator.serving_error:
                response.transaction_states.append(scls(error_code=txns.coordinator.serving_error,
                                                        transactional_id=transactional_id))
                continue
            meta = txns.coordinator.describe(transactional_id)
            if meta is None:
                response.transaction_states.append(scls(
                    error_code=E.TRANSACTIONAL_ID_NOT_FOUND.code, transactional_id=transactional_id,
                    transaction_state="", transaction_timeout_ms=0, transaction_start_time_ms=-1,
                    producer_id=-1, producer_epoch=-1))
                continue
            v = meta.value
            topics: dict[str, list[int]] = {}
            for topic, index in v.partitions:
                if may_describe(topic):
                    topics.setdefault(topic, []).append(index)
            response.transaction_states.append(scls(
                transactional_id=transactional_id, transaction_state=v.state.kafka_name,
                transaction_timeout_ms=v.transaction_timeout_ms, transaction_start_time_ms=v.start_timestamp_ms,
                producer_id=v.producer_id, producer_epoch=v.producer_epoch,
                topics=[dcls(topic=t, partitions=p) for t, p in topics.items()]))
        return response
    return txns.after_staged_writes(answer)
