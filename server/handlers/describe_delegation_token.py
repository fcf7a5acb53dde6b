"""DescribeDelegationToken: refused as a Kafka broker without delegation tokens refuses it.

Behaviour / version notes:
- v1-3 (definition in wire/definitions).  DELEGATION_TOKEN_REQUEST_NOT_ALLOWED and no tokens, Kafka's
  answer over an unauthenticated connection, whatever the owners asked for; on an authenticated one
  DELEGATION_TOKEN_AUTH_DISABLED and no tokens, Kafka's answer without delegation.token.secret.key
  (see create_delegation_token.py).  No ACL is checked before either.
"""
from __future__ import annotations

from trireme.server.dispatch import handles
from trireme.wire import error_codes as E

from .create_delegation_token import token_requests_allowed


@handles("DescribeDelegationToken", 1, 3)
def describe_delegation_token(ctx, request):
    error = E.DELEGATION_TOKEN_AUTH_DISABLED if token_requests_allowed(ctx) else E.DELEGATION_TOKEN_REQUEST_NOT_ALLOWED
    return ctx.response(error_code=error.code, tokens=[])
