"""AlterClientQuotas: there are no client quotas here, so each entry is refused and nothing is stored.

Behaviour / version notes:
- v0-1.  One result per entry, in order, echoing its entity: INVALID_REQUEST with a message saying
  quotas are not supported (Kafka, which always has quotas, would store them; DescribeClientQuotas
  here lists none, and accepting quotas that are never enforced would hide that).  validate_only
  changes nothing in the answer.  Until quotas exist (the security issue).
"""
from __future__ import annotations

from trireme.server.dispatch import handles
from trireme.wire import error_codes as E

NOT_SUPPORTED = "Client quotas are not supported by this broker."


@handles("AlterClientQuotas", 0, 1)
def alter_client_quotas(ctx, request):
    response = ctx.response()
    ecls = type(response).EntryData
    response.entries = [ecls(error_code=E.INVALID_REQUEST.code, error_message=NOT_SUPPORTED,
                             entity=[ecls.EntityData(entity_type=e.entity_type, entity_name=e.entity_name)
                                     for e in entry.entity])
                        for entry in request.entries]
    return response
