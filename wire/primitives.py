"""Kafka's primitive types (fixed ints, varints, strings, bytes, UUIDs, compact forms) read from and written to buffers.

Readers take ``(buf, pos)`` and return ``(value, new_pos)``; ``buf`` is a memoryview (or bytes) and
every length prefix is checked against the bytes that remain before anything is sliced or
allocated.  Writers append to a bytearray.  Anything malformed raises :class:`CodecError`.
"""
from __future__ import annotations

import struct
import uuid


class CodecError(ValueError):
    """The one error decoding untrusted bytes may raise."""


INT8 = struct.Struct(">b")
INT16 = struct.Struct(">h")
UINT16 = struct.Struct(">H")
INT32 = struct.Struct(">i")
UINT32 = struct.Struct(">I")
INT64 = struct.Struct(">q")
FLOAT64 = struct.Struct(">d")
ZERO_UUID = uuid.UUID(int=0)


# --- varints -------------------------------------------------------------------------------

def read_uvarint(buf, pos: int, max_bytes: int = 5) -> tuple[int, int]:
    """An unsigned LEB128 varint of at most ``max_bytes`` bytes."""
    if pos < len(buf):
        b = buf[pos]
        if b < 0x80:
            return b, pos + 1           # one byte: every small length and count
    result = 0
    shift = 0
    end = len(buf)
    for _ in range(max_bytes):
        if pos >= end:
            raise CodecError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
    raise CodecError("varint too long")


def read_varint(buf, pos: int) -> tuple[int, int]:
    """A zigzag-encoded signed 32-bit varint."""
    u, pos = read_uvarint(buf, pos, 5)
    return (u >> 1) ^ -(u & 1), pos


def read_varlong(buf, pos: int) -> tuple[int, int]:
    """A zigzag-encoded signed 64-bit varint."""
    u, pos = read_uvarint(buf, pos, 10)
    return (u >> 1) ^ -(u & 1), pos


def write_uvarint(out: bytearray, value: int) -> None:
    if value < 0:
        raise ValueError(f"unsigned varint cannot hold {value}")
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def write_varint(out: bytearray, value: int) -> None:
    write_uvarint(out, ((value << 1) ^ (value >> 31)) & 0xFFFFFFFF)


def write_varlong(out: bytearray, value: int) -> None:
    write_uvarint(out, ((value << 1) ^ (value >> 63)) & 0xFFFFFFFFFFFFFFFF)


def uvarint_size(value: int) -> int:
    size = 1
    while value > 0x7F:
        value >>= 7
        size += 1
    return size


# --- lengths -------------------------------------------------------------------------------

def _take(buf, pos: int, n: int, what: str):
    end = pos + n
    if n < 0 or end > len(buf):
        raise CodecError(f"{what} of length {n} overruns the buffer ({len(buf) - pos} bytes left)")
    return buf[pos:end], end


def read_length16(buf, pos):
    return INT16.unpack_from(buf, pos)[0], pos + 2


def read_length32(buf, pos):
    return INT32.unpack_from(buf, pos)[0], pos + 4


def read_compact_length(buf, pos):
    """Compact lengths are stored plus one, so 0 means null (-1)."""
    if pos < len(buf):
        b = buf[pos]
        if b < 0x80:
            return b - 1, pos + 1       # one byte: every length under 127 (read_uvarint's own fast path, inlined)
    n, pos = read_uvarint(buf, pos)
    return n - 1, pos


# --- strings and bytes ---------------------------------------------------------------------

def _decode_utf8(raw) -> str:
    try:
        return str(raw, "utf-8")
    except UnicodeDecodeError as e:
        raise CodecError(f"string is not valid UTF-8: {e}") from None


def read_string(buf, pos):
    n, pos = read_length16(buf, pos)
    if n < 0:
        raise CodecError("null where a non-nullable string is required")
    raw, pos = _take(buf, pos, n, "string")
    return _decode_utf8(raw), pos


def read_nullable_string(buf, pos):
    n, pos = read_length16(buf, pos)
    if n < 0:
        return None, pos
    raw, pos = _take(buf, pos, n, "string")
    return _decode_utf8(raw), pos


def read_compact_string(buf, pos):
    if pos < len(buf):
        n = buf[pos] - 1
        end = pos + 1 + n
        if 0 <= n < 0x7F and end <= len(buf):       # a one-byte length, in the buffer: the usual string
            return _decode_utf8(buf[pos + 1:end]), end
    n, pos = read_compact_length(buf, pos)
    if n < 0:
        raise CodecError("null where a non-nullable string is required")
    raw, pos = _take(buf, pos, _string_length(n), "string")
    return _decode_utf8(raw), pos


