"""AlterUserScramCredentials: there is no SASL/SCRAM here, so each user's change is refused and nothing is stored.

Behaviour / version notes:
- v0.  One result per user named by the deletions and upsertions (first appearance order):
  UNSUPPORTED_SASL_MECHANISM with a message — Kafka's answer for a mechanism it does not offer;
  here none is (DescribeUserScramCredentials answers RESOURCE_NOT_FOUND for every user).  A user
  named more than once → DUPLICATE_RESOURCE, as Kafka answers.  Until SASL exists (the security
  issue).
"""
from __future__ import annotations

from collections import Counter

from trireme.server.dispatch import handles
from trireme.wire import error_codes as E


@handles("AlterUserScramCredentials", 0, 0)
def alter_user_scram_credentials(ctx, request):
    response = ctx.response()
    rcls = type(response).AlterUserScramCredentialsResult
    counts = Counter([d.name for d in request.deletions] + [u.name for u in request.upsertions])
    for user, count in counts.items():
        if count > 1:
            error, message = E.DUPLICATE_RESOURCE, f"user {user} is named more than once in the request"
        else:
            error, message = E.UNSUPPORTED_SASL_MECHANISM, "SCRAM is not enabled on this broker (no SASL)"
        response.results.append(rcls(user=user, error_code=error.code, error_message=message))
    return response
