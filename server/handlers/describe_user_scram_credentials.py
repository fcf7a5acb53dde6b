"""DescribeUserScramCredentials: no SCRAM credentials exist (there is no SASL), so named users are not found.

Behaviour / version notes:
- v0.  Users null or empty (all users): ErrorCode 0 and no results.
- Each named user: RESOURCE_NOT_FOUND with a message naming the user; a user named more than
  once: one result with DUPLICATE_RESOURCE, as Kafka answers.  Results follow the request's
  order of first appearance.  AlterUserScramCredentials is not advertised.
"""
from __future__ import annotations

from collections import Counter

from trireme.server.dispatch import handles
from trireme.wire import error_codes as E


@handles("DescribeUserScramCredentials", 0, 0)
def describe_user_scram_credentials(ctx, request):
    response = ctx.response(error_code=0, error_message=None, results=[])
    rcls = type(response).DescribeUserScramCredentialsResult
    counts = Counter(u.name for u in request.users or ())
    for user, count in counts.items():
        if count > 1:
            error, message = E.DUPLICATE_RESOURCE, f"user {user} is named more than once in the request"
        else:
            error, message = E.RESOURCE_NOT_FOUND, f"user {user} has no SCRAM credentials"
        response.results.append(rcls(user=user, error_code=error.code, error_message=message, credential_infos=[]))
    return response
