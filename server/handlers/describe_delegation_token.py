"""DescribeDelegationToken: refused as a Kafka broker refuses it on a PLAINTEXT listener (the only kind here).

Behaviour / version notes:
- v1-3 (definition in wire/definitions).  DELEGATION_TOKEN_REQUEST_NOT_ALLOWED and no tokens, Kafka's
  answer over an unauthenticated connection, whatever the owners asked for (see
  create_delegation_token.py).
"""
from __future__ import annotations

from trireme.server.dispatch import handles
from trireme.wire import error_codes as E


@handles("DescribeDelegationToken", 1, 3)
def describe_delegation_token(ctx, request):
    return ctx.response(error_code=E.DELEGATION_TOKEN_REQUEST_NOT_ALLOWED.code, tokens=[])
