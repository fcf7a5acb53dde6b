"""Tests for wire.records: v2 batch round trips, kafka-python interoperability, CRCs, mutators, control batches, fuzzing."""
from __future__ import annotations

import struct

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from trireme.wire.primitives import CodecError
from trireme.wire.records import (
    BATCH_HEADER_SIZE,
    CONTROL_ABORT,
    CONTROL_COMMIT,
    MAGIC_V2,
    Record,
    build_batch,
    build_control_batch,
    crc_ok,
    decode_records,
    first_batch_is_transactional,
    first_batch_magic,
    iter_batch_headers,
    parse_batch_header,
    parse_control_record,
    set_base_offset,
    set_log_append_time,
    set_partition_leader_epoch,
    validate_batches,
)

CODECS = [0, 1, 2, 3, 4]
T0 = 1_700_000_000_000

keys = st.none() | st.binary(max_size=40)
header_lists = st.lists(st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=16)), max_size=3)
timestamps = st.integers(0, 2**45)
record_tuples = st.lists(st.tuples(keys, keys, header_lists, timestamps), min_size=1, max_size=25)


def compressible_records(n=200):
    """Records kafka-python will actually compress (it falls back to none when compression doesn't help)."""
    return [
        (b"key-%d" % (i % 7) if i % 5 else None,
         b"value %d " % i * 8 if i % 9 else None,
         [("trace", b"abc"), ("empty", None)] if i % 4 == 0 else [],
         T0 + i * 3 - (50 if i % 11 == 0 else 0))
        for i in range(n)
    ]


def as_tuples(decoded):
    return [(r.key, r.value, list(r.headers), r.timestamp) for r in decoded]


def raw_batch(body: bytes, count: int, *, attributes=0, last_offset_delta=None, magic=2) -> bytes:
    """A batch around arbitrary (possibly malformed) record bytes, with a correct CRC: built independently."""
    if last_offset_delta is None:
        last_offset_delta = max(count - 1, 0)
    tail = struct.pack(">hiqqqhii", attributes, last_offset_delta, T0, T0, -1, -1, -1, count) + body
    head = struct.pack(">qiibI", 0, 49 + len(body), -1, magic, crc32c.crc32c(tail))
    return head + tail


# --- layout and header parsing ---------------------------------------------------------------------

def test_header_layout():
    batch = build_batch(
        [(b"k", b"v", [], T0), (None, b"w", [], T0 + 5)],
        base_offset=1000, producer_id=77, producer_epoch=3, base_sequence=40,
        partition_leader_epoch=9, compression=0,
    )
    assert BATCH_HEADER_SIZE == 61 and MAGIC_V2 == 2
    fields = struct.unpack_from(">qiibIhiqqqhii", batch)
    assert fields == (1000, len(batch) - 12, 9, 2, fields[4], 0, 1, T0, T0 + 5, 77, 3, 40, 2)
    header = parse_batch_header(batch)
    assert header.base_offset == 1000 and header.batch_length == len(batch) - 12
    assert header.last_offset == 1001 and header.next_offset == 1002 and header.size == len(batch)
    assert header.records_count == 2 and header.max_timestamp == T0 + 5
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (77, 3, 40)
    assert header.compression == 0 and header.timestamp_type == 0
    assert not header.is_transactional and not header.is_control and not header.has_delete_horizon
    assert crc_ok(batch, 0, header)


def test_attribute_bits():
    batch = build_batch([(b"k", b"v")], compression=3, transactional=True, timestamp_type=1, producer_id=1,
                        producer_epoch=0, base_sequence=0)
    header = parse_batch_header(batch)
    assert header.attributes == 3 | 0x08 | 0x10
    assert header.compression == 3 and header.timestamp_type == 1 and header.is_transactional


