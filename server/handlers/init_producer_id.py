"""InitProducerId: hands idempotent producers a producer id and epoch.

Behaviour / version notes:
- v0-6.  Without a transactional id: a fresh producer id (unique across restarts, reserved in
  blocks on disk) with epoch 0.  A request carrying an existing producer id and epoch (v3+,
  KIP-360) gets that id with the epoch bumped, which is how an idempotent producer recovers
  from OUT_OF_ORDER_SEQUENCE_NUMBER; if the epoch would overflow a new id is issued.
- With a transactional id: the transaction coordinator is not built yet and transactions are
  not advertised (no AddPartitionsToTxn/EndTxn), so stock clients do not ask; the answer is
  TRANSACTIONAL_ID_AUTHORIZATION_FAILED, an explicit refusal.
- transaction_timeout_ms is checked against transaction.max.timeout.ms only with a
  transactional id (INVALID_TRANSACTION_TIMEOUT): idempotent Java producers send Integer.MAX_VALUE.
"""
from trireme.server.dispatch import handles
from trireme.wire import error_codes as E

MAX_EPOCH = 32767


@handles("InitProducerId", 0, 6)
def init_producer_id(ctx, request):
    broker = ctx.broker
    response = ctx.response(producer_id=-1, producer_epoch=-1)
    if request.transactional_id is not None:
        if request.transaction_timeout_ms > broker.config["transaction.max.timeout.ms"]:
            response.error_code = E.INVALID_TRANSACTION_TIMEOUT.code
        else:
            response.error_code = E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED.code
        return response
    if ctx.api_version >= 3 and request.producer_id >= 0 and 0 <= request.producer_epoch < MAX_EPOCH - 1:
        response.producer_id = request.producer_id
        response.producer_epoch = request.producer_epoch + 1
        return response
    response.producer_id = broker.producer_ids.next_id()
    response.producer_epoch = 0
    return response
