"""DeleteAcls: there is no authorizer, so each filter is answered SECURITY_DISABLED, as by a Kafka broker without one.

Behaviour / version notes:
- v1-3.  One result per filter, in order: SECURITY_DISABLED (54) with the message DescribeAcls
  gives and no matching ACLs.  Until ACLs exist (the security issue).
"""
from __future__ import annotations

from trireme.server.dispatch import handles
from trireme.wire import error_codes as E

from .describe_acls import NO_AUTHORIZER


@handles("DeleteAcls", 1, 3)
def delete_acls(ctx, request):
    response = ctx.response()
    rcls = type(response).DeleteAclsFilterResult
    response.filter_results = [rcls(error_code=E.SECURITY_DISABLED.code, error_message=NO_AUTHORIZER,
                                    matching_acls=[]) for _ in request.filters]
    return response
