"""FindCoordinator: this single node coordinates every group and every transactional id.

Behaviour / version notes:
- v0-6.  v0-3 carry one key (KeyType from v1); v4+ batch several keys in CoordinatorKeys, each
  answered on its own.  The coordinator's address: the advertised one of the listener the request came in on.
- Key type 0 (GROUP) and 1 (TRANSACTION) are answered with this node; any other key type
  (e.g. 2, share groups) → INVALID_REQUEST.  An empty group id → INVALID_REQUEST for that key.
- Authorization first (Kafka's getCoordinator), per key: a group needs Describe on the Group →
  GROUP_AUTHORIZATION_FAILED, a transactional id Describe on the TransactionalId →
  TRANSACTIONAL_ID_AUTHORIZATION_FAILED; the key is then answered with node -1, host "" and port -1
  and, as Kafka's error responses, the error's message ("Group authorization failed.",
  "Transactional Id authorization failed."; v4+ batches answer each key on its own, without a
  message, as Kafka does).
"""
from trireme.server.dispatch import handles
from trireme.server.listener import advertised_address
from trireme.state.acls import Operation, ResourceType
from trireme.wire import error_codes as E

GROUP, TRANSACTION = 0, 1
# What a key of each type needs, what it answers without it, and that error's message (Kafka's Errors.message()).
_REFUSALS = {
    GROUP: (ResourceType.GROUP, E.GROUP_AUTHORIZATION_FAILED.code, "Group authorization failed."),
    TRANSACTION: (ResourceType.TRANSACTIONAL_ID, E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED.code,
                  "Transactional Id authorization failed."),
}


@handles("FindCoordinator", 0, 6)
def find_coordinator(ctx, request):
    broker = ctx.broker
    response = ctx.response()
    key_type = request.key_type if ctx.api_version >= 1 else GROUP
    batched = ctx.api_version >= 4

    def answer(key: str) -> tuple[int, str | None]:
        refusal = _REFUSALS.get(key_type)
        if refusal is not None and not ctx.authorize(Operation.DESCRIBE, refusal[0], key):
            resource_type, error, message = refusal
            return error, None if batched else message
        if key_type not in (GROUP, TRANSACTION):
            return E.INVALID_REQUEST.code, f"key type {key_type} is not supported"
        if not key:
            return E.INVALID_REQUEST.code, "the coordinator key is empty"
        return 0, None

    host, port = advertised_address(ctx)
    if batched:
        cls = type(response).Coordinator
        for key in request.coordinator_keys:
            error, message = answer(key)
            response.coordinators.append(cls(key=key, node_id=broker.node_id if not error else -1,
                                             host=host if not error else "",
                                             port=port if not error else -1,
                                             error_code=error, error_message=message))
        return response
    error, message = answer(request.key)
    response.error_code, response.error_message = error, message
    if error:
        response.node_id, response.host, response.port = -1, "", -1
    else:
        response.node_id, response.host, response.port = broker.node_id, host, port
    return response
