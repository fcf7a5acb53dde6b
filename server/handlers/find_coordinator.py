"""FindCoordinator: the broker that coordinates a group or a transactional id, the leader of its internal partition.

Behaviour / version notes:
- v0-6.  v0-3 carry one key (KeyType from v1); v4+ batch several keys in CoordinatorKeys, each
  answered on its own.
- Key type 0 (GROUP) is coordinated by the leader of `__consumer_offsets`' partition for the
  group id, 1 (TRANSACTION) by the leader of `__transaction_state`'s for the transactional id;
  the partition is Kafka's ``abs(key.hashCode()) % partitions`` (server/routing.py; each topic
  has one partition today, so the key does not matter yet).  The answer is that broker (from
  ``broker.cluster``) at its advertised address on the listener the request came in on; no live
  leader there → COORDINATOR_NOT_AVAILABLE with node -1, host "" and port -1 (v0-3 with the
  message "The coordinator is not available.", v4+ without), as Kafka.  With the local engine
  this node coordinates everything.  Any other key type (e.g. 2, share groups) →
  INVALID_REQUEST.  An empty group id → INVALID_REQUEST for that key.
- The coordinator handlers (JoinGroup, OffsetCommit, InitProducerId, ...) answer NOT_COORDINATOR
  on a broker that does not lead the partition (COORDINATOR_LOAD_IN_PROGRESS while it opens it):
  the client finds the coordinator again (docs/architecture.md, "Coordinators").
- Authorization first (Kafka's getCoordinator), per key: a group needs Describe on the Group →
  GROUP_AUTHORIZATION_FAILED, a transactional id Describe on the TransactionalId →
  TRANSACTIONAL_ID_AUTHORIZATION_FAILED; the key is then answered with node -1, host "" and port -1
  and, as Kafka's error responses, the error's message ("Group authorization failed.",
  "Transactional Id authorization failed."; v4+ batches answer each key on its own, without a
  message, as Kafka does).
"""
from trireme.server.dispatch import handles
from trireme.server.groups import OFFSETS_TOPIC
from trireme.server.routing import Endpoint, coordinator_endpoint
from trireme.server.transactions import TRANSACTION_STATE_TOPIC
from trireme.state.acls import Operation, ResourceType
from trireme.wire import error_codes as E

GROUP, TRANSACTION = 0, 1
_INTERNAL_TOPICS = {GROUP: OFFSETS_TOPIC, TRANSACTION: TRANSACTION_STATE_TOPIC}     # whose leaders coordinate
# What a key of each type needs, what it answers without it, and that error's message (Kafka's Errors.message()).
_REFUSALS = {
    GROUP: (ResourceType.GROUP, E.GROUP_AUTHORIZATION_FAILED.code, "Group authorization failed."),
    TRANSACTION: (ResourceType.TRANSACTIONAL_ID, E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED.code,
                  "Transactional Id authorization failed."),
}


@handles("FindCoordinator", 0, 6)
def find_coordinator(ctx, request):
    response = ctx.response()
    key_type = request.key_type if ctx.api_version >= 1 else GROUP
    batched = ctx.api_version >= 4

    def answer(key: str) -> tuple[int, str | None, Endpoint | None]:
        refusal = _REFUSALS.get(key_type)
        if refusal is not None and not ctx.authorize(Operation.DESCRIBE, refusal[0], key):
            resource_type, error, message = refusal
            return error, None if batched else message, None
        if key_type not in (GROUP, TRANSACTION):
            return E.INVALID_REQUEST.code, f"key type {key_type} is not supported", None
        if not key:
            return E.INVALID_REQUEST.code, "the coordinator key is empty", None
        coordinator = coordinator_endpoint(ctx, _INTERNAL_TOPICS[key_type], key)
        if coordinator is None:
            return E.COORDINATOR_NOT_AVAILABLE.code, None if batched else "The coordinator is not available.", None
        return 0, None, coordinator

    if batched:
        cls = type(response).Coordinator
        for key in request.coordinator_keys:
            error, message, node = answer(key)
            response.coordinators.append(cls(key=key, node_id=node.node_id if node else -1,
                                             host=node.host if node else "", port=node.port if node else -1,
                                             error_code=error, error_message=message))
        return response
    error, message, node = answer(request.key)
    response.error_code, response.error_message = error, message
    if node is None:
        response.node_id, response.host, response.port = -1, "", -1
    else:
        response.node_id, response.host, response.port = node.node_id, node.host, node.port
    return response
