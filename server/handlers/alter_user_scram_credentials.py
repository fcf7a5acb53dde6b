"""AlterUserScramCredentials: adds, replaces and deletes users' SCRAM credentials, durably (records in __cluster_metadata), with Kafka's validation.

Behaviour / version notes:
- v0.  ALTER on the Cluster first, else CLUSTER_AUTHORIZATION_FAILED (31) for every user named.
  Otherwise one result per user, in the order users first appear (deletions, then upsertions), as
  Kafka's ScramControlManager decides:
  - a user named more than once (whatever the mechanisms) → DUPLICATE_RESOURCE, and nothing of
    theirs changes;
  - an empty user name → UNACCEPTABLE_CREDENTIAL; a mechanism other than 1 (SCRAM-SHA-256) or 2
    (SCRAM-SHA-512) → UNSUPPORTED_SASL_MECHANISM;
  - an upsertion with fewer than 4096 or more than 16384 iterations → UNACCEPTABLE_CREDENTIAL;
    ours: a salt or salted password over 1024 bytes, or a new credential past 100,000 kept, too;
  - deleting a credential that does not exist → RESOURCE_NOT_FOUND.
- The broker keeps the salt, StoredKey and ServerKey (derived from the salted password the client
  sends) and the iterations, never a password.  Changes are answered once durable and in force (the
  next SCRAM login uses them); if the log cannot be written, KAFKA_STORAGE_ERROR for those users.
  The users changed are logged by name (trireme.security), nothing else of theirs.
"""
from __future__ import annotations

import logging

from trireme.server.cluster_metadata import MetadataUnavailable
from trireme.server.deferred import Deferred
from trireme.server.dispatch import handles
from trireme.state.acls import CLUSTER_NAME, Operation, ResourceType
from trireme.wire import error_codes as E

from .describe_acls import CLUSTER_DENIED

log = logging.getLogger("trireme.security")


@handles("AlterUserScramCredentials", 0, 0)
def alter_user_scram_credentials(ctx, request):
    response = ctx.response()
    rcls = type(response).AlterUserScramCredentialsResult
    users = list(dict.fromkeys([d.name for d in request.deletions] + [u.name for u in request.upsertions]))
    if not ctx.authorize(Operation.ALTER, ResourceType.CLUSTER, CLUSTER_NAME):
        response.results = [rcls(user=u, error_code=E.CLUSTER_AUTHORIZATION_FAILED.code, error_message=CLUSTER_DENIED)
                            for u in users]
        return response
    scram = ctx.broker.security.scram
    deletions = [(d.name, d.mechanism) for d in request.deletions]
    upsertions = [(u.name, u.mechanism, u.iterations, bytes(u.salt), bytes(u.salted_password))
                  for u in request.upsertions]

    async def alter():
        try:
            results = await ctx.broker.security.update(lambda: scram.alter(deletions, upsertions))
        except MetadataUnavailable as e:
            response.results = [rcls(user=u, error_code=E.KAFKA_STORAGE_ERROR.code,
                                     error_message=f"credentials not stored: {e}") for u in users]
            return response
        response.results = [rcls(user=r.user, error_code=getattr(E, r.error).code if r.error else 0,
                                 error_message=r.message) for r in results]
        changed = [r.user for r in results if not r.error]
        if changed:      # names only: never a salt, key or salted password
            log.info("SCRAM credentials changed for users=%r (by %r from %s)", changed, ctx.principal,
                     ctx.host)
        return response
    return Deferred(alter)
