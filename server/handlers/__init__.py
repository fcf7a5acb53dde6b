"""One module per Kafka API; each registers itself with the dispatcher."""
from __future__ import annotations

from trireme.state.acls import Operation, ResourceType

# Kafka's AclEntry.supportedOperations: the operations an authorized-operations bit set (Metadata, DescribeCluster,
# DescribeGroups, DescribeTopicPartitions) reports on, by resource type.
SUPPORTED_OPERATIONS: dict[ResourceType, tuple[Operation, ...]] = {
    ResourceType.TOPIC: (Operation.READ, Operation.WRITE, Operation.CREATE, Operation.DESCRIBE, Operation.DELETE,
                         Operation.ALTER, Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS),
    ResourceType.GROUP: (Operation.READ, Operation.DESCRIBE, Operation.DELETE, Operation.DESCRIBE_CONFIGS,
                         Operation.ALTER_CONFIGS),
    ResourceType.CLUSTER: (Operation.CREATE, Operation.CLUSTER_ACTION, Operation.DESCRIBE_CONFIGS,
                           Operation.ALTER_CONFIGS, Operation.IDEMPOTENT_WRITE, Operation.ALTER, Operation.DESCRIBE),
    ResourceType.TRANSACTIONAL_ID: (Operation.DESCRIBE, Operation.WRITE),
    ResourceType.DELEGATION_TOKEN: (Operation.DESCRIBE,),
    ResourceType.USER: (Operation.CREATE_TOKENS, Operation.DESCRIBE_TOKENS),
}


def first_of_each(items, key=None) -> list:
    """``items`` without repeats (by ``key``, default the item), each kept where it first stands: what a handler
    answers must grow with what the request names, not with how often it names it."""
    seen = set()
    out = []
    for item in items:
        k = item if key is None else key(item)
        if k not in seen:
            seen.add(k)
            out.append(item)
    return out


def unauthorized(ctx, operation: Operation, resource_type: ResourceType, names, *,
                 log_if_denied: bool = True) -> set[str]:
    """The distinct names among ``names`` on which the request's principal may not do ``operation``: each name asked
    once however often the request repeats it, as Kafka's AuthHelper.filterByAuthorized."""
    return {name for name in set(names)
            if not ctx.authorize(operation, resource_type, name, log_if_denied=log_if_denied)}


def authorized_operations(ctx, resource_type: ResourceType, name: str) -> int:
    """Kafka's authorized-operations bit set of a resource for the request's principal: bit ``op`` set for each
    supported operation it may do (AuthHelper.authorizedOperations; denials are not counted)."""
    bits = 0
    for operation in SUPPORTED_OPERATIONS[resource_type]:
        if ctx.authorize(operation, resource_type, name, log_if_denied=False):
            bits |= 1 << operation
    return bits
