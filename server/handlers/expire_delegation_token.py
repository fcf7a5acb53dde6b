"""ExpireDelegationToken: refused as a Kafka broker without delegation tokens refuses it.

Behaviour / version notes:
- v1-2 (definition in wire/definitions).  DELEGATION_TOKEN_REQUEST_NOT_ALLOWED with expiry timestamp -1,
  Kafka's answer over an unauthenticated connection; on an authenticated one
  DELEGATION_TOKEN_AUTH_DISABLED with expiry timestamp 0, Kafka's controller's answer without
  delegation.token.secret.key (see create_delegation_token.py).  No ACL is checked before either.
"""
from __future__ import annotations

from trireme.server.dispatch import handles
from trireme.wire import error_codes as E

from .create_delegation_token import NO_TIMESTAMP, token_requests_allowed


@handles("ExpireDelegationToken", 1, 2)
def expire_delegation_token(ctx, request):
    if token_requests_allowed(ctx):
        return ctx.response(error_code=E.DELEGATION_TOKEN_AUTH_DISABLED.code, expiry_timestamp_ms=0)
    return ctx.response(error_code=E.DELEGATION_TOKEN_REQUEST_NOT_ALLOWED.code, expiry_timestamp_ms=NO_TIMESTAMP)