def test_first_batch_magic_and_transactional_bit_read_without_validation():
    plain = build_batch([(b"k", b"v", [], T0)])
    txn = build_batch([(b"k", b"v", [], T0)], producer_id=7, producer_epoch=0, base_sequence=0, transactional=True)
    assert (first_batch_magic(plain), first_batch_is_transactional(plain)) == (MAGIC_V2, False)
    assert (first_batch_magic(txn), first_batch_is_transactional(txn)) == (MAGIC_V2, True)
    assert first_batch_is_transactional(txn[:23]) and not first_batch_is_transactional(txn[:22])
    old = bytearray(txn)
    old[16] = 1                                         # a magic 1 message set has no transactional bit
    assert (first_batch_magic(old), first_batch_is_transactional(old)) == (1, False)
    assert first_batch_magic(b"") is None and first_batch_magic(plain[:16]) is None


def test_parse_batch_header_rejects_short_bad_magic_and_bad_length():
    batch = build_batch([(b"k", b"v", [], T0)])
    with pytest.raises(CodecError):
        parse_batch_header(batch[:60])
    with pytest.raises(CodecError):
        parse_batch_header(batch, 5)
    for magic in (0, 1, 3):
        bad = bytearray(batch)
        bad[16] = magic
        with pytest.raises(CodecError, match="magic"):
            parse_batch_header(bad)
    bad = bytearray(batch)
    struct.pack_into(">i", bad, 8, 48)
    with pytest.raises(CodecError):
        parse_batch_header(bad)


# --- round trips ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("codec", CODECS)
def test_round_trip_every_codec(codec):
    recs = compressible_records()
    batch = build_batch(recs, compression=codec, base_offset=500)
    header = parse_batch_header(batch)
    assert header.compression == codec and crc_ok(batch, 0, header)
    decoded = decode_records(batch)
    assert as_tuples(decoded) == recs
    assert [r.offset for r in decoded] == list(range(500, 700))
    assert header.max_timestamp == max(t for *_, t in recs)
    assert header.base_timestamp == recs[0][3]


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(recs=record_tuples, codec=st.sampled_from(CODECS), base_offset=st.integers(0, 2**40))
def test_round_trip_property(recs, codec, base_offset):
    batch = build_batch(recs, compression=codec, base_offset=base_offset)
    [(pos, header)] = validate_batches(batch)
    assert pos == 0 and crc_ok(batch, 0, header)
    decoded = decode_records(batch)
    assert as_tuples(decoded) == recs
    assert [r.offset for r in decoded] == list(range(base_offset, base_offset + len(recs)))


def test_record_objects_and_default_timestamps():
    recs = [Record(99, T0, b"a", None, [("h", b"1")]), Record(7, T0 - 10, None, b"b")]
    decoded = decode_records(build_batch(recs))
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in decoded] == [
        (0, T0, b"a", None, [("h", b"1")]), (1, T0 - 10, None, b"b", []),
    ]
    decoded = decode_records(build_batch([(b"x", b"y"), (b"z", b"w", None, T0)], base_timestamp=T0 - 1))
    assert [r.timestamp for r in decoded] == [T0 - 1, T0]
    decoded = decode_records(build_batch([(b"x", b"y"), (b"z", b"w")]))
    assert decoded[0].timestamp == decoded[1].timestamp > T0
    with pytest.raises(ValueError):
        build_batch([])


def test_extreme_varints_round_trip():
    recs = [(b"k", b"v", [], 0), (None, None, [], 2**62), (b"", b"", [("", b"")], 2**40)]
    assert as_tuples(decode_records(build_batch(recs))) == recs
    big = [(b"k" * 70000, b"v" * 300000, [("h" * 200, b"x" * 20000)], T0)]
    assert as_tuples(decode_records(build_batch(big, compression=4))) == big


def test_decode_accepts_any_buffer_and_position():
    first = build_batch(compressible_records(10), compression=0)
    second = build_batch(compressible_records(30), compression=1, base_offset=10)
    joined = first + second
    for buf in (joined, bytearray(joined), memoryview(joined), memoryview(bytearray(joined))):
        assert as_tuples(decode_records(buf, len(first))) == compressible_records(30)
        assert [r.offset for r in decode_records(buf, 0)] == list(range(10))


def test_log_append_time_batch_reports_max_timestamp():
    batch = build_batch([(b"k", b"v", [], T0), (b"k", b"v", [], T0 + 9)], timestamp_type=1)
    assert [r.timestamp for r in decode_records(batch)] == [T0 + 9, T0 + 9]


