"""Compiles Kafka's message definitions into fast encoders and decoders, one pair per (message, version).

For each message the engine makes plain ``dataclass(slots=True)`` types (snake_case field names,
one class per struct, struct classes reachable as attributes of the message class, e.g.
``ProduceResponse.TopicProduceResponse``), then for each version it generates straight-line
Python source — consecutive fixed-width fields merged into one ``struct`` call, loops for
arrays — and compiles it once.  Decoders take a memoryview and never copy record data (a
``records`` field decodes to a view of the frame).  Encoders return a list of buffers: header
pieces plus record data passed through untouched, ready for one vectored send.
"""
from __future__ import annotations

import dataclasses
import struct
import uuid
from functools import lru_cache
from typing import Any, Callable

from . import primitives as P
from .primitives import CodecError
from .schema import FieldSpec, MessageSpec, load_message

_FIXED = {"bool": "?", "int8": "b", "int16": "h", "uint16": "H", "int32": "i", "uint32": "I",
          "int64": "q", "float64": "d"}

# Record data at least this large is passed through as its own buffer instead of being copied.
_RECORDS_INLINE_LIMIT = 8192


# --- the generated classes -----------------------------------------------------------------

def _default_expr(field: FieldSpec, classes: dict[int, type]) -> str:
    """A Python expression for the field's default value (fresh mutable objects each time)."""
    if field.is_array:
        return "None" if field.default is None else "[]"
    if field.is_struct:
        return "None" if field.nullable is not None else f"C{id(classes[id(field)])}()"
    if field.type == "uuid":
        return "ZERO_UUID"
    return repr(field.default)


def _make_classes(spec: MessageSpec) -> tuple[type, dict[int, type], dict[str, Any]]:
    """One dataclass per struct; returns the top class, {id(field): class}, and the codegen namespace."""
    classes: dict[int, type] = {}
    namespace: dict[str, Any] = {"ZERO_UUID": P.ZERO_UUID}

    by_name: dict[str, type] = {}

    def _reuse(fields: list[FieldSpec]) -> None:
        for f in fields:
            if f.is_struct:
                classes[id(f)] = by_name[f.type]
                _reuse(f.fields)

    def make(name: str, fields: list[FieldSpec]) -> type:
        # One class per struct type name: a struct used by two fields (e.g. ReplicaState in
        # DescribeQuorumResponse) is one type, as in Kafka's generated code.
        if name in by_name:
            _reuse(fields)
            return by_name[name]
        for f in fields:
            if f.is_struct:
                classes[id(f)] = make(f.type, f.fields)
        dc_fields = []
        for f in fields:
            if f.is_array and f.default is None:
                dc_fields.append((f.py_name, Any, dataclasses.field(default=None)))
            elif f.is_array:
                dc_fields.append((f.py_name, Any, dataclasses.field(default_factory=list)))
            elif f.is_struct:
                if f.nullable is not None:
                    dc_fields.append((f.py_name, Any, dataclasses.field(default=None)))
                else:
                    dc_fields.append((f.py_name, Any, dataclasses.field(default_factory=classes[id(f)])))
            elif f.type == "uuid":
                dc_fields.append((f.py_name, Any, dataclasses.field(default=P.ZERO_UUID)))
            else:
                dc_fields.append((f.py_name, Any, dataclasses.field(default=f.default)))
        cls = dataclasses.make_dataclass(name, dc_fields, slots=True)
        cls.__module__ = "trireme.wire.messages"
        for f in fields:
            if f.is_struct:
                setattr(cls, f.type, classes[id(f)])
        namespace[f"C{id(cls)}"] = cls
        by_name[name] = cls
        return cls

    top = make(spec.name, spec.fields)
    return top, classes, namespace


# --- source generation ---------------------------------------------------------------------

