"""Golden vectors under tests/vectors/: bytes made by other implementations, checked against our codec.

Every ``tests/vectors/<ApiName>/v<N>_<case>_<request|response>.hex`` file present is tested (the
"basic" case comes from tools/make_vectors.py, encoded by kafka-python; "handmade" from
tools/make_handmade_vectors.py for the definitions kafka-python lacks; other cases, e.g.
``librdkafka``, are captured from real clients).  For each: our decoder reads the whole body, our
encoder re-creates the same bytes from what it decoded, and where a ``v<N>_<case>.json`` sidecar
holds the field values, the decoded object equals them and the object rebuilt from them encodes
to exactly these bytes.  Versions below Kafka's own definition (Produce v0-2) are read with our
local ``Legacy<Name>`` definitions.

Also: every (API key, version) the server advertises has a request and a response vector.
"""
from __future__ import annotations

import importlib.util
import json
import re
import uuid
from pathlib import Path

import pytest

from trireme.wire.codec import message
from trireme.wire.primitives import ZERO_UUID
from trireme.wire.schema import api_names, load_message

VECTORS = Path(__file__).resolve().parent / "vectors"
HEX_NAME = re.compile(r"^v(\d+)_(.+)_(request|response)\.hex$")
API_KEYS = {name: key for key, name in api_names().items()}


def _vector_files():
    out = []
    for path in sorted(VECTORS.glob("*/*.hex")):
        m = HEX_NAME.match(path.name)
        assert m, f"unexpected vector file name {path}"
        out.append((path.parent.name, int(m.group(1)), m.group(2), m.group(3), path))
    return out


FILES = _vector_files()


def codec_name(api: str, version: int, kind: str) -> str:
    """Kafka's definition when it covers ``version``, else our Legacy one (e.g. Produce v0-2)."""
    name = api + kind.capitalize()
    if version in load_message(name).valid:
        return name
    return "Legacy" + name


# --- sidecar values <-> our objects --------------------------------------------------------

def from_values(values: dict, fields, version: int, cls):
    """Rebuild one of our objects from sidecar values; fields the sidecar omits keep their defaults."""
    known = {f.name for f in fields}
    assert set(values) <= known, f"sidecar has unknown fields {sorted(set(values) - known)}"
    kwargs = {}
    for f in fields:
        if f.present(version) and f.name in values:
            kwargs[f.py_name] = _from_value(values[f.name], f, version, cls)
    return cls(**kwargs)


def _from_value(v, f, version, cls):
    if v is None:
        return None
    if f.is_struct:
        sub = getattr(cls, f.type)
        if f.is_array:
            return [from_values(e, f.fields, version, sub) for e in v]
        return from_values(v, f.fields, version, sub)
    if f.type in ("bytes", "records"):
        return bytes.fromhex(v)
    if f.type == "uuid":
        return [uuid.UUID(e) for e in v] if f.is_array else uuid.UUID(v)
    return list(v) if f.is_array else v


def plain(obj, fields, version, cls):
    out = {}
    for f in fields:
        if not f.present(version):
            continue
        v = getattr(obj, f.py_name)
        if v is not None:
            if f.is_struct:
                sub = getattr(cls, f.type)
                v = [plain(e, f.fields, version, sub) for e in v] if f.is_array else plain(v, f.fields, version, sub)
            elif f.type in ("bytes", "records"):
                v = bytes(v)
            elif f.is_array:
                v = list(v)
        out[f.name] = v
    return out


def _sidecar(api: str, version: int, case: str) -> dict | None:
    path = VECTORS / api / f"v{version}_{case}.json"
    return json.loads(path.read_text()) if path.exists() else None


# --- the vectors ---------------------------------------------------------------------------

@pytest.mark.parametrize("api,version,case,kind,path", FILES,
                         ids=[f"{a}-v{v}-{c}-{k}" for a, v, c, k, _ in FILES])
def test_vector(api, version, case, kind, path):
    assert api in API_KEYS, f"{path}: no API named {api}"
    text = path.read_text().strip()
    assert re.fullmatch(r"(?:[0-9a-f]{2})*", text), f"{path}: not one line of lowercase hex"
    body = bytes.fromhex(text)
    name = codec_name(api, version, kind)
    codec = message(name)
    spec = load_message(name)

    decoded, end = codec.decode(body, version)
    assert end == len(body), f"{path}: decoded {end} of {len(body)} bytes"
    assert codec.encode_bytes(decoded, version).hex() == body.hex(), f"{path}: re-encoding differs"

    sidecar = _sidecar(api, version, case)
    if sidecar is None or kind not in sidecar:
        return
    assert sidecar.get("version", version) == version
    if "api_key" in sidecar:
        assert sidecar["api_key"] == API_KEYS[api]
    expected = from_values(sidecar[kind], spec.fields, version, codec.cls)
    assert plain(decoded, spec.fields, version, codec.cls) == plain(expected, spec.fields, version, codec.cls)
    assert codec.encode_bytes(expected, version).hex() == body.hex(), f"{path}: our encoding of the sidecar differs"


def test_vectors_exist():
    assert len(FILES) >= 300


def test_every_basic_vector_has_both_sides_and_a_sidecar():
    basic = {(a, v, k) for a, v, c, k, _ in FILES if c == "basic"}
    for api, version, _ in basic:
        assert (api, version, "request") in basic and (api, version, "response") in basic
        assert _sidecar(api, version, "basic") is not None


def test_basic_vectors_cover_every_json_version():
    make_vectors = _load_make_vectors()
    have = {(a, v, k) for a, v, c, k, _ in FILES if c == "basic"}
    for api in make_vectors.APIS:
        spec = load_message(api + "Request")
        for version in range(spec.valid.low, spec.valid.high + 1):
            for kind in ("request", "response"):
                assert (api, version, kind) in have, f"missing {api} v{version} {kind} vector"


def test_every_advertised_version_has_vectors():
    """Every (api_key, version) in ApiVersions has at least one request and one response vector."""
    import trireme.server.dispatch
    advertised = trireme.server.dispatch.advertised_versions()
    assert advertised, "the server advertises nothing"
    names = api_names()
    have = {(a, v, k) for a, v, _, k, _ in FILES}
    missing = []
    for key, (lo, hi) in sorted(advertised.items()):
        for version in range(lo, hi + 1):
            for kind in ("request", "response"):
                if (names[key], version, kind) not in have:
                    missing.append(f"{names[key]}(key {key}) v{version} {kind}")
    assert not missing, "advertised without vectors: " + ", ".join(missing)


def _load_make_vectors():
    path = Path(__file__).resolve().parent.parent / "tools" / "make_vectors.py"
    spec = importlib.util.spec_from_file_location("make_vectors", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_basic_vectors_are_up_to_date():
    """The committed "basic" files are exactly what tools/make_vectors.py generates."""
    make_vectors = _load_make_vectors()
    stale = []
    for api, files in make_vectors.generate_all().items():
        for fname, content in files.items():
            path = VECTORS / api / fname
            if not path.exists() or path.read_text() != content:
                stale.append(str(path.relative_to(VECTORS)))
    assert not stale, f"run tools/make_vectors.py: stale {stale[:10]}"


def test_zero_uuid_round_trips_through_sidecar_values():
    f = next(f for f in load_message("MetadataRequest").fields[0].fields if f.name == "TopicId")
    assert _from_value(str(ZERO_UUID), f, 12, None) == ZERO_UUID
