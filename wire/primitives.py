"""Kafka's primitive types (fixed ints, varints, strings, bytes, UUIDs, compact forms) read from and written to buffers."""
from __future__ import annotations


class CodecError(ValueError):
    """The one error decoding untrusted bytes may raise."""
