"""CreateAcls: there is no authorizer, so each creation is answered SECURITY_DISABLED, as by a Kafka broker without one.

Behaviour / version notes:
- v1-3.  One result per creation, in order: SECURITY_DISABLED (54) with the message DescribeAcls
  gives; nothing is stored.  Until ACLs exist (the security issue).
"""
from __future__ import annotations

from trireme.server.dispatch import handles
from trireme.wire import error_codes as E

from .describe_acls import NO_AUTHORIZER


@handles("CreateAcls", 1, 3)
def create_acls(ctx, request):
    response = ctx.response()
    rcls = type(response).AclCreationResult
    response.results = [rcls(error_code=E.SECURITY_DISABLED.code, error_message=NO_AUTHORIZER)
                        for _ in request.creations]
    return response
