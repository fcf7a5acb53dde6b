"""Kafka v2 record batches (magic 2): parse, validate, patch in place, decode records and build batches."""
from __future__ import annotations

import struct
import time
from dataclasses import dataclass, field
from typing import Iterable, Iterator

import crc32c

from trireme.wire import compression as _compression
from trireme.wire.primitives import CodecError

BATCH_HEADER_SIZE = 61
LOG_OVERHEAD = 12  # baseOffset + batchLength: the bytes not counted by batchLength
MIN_BATCH_LENGTH = BATCH_HEADER_SIZE - LOG_OVERHEAD  # 49
MAGIC_V2 = 2

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_MASK = 0x10
CONTROL_MASK = 0x20
DELETE_HORIZON_MASK = 0x40

CREATE_TIME = 0
LOG_APPEND_TIME = 1

CONTROL_ABORT = 0
CONTROL_COMMIT = 1

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_PARTITION_LEADER_EPOCH = -1

# Byte offsets of header fields from the start of a batch.
PARTITION_LEADER_EPOCH_OFFSET = 12
MAGIC_OFFSET = 16
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21  # the CRC covers everything from here to the end of the batch
MAX_TIMESTAMP_OFFSET = 35

_HEADER = struct.Struct(">qiibIhiqqqhii")
_HEAD = struct.Struct(">qiibI")  # baseOffset .. crc
_TAIL = struct.Struct(">hiqqqhii")  # attributes .. recordsCount
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_CONTROL_KEY = struct.Struct(">hh")  # version, type
_CONTROL_VALUE = struct.Struct(">hi")  # version, coordinatorEpoch


@dataclass(slots=True)
class BatchHeader:
    """The fixed 61-byte header of a v2 record batch."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def timestamp_type(self) -> int:
        return (self.attributes & TIMESTAMP_TYPE_MASK) >> 3

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_MASK)

    @property
    def has_delete_horizon(self) -> bool:
        return bool(self.attributes & DELETE_HORIZON_MASK)

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def size(self) -> int:
        """The whole batch's size in bytes, header included."""
        return self.batch_length + LOG_OVERHEAD


@dataclass(slots=True)
class Record:
    """One record with its absolute offset and timestamp."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)
    attributes: int = 0


# --- batch headers -----------------------------------------------------------------------------------

def parse_batch_header(buf, pos: int = 0) -> BatchHeader:
    """Parse the batch header at `pos`; CodecError if it is short, not magic 2, or its length is impossible."""
    if len(buf) - pos < BATCH_HEADER_SIZE:
        raise CodecError(f"record batch header needs {BATCH_HEADER_SIZE} bytes, {max(len(buf) - pos, 0)} left")
    fields = _HEADER.unpack_from(buf, pos)
    if fields[3] != MAGIC_V2:
        raise CodecError(f"unsupported record batch magic {fields[3]} (only v2 is supported)")
    if fields[1] < MIN_BATCH_LENGTH:
        raise CodecError(f"record batch length {fields[1]} is smaller than the header")
    return BatchHeader(*fields)


def first_batch_magic(buf) -> int | None:
    """The magic byte of the first batch in buf (None if too short to hold one): old message sets are told from v2
    batches before anything else is read."""
    return buf[MAGIC_OFFSET] if len(buf) > MAGIC_OFFSET else None


def first_batch_is_transactional(buf) -> bool:
    """Whether the first batch in buf is a v2 batch with the transactional bit, read from its attributes alone."""
    return first_batch_magic(buf) == MAGIC_V2 and len(buf) >= ATTRIBUTES_OFFSET + 2 \
        and bool(_I16.unpack_from(buf, ATTRIBUTES_OFFSET)[0] & TRANSACTIONAL_MASK)


def iter_batch_headers(buf, pos: int = 0, end: int | None = None) -> Iterator[tuple[int, BatchHeader]]:
    """Yield (position, header) for each complete batch in buf[pos:end], stopping silently at a trailing partial one.

    A batch with an impossible length or a magic other than 2 raises CodecError.
    """
    if end is None:
        end = len(buf)
    while end - pos >= LOG_OVERHEAD:
        (batch_length,) = _I32.unpack_from(buf, pos + 8)
        if batch_length < MIN_BATCH_LENGTH:
            raise CodecError(f"record batch length {batch_length} is smaller than the header")
        if end - pos < LOG_OVERHEAD + batch_length:
            return
        yield pos, parse_batch_header(buf, pos)
        pos += LOG_OVERHEAD + batch_length


def validate_batches(buf) -> list[tuple[int, BatchHeader]]:
    """Check that buf is exactly a sequence of complete v2 batches (e.g. produce input); return their headers."""
    batches = []
    pos = 0
    end = len(buf)
    while pos < end:
        header = parse_batch_header(buf, pos)
        if header.size > end - pos:
            raise CodecError(f"record batch of {header.size} bytes at {pos} is truncated to {end - pos}")
        if header.records_count < 0:
            raise CodecError(f"record batch at {pos} has a negative record count")
        batches.append((pos, header))
        pos += header.size
    return batches


def crc_ok(buf, pos: int, header: BatchHeader) -> bool:
    """Whether the CRC-32C stored in the batch at `pos` matches its contents."""
    return crc32c.crc32c(memoryview(buf)[pos + ATTRIBUTES_OFFSET:pos + header.size]) == header.crc


# --- in-place mutators (buf must be writable: a bytearray or a writable memoryview) -----------------------

def set_base_offset(buf, pos: int, base_offset: int) -> None:
    """Assign the batch's base offset (not covered by the CRC)."""
    _I64.pack_into(buf, pos, base_offset)