class _Gen:
    """Accumulates generated source lines with indentation and fresh local names."""

    def __init__(self, namespace: dict[str, Any]):
        self.lines: list[str] = []
        self.counter = 0
        self.ns = namespace

    def var(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def emit(self, indent: int, line: str) -> None:
        self.lines.append("    " * indent + line)

    def default_instance(self, cls: type) -> str:
        """A name for one default instance of ``cls``, made once, to compare tagged struct fields with."""
        name = f"D{id(cls)}"
        if name not in self.ns:
            self.ns[name] = cls()
        return name

    def struct_const(self, fmt: str) -> str:
        name = "S_" + fmt.replace("?", "Q_")
        if name not in self.ns:
            self.ns[name] = struct.Struct(">" + fmt)
        return name


def _groups(fields: list[FieldSpec], version: int) -> list[list[FieldSpec] | FieldSpec]:
    """Present, untagged fields with runs of fixed-width scalars grouped together."""
    out: list = []
    run: list[FieldSpec] = []
    for f in fields:
        if not f.present(version) or f.is_tagged(version):
            continue
        if not f.is_array and not f.is_struct and f.type in _FIXED:
            run.append(f)
            continue
        if run:
            out.append(run)
            run = []
        out.append(f)
    if run:
        out.append(run)
    return out


# decoding

def _decode_scalar(g: _Gen, ind: int, f_type: str, nullable: bool, compact: bool, target: str) -> None:
    if f_type in _FIXED:
        s = g.struct_const(_FIXED[f_type])
        g.emit(ind, f"{target} = {s}.unpack_from(buf, pos)[0]; pos += {struct.calcsize('>' + _FIXED[f_type])}")
        return
    reader = {
        ("string", False, False): "read_string", ("string", True, False): "read_nullable_string",
        ("string", False, True): "read_compact_string", ("string", True, True): "read_compact_nullable_string",
        ("bytes", False, False): "read_bytes", ("bytes", True, False): "read_nullable_bytes",
        ("bytes", False, True): "read_compact_bytes", ("bytes", True, True): "read_compact_nullable_bytes",
        ("records", False, False): "read_records", ("records", True, False): "read_records",
        ("records", False, True): "read_compact_records", ("records", True, True): "read_compact_records",
    }.get((f_type, nullable, compact))
    if f_type == "uuid":
        reader = "read_uuid"
    if reader is None:
        raise NotImplementedError(f"type {f_type}")
    g.emit(ind, f"{target}, pos = {reader}(buf, pos)")


def _decode_field(g: _Gen, ind: int, f: FieldSpec, version: int, flexible: bool, target: str) -> None:
    compact = f.is_compact(version, flexible)
    nullable = f.is_nullable(version)
    if f.is_array:
        n = g.var("n")
        g.emit(ind, f"{n}, pos = {'read_compact_array_length' if compact else 'read_array_length'}(buf, pos)")
        g.emit(ind, f"if {n} < 0:")
        g.emit(ind + 1, f"{target} = None" if nullable else "raise CodecError('null array where one is required')")
        g.emit(ind, "else:")
        if not f.is_struct and f.type in _FIXED and f.type != "bool":
            size = struct.calcsize(">" + _FIXED[f.type])
            g.emit(ind + 1, f"{target} = list(struct.unpack_from('>%d{_FIXED[f.type]}' % {n}, buf, pos)); pos += {size} * {n}")
            return
        g.emit(ind + 1, f"{target} = []")
        item = g.var("e")
        g.emit(ind + 1, f"for _ in range({n}):")
        if f.is_struct:
            _decode_struct(g, ind + 2, f, f.fields, version, flexible, item)
        else:
            _decode_scalar(g, ind + 2, f.type, False, compact, item)
        g.emit(ind + 2, f"{target}.append({item})")
        return
    if f.is_struct:
        if nullable:
            marker = g.var("m")
            g.emit(ind, f"{marker} = S_b.unpack_from(buf, pos)[0]; pos += 1")
            g.ns.setdefault("S_b", struct.Struct(">b"))
            g.emit(ind, f"if {marker} < 0:")
            g.emit(ind + 1, f"{target} = None")
            g.emit(ind, "else:")
            _decode_struct(g, ind + 1, f, f.fields, version, flexible, target)
        else:
            _decode_struct(g, ind, f, f.fields, version, flexible, target)
        return
    _decode_scalar(g, ind, f.type, nullable, compact, target)


def _decode_struct(g: _Gen, ind: int, owner: FieldSpec | None, fields: list[FieldSpec], version: int,
                   flexible: bool, target: str, cls_name: str | None = None) -> None:
    cls_name = cls_name or f"C{id(g.classes[id(owner)])}"
    values: dict[str, str] = {}
    for group in _groups(fields, version):
        if isinstance(group, list):
            fmt = "".join(_FIXED[f.type] for f in group)
            s = g.struct_const(fmt)
            names = [g.var("v") for _ in group]
            lhs = ", ".join(names) + ("," if len(names) == 1 else "")
            g.emit(ind, f"{lhs} = {s}.unpack_from(buf, pos); pos += {struct.calcsize('>' + fmt)}")
            for f, n in zip(group, names):
                values[f.py_name] = n
        else:
            n = g.var("v")
            _decode_field(g, ind, group, version, flexible, n)
            values[group.py_name] = n
    tagged = [f for f in fields if f.present(version) and f.is_tagged(version)]
    for f in tagged:
        values[f.py_name] = g.var("t")
        g.emit(ind, f"{values[f.py_name]} = {_default_expr(f, g.classes)}")
    if flexible:
        if tagged:
            cnt, tag, size, end = g.var("tc"), g.var("tg"), g.var("ts"), g.var("te")
            g.emit(ind, f"{cnt}, pos = read_uvarint(buf, pos)")
            g.emit(ind, f"for _ in range({cnt}):")
            g.emit(ind + 1, f"{tag}, pos = read_uvarint(buf, pos)")
            g.emit(ind + 1, f"{size}, pos = read_uvarint(buf, pos)")
            g.emit(ind + 1, f"{end} = pos + {size}")
            g.emit(ind + 1, f"if {end} > len(buf): raise CodecError('tagged field overruns the buffer')")
            for i, f in enumerate(tagged):
                g.emit(ind + 1, f"{'if' if i == 0 else 'elif'} {tag} == {f.tag}:")
                _decode_field(g, ind + 2, f, version, flexible, values[f.py_name])
            g.emit(ind + 1, f"pos = {end}")
        else:   # almost always an empty section: one byte 0
            g.emit(ind, "if buf[pos]: _, pos = skip_tagged_fields(buf, pos)")
            g.emit(ind, "else: pos += 1")
    args = ", ".join(values.get(f.py_name) or _default_expr(f, g.classes) for f in fields)
    g.emit(ind, f"{target} = {cls_name}({args})")


# encoding

def _encode_scalar(g: _Gen, ind: int, f_type: str, compact: bool, value: str, out: str, chunks_ok: bool) -> None:
    if f_type in _FIXED:
        g.emit(ind, f"{out} += {g.struct_const(_FIXED[f_type])}.pack({value})")
    elif f_type == "string":
        g.emit(ind, f"{'write_compact_string' if compact else 'write_string'}({out}, {value})")
    elif f_type == "bytes":
        g.emit(ind, f"{'write_compact_bytes' if compact else 'write_bytes'}({out}, {value})")
    elif f_type == "uuid":
        g.emit(ind, f"write_uuid({out}, {value})")
    elif f_type == "records":
        if not chunks_ok:
            raise NotImplementedError("records inside a tagged field")
        g.emit(ind, f"{out} = write_records({out}, chunks, {value}, {compact})")
    else:
        raise NotImplementedError(f"type {f_type}")


def _encode_field(g: _Gen, ind: int, f: FieldSpec, version: int, flexible: bool, value: str, out: str,
                  chunks_ok: bool) -> None:
    compact = f.is_compact(version, flexible)
    if f.is_array:
        g.emit(ind, f"{'write_compact_array_length' if compact else 'write_array_length'}({out}, {value})")
        item = g.var("e")
        if f.is_struct:
            g.emit(ind, f"for {item} in {value} or ():")
            _encode_struct(g, ind + 1, f.fields, version, flexible, item, out, chunks_ok)
        elif f.type in _FIXED and f.type != "bool":
            g.emit(ind, f"if {value}: {out} += struct.pack('>%d{_FIXED[f.type]}' % len({value}), *{value})")
        else:
            g.emit(ind, f"for {item} in {value} or ():")
            _encode_scalar(g, ind + 1, f.type, compact, item, out, chunks_ok)
        return
    if f.is_struct:
        if f.is_nullable(version):
            g.emit(ind, f"if {value} is None:")
            g.emit(ind + 1, f"{out}.append(0xff)")
            g.emit(ind, "else:")
            g.emit(ind + 1, f"{out}.append(1)")
            _encode_struct(g, ind + 1, f.fields, version, flexible, value, out, chunks_ok)
        else:
            _encode_struct(g, ind, f.fields, version, flexible, value, out, chunks_ok)
        return
    _encode_scalar(g, ind, f.type, compact, value, out, chunks_ok)


def _encode_struct(g: _Gen, ind: int, fields: list[FieldSpec], version: int, flexible: bool,
                   obj: str, out: str, chunks_ok: bool) -> None:
    for group in _groups(fields, version):
        if isinstance(group, list):
            s = g.struct_const("".join(_FIXED[f.type] for f in group))
            g.emit(ind, f"{out} += {s}.pack({', '.join(f'{obj}.{f.py_name}' for f in group)})")
        else:
            _encode_field(g, ind, group, version, flexible, f"{obj}.{group.py_name}", out, chunks_ok)
    if not flexible:
        return
    tagged = sorted((f for f in fields if f.present(version) and f.is_tagged(version)), key=lambda f: f.tag)
    if not tagged:
        g.emit(ind, f"{out}.append(0)")
        return
    tags = g.var("tags")
    g.emit(ind, f"{tags} = []")
    for f in tagged:
        value = f"{obj}.{f.py_name}"
        if f.is_array:
            cond = f"{value}"
        elif f.is_struct:
            cond = (f"{value} is not None" if f.nullable is not None
                    else f"{value} != {g.default_instance(g.classes[id(f)])}")
        else:
            cond = f"{value} != {_default_expr(f, g.classes)}"
        tb = g.var("tb")
        g.emit(ind, f"if {cond}:")
        g.emit(ind + 1, f"{tb} = bytearray()")
        _encode_field(g, ind + 1, f, version, flexible, value, tb, False)
        g.emit(ind + 1, f"{tags}.append(({f.tag}, {tb}))")
    g.emit(ind, f"write_uvarint({out}, len({tags}))")
    tg, tb = g.var("tg"), g.var("tb")
    g.emit(ind, f"for {tg}, {tb} in {tags}:")
    g.emit(ind + 1, f"write_uvarint({out}, {tg}); write_uvarint({out}, len({tb})); {out} += {tb}")


def write_records(out: bytearray, chunks: list, value, compact: bool) -> bytearray:
    """Emit a records field: the length prefix goes in ``out``, large data becomes its own chunk."""
    if value is None:
        if compact:
            out.append(0)
        else:
            out += b"\xff\xff\xff\xff"
        return out
    parts = value if isinstance(value, (list, tuple)) else (value,)
    total = sum(len(p) for p in parts)
    if compact:
        P.write_uvarint(out, total + 1)
    else:
        out += P.INT32.pack(total)
    if total < _RECORDS_INLINE_LIMIT:
        for p in parts:
            out += p
        return out
    chunks.append(out)
    chunks.extend(parts)
    return bytearray()


# --- compiled codecs -----------------------------------------------------------------------

class MessageCodec:
    """Encoder/decoder for every version of one message, compiled lazily once per version."""

    def __init__(self, spec: MessageSpec):
        self.spec = spec
        self.name = spec.name
        self.api_key = spec.api_key
        self.min_version = spec.valid.low
        self.max_version = spec.valid.high
        self.cls, self._classes, self._ns = _make_classes(spec)
        self._decoders: dict[int, Callable] = {}
        self._encoders: dict[int, Callable] = {}

    def is_flexible(self, version: int) -> bool:
        return self.spec.is_flexible(version)

    def _namespace(self) -> dict[str, Any]:
        ns = dict(vars(P))
        ns.update(self._ns)
        ns.update(struct=struct, uuid=uuid, write_records=write_records, CodecError=CodecError)
        return ns

    def _compile(self, version: int, kind: str) -> Callable:
        if version not in self.spec.valid:
            raise ValueError(f"{self.name} has no version {version}")
        g = _Gen(self._ns)
        g.classes = self._classes
        flexible = self.is_flexible(version)
        top = f"C{id(self.cls)}"
        if kind == "decode":
            g.emit(0, "def decode(buf, pos=0):")
            g.emit(1, "try:")
            _decode_struct(g, 2, None, self.spec.fields, version, flexible, "obj", cls_name=top)
            g.emit(1, "except (struct.error, IndexError, UnicodeDecodeError, ValueError, OverflowError) as e:")
            g.emit(2, "if isinstance(e, CodecError): raise")
            g.emit(2, f"raise CodecError('malformed {self.name} v{version}: ' + str(e)) from None")
            g.emit(1, "return obj, pos")
        else:
            g.emit(0, "def encode(obj):")
            g.emit(1, "out = bytearray(); chunks = []")
            _encode_struct(g, 1, self.spec.fields, version, flexible, "obj", "out", True)
            g.emit(1, "chunks.append(out)")
            g.emit(1, "return chunks")
        source = "\n".join(g.lines)
        ns = self._namespace()
        exec(compile(source, f"<{self.name} v{version} {kind}>", "exec"), ns)
        fn = ns[kind]
        fn.source = source
        return fn

    def decode(self, buf, version: int, pos: int = 0):
        """Decode one message from ``buf`` (bytes or memoryview) → ``(obj, end_pos)``."""
        fn = self._decoders.get(version)
        if fn is None:
            if version not in self.spec.valid:
                raise CodecError(f"{self.name} has no version {version}")
            fn = self._decoders[version] = self._compile(version, "decode")
        if not isinstance(buf, memoryview):
            buf = memoryview(buf)
        return fn(buf, pos)

    def encode(self, obj, version: int) -> list:
        """Encode ``obj`` at ``version`` → list of buffers (concatenate them for the wire form)."""
        fn = self._encoders.get(version)
        if fn is None:
            fn = self._encoders[version] = self._compile(version, "encode")
        return fn(obj)

    def encode_bytes(self, obj, version: int) -> bytes:
        return b"".join(self.encode(obj, version))


@lru_cache(maxsize=None)
def message(name: str) -> MessageCodec:
    """The codec for a message by its definition name, e.g. ``message("FetchResponse")``."""
    return MessageCodec(load_message(name))
