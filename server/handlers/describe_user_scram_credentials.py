"""DescribeUserScramCredentials: which SCRAM mechanisms (and iteration counts) each user has, never salts or keys.

Behaviour / version notes:
- v0.  DESCRIBE on the Cluster first, else CLUSTER_AUTHORIZATION_FAILED (31) as the top-level error
  and no results.
- Users null or empty: every user with a credential.  Otherwise each named user once, in the order
  they first appear: their mechanisms and iterations; RESOURCE_NOT_FOUND ("Attempt to describe a
  user credential that does not exist: NAME") without any; DUPLICATE_RESOURCE for a user named more
  than once (Kafka's ScramImage.describe).
"""
from __future__ import annotations

from trireme.server.dispatch import handles
from trireme.state.acls import CLUSTER_NAME, Operation, ResourceType
from trireme.wire import error_codes as E

from .describe_acls import CLUSTER_DENIED


@handles("DescribeUserScramCredentials", 0, 0)
def describe_user_scram_credentials(ctx, request):
    response = ctx.response(error_code=0, error_message=None, results=[])
    if not ctx.authorize(Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME):
        response.error_code, response.error_message = E.CLUSTER_AUTHORIZATION_FAILED.code, CLUSTER_DENIED
        return response
    rcls = type(response).DescribeUserScramCredentialsResult
    icls = rcls.CredentialInfo
    users = None if not request.users else [u.name for u in request.users]
    for r in ctx.broker.security.scram.describe(users):
        response.results.append(rcls(
            user=r.user, error_code=getattr(E, r.error).code if r.error else 0, error_message=r.message,
            credential_infos=[icls(mechanism=m, iterations=i) for m, i in r.credentials]))
    return response
