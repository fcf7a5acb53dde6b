"""CreateAcls: adds ACL bindings, durably (records in __cluster_metadata), with Kafka's validation and one result per binding.

Behaviour / version notes:
- v1-3.  ALTER on the Cluster first, else CLUSTER_AUTHORIZATION_FAILED (31) for every creation.
  With `authorizer.class.name` unset: SECURITY_DISABLED (54) per creation, "No Authorizer is
  configured.", nothing stored (as Kafka).
- Per binding, INVALID_REQUEST with Kafka's message for: a Cluster resource not named
  `kafka-cluster`, an empty name, resource type ANY/UNKNOWN, pattern type other than LITERAL or
  PREFIXED, operation ANY/UNKNOWN, permission other than ALLOW/DENY, a principal without a colon
  (Kafka's AclApis and AclControlManager.validateNewAcl).  Ours: DELEGATION_TOKEN bindings are
  refused (no delegation tokens here), and past `trireme.max.acls` bindings POLICY_VIOLATION.
- A binding that exists already succeeds without change.  The others are written to
  `__cluster_metadata` and answered once durable and in force; if the log cannot be written,
  KAFKA_STORAGE_ERROR for the bindings that would have been added.  Each binding added is logged
  (trireme.security) with the principal and address that asked.
"""
from __future__ import annotations

import logging

from trireme.server.cluster_metadata import MetadataUnavailable
from trireme.server.deferred import Deferred
from trireme.server.dispatch import handles
from trireme.state.acls import CLUSTER_NAME, AclBinding, Operation, ResourceType
from trireme.wire import error_codes as E

from .describe_acls import CLUSTER_DENIED, NO_AUTHORIZER

log = logging.getLogger("trireme.security")


def refuse_all(response, items, rcls, error, message=None):
    response.results = [rcls(error_code=error.code, error_message=message) for _ in items]
    return response


@handles("CreateAcls", 1, 3)
def create_acls(ctx, request):
    response = ctx.response()
    rcls = type(response).AclCreationResult
    if not ctx.authorize(Operation.ALTER, ResourceType.CLUSTER, CLUSTER_NAME):
        return refuse_all(response, request.creations, rcls, E.CLUSTER_AUTHORIZATION_FAILED, CLUSTER_DENIED)
    security = ctx.broker.security
    if not security.authorizer_enabled:
        return refuse_all(response, request.creations, rcls, E.SECURITY_DISABLED, NO_AUTHORIZER)
    bindings = [AclBinding.of(c.resource_type, c.resource_name, c.resource_pattern_type, c.principal, c.host,
                              c.operation, c.permission_type) for c in request.creations]

    async def create():
        try:
            results = await security.update(lambda: security.acls.create(bindings))
        except MetadataUnavailable as e:
            return refuse_all(response, bindings, rcls, E.KAFKA_STORAGE_ERROR, f"ACLs not stored: {e}")
        response.results = [rcls(error_code=0, error_message=None) if r is None else
                            rcls(error_code=getattr(E, r[0]).code, error_message=r[1]) for r in results]
        for b, r in zip(bindings, results):
            if r is None:
                # repr: a name or principal holding a newline cannot start a forged log line
                log.info("ACL created: %r (by %r from %s)", str(b), ctx.principal, ctx.host)
        return response
    return Deferred(create)