def set_partition_leader_epoch(buf, pos: int, epoch: int) -> None:
    """Stamp the batch with the partition leader epoch (not covered by the CRC)."""
    _I32.pack_into(buf, pos + PARTITION_LEADER_EPOCH_OFFSET, epoch)


def set_log_append_time(buf, pos: int, timestamp: int) -> None:
    """Switch the batch to LogAppendTime with maxTimestamp = `timestamp`, and recompute its CRC."""
    (batch_length,) = _I32.unpack_from(buf, pos + 8)
    (attributes,) = _I16.unpack_from(buf, pos + ATTRIBUTES_OFFSET)
    _I16.pack_into(buf, pos + ATTRIBUTES_OFFSET, attributes | TIMESTAMP_TYPE_MASK)
    _I64.pack_into(buf, pos + MAX_TIMESTAMP_OFFSET, timestamp)
    crc = crc32c.crc32c(memoryview(buf)[pos + ATTRIBUTES_OFFSET:pos + LOG_OVERHEAD + batch_length])
    _U32.pack_into(buf, pos + CRC_OFFSET, crc)


# --- decoding records ------------------------------------------------------------------------------------

def decode_records(buf, pos: int = 0, max_uncompressed: int | None = None) -> list[Record]:
    """Decode every record of the batch at `pos`, decompressing if needed (output capped at max_uncompressed).

    Offsets and timestamps are absolute; under LogAppendTime every record carries the batch's maxTimestamp.
    Raises CodecError on any malformed data, including a record count that disagrees with the records present.
    """
    header = parse_batch_header(buf, pos)
    end = pos + header.size
    if end > len(buf):
        raise CodecError(f"record batch of {header.size} bytes is truncated to {len(buf) - pos}")
    if header.records_count < 0:
        raise CodecError(f"negative record count {header.records_count}")
    if header.compression == _compression.NONE:
        data = buf if type(buf) is bytes else memoryview(buf)
        start = pos + BATCH_HEADER_SIZE
    else:
        data = _compression.decompress(
            header.compression, memoryview(buf)[pos + BATCH_HEADER_SIZE:end], max_uncompressed
        )
        if type(data) is not bytes:
            data = memoryview(data)
        start = 0
        end = len(data)
    append_time = header.max_timestamp if header.timestamp_type == LOG_APPEND_TIME else None
    try:
        return _read_records(
            data, start, end, header.records_count, header.base_offset, header.base_timestamp, append_time
        )
    except IndexError:
        raise CodecError("record data ends in the middle of a record") from None
    except UnicodeDecodeError:
        raise CodecError("record header key is not valid UTF-8") from None


def _read_varint(data, p: int) -> tuple[int, int]:
    """Read a zigzag varint/varlong at p; return (value, position after it)."""
    result = 0
    shift = 0
    while True:
        b = data[p]
        p += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return (result >> 1) ^ -(result & 1), p
        shift += 7
        if shift > 63:
            raise CodecError("varint is longer than 10 bytes")


