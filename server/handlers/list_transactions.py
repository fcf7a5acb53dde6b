"""ListTransactions: the coordinator's transactional ids, filtered (KIP-664, KIP-994, KIP-1152).

Behaviour / version notes:
- v0-2.  StateFilters (Kafka's state names; unknown names are echoed in UnknownStateFilters and
  match nothing), ProducerIdFilters, v1+ DurationFilter (only transactions running for longer
  than that many ms, as Kafka; -1: no filter), v2+ TransactionalIdPattern.  Empty filters match
  everything; ids being expired (Dead) are never listed.
- TransactionalIdPattern is a regular expression the whole id must match (Kafka: RE2/J,
  ``Pattern.matcher(id).matches()``).  It runs on RE2 (``google-re2``), a linear-time engine with
  the same syntax, so no pattern can backtrack for hours on the event loop as Python's ``re`` did.
  What RE2 cannot compile (back-references, look-around, a bad syntax) → INVALID_REGULAR_EXPRESSION,
  and so does a pattern whose compiled program needs more than PATTERN_MAX_MEM bytes (Kafka has no
  such bound; 1 MiB still holds an alternation of 1,000 literal ids).  The pattern itself is at
  most 32,767 bytes, as every string the codec reads.  Even linear matching costs ids × id
  length × program size, so the ids are matched in a worker thread (RE2 releases the GIL): the
  event loop goes on serving other clients.
- Only this broker's transactions: none where it does not lead ``__transaction_state``'s partition
  (Kafka lists the partitions a broker leads); COORDINATOR_LOAD_IN_PROGRESS while it opens it.
- Authorization (Kafka's handleListTransactionsRequest): only the transactional ids the principal may
  Describe are listed (each asked once; a left-out id is a counted denial, as Kafka logs it).
"""
import re2
import trio

from trireme.server.deferred import Deferred
from trireme.server.dispatch import handles
from trireme.state.acls import Operation, ResourceType
from trireme.state.txn_records import TxnState
from trireme.wire import error_codes as E

STATE_NAMES = {s.kafka_name for s in TxnState}
PATTERN_MAX_MEM = 1 << 20                 # RE2's budget for the compiled program


def compile_pattern(pattern: str):
    """The RE2 program for a client's pattern, or None if RE2 refuses it (or it is over the bound)."""
    options = re2.Options()
    options.log_errors = False            # RE2 would write each refused pattern to stderr
    options.max_mem = PATTERN_MAX_MEM
    try:
        return re2.compile(pattern, options)
    except re2.error:
        return None


@handles("ListTransactions", 0, 2)
def list_transactions(ctx, request):
    txns = ctx.broker.transactions
    version = ctx.api_version
    response = ctx.response()
    scls = type(response).TransactionState
    pattern = None
    if version >= 2 and request.transactional_id_pattern:
        pattern = compile_pattern(request.transactional_id_pattern)
        if pattern is None:
            response.error_code = E.INVALID_REGULAR_EXPRESSION.code
            return response
    if txns.coordinator.serving_error == E.COORDINATOR_LOAD_IN_PROGRESS.code:
        response.error_code = E.COORDINATOR_LOAD_IN_PROGRESS.code
        return response
    unknown = [s for s in request.state_filters if s not in STATE_NAMES]
    response.unknown_state_filters = unknown
    states = [s for s in request.state_filters if s in STATE_NAMES]
    if request.state_filters and not states:
        return response

    def listed():
        return [scls(transactional_id=meta.transactional_id, producer_id=meta.producer_id,
                     transaction_state=meta.state.kafka_name)
                for meta in txns.coordinator.list(states, request.producer_id_filters,
                                                  request.duration_filter if version >= 1 else -1, ctx.now_ms())]

    def authorized(listing):
        return [s for s in listing
                if ctx.authorize(Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, s.transactional_id)]

    if pattern is None:
        def answer():
            response.transaction_states = authorized(listed())
            return response
        return txns.after_staged_writes(answer)

    async def answer_matching():
        await txns.wait_replayed()
        candidates = listed()             # a snapshot taken on the event loop; the thread sees only these strings
        response.transaction_states = authorized(await trio.to_thread.run_sync(
            lambda: [s for s in candidates if pattern.fullmatch(s.transactional_id)]))
        return response
    return Deferred(answer_matching)
