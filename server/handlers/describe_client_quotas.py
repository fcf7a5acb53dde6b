"""DescribeClientQuotas: no client quotas are ever configured, so a valid filter matches nothing.

Behaviour / version notes:
- v0-1.  The filter is checked as Kafka checks it, each failure answering the whole request
  with an error and message and null entries: an empty entity type, or one named twice →
  INVALID_REQUEST; a type other than "user", "client-id", "ip" → UNSUPPORTED_VERSION (Kafka's
  code for it); match type 0 (exact) with a null match, 1 (default) or 2 (any) with a match,
  or another match type → INVALID_REQUEST; "ip" together with "user" or "client-id" →
  INVALID_REQUEST.
- A valid filter: ErrorCode 0 and no entries (AlterClientQuotas is not advertised; nothing is
  throttled).
"""
from __future__ import annotations

from trireme.server.dispatch import handles
from trireme.wire import error_codes as E

ENTITY_TYPES = ("user", "client-id", "ip")
MATCH_EXACT, MATCH_DEFAULT, MATCH_ANY = 0, 1, 2


def _filter_error(components) -> tuple[E.KafkaError, str] | None:
    seen = set()
    for c in components:
        if not c.entity_type:
            return E.INVALID_REQUEST, "an entity type is empty"
        if c.entity_type in seen:
            return E.INVALID_REQUEST, f"entity type {c.entity_type} appears more than once in the filter"
        seen.add(c.entity_type)
        if c.entity_type not in ENTITY_TYPES:
            return E.UNSUPPORTED_VERSION, f"unsupported entity type {c.entity_type}"
        if c.match_type == MATCH_EXACT and c.match is None:
            return E.INVALID_REQUEST, "an exact match needs a match string"
        if c.match_type in (MATCH_DEFAULT, MATCH_ANY) and c.match is not None:
            return E.INVALID_REQUEST, f"match type {c.match_type} takes no match string"
        if c.match_type not in (MATCH_EXACT, MATCH_DEFAULT, MATCH_ANY):
            return E.INVALID_REQUEST, f"unknown match type {c.match_type}"
    if "ip" in seen and seen & {"user", "client-id"}:
        return E.INVALID_REQUEST, "an ip filter cannot be combined with a user or client-id filter"
    return None


@handles("DescribeClientQuotas", 0, 1)
def describe_client_quotas(ctx, request):
    failed = _filter_error(request.components)
    if failed is not None:
        error, message = failed
        return ctx.response(error_code=error.code, error_message=message, entries=None)
    return ctx.response(error_code=0, error_message=None, entries=[])
