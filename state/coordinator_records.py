"""Kafka's coordinator record framing, shared by the group and transaction logs: an int16 version, then the message at that version.

Both ``__consumer_offsets`` and ``__transaction_state`` store keys and values this way.  A value written
at a version newer than the newest definition we know is read as that newest one, which is sound
because Kafka only adds tagged fields to these records (KIP-915).
"""
from __future__ import annotations

import struct

from trireme.wire.codec import message
from trireme.wire.primitives import CodecError

_VERSION = struct.Struct(">h")


class RecordError(ValueError):
    """A coordinator record that cannot be read, or a value that cannot be written."""


def encode(name: str, obj, version: int, error: type[RecordError] = RecordError) -> bytes:
    """``obj`` as the message ``name`` at ``version``, prefixed by the version."""
    try:
        return _VERSION.pack(version) + message(name).encode_bytes(obj, version)
    except (struct.error, ValueError, OverflowError) as e:
        raise error(f"cannot write {name} v{version}: {e}") from None


def split_version(data, error: type[RecordError] = RecordError) -> tuple[int, memoryview]:
    """(version, the bytes after it) of a record; ``error`` for anything that is not a run of bytes that long."""
    try:
        view = memoryview(data)
    except TypeError:
        raise error(f"a record is bytes, not {type(data).__name__}") from None
    if view.format != "B":
        try:
            view = view.cast("B")
        except TypeError:
            raise error("a record is a contiguous run of bytes") from None
    if len(view) < 2:
        raise error("record shorter than its version prefix")
    return _VERSION.unpack_from(view)[0], view[2:]


def decode(name: str, body: memoryview, version: int, error: type[RecordError] = RecordError):
    """The message ``name`` at ``version`` (a newer version read as the newest known); ``error`` if it does not decode."""
    codec = message(name)
    if version < codec.min_version:
        raise error(f"{name} has no version {version}")
    try:
        obj, _ = codec.decode(body, min(version, codec.max_version))
    except CodecError as e:
        raise error(str(e)) from None
    return obj
