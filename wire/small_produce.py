"""The common small Produce (one topic, one partition, no transactional id) read and answered without message objects.

Most produce requests of many-producer, low-latency workloads have this shape, and building the request
and response objects of the compiled codec cost more than the rest of their handling.  These two
functions read exactly that shape and write the answer of one accepted batch; everything else (more
topics or partitions, a transactional id, tagged fields, any malformed byte) is left to the codec,
which defines the bytes: ``tests/test_small_produce.py`` checks on random input that both read the
same fields, that what the codec refuses is never read here, and that both write the same answer.
"""
from __future__ import annotations

import struct
import uuid
from typing import NamedTuple

from .primitives import INT32, MAX_STRING_BYTES, CodecError, read_compact_length, write_compact_string, write_string

FIRST_FLEXIBLE = 9           # ProduceRequest/Response are flexible from v9
FIRST_TOPIC_ID = 13          # v13 names topics by id

# flexible (v9+): null transactional id, acks, timeout, one topic
_FLEXIBLE_START = struct.Struct(">BhiB")
# v13: the topic's id, one partition, its index
_TOPIC_ID_PARTITION = struct.Struct(">16sBi")
# v3-8: transactional id (null), acks, timeout, one topic, its name's length
_CLASSIC_START = struct.Struct(">hhiih")
_CLASSIC_PARTITION = struct.Struct(">iii")       # one partition, its index, its records' length
# after the record bytes, flexible: the partition's, topic's and request's empty tagged fields
_FLEXIBLE_END = b"\x00\x00\x00"
# topic ids as read (16 bytes) → their UUID, made once: a UUID costs about as much to build as the rest of the
# request's reading (bounded: cleared when it grows past _TOPIC_IDS_MAX)
_TOPIC_IDS: dict[bytes, uuid.UUID] = {}
_TOPIC_IDS_MAX = 1024


class SmallProduce(NamedTuple):
    acks: int
    timeout_ms: int
    topic: str | None            # v3-12
    topic_id: uuid.UUID | None   # v13
    partition: int
    records: memoryview          # a view into the frame: the batch is written from it as it came


def read_small_produce(frame, pos: int, version: int) -> SmallProduce | None:
    """The body of a ProduceRequest of ``version`` (3-13) starting at ``pos``, if it has the small shape; else
    None (the codec reads it, and refuses it if it is malformed)."""
    view = memoryview(frame)
    end = len(view)
    try:
        if version < FIRST_FLEXIBLE:
            tid, acks, timeout, topics, n = _CLASSIC_START.unpack_from(view, pos)
            if tid != -1 or topics != 1 or n < 0:
                return None
            pos += 14
            topic = str(view[pos:pos + n], "utf-8")
            pos += n
            partitions, index, size = _CLASSIC_PARTITION.unpack_from(view, pos)
            pos += 12
            if partitions != 1 or size <= 0 or pos + size != end:
                return None
            return SmallProduce(acks, timeout, topic, None, index, view[pos:end])
        null_id, acks, timeout, topics = _FLEXIBLE_START.unpack_from(view, pos)
        if null_id != 0 or topics != 2:                   # compact: 0 is a null string, 2 an array of one
            return None
        pos += 8
        if version >= FIRST_TOPIC_ID:
            raw_id, partitions, index = _TOPIC_ID_PARTITION.unpack_from(view, pos)
            if partitions != 2:                           # compact array of one partition
                return None
            topic, topic_id = None, _topic_id(raw_id)
            pos += 21
        else:
            n, pos = read_compact_length(view, pos)
            if not 0 <= n <= MAX_STRING_BYTES:            # null, or too long (the codec refuses it)
                return None
            topic, topic_id = str(view[pos:pos + n], "utf-8"), None
            pos += n
            if view[pos] != 2:                            # compact array of one partition
                return None
            index = INT32.unpack_from(view, pos + 1)[0]
            pos += 5
        size, pos = read_compact_length(view, pos)
        if size <= 0 or pos + size + 3 != end or view[end - 3:end] != _FLEXIBLE_END:
            return None
        return SmallProduce(acks, timeout, topic, topic_id, index, view[pos:pos + size])
    except (struct.error, IndexError, UnicodeDecodeError, ValueError, CodecError):
        return None


def _topic_id(raw: bytes) -> uuid.UUID:
    topic_id = _TOPIC_IDS.get(raw)
    if topic_id is None:
        if len(_TOPIC_IDS) >= _TOPIC_IDS_MAX:
            _TOPIC_IDS.clear()
        topic_id = _TOPIC_IDS[raw] = uuid.UUID(bytes=raw)
    return topic_id


def encode_small_produce_response(version: int, topic: str | None, topic_id: uuid.UUID | None, partition: int,
                                  base_offset: int, log_append_time_ms: int, log_start_offset: int) -> bytes:
    """The body of a ProduceResponse of ``version`` answering one partition of one topic: accepted, no error,
    no throttle (:func:`with_throttle` sets one)."""
    name = bytearray()
    if version >= FIRST_TOPIC_ID:
        name += topic_id.bytes
    else:
        (write_compact_string if version >= FIRST_FLEXIBLE else write_string)(name, topic)
    offsets = struct.pack(">ihqq", partition, 0, base_offset, log_append_time_ms)
    if version >= 5:
        offsets += struct.pack(">q", log_start_offset)
    if version >= FIRST_FLEXIBLE:
        # topics: one; partitions: one; no record errors, null error message, tags; topic tags; throttle; tags
        return b"".join((b"\x02", name, b"\x02", offsets, b"\x01\x00\x00\x00", b"\x00\x00\x00\x00\x00"))
    tail = b"\x00\x00\x00\x00\xff\xff" if version >= 8 else b""     # no record errors, null error message
    return b"".join((b"\x00\x00\x00\x01", name, b"\x00\x00\x00\x01", offsets, tail, b"\x00\x00\x00\x00"))


def with_throttle(body: bytes, version: int, throttle_time_ms: int) -> bytes:
    """``body`` (an answer of :func:`encode_small_produce_response` of ``version``) with its ThrottleTimeMs set: the
    field is the body's last INT32, before the request's empty tagged fields when flexible."""
    if version >= FIRST_FLEXIBLE:
        return b"".join((body[:-5], INT32.pack(throttle_time_ms), body[-1:]))
    return b"".join((body[:-4], INT32.pack(throttle_time_ms)))
