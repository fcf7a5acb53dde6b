"""Hypothesis strategies that build random, valid objects of our codec's classes for any (message, version).

The strategies walk the FieldSpec tree from ``wire.schema`` so they follow Kafka's definitions
exactly: fields absent at a version keep their class default (they are not on the wire), ``None``
is only produced where the field is nullable at that version, integers stay inside their type's
range, strings/bytes/records are small, arrays hold 0-3 elements, and tagged fields are filled
like any other field (sometimes with their default, which the encoder then omits).
"""
from __future__ import annotations

from functools import lru_cache

from hypothesis import strategies as st

from trireme.wire.codec import message
from trireme.wire.primitives import ZERO_UUID
from trireme.wire.schema import FieldSpec, load_message

INT_RANGES = {
    "int8": (-(1 << 7), (1 << 7) - 1),
    "int16": (-(1 << 15), (1 << 15) - 1),
    "uint16": (0, (1 << 16) - 1),
    "int32": (-(1 << 31), (1 << 31) - 1),
    "uint32": (0, (1 << 32) - 1),
    "int64": (-(1 << 63), (1 << 63) - 1),
}

MAX_ARRAY = 3
MAX_TEXT = 6
MAX_BYTES = 8
MAX_RECORDS = 24


def _int(kind: str) -> st.SearchStrategy:
    lo, hi = INT_RANGES[kind]
    # Bias towards the interesting edges (0, -1, min, max) as well as random values.
    edges = sorted({lo, hi, 0, max(lo, -1), min(hi, 1)})
    return st.one_of(st.sampled_from(edges), st.integers(lo, hi))


_UUIDS = st.one_of(st.just(ZERO_UUID), st.uuids(allow_nil=True))
_TEXT = st.text(max_size=MAX_TEXT)


def scalar_strategy(type_name: str) -> st.SearchStrategy:
    """A strategy for one non-null value of a scalar Kafka type."""
    if type_name in INT_RANGES:
        return _int(type_name)
    if type_name == "bool":
        return st.booleans()
    if type_name == "float64":
        return st.floats(allow_nan=False, allow_infinity=True)
    if type_name == "string":
        return _TEXT
    if type_name == "bytes":
        return st.binary(max_size=MAX_BYTES)
    if type_name == "records":
        return st.binary(max_size=MAX_RECORDS)
    if type_name == "uuid":
        return _UUIDS
    raise NotImplementedError(type_name)


def field_strategy(parent_cls: type, field: FieldSpec, version: int) -> st.SearchStrategy:
    """A strategy for the value of ``field`` (present at ``version``) inside an object of ``parent_cls``."""
    nullable = field.is_nullable(version)
    if field.is_struct:
        elem = struct_strategy(getattr(parent_cls, field.type), field.fields, version)
    else:
        elem = scalar_strategy(field.type)
    if field.is_array:
        value = st.lists(elem, max_size=MAX_ARRAY)
    else:
        value = elem
    if nullable:
        value = st.one_of(st.none(), value)
    return value


def struct_strategy(cls: type, fields: list[FieldSpec], version: int) -> st.SearchStrategy:
    """Objects of ``cls`` with every field present at ``version`` drawn; the rest keep their defaults."""
    kwargs = {f.py_name: field_strategy(cls, f, version) for f in fields if f.present(version)}
    return st.builds(cls, **kwargs)


@lru_cache(maxsize=None)
def message_strategy(name: str, version: int) -> st.SearchStrategy:
    """Random valid objects of message ``name`` (e.g. ``"FetchRequest"``) at ``version``."""
    codec = message(name)
    spec = load_message(name)
    if version not in spec.valid:
        raise ValueError(f"{name} has no version {version}")
    return struct_strategy(codec.cls, spec.fields, version)


def local_message_names() -> list[str]:
    """Request/response definitions we ship ourselves under wire/definitions (e.g. LegacyProduceRequest)."""
    import importlib.resources
    try:
        entries = list(importlib.resources.files("trireme.wire.definitions").iterdir())
    except ModuleNotFoundError:
        return []
    names = []
    for entry in entries:
        if entry.name.endswith(("Request.json", "Response.json")):
            names.append(entry.name[: -len(".json")])
    return sorted(names)


def all_messages() -> list[tuple[str, int]]:
    """Every (message name, version) pair: both sides of every API in ``api_names()`` at every valid
    version, plus our own local request/response definitions."""
    from trireme.wire.schema import api_names
    names = []
    for _, api in sorted(api_names().items()):
        names += [api + "Request", api + "Response"]
    names += [n for n in local_message_names() if n not in names]
    out = []
    for name in names:
        spec = load_message(name)
        for v in range(spec.valid.low, spec.valid.high + 1):
            out.append((name, v))
    return out


__all__ = ["message_strategy", "struct_strategy", "field_strategy", "scalar_strategy", "all_messages",
           "local_message_names", "INT_RANGES"]
