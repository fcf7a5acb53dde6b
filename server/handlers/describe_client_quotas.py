"""DescribeClientQuotas: the client quotas whose entities match a filter, with their values.

Behaviour / version notes:
- v0-1.  Needs DescribeConfigs on the cluster: without it → CLUSTER_AUTHORIZATION_FAILED, null entries.
- The filter is checked as Kafka checks it, each failure answering the whole request with an error
  and message and null entries: an empty entity type, or one named twice → INVALID_REQUEST; a type
  other than "user", "client-id", "ip" → UNSUPPORTED_VERSION (Kafka's code for it); match type 0
  (exact) with a null match, 1 (default) or 2 (any) with a match, or another match type →
  INVALID_REQUEST; "ip" together with "user" or "client-id" → INVALID_REQUEST.
- Matching as Kafka's: an exact component needs the entity to have that name, a default one the
  type's default, an "any" one the type with any name (default included); ``strict`` also needs the
  entity to have no other type.  Each matching entity is listed with every quota it has (its
  components in the order user, client-id).
"""
from __future__ import annotations

from trireme.server.dispatch import handles
from trireme.state.acls import CLUSTER_NAME, Operation, ResourceType
from trireme.state.client_quotas import ENTITY_TYPES, QuotaError
from trireme.wire import error_codes as E


def _type_order(pair) -> int:
    return ENTITY_TYPES.index(pair[0]) if pair[0] in ENTITY_TYPES else len(ENTITY_TYPES)


@handles("DescribeClientQuotas", 0, 1)
def describe_client_quotas(ctx, request):
    if not ctx.authorize(Operation.DESCRIBE_CONFIGS, ResourceType.CLUSTER, CLUSTER_NAME):
        return ctx.response(error_code=E.CLUSTER_AUTHORIZATION_FAILED.code,
                            error_message="Cluster authorization failed.", entries=None)
    try:
        found = ctx.broker.security.client_quotas.describe(
            [(c.entity_type, c.match_type, c.match) for c in request.components], request.strict)
    except QuotaError as e:
        return ctx.response(error_code=getattr(E, e.error).code, error_message=e.message, entries=None)
    response = ctx.response(error_code=0, error_message=None)
    ecls = type(response).EntryData
    response.entries = [ecls(entity=[ecls.EntityData(entity_type=t, entity_name=n)
                                     for t, n in sorted(entity, key=_type_order)],
                             values=[ecls.ValueData(key=k, value=v) for k, v in sorted(values.items())])
                        for entity, values in sorted(found, key=lambda item: repr(item[0]))]
    return response
