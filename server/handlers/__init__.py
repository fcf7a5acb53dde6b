"""One module per Kafka API; each registers itself with the dispatcher."""
from __future__ import annotations

from trireme.state.acls import Operation, ResourceType


def first_of_each(items, key=None) -> list:
    """``items`` without repeats (by ``key``, default the item), each kept where it first stands: what a handler
    answers must grow with what the request names, not with how often it names it."""
    seen = set()
    out = []
    for item in items:
        k = item if key is None else key(item)
        if k not in seen:
            seen.add(k)
            out.append(item)
    return out


def unauthorized(ctx, operation: Operation, resource_type: ResourceType, names, *,
                 log_if_denied: bool = True) -> set[str]:
    """The distinct names among ``names`` on which the request's principal may not do ``operation``: each name asked
    once however often the request repeats it, as Kafka's AuthHelper.filterByAuthorized."""
    return {name for name in set(names)
            if not ctx.authorize(operation, resource_type, name, log_if_denied=log_if_denied)}