def read_compact_nullable_string(buf, pos):
    n, pos = read_compact_length(buf, pos)
    if n < 0:
        return None, pos
    raw, pos = _take(buf, pos, _string_length(n), "string")
    return _decode_utf8(raw), pos


MAX_STRING_BYTES = 0x7FFF


def _string_length(n: int) -> int:
    """A compact string's length, refused over 32,767 bytes as Kafka's generated readers refuse it ("string field
    … had invalid length"): a classic string cannot be longer, and the records that store one (a transactional id
    in ``__transaction_state``'s key) could not hold it."""
    if n > MAX_STRING_BYTES:
        raise CodecError(f"string of {n} bytes is over the {MAX_STRING_BYTES}-byte limit")
    return n


def read_bytes(buf, pos):
    n, pos = read_length32(buf, pos)
    if n < 0:
        raise CodecError("null where non-nullable bytes are required")
    raw, pos = _take(buf, pos, n, "bytes")
    return bytes(raw), pos


def read_nullable_bytes(buf, pos):
    n, pos = read_length32(buf, pos)
    if n < 0:
        return None, pos
    raw, pos = _take(buf, pos, n, "bytes")
    return bytes(raw), pos


def read_compact_bytes(buf, pos):
    n, pos = read_compact_length(buf, pos)
    if n < 0:
        raise CodecError("null where non-nullable bytes are required")
    raw, pos = _take(buf, pos, n, "bytes")
    return bytes(raw), pos


def read_compact_nullable_bytes(buf, pos):
    n, pos = read_compact_length(buf, pos)
    if n < 0:
        return None, pos
    raw, pos = _take(buf, pos, n, "bytes")
    return bytes(raw), pos


def read_records(buf, pos):
    """Record data stays a view into the frame: it is never copied by the codec."""
    n, pos = read_length32(buf, pos)
    if n < 0:
        return None, pos
    return _take(buf, pos, n, "records")


def read_compact_records(buf, pos):
    n, pos = read_compact_length(buf, pos)
    if n < 0:
        return None, pos
    return _take(buf, pos, n, "records")


def read_uuid(buf, pos):
    raw, pos = _take(buf, pos, 16, "uuid")
    return uuid.UUID(bytes=bytes(raw)), pos


def read_bool(buf, pos):
    if pos >= len(buf):
        raise CodecError("truncated boolean")
    return buf[pos] != 0, pos + 1


def read_array_length(buf, pos):
    n, pos = read_length32(buf, pos)
    if n > len(buf) - pos:
        raise CodecError(f"array of {n} elements overruns the buffer")
    return n, pos


def read_compact_array_length(buf, pos):
    if pos < len(buf) and buf[pos] < 0x80:
        n = buf[pos] - 1
        pos += 1
    else:
        n, pos = read_uvarint(buf, pos)
        n -= 1
    if n > len(buf) - pos:
        raise CodecError(f"array of {n} elements overruns the buffer")
    return n, pos


def skip_tagged_fields(buf, pos):
    """Skip a tagged-field section, returning ``({tag: raw bytes}, pos)``."""
    count, pos = read_uvarint(buf, pos)
    if count == 0:
        return None, pos
    unknown = {}
    for _ in range(count):
        tag, pos = read_uvarint(buf, pos)
        size, pos = read_uvarint(buf, pos)
        raw, pos = _take(buf, pos, size, "tagged field")
        unknown[tag] = bytes(raw)
    return unknown, pos


# --- writers -------------------------------------------------------------------------------

def _utf8(value: str) -> bytes:
    return value.encode("utf-8")


def write_string(out: bytearray, value: str | None) -> None:
    if value is None:
        out += b"\xff\xff"
        return
    raw = _utf8(value)
    out += INT16.pack(len(raw))
    out += raw


def write_compact_string(out: bytearray, value: str | None) -> None:
    if value is None:
        out.append(0)
        return
    raw = _utf8(value)
    n = len(raw) + 1
    if n < 0x80:
        out.append(n)
    else:
        write_uvarint(out, n)
    out += raw


def write_bytes(out: bytearray, value) -> None:
    if value is None:
        out += b"\xff\xff\xff\xff"
        return
    out += INT32.pack(len(value))
    out += value


def write_compact_bytes(out: bytearray, value) -> None:
    if value is None:
        out.append(0)
        return
    write_uvarint(out, len(value) + 1)
    out += value


def write_uuid(out: bytearray, value) -> None:
    out += (value or ZERO_UUID).bytes


def write_array_length(out: bytearray, value) -> None:
    out += INT32.pack(-1 if value is None else len(value))


def write_compact_array_length(out: bytearray, value) -> None:
    n = 0 if value is None else len(value) + 1
    if n < 0x80:
        out.append(n)
    else:
        write_uvarint(out, n)