def test_max_uncompressed_guards_decode():
    batch = build_batch([(None, bytes(1 << 20), [], T0)] * 4, compression=4)
    assert len(decode_records(batch, max_uncompressed=5 << 20)) == 4
    with pytest.raises(CodecError):
        decode_records(batch, max_uncompressed=1 << 20)


# --- interoperability with kafka-python's independent implementation ---------------------------------------

@pytest.mark.parametrize("codec", CODECS)
def test_kafka_python_decodes_ours(codec):
    recs = compressible_records()
    batch = build_batch(recs, compression=codec, base_offset=42, producer_id=9, producer_epoch=2, base_sequence=5)
    theirs = DefaultRecordBatch(batch)
    assert theirs.validate_crc()
    assert (theirs.base_offset, theirs.compression_type, theirs.producer_id, theirs.base_sequence) == (42, codec, 9, 5)
    assert theirs.max_timestamp == max(t for *_, t in recs) and theirs.last_offset_delta == len(recs) - 1
    got = [(r.offset, r.key, r.value, list(r.headers), r.timestamp) for r in theirs]
    assert got == [(42 + i, k, v, h, t) for i, (k, v, h, t) in enumerate(recs)]


@pytest.mark.parametrize("codec", CODECS)
def test_we_decode_kafka_python(codec):
    recs = compressible_records()
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=codec, is_transactional=False,
        producer_id=-1, producer_epoch=-1, base_sequence=-1, batch_size=1 << 30,
    )
    for i, (key, value, headers, timestamp) in enumerate(recs):
        assert builder.append(i, timestamp=timestamp, key=key, value=value, headers=headers) is not None
    batch = bytes(builder.build())
    [(_, header)] = validate_batches(batch)
    assert header.compression == codec and crc_ok(batch, 0, header)
    assert header.max_timestamp == max(t for *_, t in recs)
    assert as_tuples(decode_records(batch)) == recs


@settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow])
@given(recs=record_tuples, codec=st.sampled_from(CODECS))
def test_kafka_python_cross_check_property(recs, codec):
    builder = DefaultRecordBatchBuilder(2, codec, False, -1, -1, -1, 1 << 30)
    for i, (key, value, headers, timestamp) in enumerate(recs):
        builder.append(i, timestamp=timestamp, key=key, value=value, headers=headers)
    assert as_tuples(decode_records(bytes(builder.build()))) == recs
    theirs = DefaultRecordBatch(build_batch(recs, compression=codec))
    assert theirs.validate_crc()
    assert [(r.key, r.value, list(r.headers), r.timestamp) for r in theirs] == recs


# --- CRC, framing, truncation -------------------------------------------------------------------------------

