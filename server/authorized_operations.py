"""Kafka's "authorized operations" bit sets (DescribeGroups, DescribeCluster, ...): which of a resource type's operations the principal may do.

As Kafka's AuthHelper.authorizedOperations: each operation Kafka supports on the resource type
(AclEntry.supportedOperations) is asked of the authorizer without counting a denial, and the allowed
ones become bit ``1 << operation code``.  Without an authorizer every supported operation is allowed.
"""
from __future__ import annotations

from trireme.state.acls import Operation as Op, ResourceType

SUPPORTED_OPERATIONS: dict[ResourceType, tuple[Op, ...]] = {
    ResourceType.TOPIC: (Op.READ, Op.WRITE, Op.CREATE, Op.DESCRIBE, Op.DELETE, Op.ALTER, Op.DESCRIBE_CONFIGS,
                         Op.ALTER_CONFIGS),
    ResourceType.GROUP: (Op.READ, Op.DESCRIBE, Op.DELETE, Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS),
    ResourceType.CLUSTER: (Op.CREATE, Op.CLUSTER_ACTION, Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS, Op.IDEMPOTENT_WRITE,
                           Op.ALTER, Op.DESCRIBE),
    ResourceType.TRANSACTIONAL_ID: (Op.DESCRIBE, Op.WRITE),
    ResourceType.DELEGATION_TOKEN: (Op.DESCRIBE,),
    ResourceType.USER: (Op.CREATE_TOKENS, Op.DESCRIBE_TOKENS),
}


def operations_bits(operations) -> int:
    """Kafka's 32-bit field of a set of operations (Utils.to32BitField)."""
    return sum(1 << int(op) for op in set(operations))


def authorized_operations(ctx, resource_type: ResourceType, name: str) -> int:
    """The bit set of the operations on (resource_type, name) that ``ctx``'s principal may do."""
    return operations_bits(op for op in SUPPORTED_OPERATIONS[resource_type]
                           if ctx.authorize(op, resource_type, name, log_if_denied=False))
