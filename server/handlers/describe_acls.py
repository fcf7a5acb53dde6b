"""DescribeAcls: the ACLs a filter matches, grouped by resource pattern; SECURITY_DISABLED without an authorizer, as Kafka.

Behaviour / version notes:
- v1-3.  Kafka's AclApis: DESCRIBE on the Cluster first (else CLUSTER_AUTHORIZATION_FAILED (31) for
  the whole answer), then, with `authorizer.class.name` unset, SECURITY_DISABLED (54) with the
  message "No Authorizer is configured." and no resources (kafka-python raises
  SecurityDisabledError, the Java Admin SecurityDisabledException).
- The filter (Kafka's AclBindingFilter): resource type, name (null: any), pattern type (ANY,
  MATCH — the LITERAL and PREFIXED patterns that apply to the name, the wildcard `*` among them —
  LITERAL or PREFIXED), principal and host (null: any; otherwise exact), operation and permission
  (ANY or exact).  A filter field Kafka reads as UNKNOWN (code 0 or one it does not know) →
  INVALID_REQUEST (Kafka fails the request's parse).
- Each resource pattern (type, name, pattern type) appears once with its ACLs (principal, host,
  operation, permission), in no particular order.
"""
from __future__ import annotations

from itertools import groupby

from trireme.server.dispatch import handles
from trireme.state.acls import CLUSTER_NAME, AclFilter, Operation, ResourceType
from trireme.wire import error_codes as E

NO_AUTHORIZER = "No Authorizer is configured."
# Kafka's answers carry the message of Errors.CLUSTER_AUTHORIZATION_FAILED's exception (ApiError.fromThrowable).
CLUSTER_DENIED = "Cluster authorization failed."


@handles("DescribeAcls", 1, 3)
def describe_acls(ctx, request):
    response = ctx.response(error_code=0, error_message=None, resources=[])
    if not ctx.authorize(Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME):
        response.error_code, response.error_message = E.CLUSTER_AUTHORIZATION_FAILED.code, CLUSTER_DENIED
        return response
    security = ctx.broker.security
    if not security.authorizer_enabled:
        response.error_code, response.error_message = E.SECURITY_DISABLED.code, NO_AUTHORIZER
        return response
    f = AclFilter.of(request.resource_type_filter, request.resource_name_filter, request.pattern_type_filter,
                     request.principal_filter, request.host_filter, request.operation, request.permission_type)
    problem = f.error()
    if problem is not None:
        response.error_code, response.error_message = E.INVALID_REQUEST.code, problem
        return response
    rcls = type(response).DescribeAclsResource
    acl = rcls.AclDescription
    pattern = lambda b: (b.resource_type, b.name, b.pattern_type)         # noqa: E731
    for (rtype, name, ptype), bindings in groupby(sorted(security.authorizer.acls(f), key=pattern), key=pattern):
        response.resources.append(rcls(resource_type=rtype, resource_name=name, pattern_type=ptype, acls=[
            acl(principal=b.principal, host=b.host, operation=b.operation, permission_type=b.permission)
            for b in bindings]))
    return response