def _read_records(data, p, end, count, base_offset, base_timestamp, append_time) -> list[Record]:
    """The record loop, with one- and two-byte fast paths inlined for each varint (the common cases)."""
    records = []
    append = records.append
    for _ in range(count):
        if p >= end:
            raise CodecError(f"batch holds fewer records than its count of {count}")
        b = data[p]
        if b < 0x80:
            length = (b >> 1) ^ -(b & 1)
            p += 1
        elif data[p + 1] < 0x80:
            b = (b ^ 0x80) | (data[p + 1] << 7)
            length = (b >> 1) ^ -(b & 1)
            p += 2
        else:
            length, p = _read_varint(data, p)
        record_end = p + length
        if length <= 0 or record_end > end:
            raise CodecError(f"record length {length} is out of bounds")
        attributes = data[p]
        p += 1
        b = data[p]
        if b < 0x80:
            timestamp_delta = (b >> 1) ^ -(b & 1)
            p += 1
        elif data[p + 1] < 0x80:
            b = (b ^ 0x80) | (data[p + 1] << 7)
            timestamp_delta = (b >> 1) ^ -(b & 1)
            p += 2
        else:
            timestamp_delta, p = _read_varint(data, p)
        b = data[p]
        if b < 0x80:
            offset_delta = (b >> 1) ^ -(b & 1)
            p += 1
        elif data[p + 1] < 0x80:
            b = (b ^ 0x80) | (data[p + 1] << 7)
            offset_delta = (b >> 1) ^ -(b & 1)
            p += 2
        else:
            offset_delta, p = _read_varint(data, p)

        b = data[p]
        if b < 0x80:
            key_length = (b >> 1) ^ -(b & 1)
            p += 1
        elif data[p + 1] < 0x80:
            b = (b ^ 0x80) | (data[p + 1] << 7)
            key_length = (b >> 1) ^ -(b & 1)
            p += 2
        else:
            key_length, p = _read_varint(data, p)
        if key_length < 0:
            if key_length != -1:
                raise CodecError(f"invalid record key length {key_length}")
            key = None
        else:
            if p + key_length > record_end:
                raise CodecError("record key overruns the record")
            key = bytes(data[p:p + key_length])
            p += key_length

        b = data[p]
        if b < 0x80:
            value_length = (b >> 1) ^ -(b & 1)
            p += 1
        elif data[p + 1] < 0x80:
            b = (b ^ 0x80) | (data[p + 1] << 7)
            value_length = (b >> 1) ^ -(b & 1)
            p += 2
        else:
            value_length, p = _read_varint(data, p)
        if value_length < 0:
            if value_length != -1:
                raise CodecError(f"invalid record value length {value_length}")
            value = None
        else:
            if p + value_length > record_end:
                raise CodecError("record value overruns the record")
            value = bytes(data[p:p + value_length])
            p += value_length

        b = data[p]
        if b < 0x80:
            header_count = (b >> 1) ^ -(b & 1)
            p += 1
        elif data[p + 1] < 0x80:
            b = (b ^ 0x80) | (data[p + 1] << 7)
            header_count = (b >> 1) ^ -(b & 1)
            p += 2
        else:
            header_count, p = _read_varint(data, p)
        if header_count == 0:
            headers = []
        else:
            headers, p = _read_headers(data, p, record_end, header_count)

        if p != record_end:
            raise CodecError(f"record declares {length} bytes but its fields take {length + p - record_end}")
        timestamp = base_timestamp + timestamp_delta if append_time is None else append_time
        append(Record(base_offset + offset_delta, timestamp, key, value, headers, attributes))
    if p != end:
        raise CodecError(f"{end - p} bytes remain after the batch's {count} records")
    return records


def _read_headers(data, p, record_end, count) -> tuple[list[tuple[str, bytes | None]], int]:
    if count < 0:
        raise CodecError(f"invalid record header count {count}")
    headers = []
    for _ in range(count):
        key_length, p = _read_varint(data, p)
        if key_length < 0 or p + key_length > record_end:
            raise CodecError(f"invalid record header key length {key_length}")
        key = str(data[p:p + key_length], "utf-8")
        p += key_length
        value_length, p = _read_varint(data, p)
        if value_length < 0:
            if value_length != -1:
                raise CodecError(f"invalid record header value length {value_length}")
            value = None
        else:
            if p + value_length > record_end:
                raise CodecError("record header value overruns the record")
            value = bytes(data[p:p + value_length])
            p += value_length
        headers.append((key, value))
    return headers, p


# --- building batches --------------------------------------------------------------------------------------

