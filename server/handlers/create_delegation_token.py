"""CreateDelegationToken: refused as a Kafka broker refuses it on a PLAINTEXT listener (the only kind here).

Behaviour / version notes:
- v1-3 (definition in wire/definitions: kafka-python lacks it).  Kafka allows delegation-token
  requests only over an authenticated (SASL, or SSL with client certificates) connection; on PLAINTEXT
  it answers DELEGATION_TOKEN_REQUEST_NOT_ALLOWED before anything else, with the owner (the one named
  in v3+, else the requester) and requester principals, timestamps -1, an empty token id and HMAC.
  Here every connection is PLAINTEXT and User:ANONYMOUS.  Until SASL exists (the security issue).
"""
from __future__ import annotations

from trireme.server.dispatch import handles
from trireme.wire import error_codes as E

NO_TIMESTAMP = -1


def split_principal(principal: str) -> tuple[str, str]:
    """``"User:alice"`` → ``("User", "alice")``."""
    kind, _, name = principal.partition(":")
    return kind, name


@handles("CreateDelegationToken", 1, 3)
def create_delegation_token(ctx, request):
    requester_type, requester_name = split_principal(ctx.principal)
    owner_type, owner_name = requester_type, requester_name
    if ctx.api_version >= 3 and request.owner_principal_name:
        owner_type, owner_name = request.owner_principal_type or "", request.owner_principal_name
    return ctx.response(error_code=E.DELEGATION_TOKEN_REQUEST_NOT_ALLOWED.code, principal_type=owner_type,
                        principal_name=owner_name, token_requester_principal_type=requester_type,
                        token_requester_principal_name=requester_name, issue_timestamp_ms=NO_TIMESTAMP,
                        expiry_timestamp_ms=NO_TIMESTAMP, max_timestamp_ms=NO_TIMESTAMP, token_id="", hmac=b"")
