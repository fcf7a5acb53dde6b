"""DeleteAcls: removes the ACLs each filter matches, durably, and lists them per filter; SECURITY_DISABLED without an authorizer.

Behaviour / version notes:
- v1-3.  ALTER on the Cluster first, else CLUSTER_AUTHORIZATION_FAILED (31) for every filter.
  With `authorizer.class.name` unset: SECURITY_DISABLED (54) per filter, "No Authorizer is
  configured.", no matching ACLs (as Kafka).
- Filters as DescribeAcls reads them (describe_acls.py; MATCH deletes every pattern that applies to
  the name).  A filter with a field Kafka reads as UNKNOWN → INVALID_REQUEST for that filter.
- Each filter's result lists every binding it matched (error 0 each); a binding several filters
  match is listed under each and removed once.  The removals are written to `__cluster_metadata`
  and answered once durable and in force; if the log cannot be written, KAFKA_STORAGE_ERROR per
  filter and nothing is listed.  Each binding removed is logged (trireme.security).
"""
from __future__ import annotations

import logging

from trireme.server.cluster_metadata import MetadataUnavailable
from trireme.server.deferred import Deferred
from trireme.server.dispatch import handles
from trireme.state.acls import CLUSTER_NAME, AclFilter, Operation, ResourceType
from trireme.wire import error_codes as E

from .describe_acls import CLUSTER_DENIED, NO_AUTHORIZER

log = logging.getLogger("trireme.security")


def refuse_all(response, request, error, message=None):
    """The answer refusing every filter of ``request`` (also a forwarded request's, server/forwarding.py)."""
    rcls = type(response).DeleteAclsFilterResult
    response.filter_results = [rcls(error_code=error.code, error_message=message, matching_acls=[])
                               for _ in request.filters]
    return response


@handles("DeleteAcls", 1, 3)
def delete_acls(ctx, request):
    response = ctx.response()
    rcls = type(response).DeleteAclsFilterResult
    mcls = rcls.DeleteAclsMatchingAcl

    if not ctx.authorize(Operation.ALTER, ResourceType.CLUSTER, CLUSTER_NAME):
        return refuse_all(response, request, E.CLUSTER_AUTHORIZATION_FAILED, CLUSTER_DENIED)
    security = ctx.broker.security
    if not security.authorizer_enabled:
        return refuse_all(response, request, E.SECURITY_DISABLED, NO_AUTHORIZER)
    filters = [AclFilter.of(f.resource_type_filter, f.resource_name_filter, f.pattern_type_filter, f.principal_filter,
                            f.host_filter, f.operation, f.permission_type) for f in request.filters]

    async def delete():
        try:
            results = await security.update(lambda: security.acls.delete(filters))
        except MetadataUnavailable as e:
            return refuse_all(response, request, E.KAFKA_STORAGE_ERROR, f"ACLs not deleted: {e}")
        for r in results:
            if isinstance(r, tuple):
                response.filter_results.append(rcls(error_code=getattr(E, r[0]).code, error_message=r[1],
                                                     matching_acls=[]))
                continue
            for b in r:
                # repr: a name or principal holding a newline cannot start a forged log line
                log.info("ACL deleted: %r (by %r from %s)", str(b), ctx.principal, ctx.host)
            response.filter_results.append(rcls(error_code=0, error_message=None, matching_acls=[
                mcls(error_code=0, error_message=None, resource_type=b.resource_type, resource_name=b.name,
                     pattern_type=b.pattern_type, principal=b.principal, host=b.host, operation=b.operation,
                     permission_type=b.permission) for b in r]))
        return response
    return Deferred(delete)