def build_batch(
    records: Iterable,
    *,
    base_offset: int = 0,
    compression: int = 0,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    transactional: bool = False,
    control: bool = False,
    timestamp_type: int = CREATE_TIME,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    base_timestamp: int | None = None,
) -> bytes:
    """Build one v2 batch from Record objects or (key, value[, headers[, timestamp]]) tuples.

    Offset deltas run 0..n-1 (a Record's own offset is ignored). A record without a timestamp gets
    base_timestamp, or the current time when that is None too; base_timestamp defaults to the first
    record's timestamp. At least one record is required.
    """
    entries = [_as_entry(record) for record in records]
    if not entries:
        raise ValueError("a record batch needs at least one record")
    if base_timestamp is None:
        base_timestamp = entries[0][3]
        if base_timestamp is None:
            base_timestamp = int(time.time() * 1000)
    body = bytearray()
    max_timestamp = None
    for offset_delta, (key, value, headers, timestamp) in enumerate(entries):
        if timestamp is None:
            timestamp = base_timestamp
        if max_timestamp is None or timestamp > max_timestamp:
            max_timestamp = timestamp
        record = _encode_record(offset_delta, timestamp - base_timestamp, key, value, headers)
        _write_varint(body, len(record))
        body += record
    payload = body if compression == _compression.NONE else _compression.compress(compression, body)
    attributes = (
        compression
        | (timestamp_type << 3)
        | (TRANSACTIONAL_MASK if transactional else 0)
        | (CONTROL_MASK if control else 0)
    )
    tail = _TAIL.pack(
        attributes, len(entries) - 1, base_timestamp, max_timestamp,
        producer_id, producer_epoch, base_sequence, len(entries),
    )
    crc = crc32c.crc32c(payload, crc32c.crc32c(tail))
    head = _HEAD.pack(base_offset, MIN_BATCH_LENGTH + len(payload), partition_leader_epoch, MAGIC_V2, crc)
    return b"".join((head, tail, payload))


def _as_entry(record) -> tuple:
    """Normalise a Record or a (key, value[, headers[, timestamp]]) tuple to (key, value, headers, timestamp)."""
    if isinstance(record, Record):
        return record.key, record.value, record.headers, record.timestamp
    key, value, *rest = record
    headers = rest[0] if rest else None
    timestamp = rest[1] if len(rest) > 1 else None
    return key, value, headers, timestamp


def _encode_record(offset_delta: int, timestamp_delta: int, key, value, headers) -> bytearray:
    """Everything of one record after its length prefix."""
    out = bytearray(b"\x00")  # attributes: unused in v2
    _write_varint(out, timestamp_delta)
    _write_varint(out, offset_delta)
    _write_bytes(out, key)
    _write_bytes(out, value)
    if not headers:
        out.append(0)
        return out
    _write_varint(out, len(headers))
    for header_key, header_value in headers:
        _write_bytes(out, header_key.encode("utf-8") if isinstance(header_key, str) else header_key)
        _write_bytes(out, header_value)
    return out


def _write_bytes(out: bytearray, data) -> None:
    """A varint length (-1 for None) followed by the bytes."""
    if data is None:
        out.append(1)  # zigzag(-1)
        return
    _write_varint(out, len(data))
    out += data


def _write_varint(out: bytearray, value: int) -> None:
    """Append a zigzag varint/varlong (valid for any value in the int64 range)."""
    zigzag = (value << 1) ^ (value >> 63)
    while zigzag >= 0x80:
        out.append((zigzag & 0x7F) | 0x80)
        zigzag >>= 7
    out.append(zigzag)


# --- control records ---------------------------------------------------------------------------------------

def build_control_batch(
    commit: bool,
    *,
    producer_id: int,
    producer_epoch: int,
    coordinator_epoch: int,
    base_offset: int = 0,
    timestamp: int,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
) -> bytes:
    """A transactional control batch holding one COMMIT or ABORT end-transaction marker."""
    key = _CONTROL_KEY.pack(0, CONTROL_COMMIT if commit else CONTROL_ABORT)
    value = _CONTROL_VALUE.pack(0, coordinator_epoch)
    return build_batch(
        [(key, value, None, timestamp)],
        base_offset=base_offset,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        transactional=True,
        control=True,
        partition_leader_epoch=partition_leader_epoch,
        base_timestamp=timestamp,
    )


def parse_control_record(record: Record) -> tuple[int, int]:
    """(type, coordinator_epoch) of a control record; the epoch is -1 for types other than ABORT/COMMIT."""
    key = record.key
    if key is None or len(key) < _CONTROL_KEY.size:
        raise CodecError("control record key is missing or shorter than 4 bytes")
    version, control_type = _CONTROL_KEY.unpack_from(key)
    if version < 0:
        raise CodecError(f"invalid control record key version {version}")
    if control_type not in (CONTROL_ABORT, CONTROL_COMMIT):
        return control_type, -1
    value = record.value
    if value is None or len(value) < _CONTROL_VALUE.size:
        raise CodecError("end transaction marker value is missing or shorter than 6 bytes")
    _, coordinator_epoch = _CONTROL_VALUE.unpack_from(value)
    return control_type, coordinator_epoch


# --- rewriting batches (the log cleaner) -------------------------------------------------------------------

