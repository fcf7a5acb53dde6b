"""InitProducerId: hands idempotent and transactional producers a producer id and epoch.

Behaviour / version notes:
- v0-6.  Without a transactional id: a fresh producer id (unique across restarts, reserved in
  blocks in __cluster_metadata) with epoch 0.  A request carrying an existing producer id and epoch (v3+,
  KIP-360) gets that id with the epoch bumped, which is how an idempotent producer recovers
  from OUT_OF_ORDER_SEQUENCE_NUMBER; if the epoch would overflow a new id is issued.
- With a transactional id the transaction coordinator answers once its record is durable: a new
  id gets a producer id with epoch 0; a known one gets its epoch bumped (a new producer id when
  the epoch is exhausted).  An open transaction is fenced: the epoch is bumped, the transaction
  aborted with it, and the caller answered CONCURRENT_TRANSACTIONS until the abort completes (the
  client retries).  A prepared transaction (markers still being written) → CONCURRENT_TRANSACTIONS.
  v3+ ProducerId/ProducerEpoch that are neither the current ones nor the ones before the last bump
  → PRODUCER_FENCED (v4+; INVALID_PRODUCER_EPOCH below v4).
- transaction_timeout_ms above transaction.max.timeout.ms (or not positive) →
  INVALID_TRANSACTION_TIMEOUT, only with a transactional id: idempotent Java producers send
  Integer.MAX_VALUE.
- v6 (KIP-939): Enable2Pc is refused with TRANSACTIONAL_ID_AUTHORIZATION_FAILED unless
  transaction.two.phase.commit.enable is on (as on Kafka); a 2PC transaction never times out.
  KeepPreparedTxn (only with Enable2Pc, else INVALID_REQUEST) keeps an Ongoing ("prepared") transaction
  for the external coordinator to complete: the transaction keeps its producer id and epoch (its
  markers use them, reported as OngoingTxnProducerId/Epoch), the client gets the next epoch (stored
  as NextProducerId/NextProducerEpoch), which fences the instance before it; EndTxn with that pair
  completes the transaction.  (Kafka 4.3 still answers KeepPreparedTxn with UNSUPPORTED_VERSION,
  KAFKA-20739; this follows the KIP and the fix planned for 4.4.)
- Authorization first (Kafka's handleInitProducerIdRequest): with a transactional id, Write on that
  TransactionalId → else TRANSACTIONAL_ID_AUTHORIZATION_FAILED; without one (idempotence),
  IdempotentWrite on the cluster (a denial not counted) or Write on at least one topic
  (authorize_by_resource_type, as Kafka 3+) → else CLUSTER_AUTHORIZATION_FAILED.  Refused: producer
  id and epoch -1, no id handed out, no transaction touched.
- With a transactional id, on a broker that does not lead ``__transaction_state``'s partition:
  NOT_COORDINATOR (COORDINATOR_LOAD_IN_PROGRESS while it opens it).  Without one any broker answers.
"""
from trireme.server.deferred import Deferred
from trireme.server.dispatch import handles
from trireme.server.transactions import error_for_version
from trireme.state.acls import CLUSTER_NAME, Operation, ResourceType
from trireme.wire import error_codes as E

MAX_EPOCH = 32767
FENCED_SINCE = 4


@handles("InitProducerId", 0, 6)
def init_producer_id(ctx, request):
    broker = ctx.broker
    version = ctx.api_version
    response = ctx.response(producer_id=-1, producer_epoch=-1)
    refusal = _refusal(ctx, request.transactional_id)
    if refusal:
        response.error_code = refusal
        return response
    if request.transactional_id is not None:
        async def init():
            outcome = await broker.transactions.init_producer_id(
                request.transactional_id, request.transaction_timeout_ms,
                expected_producer_id=request.producer_id if version >= 3 else -1,
                expected_producer_epoch=request.producer_epoch if version >= 3 else -1,
                enable_2pc=version >= 6 and request.enable2_pc,
                keep_prepared_txn=version >= 6 and request.keep_prepared_txn)
            response.error_code = error_for_version(outcome.error, version, FENCED_SINCE)
            if not outcome.error:
                response.producer_id, response.producer_epoch = outcome.producer_id, outcome.producer_epoch
                if version >= 6:
                    response.ongoing_txn_producer_id = outcome.ongoing_producer_id
                    response.ongoing_txn_producer_epoch = outcome.ongoing_producer_epoch
            return response
        return Deferred(init)
    if version >= 3 and request.producer_id >= 0 and 0 <= request.producer_epoch < MAX_EPOCH - 1:
        response.producer_id = request.producer_id
        response.producer_epoch = request.producer_epoch + 1
        return response

    async def idempotent():
        producer_id = await broker.transactions.idempotent_producer_id()
        if producer_id is None:             # a new block of ids could not be reserved (disk full): retriable
            response.error_code = E.COORDINATOR_NOT_AVAILABLE.code
            return response
        response.producer_id, response.producer_epoch = producer_id, 0
        return response
    return Deferred(idempotent)


def _refusal(ctx, transactional_id: str | None) -> int:
    """The authorization error of this InitProducerId, or 0."""
    if transactional_id is not None:
        if ctx.authorize(Operation.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id):
            return 0
        return E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED.code
    if ctx.authorize(Operation.IDEMPOTENT_WRITE, ResourceType.CLUSTER, CLUSTER_NAME, log_if_denied=False):
        return 0
    if ctx.broker.security.authorize_by_resource_type(ctx.principal, ctx.host, Operation.WRITE, ResourceType.TOPIC):
        return 0
    ctx.broker.metrics.request_denied(ctx.principal, "InitProducerId", ResourceType.CLUSTER.name, CLUSTER_NAME)
    return E.CLUSTER_AUTHORIZATION_FAILED.code
