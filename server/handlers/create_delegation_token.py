"""CreateDelegationToken: refused as a Kafka broker without delegation tokens refuses it.

Behaviour / version notes:
- v1-3 (definition in wire/definitions: kafka-python lacks it).  Kafka allows delegation-token
  requests only over an authenticated (SASL, or SSL with client certificates) connection; on
  PLAINTEXT (and 1-way SSL: principal User:ANONYMOUS) it answers DELEGATION_TOKEN_REQUEST_NOT_ALLOWED
  before anything else, with the owner (the one named in v3+, else the requester) and requester
  principals, timestamps -1, an empty token id and HMAC.
- On an authenticated connection, as Kafka's controller without delegation.token.secret.key:
  creating a token for another owner needs CreateTokens on that User (else
  DELEGATION_TOKEN_AUTHORIZATION_FAILED, the same fields as above); otherwise
  DELEGATION_TOKEN_AUTH_DISABLED with the principals, timestamps 0, an empty token id and HMAC.
  Delegation tokens are not supported here (the DelegationToken resource type is refused).
"""
from __future__ import annotations

from trireme.server.dispatch import handles
from trireme.state.acls import Operation, ResourceType
from trireme.wire import error_codes as E

NO_TIMESTAMP = -1
ANONYMOUS = "User:ANONYMOUS"


def token_requests_allowed(ctx) -> bool:
    """Kafka's allowTokenRequests: not on PLAINTEXT nor 1-way SSL, whose principal is always User:ANONYMOUS here
    (no token-authenticated principal exists: there are no delegation tokens)."""
    return ctx.principal != ANONYMOUS


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
    if token_requests_allowed(ctx):
        if (owner_type, owner_name) != (requester_type, requester_name) and \
                not ctx.authorize(Operation.CREATE_TOKENS, ResourceType.USER, f"{owner_type}:{owner_name}"):
            error, stamp = E.DELEGATION_TOKEN_AUTHORIZATION_FAILED, NO_TIMESTAMP
        else:
            error, stamp = E.DELEGATION_TOKEN_AUTH_DISABLED, 0
        return ctx.response(error_code=error.code, principal_type=owner_type, principal_name=owner_name,
                            token_requester_principal_type=requester_type,
                            token_requester_principal_name=requester_name, issue_timestamp_ms=stamp,
                            expiry_timestamp_ms=stamp, max_timestamp_ms=stamp, token_id="", hmac=b"")
    return ctx.response(error_code=E.DELEGATION_TOKEN_REQUEST_NOT_ALLOWED.code, principal_type=owner_type,
                        principal_name=owner_name, token_requester_principal_type=requester_type,
                        token_requester_principal_name=requester_name, issue_timestamp_ms=NO_TIMESTAMP,
                        expiry_timestamp_ms=NO_TIMESTAMP, max_timestamp_ms=NO_TIMESTAMP, token_id="", hmac=b"")