def rebuild_batch(header: BatchHeader, records: list[Record], *, delete_horizon_ms: int | None = None) -> bytes:
    """The batch `header` describes, holding only `records` (a subset of its own records, offsets unchanged).

    As Kafka's cleaner rewrites a v2 batch: the base offset and last offset delta are kept (so the producer's
    last sequence, base sequence + last offset delta, survives), as are the producer id, epoch, base sequence,
    partition leader epoch, timestamp type, transactional and control flags and the compression codec. With
    `delete_horizon_ms` (or when the batch had one already) the delete-horizon attribute is set and the base
    timestamp holds the horizon; record timestamps are kept as deltas from it. No records: an empty batch
    (Kafka's RETAIN_EMPTY, kept only for its producer state), uncompressed, both timestamps the max timestamp.
    """
    if delete_horizon_ms is None and header.has_delete_horizon:
        delete_horizon_ms = header.base_timestamp
    append_time = header.timestamp_type == LOG_APPEND_TIME
    flags = header.attributes & (TIMESTAMP_TYPE_MASK | TRANSACTIONAL_MASK | CONTROL_MASK)
    if not records:
        payload = b""
        attributes = flags
        base_timestamp = max_timestamp = header.max_timestamp
    else:
        if delete_horizon_ms is not None:
            base_timestamp = delete_horizon_ms
            flags |= DELETE_HORIZON_MASK
        elif append_time:
            base_timestamp = header.base_timestamp
        else:
            base_timestamp = records[0].timestamp
        body = bytearray()
        max_timestamp = None
        base_offset = header.base_offset
        for record in records:
            ts = record.timestamp
            if max_timestamp is None or ts > max_timestamp:
                max_timestamp = ts
            encoded = _encode_record(record.offset - base_offset, 0 if append_time else ts - base_timestamp,
                                     record.key, record.value, record.headers)
            _write_varint(body, len(encoded))
            body += encoded
        if append_time:
            max_timestamp = header.max_timestamp
        payload = body if header.compression == _compression.NONE else _compression.compress(header.compression, body)
        attributes = flags | header.compression
    tail = _TAIL.pack(attributes, header.last_offset_delta, base_timestamp, max_timestamp, header.producer_id,
                      header.producer_epoch, header.base_sequence, len(records))
    crc = crc32c.crc32c(payload, crc32c.crc32c(tail))
    head = _HEAD.pack(header.base_offset, MIN_BATCH_LENGTH + len(payload), header.partition_leader_epoch,
                      MAGIC_V2, crc)
    return b"".join((head, tail, payload))


def scan_keys(buf, pos: int = 0, max_uncompressed: int | None = None) -> list[tuple[int, bytes | None, bool]]:
    """(offset, key, has value) of every record of the batch at `pos`: what the log cleaner's offset map and
    retention decision need, without decoding values and headers (faster than :func:`decode_records`)."""
    header = parse_batch_header(buf, pos)
    end = pos + header.size
    if end > len(buf):
        raise CodecError(f"record batch of {header.size} bytes is truncated to {len(buf) - pos}")
    if header.compression == _compression.NONE:
        data = buf if type(buf) is bytes else memoryview(buf)
        p = pos + BATCH_HEADER_SIZE
    else:
        data = _compression.decompress(header.compression, memoryview(buf)[pos + BATCH_HEADER_SIZE:end],
                                       max_uncompressed)
        p, end = 0, len(data)
    base_offset = header.base_offset
    out = []
    try:
        append = out.append
        for _ in range(header.records_count):
            b = data[p]
            if b < 0x80:                            # one-byte varints inlined (the common case)
                length = (b >> 1) ^ -(b & 1)
                p += 1
            else:
                length, p = _read_varint(data, p)
            record_end = p + length
            if length <= 0 or record_end > end:
                raise CodecError(f"record length {length} is out of bounds")
            p += 1                                  # attributes
            while data[p] & 0x80:                   # timestamp delta
                p += 1
            p += 1
            b = data[p]
            if b < 0x80:
                offset_delta = (b >> 1) ^ -(b & 1)
                p += 1
            else:
                offset_delta, p = _read_varint(data, p)
            b = data[p]
            if b < 0x80:
                key_length = (b >> 1) ^ -(b & 1)
                p += 1
            else:
                key_length, p = _read_varint(data, p)
            if key_length < 0:
                key = None
            else:
                key = bytes(data[p:p + key_length])
                p += key_length
            if p >= record_end:
                raise CodecError("record key overruns the record")
            append((base_offset + offset_delta, key, data[p] != 1))   # zigzag(-1) == 1: a null value
            p = record_end
    except IndexError:
        raise CodecError("record data ends in the middle of a record") from None
    return out