@pytest.mark.parametrize("codec", CODECS)
def test_crc_detects_any_flipped_byte(codec):
    batch = build_batch(compressible_records(20), compression=codec)
    header = parse_batch_header(batch)
    assert crc_ok(batch, 0, header)
    for at in range(21, len(batch), max(1, len(batch) // 97)):
        bad = bytearray(batch)
        bad[at] ^= 0x40
        assert not crc_ok(bad, 0, header), at
    for at in (17, 20):  # the stored CRC itself
        bad = bytearray(batch)
        bad[at] ^= 1
        assert not crc_ok(bad, 0, parse_batch_header(bad))


def test_iter_batch_headers_stops_at_trailing_partial():
    batches = [build_batch(compressible_records(n), compression=n % 5, base_offset=o)
               for n, o in ((3, 0), (5, 3), (8, 8))]
    whole = b"".join(batches)
    positions = [0, len(batches[0]), len(batches[0]) + len(batches[1])]
    extra = build_batch(compressible_records(4), base_offset=16)
    for cut in (0, 5, 11, 12, 30, 61, 70, len(extra) - 1):
        found = list(iter_batch_headers(whole + extra[:cut]))
        assert [p for p, _ in found] == positions
        assert [h.base_offset for _, h in found] == [0, 3, 8]
    assert len(list(iter_batch_headers(whole + extra))) == 4
    assert [p for p, _ in iter_batch_headers(whole, len(batches[0]))] == positions[1:]
    assert [p for p, _ in iter_batch_headers(whole, 0, len(whole) - 1)] == positions[:2]
    assert list(iter_batch_headers(b"")) == []


def test_iter_batch_headers_raises_on_garbage():
    good = build_batch([(b"k", b"v", [], T0)])
    bad_length = bytearray(good)
    struct.pack_into(">i", bad_length, 8, 10)
    with pytest.raises(CodecError):
        list(iter_batch_headers(good + bytes(bad_length)))
    with pytest.raises(CodecError, match="magic"):
        list(iter_batch_headers(raw_batch(b"", 0, magic=1)))


def test_validate_batches():
    a = build_batch(compressible_records(3))
    b = build_batch(compressible_records(6), compression=2, base_offset=3)
    assert [(p, h.records_count) for p, h in validate_batches(a + b)] == [(0, 3), (len(a), 6)]
    assert validate_batches(b"") == []
    for bad in (a + b[:-1], a + b[:30], a + b"\x00" * 5, a + b + b"\x00" * 61, raw_batch(b"", 0, magic=0)):
        with pytest.raises(CodecError):
            validate_batches(bad)
    too_long = bytearray(a)
    struct.pack_into(">i", too_long, 8, len(a))
    with pytest.raises(CodecError):
        validate_batches(too_long)


@pytest.mark.parametrize("codec", CODECS)
def test_truncated_batches_raise(codec):
    batch = build_batch(compressible_records(30), compression=codec)
    for cut in (0, 10, 60, 61, 62, len(batch) // 2, len(batch) - 1):
        with pytest.raises(CodecError):
            decode_records(batch[:cut])


def test_record_count_must_match():
    batch = bytearray(build_batch(compressible_records(5)))
    for count in (4, 6, 1000, -1):
        bad = bytearray(batch)
        struct.pack_into(">i", bad, 57, count)
        with pytest.raises(CodecError):
            decode_records(bad)
    compressed = build_batch(compressible_records(5), compression=1)
    for count in (4, 6):
        bad = bytearray(compressed)
        struct.pack_into(">i", bad, 57, count)
        with pytest.raises(CodecError):
            decode_records(bad)


@pytest.mark.parametrize("body, count", [
    (b"\x02\x00", 1),  # record of length 1: too short for its fields
    (b"\x0c\x00\x00\x00\x01\x01\x00\x00", 1),  # a stray byte after the last record
    (b"\x00", 1),  # zero length
    (b"\x01\x00\x00\x00\x01\x01\x00", 1),  # negative length
    (b"\xff" * 11 + b"\x01", 1),  # varint longer than 10 bytes
    (b"\x0c\x00\x00\x00\x03\x01\x00", 1),  # key length -2
    (b"\x0c\x00\x00\x00\x0a\x01\x00", 1),  # key of 5 bytes overruns the record
    (b"\x0e\x00\x00\x00\x01\x01\x00", 1),  # record length overruns the batch
    (b"\x0c\x00\x00\x00\x01\x01\x01", 1),  # header count -1
    (b"\x10\x00\x00\x00\x01\x01\x02\x01\x01", 1),  # header key length -1
    (b"\x12\x00\x00\x00\x01\x01\x02\x02\xff\x01", 1),  # header key not UTF-8
    (b"\x0c\x00\x00\x00\x01\x01\x00" * 2, 1),  # more records than counted
])
def test_malformed_records_raise(body, count):
    with pytest.raises(CodecError):
        decode_records(raw_batch(body, count))


def test_raw_batch_helper_builds_valid_batches():
    body = b"\x0c\x00\x00\x00\x01\x01\x00"  # one record: null key, null value, no headers
    [record] = decode_records(raw_batch(body, 1))
    assert (record.offset, record.timestamp, record.key, record.value, record.headers) == (0, T0, None, None, [])


# --- in-place mutators ---------------------------------------------------------------------------------------

def test_offset_and_epoch_mutators_leave_crc_valid():
    first = build_batch(compressible_records(4))
    buf = bytearray(first + build_batch(compressible_records(6), compression=3))
    pos = len(first)
    set_base_offset(buf, pos, 1234)
    set_partition_leader_epoch(buf, pos, 17)
    header = parse_batch_header(buf, pos)
    assert (header.base_offset, header.partition_leader_epoch) == (1234, 17)
    assert crc_ok(buf, pos, header)
    assert [r.offset for r in decode_records(buf, pos)] == list(range(1234, 1240))
    view = memoryview(buf)
    set_base_offset(view, 0, 7)
    assert parse_batch_header(buf).base_offset == 7


@pytest.mark.parametrize("codec", CODECS)
def test_set_log_append_time_keeps_crc_valid(codec):
    first = build_batch(compressible_records(2))
    buf = bytearray(first + build_batch(compressible_records(9), compression=codec))
    pos = len(first)
    set_log_append_time(memoryview(buf), pos, T0 + 10**6)
    header = parse_batch_header(buf, pos)
    assert header.timestamp_type == 1 and header.max_timestamp == T0 + 10**6 and header.compression == codec
    assert crc_ok(buf, pos, header)
    assert {r.timestamp for r in decode_records(buf, pos)} == {T0 + 10**6}
    theirs = DefaultRecordBatch(bytes(buf[pos:]))
    assert theirs.validate_crc() and {r.timestamp for r in theirs} == {T0 + 10**6}
    assert crc_ok(buf, 0, parse_batch_header(buf, 0))


# --- control batches -------------------------------------------------------------------------------------

@pytest.mark.parametrize("commit", [True, False])
def test_control_batch(commit):
    batch = build_control_batch(commit, producer_id=4000, producer_epoch=3, coordinator_epoch=11,
                                base_offset=90, timestamp=T0)
    header = parse_batch_header(batch)
    assert header.is_control and header.is_transactional and crc_ok(batch, 0, header)
    assert (header.producer_id, header.producer_epoch, header.base_offset, header.records_count) == (4000, 3, 90, 1)
    assert header.base_sequence == -1 and header.max_timestamp == T0
    [record] = decode_records(batch)
    assert record.offset == 90 and record.timestamp == T0
    expected_type = CONTROL_COMMIT if commit else CONTROL_ABORT
    assert parse_control_record(record) == (expected_type, 11)
    assert record.key == struct.pack(">hh", 0, expected_type)
    assert record.value == struct.pack(">hi", 0, 11)
    [theirs] = list(DefaultRecordBatch(batch))
    assert theirs.commit is commit and theirs.abort is not commit


def test_parse_control_record_edge_cases():
    assert parse_control_record(Record(0, 0, struct.pack(">hh", 0, 3), b"anything")) == (3, -1)
    for bad in (Record(0, 0, None, b""), Record(0, 0, b"\x00", b""),
                Record(0, 0, struct.pack(">hh", 0, 1), b"\x00\x00"),
                Record(0, 0, struct.pack(">hh", 0, 0), None),
                Record(0, 0, struct.pack(">hh", -1, 0), struct.pack(">hi", 0, 1))):
        with pytest.raises(CodecError):
            parse_control_record(bad)


# --- fuzzing: untrusted bytes only ever raise CodecError ----------------------------------------------------

def _exercise(buf):
    for call in (lambda: parse_batch_header(buf), lambda: validate_batches(buf),
                 lambda: list(iter_batch_headers(buf)), lambda: decode_records(buf, 0, 1 << 20)):
        try:
            call()
        except CodecError:
            pass


@settings(max_examples=100)
@given(st.binary(max_size=300))
def test_fuzz_random_bytes(data):
    _exercise(data)


@settings(max_examples=100)
@given(body=st.binary(max_size=120), count=st.integers(-2, 5), attributes=st.integers(0, 0x7F))
def test_fuzz_random_record_bodies(body, count, attributes):
    _exercise(raw_batch(body, count, attributes=attributes))


_SEEDS = [build_batch(compressible_records(12), compression=c) for c in CODECS]


@settings(max_examples=100)
@given(seed=st.sampled_from(_SEEDS), flips=st.lists(st.tuples(st.integers(0), st.integers(0, 255)), min_size=1, max_size=5),
       cut=st.integers(0, 2000))
def test_fuzz_mutated_batches(seed, flips, cut):
    buf = bytearray(seed)
    for at, value in flips:
        buf[at % len(buf)] = value
    _exercise(bytes(buf))
    _exercise(bytes(buf[:cut]))
