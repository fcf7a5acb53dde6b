"""ListTransactions: the coordinator's transactional ids, filtered (KIP-664, KIP-994, KIP-1152).

Behaviour / version notes:
- v0-2.  StateFilters (Kafka's state names; unknown names are echoed in UnknownStateFilters and
  match nothing), ProducerIdFilters, v1+ DurationFilter (only transactions started at least that
  many ms ago; -1: no filter), v2+ TransactionalIdPattern (a regular expression the whole id must
  match; an invalid one → INVALID_REGULAR_EXPRESSION).  Empty filters match everything.
"""
import re

from trireme.server.dispatch import handles
from trireme.state.txn_records import TxnState
from trireme.wire import error_codes as E

STATE_NAMES = {s.kafka_name for s in TxnState}


@handles("ListTransactions", 0, 2)
def list_transactions(ctx, request):
    txns = ctx.broker.transactions
    version = ctx.api_version
    response = ctx.response()
    scls = type(response).TransactionState
    pattern = None
    if version >= 2 and request.transactional_id_pattern:
        try:
            pattern = re.compile(request.transactional_id_pattern)
        except re.error:
            response.error_code = E.INVALID_REGULAR_EXPRESSION.code
            return response
    unknown = [s for s in request.state_filters if s not in STATE_NAMES]
    response.unknown_state_filters = unknown
    states = [s for s in request.state_filters if s in STATE_NAMES]
    if request.state_filters and not states:
        return response

    def answer():
        for meta in txns.coordinator.list(states, request.producer_id_filters,
                                          request.duration_filter if version >= 1 else -1, ctx.now_ms(), pattern):
            response.transaction_states.append(scls(transactional_id=meta.transactional_id,
                                                    producer_id=meta.producer_id,
                                                    transaction_state=meta.state.kafka_name))
        return response
    return txns.after_staged_writes(answer)
