"""One module per Kafka API; each registers itself with the dispatcher."""


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
