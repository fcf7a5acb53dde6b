"""Loads Kafka's JSON message definitions (from the kafka-python wheel, plus any under wire/definitions) into field trees.

Kafka's own definitions are the source of truth for every field, version range, nullability,
tag and default; nothing here restates a message layout by hand.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
from functools import lru_cache
from pathlib import Path

# Where kafka-python keeps Kafka's JSON definitions, inside its package directory.  The files are read
# from there without importing kafka-python: importing it would run its modules (and their deprecated
# importlib.resources calls, which warn in a user's test run) for nothing but a directory's path.
KAFKA_SCHEMA_DIR = ("protocol", "schemas", "resources")
LOCAL_SCHEMA_DIR = Path(__file__).with_name("definitions")

INFINITY = 1 << 30


@dataclasses.dataclass(frozen=True, slots=True)
class Versions:
    """An inclusive version range as written in the JSON ("0+", "3-12", "5", "none")."""

    low: int
    high: int

    @classmethod
    def parse(cls, text: str | None) -> "Versions | None":
        if text is None or text == "none":
            return None
        text = text.strip()
        if text.endswith("+"):
            return cls(int(text[:-1]), INFINITY)
        if "-" in text:
            low, high = text.split("-")
            return cls(int(low), int(high))
        return cls(int(text), int(text))

    def __contains__(self, version: int) -> bool:
        return self.low <= version <= self.high


def _contains(versions: Versions | None, version: int) -> bool:
    return versions is not None and version in versions


_CAMEL_1 = re.compile(r"([A-Z]+)([A-Z][a-z])")
_CAMEL_2 = re.compile(r"([a-z0-9])([A-Z])")


def snake_case(name: str) -> str:
    """Kafka's CamelCase field names as Python attribute names: ``ThrottleTimeMs`` → ``throttle_time_ms``."""
    return _CAMEL_2.sub(r"\1_\2", _CAMEL_1.sub(r"\1_\2", name)).lower()


@dataclasses.dataclass(slots=True)
class FieldSpec:
    """One field of a message or struct, with everything its encoding depends on."""

    name: str
    py_name: str
    type: str                      # element type for arrays ("int32", "string", or a struct name)
    is_array: bool
    versions: Versions | None
    nullable: Versions | None
    tagged: Versions | None
    tag: int | None
    flexible_override: Versions | None | bool   # False when the field follows the message
    default: object
    fields: list["FieldSpec"] | None            # for struct and struct-array fields

    @property
    def is_struct(self) -> bool:
        return self.fields is not None

    def present(self, version: int) -> bool:
        return _contains(self.versions, version)

    def is_tagged(self, version: int) -> bool:
        return _contains(self.tagged, version)

    def is_nullable(self, version: int) -> bool:
        return _contains(self.nullable, version)

    def is_compact(self, version: int, message_flexible: bool) -> bool:
        if self.flexible_override is False:
            return message_flexible
        return _contains(self.flexible_override, version)


@dataclasses.dataclass(slots=True)
class MessageSpec:
    name: str
    kind: str                      # request, response, header, data
    api_key: int | None
    valid: Versions
    flexible: Versions | None
    fields: list[FieldSpec]
    latest_version_unstable: bool = False    # Kafka's "latestVersionUnstable": the last version is off by default

    def is_flexible(self, version: int) -> bool:
        return _contains(self.flexible, version)


def _strip_comments(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("//"))


@lru_cache(maxsize=None)
def _kafka_schema_dir() -> Path | None:
    """The directory of Kafka's JSON definitions in the installed kafka-python, found without importing it."""
    spec = importlib.util.find_spec("kafka")       # a top-level name: finding it imports nothing
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        folder = Path(location, *KAFKA_SCHEMA_DIR)
        if folder.is_dir():
            return folder
    return None


def _schema_dirs() -> list[Path]:
    """Where definitions are looked up, ours first (layouts Kafka no longer ships, or ships wrong)."""
    kafka = _kafka_schema_dir()
    return [LOCAL_SCHEMA_DIR] + ([kafka] if kafka is not None else [])


def _read_json(name: str) -> dict:
    for folder in _schema_dirs():
        try:
            text = (folder / (name + ".json")).read_text("utf-8")
        except FileNotFoundError:
            continue
        return json.loads(_strip_comments(text))
    raise KeyError(f"no message definition named {name}")


_SCALAR_DEFAULTS = {
    "bool": False, "int8": 0, "int16": 0, "uint16": 0, "int32": 0, "uint32": 0, "int64": 0,
    "float64": 0.0, "string": "", "bytes": b"", "uuid": None, "records": None,
}


def _parse_default(field_type: str, raw, nullable: bool):
    if raw is None:
        if field_type in ("string",) and nullable:
            return ""
        return _SCALAR_DEFAULTS.get(field_type)
    if raw == "null":
        return None
    if field_type == "bool":
        return str(raw).lower() == "true"
    if field_type in ("int8", "int16", "uint16", "int32", "uint32", "int64"):
        return int(str(raw), 0)
    if field_type == "float64":
        return float(raw)
    return raw


def _array_default(raw: dict):
    """Arrays default to empty, or to null where the definition says ``"default": "null"``."""
    return None if raw.get("default") == "null" else ()


def _build_fields(raw_fields: list[dict], common: dict[str, list[dict]]) -> list[FieldSpec]:
    fields = []
    for raw in raw_fields:
        type_text: str = raw["type"]
        is_array = type_text.startswith("[]")
        elem = type_text[2:] if is_array else type_text
        sub = raw.get("fields")
        if sub is None and elem[:1].isupper():
            sub = common.get(elem)
            if sub is None:
                raise KeyError(f"struct type {elem} has no definition")
        nullable = Versions.parse(raw.get("nullableVersions"))
        flexible_override = raw.get("flexibleVersions", False)
        if flexible_override is not False:
            flexible_override = Versions.parse(flexible_override)
        fields.append(FieldSpec(
            name=raw["name"],
            py_name=snake_case(raw["name"]),
            type=elem,
            is_array=is_array,
            versions=Versions.parse(raw.get("versions")),
            nullable=nullable,
            tagged=Versions.parse(raw.get("taggedVersions")),
            tag=raw.get("tag"),
            flexible_override=flexible_override,
            default=_array_default(raw) if is_array else
                    None if sub is not None else _parse_default(elem, raw.get("default"), nullable is not None),
            fields=_build_fields(sub, common) if sub is not None else None,
        ))
    return fields


@lru_cache(maxsize=None)
def load_message(name: str) -> MessageSpec:
    """The parsed definition of one message, e.g. ``load_message("ProduceRequest")``."""
    data = _read_json(name)
    common = {s["name"]: s["fields"] for s in data.get("commonStructs", [])}
    return MessageSpec(
        name=data["name"],
        kind=data["type"],
        api_key=data.get("apiKey"),
        valid=Versions.parse(data["validVersions"]),
        flexible=Versions.parse(data.get("flexibleVersions")),
        fields=_build_fields(data["fields"], common),
        latest_version_unstable=bool(data.get("latestVersionUnstable", False)),
    )


@lru_cache(maxsize=None)
def api_names() -> dict[int, str]:
    """API key → API name (``0`` → ``"Produce"``) for every request definition available."""
    names = {}
    for folder in reversed(_schema_dirs()):          # Kafka's names first, as before
        for entry in sorted(folder.iterdir()):
            if entry.name.endswith("Request.json"):
                data = json.loads(_strip_comments(entry.read_text("utf-8")))
                if data.get("apiKey") is not None:
                    names.setdefault(data["apiKey"], data["name"][: -len("Request")])
    return names
