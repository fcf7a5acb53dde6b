"""RenewDelegationToken: refused as a Kafka broker refuses it on a PLAINTEXT listener (the only kind here).

Behaviour / version notes:
- v1-2 (definition in wire/definitions).  DELEGATION_TOKEN_REQUEST_NOT_ALLOWED with expiry timestamp -1,
  Kafka's answer over an unauthenticated connection (see create_delegation_token.py).
"""
from __future__ import annotations

from trireme.server.dispatch import handles
from trireme.wire import error_codes as E

from .create_delegation_token import NO_TIMESTAMP


@handles("RenewDelegationToken", 1, 2)
def renew_delegation_token(ctx, request):
    return ctx.response(error_code=E.DELEGATION_TOKEN_REQUEST_NOT_ALLOWED.code, expiry_timestamp_ms=NO_TIMESTAMP)
