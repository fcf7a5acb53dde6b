"""TxnOffsetCommit: a transactional producer stages a group's offsets in its transaction (KIP-98, KIP-447).

Behaviour / version notes:
- v0-5.  v3+ carry the consumer's generation, member id and instance id (KIP-447),
  checked as an OffsetCommit's would be (ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID,
  FENCED_INSTANCE_ID); a generation of -1 skips the check.
- The group's offsets partition must be in the producer's ongoing transaction (AddOffsetsToTxn):
  checked with the coordinator as a transactional produce is (KIP-890 part 1).  v5 (transactions
  V2, no AddOffsetsToTxn) asks the coordinator to add it instead (AddPartitionsToTxn without
  VerifyOnly), as a Produce v12 does.  Otherwise the coordinator's error (INVALID_TXN_STATE, INVALID_PRODUCER_ID_MAPPING, PRODUCER_FENCED /
  INVALID_PRODUCER_EPOCH below v2, CONCURRENT_TRANSACTIONS) for every partition.
- The offsets are appended to ``__consumer_offsets`` as a transactional batch of the producer and
  stay pending (invisible to OffsetFetch; UNSTABLE_OFFSET_COMMIT with RequireStable) until the
  transaction's marker is replayed: COMMIT makes them the committed offsets, ABORT drops them.
- Answered once the batch is durable; if it cannot be made durable → NOT_COORDINATOR.
- A broker that does not lead ``__consumer_offsets``' partition answers every partition NOT_COORDINATOR
  (COORDINATOR_LOAD_IN_PROGRESS while it opens it) before asking the transaction coordinator anything.
  The transaction coordinator is asked on its broker (transactions.ask_coordinator): at once by this
  broker's handlers when it is here, over the wire otherwise (NETWORK_EXCEPTION if it does not answer).
- Authorization first (Kafka's handleTxnOffsetCommitRequest): Write on the TransactionalId → else every
  partition TRANSACTIONAL_ID_AUTHORIZATION_FAILED; Read on the Group → else every partition
  GROUP_AUTHORIZATION_FAILED; Read on each topic (asked once per topic) → else its partitions
  TOPIC_AUTHORIZATION_FAILED while the others are committed.  When every topic is refused nothing is
  asked of the transaction coordinator (no verification, no v5 add) and nothing is staged.
"""
from trireme.server.deferred import Deferred
from trireme.server.dispatch import handles
from trireme.server.groups import OFFSETS_TOPIC
from trireme.server.handlers import unauthorized
from trireme.server.transactions import ask_coordinator, coordinator_here, error_for_version, verify_in_transaction
from trireme.state.acls import Operation, ResourceType
from trireme.wire import error_codes as E

FENCED_SINCE = 2
IMPLICIT_ADD_SINCE = 5


@handles("TxnOffsetCommit", 0, 5)
def txn_offset_commit(ctx, request):
    broker = ctx.broker
    version = ctx.api_version
    response = ctx.response()
    tcls = type(response).TxnOffsetCommitResponseTopic
    pcls = tcls.TxnOffsetCommitResponsePartition
    refused = 0
    if not ctx.authorize(Operation.WRITE, ResourceType.TRANSACTIONAL_ID, request.transactional_id):
        refused = E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED.code
    elif not ctx.authorize(Operation.READ, ResourceType.GROUP, request.group_id):
        refused = E.GROUP_AUTHORIZATION_FAILED.code
    denied = set() if refused else unauthorized(ctx, Operation.READ, ResourceType.TOPIC,
                                                 (t.name for t in request.topics))
    offsets = [(t.name, p.partition_index, p.committed_offset,
                p.committed_leader_epoch if version >= 2 else -1, p.committed_metadata)
               for t in request.topics if t.name not in denied for p in t.partitions]

    def answer(errors) -> object:
        def error(topic: str, index: int) -> int:
            if refused:
                return refused
            if topic in denied:
                return E.TOPIC_AUTHORIZATION_FAILED.code
            return error_for_version(errors.get((topic, index), 0), version, FENCED_SINCE)
        response.topics = [tcls(name=t.name, partitions=[
            pcls(partition_index=p.partition_index, error_code=error(t.name, p.partition_index))
            for p in t.partitions]) for t in request.topics]
        return response

    if refused or (denied and not offsets):
        return answer({})

    def stage(in_transaction: int):
        if in_transaction:
            return answer({(t, p): in_transaction for t, p, *_ in offsets})
        return _stage_offsets(ctx, request, offsets, answer)

    moved = broker.groups.coordinator.serving_error
    if moved:                           # the group coordinator is not here: nothing to ask the transaction's
        return answer({(t, p): moved for t, p, *_ in offsets})
    ids = (request.transactional_id, request.producer_id, request.producer_epoch, [(OFFSETS_TOPIC, 0)])
    if version < IMPLICIT_ADD_SINCE and coordinator_here(broker):
        return stage(verify_in_transaction(broker.local_peer, *ids)[(OFFSETS_TOPIC, 0)])

    async def ask_then_stage():
        errors = await ask_coordinator(broker, *ids, verify_only=version < IMPLICIT_ADD_SINCE)
        result = stage(errors[(OFFSETS_TOPIC, 0)])
        return await result.wait() if isinstance(result, Deferred) else result
    return Deferred(ask_then_stage)


def _stage_offsets(ctx, request, offsets, answer):
    """Stage the offsets as a transactional batch in ``__consumer_offsets`` → the answer, or a Deferred of it."""
    groups = ctx.broker.groups
    version = ctx.api_version
    generation = request.generation_id if version >= 3 else -1
    member_id = request.member_id if version >= 3 else ""
    instance_id = request.group_instance_id if version >= 3 else None
    results, records = groups.coordinator.txn_commit_offsets(
        request.transactional_id, request.group_id, request.producer_id, request.producer_epoch, generation,
        member_id, instance_id, offsets, ctx.now_ms())
    errors = {(r.topic, r.partition): r.error for r in results}
    if not records:
        return answer(errors)
    staged = groups.stage(records, producer_id=request.producer_id, producer_epoch=request.producer_epoch,
                          transactional=True)

    async def wait():
        if not await groups.complete(staged):
            return answer({tp: error or E.NOT_COORDINATOR.code for tp, error in errors.items()})
        return answer(errors)
    return Deferred(wait)
