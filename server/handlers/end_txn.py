"""EndTxn: commit or abort the producer's transaction; answered once the PREPARE record (the commit point) is durable.

Behaviour / version notes:
- v0-4 (the classic protocol; v5, transactions V2 with an epoch bump per transaction, is not
  offered while the transaction.version feature is not finalized at 2).  librdkafka sends v0-1.
- Ongoing → PrepareCommit/PrepareAbort, written and fsynced, then the answer; the markers are
  written to every partition of the transaction afterwards (WriteTxnMarkers), then CompleteCommit
  /CompleteAbort.  A retried EndTxn of a completed transaction with the same result → NONE.
- Errors: INVALID_PRODUCER_ID_MAPPING, PRODUCER_FENCED (v2+; INVALID_PRODUCER_EPOCH below v2),
  CONCURRENT_TRANSACTIONS while the previous one's markers are still being written (the client
  retries), INVALID_TXN_STATE for the opposite result of a prepared/completed transaction or
  for an Empty one.
"""
from trireme.server.deferred import Deferred
from trireme.server.dispatch import handles
from trireme.server.transactions import error_for_version

FENCED_SINCE = 2


@handles("EndTxn", 0, 4)
def end_txn(ctx, request):
    response = ctx.response(producer_id=-1, producer_epoch=-1)

    async def end():
        outcome = await ctx.broker.transactions.end_txn(request.transactional_id, request.producer_id,
                                                        request.producer_epoch, request.committed)
        response.error_code = error_for_version(outcome.error, ctx.api_version, FENCED_SINCE)
        return response
    return Deferred(end)
