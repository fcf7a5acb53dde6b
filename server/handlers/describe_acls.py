"""DescribeAcls: there is no authorizer, so the answer is SECURITY_DISABLED, as from a Kafka broker without one.

Behaviour / version notes:
- v1-3.  Whatever the filter: ErrorCode SECURITY_DISABLED (54) with a message, no resources —
  exactly what Kafka answers when `authorizer.class.name` is unset.  Admin UIs show "ACLs not
  enabled"; kafka-python's describe_acls raises SecurityDisabledError, the Java Admin's
  describeAcls fails with SecurityDisabledException.  CreateAcls/DeleteAcls answer the same way
  (create_acls.py, delete_acls.py).
"""
from __future__ import annotations

from trireme.server.dispatch import handles
from trireme.wire import error_codes as E

NO_AUTHORIZER = "No Authorizer is configured."


@handles("DescribeAcls", 1, 3)
def describe_acls(ctx, request):
    return ctx.response(error_code=E.SECURITY_DISABLED.code, resources=[],
                        error_message=NO_AUTHORIZER)
