"""EndTxn: commit or abort the producer's transaction; answered once the PREPARE record (the commit point) is durable.

Behaviour / version notes:
- v0-5.  librdkafka sends v0-1, Java 3.9 up to v4; v5 is transactions V2 (KIP-890 part 2), which the
  Java 4.x client uses once ApiVersions lists transaction.version >= 2 as finalized.
- v0-4 (classic): Ongoing → PrepareCommit/PrepareAbort, written and fsynced, then the answer; the
  markers are written to every partition of the transaction afterwards (WriteTxnMarkers), then
  CompleteCommit/CompleteAbort.  A retried EndTxn of a completed transaction with the same result →
  NONE.
- v5 (V2): the PREPARE record carries the producer epoch + 1 (at the last epoch: a new producer id at
  epoch 0), the markers carry it too, and the answer names the new id and epoch, which the client
  uses for its next transaction.  A retry names the epoch before the bump and gets the same new id
  and epoch back (NONE); an abort with no transaction open is allowed (it bumps the epoch).  Kafka's
  retry rules apply: the epoch the state already has is the next transaction's EndTxn.
- Errors, checked in Kafka 4.x's order (docs/transactions.md, "Order of checks"): INVALID_REQUEST
  (empty id), INVALID_PRODUCER_ID_MAPPING, PRODUCER_FENCED (v2+; INVALID_PRODUCER_EPOCH below v2),
  CONCURRENT_TRANSACTIONS while a transition of the id is in flight, its previous transaction's
  markers included (v5: before the producer checks, so an EndTxn sent as soon as the previous one
  returned waits instead of being fenced; the broker waits up to 5 s and tries again before
  answering it), INVALID_TXN_STATE for the opposite result of a completed transaction or for
  committing an Empty one.  Errors answer producer id and epoch -1.
- Authorization first (Kafka's handleEndTxnRequest): Write on the TransactionalId → else
  TRANSACTIONAL_ID_AUTHORIZATION_FAILED; the transaction is left as it was.
- On a broker that does not lead ``__transaction_state``'s partition: NOT_COORDINATOR
  (COORDINATOR_LOAD_IN_PROGRESS while it opens it).
"""
from trireme.server.deferred import Deferred
from trireme.server.dispatch import handles
from trireme.server.transactions import error_for_version
from trireme.state.acls import Operation, ResourceType
from trireme.wire import error_codes as E

FENCED_SINCE = 2
EPOCH_BUMP_SINCE = 5


@handles("EndTxn", 0, 5)
def end_txn(ctx, request):
    response = ctx.response(producer_id=-1, producer_epoch=-1)
    if not ctx.authorize(Operation.WRITE, ResourceType.TRANSACTIONAL_ID, request.transactional_id):
        response.error_code = E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED.code
        return response

    async def end():
        outcome = await ctx.broker.transactions.end_txn(
            request.transactional_id, request.producer_id, request.producer_epoch, request.committed,
            epoch_bump=ctx.api_version >= EPOCH_BUMP_SINCE)
        response.error_code = error_for_version(outcome.error, ctx.api_version, FENCED_SINCE)
        if outcome.error == 0:
            response.producer_id, response.producer_epoch = outcome.producer_id, outcome.producer_epoch
        return response
    return Deferred(end)
