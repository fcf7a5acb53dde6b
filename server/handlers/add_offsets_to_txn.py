"""AddOffsetsToTxn: a transactional producer is about to commit a group's offsets in its transaction (KIP-98, KIP-447).

Behaviour / version notes:
- v0-4.  Adds the group's ``__consumer_offsets`` partition (this node keeps one) to the
  transaction, so that EndTxn writes a marker there too; TxnOffsetCommit then stages the offsets.
- Errors as AddPartitionsToTxn: INVALID_PRODUCER_ID_MAPPING, PRODUCER_FENCED (v2+; below v2
  INVALID_PRODUCER_EPOCH), CONCURRENT_TRANSACTIONS; an empty group id → INVALID_GROUP_ID.
- Authorization first (Kafka's handleAddOffsetsToTxnRequest): Write on the TransactionalId → else
  TRANSACTIONAL_ID_AUTHORIZATION_FAILED; then Read on the Group → else GROUP_AUTHORIZATION_FAILED.
  Refused, nothing is added to the transaction.
- On a broker that does not lead ``__transaction_state``'s partition: NOT_COORDINATOR
  (COORDINATOR_LOAD_IN_PROGRESS while it opens it).
"""
from trireme.server.deferred import Deferred
from trireme.server.dispatch import handles
from trireme.server.groups import OFFSETS_TOPIC
from trireme.server.transactions import error_for_version
from trireme.state.acls import Operation, ResourceType
from trireme.wire import error_codes as E

FENCED_SINCE = 2


@handles("AddOffsetsToTxn", 0, 4)
def add_offsets_to_txn(ctx, request):
    response = ctx.response()
    if not ctx.authorize(Operation.WRITE, ResourceType.TRANSACTIONAL_ID, request.transactional_id):
        response.error_code = E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED.code
        return response
    if not ctx.authorize(Operation.READ, ResourceType.GROUP, request.group_id):
        response.error_code = E.GROUP_AUTHORIZATION_FAILED.code
        return response
    if not request.group_id:
        response.error_code = E.INVALID_GROUP_ID.code
        return response

    async def add():
        outcome = await ctx.broker.transactions.add_partitions(
            request.transactional_id, request.producer_id, request.producer_epoch, [(OFFSETS_TOPIC, 0)])
        response.error_code = error_for_version(outcome.error, ctx.api_version, FENCED_SINCE)
        return response
    return Deferred(add)
