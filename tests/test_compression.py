"""Tests for wire.compression: round trips, interoperability with other implementations, bombs and garbage."""
from __future__ import annotations

import gzip
import os
import random
import struct

import lz4.frame
import pytest
import snappy
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka import codec as kafka_codec

from trireme.wire import compression as C
from trireme.wire.primitives import CodecError

CODECS = [C.NONE, C.GZIP, C.SNAPPY, C.LZ4, C.ZSTD]
COMPRESSED = [C.GZIP, C.SNAPPY, C.LZ4, C.ZSTD]
TEXT = b"".join(b'{"user": %d, "name": "trireme", "score": %d}\n' % (i, i * 7) for i in range(20000))
MIXED = TEXT + os.urandom(150_000)  # spans many LZ4 blocks / xerial chunks, some incompressible


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("data", [b"", b"x", b"hello" * 3, TEXT, MIXED], ids=["empty", "1", "15", "text", "mixed"])
def test_round_trip(codec, data):
    packed = C.compress(codec, data)
    assert isinstance(packed, bytes)
    assert bytes(C.decompress(codec, packed)) == data
    assert bytes(C.decompress(codec, packed, max_size=len(data))) == data
    assert bytes(C.decompress(codec, memoryview(packed), max_size=10 * len(data) + 1)) == data


@pytest.mark.parametrize("codec", CODECS)
def test_compress_accepts_any_buffer(codec):
    for data in (bytearray(MIXED), memoryview(MIXED)[7:], memoryview(bytearray(TEXT))):
        assert bytes(C.decompress(codec, C.compress(codec, data))) == bytes(data)


@pytest.mark.parametrize("codec", COMPRESSED)
def test_compression_shrinks_text(codec):
    assert len(C.compress(codec, TEXT)) < len(TEXT) // 3


@settings(max_examples=60)
@given(codec=st.sampled_from(CODECS), data=st.binary(max_size=3000))
def test_round_trip_property(codec, data):
    assert bytes(C.decompress(codec, C.compress(codec, data), max_size=len(data))) == data


# --- what other implementations write, we read ---------------------------------------------------------

@pytest.mark.parametrize("data", [b"", TEXT, MIXED], ids=["empty", "text", "mixed"])
def test_reads_foreign_gzip(data):
    assert bytes(C.decompress(C.GZIP, gzip.compress(data))) == data
    assert bytes(C.decompress(C.GZIP, kafka_codec.gzip_encode(data))) == data
    two_members = gzip.compress(data[:1000]) + gzip.compress(data[1000:])
    assert bytes(C.decompress(C.GZIP, two_members, max_size=len(data))) == data


@pytest.mark.parametrize("data", [b"x", TEXT, MIXED], ids=["1", "text", "mixed"])
def test_reads_raw_and_xerial_snappy(data):
    raw = snappy.compress(data)
    assert not raw.startswith(b"\x82SNAPPY\x00")
    assert bytes(C.decompress(C.SNAPPY, raw)) == data
    xerial = kafka_codec.snappy_encode(data, xerial_compatible=True, xerial_blocksize=32 * 1024)
    assert xerial.startswith(b"\x82SNAPPY\x00")
    assert bytes(C.decompress(C.SNAPPY, xerial, max_size=len(data))) == data
    odd_blocks = kafka_codec.snappy_encode(data, xerial_compatible=True, xerial_blocksize=1000)
    assert bytes(C.decompress(C.SNAPPY, odd_blocks)) == data


@pytest.mark.parametrize("linked", [False, True])
@pytest.mark.parametrize("content_checksum", [False, True])
@pytest.mark.parametrize("store_size", [False, True])
@pytest.mark.parametrize("block_checksum", [False, True])
def test_reads_lz4_frames_with_any_options(linked, content_checksum, store_size, block_checksum):
    frame = lz4.frame.compress(
        MIXED, block_linked=linked, content_checksum=content_checksum,
        store_size=store_size, block_checksum=block_checksum,
    )
    assert bytes(C.decompress(C.LZ4, frame)) == MIXED
    assert bytes(C.decompress(C.LZ4, frame, max_size=len(MIXED))) == MIXED


@pytest.mark.parametrize("content_size", [False, True])
def test_reads_zstd_with_and_without_content_size(content_size):
    compressor = zstandard.ZstdCompressor(write_content_size=content_size)
    one_shot = compressor.compress(MIXED)
    stream = compressor.compressobj()
    streamed = stream.compress(MIXED) + stream.flush()
    for frame in (one_shot, streamed):
        assert bytes(C.decompress(C.ZSTD, frame)) == MIXED
        assert bytes(C.decompress(C.ZSTD, frame, max_size=len(MIXED))) == MIXED


def test_reads_kafka_python_encodings():
    for codec, encode in [
        (C.GZIP, kafka_codec.gzip_encode), (C.SNAPPY, kafka_codec.snappy_encode),
        (C.LZ4, kafka_codec.lz4_encode), (C.ZSTD, kafka_codec.zstd_encode),
    ]:
        assert bytes(C.decompress(codec, encode(MIXED))) == MIXED


# --- what we write, other implementations read ----------------------------------------------------------

@pytest.mark.parametrize("data", [b"", TEXT, MIXED], ids=["empty", "text", "mixed"])
def test_others_read_ours(data):
    assert gzip.decompress(C.compress(C.GZIP, data)) == data
    assert kafka_codec.snappy_decode(C.compress(C.SNAPPY, data)) == data
    assert lz4.frame.decompress(C.compress(C.LZ4, data)) == data
    assert lz4.frame.decompress(C.compress(C.LZ4, data, level=9)) == data
    assert kafka_codec.zstd_decode(C.compress(C.ZSTD, data)) == data


def test_snappy_writes_java_style_xerial_framing():
    packed = C.compress(C.SNAPPY, MIXED)
    assert packed[:16] == b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
    pos, out = 16, b""
    while pos < len(packed):
        (length,) = struct.unpack_from(">i", packed, pos)
        chunk = snappy.decompress(packed[pos + 4:pos + 4 + length])
        assert len(chunk) <= 32 * 1024
        out += chunk
        pos += 4 + length
    assert pos == len(packed) and out == MIXED


def test_lz4_writes_independent_blocks_and_a_correct_header_checksum():
    packed = C.compress(C.LZ4, MIXED)
    magic, flg, bd = struct.unpack_from("<IBB", packed)
    assert magic == 0x184D2204
    assert flg >> 6 == 1 and flg & 0x20  # version 01, block independence (what the Java client requires)
    assert bd == 0x40  # 64 KiB blocks
    reference = lz4.frame.compress(
        b"", block_linked=False, content_checksum=False, store_size=False,
        block_size=lz4.frame.BLOCKSIZE_MAX64KB, block_checksum=False,
    )
    assert packed[:7] == reference[:7]  # descriptor and its xxh32-derived HC byte agree


def test_xxh32_known_values():
    assert C._xxh32(b"") == 0x02CC5D05
    assert C._xxh32(b"abc") == 0x32D153FF


# --- malformed input and decompression bombs -------------------------------------------------------------

@pytest.mark.parametrize("codec", COMPRESSED)
def test_garbage_raises_codec_error(codec):
    for garbage in (b"", b"\x07", b"not compressed at all", random.Random(7).randbytes(200), b"\xff" * 64):
        with pytest.raises(CodecError):
            C.decompress(codec, garbage)


def test_snappy_garbage_looking_like_xerial():
    for bad in (
        b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1) + b"\x00\x00",  # truncated chunk length
        b"\x82SNAPPY\x00" + struct.pack(">iii", 1, 1, 100) + b"abc",  # chunk overruns
        b"\x82SNAPPY\x00" + struct.pack(">iii", 1, 1, -5),  # negative chunk length
        b"\x82SNAPPY\x00" + struct.pack(">iii", 1, 1, 3) + b"\xff\xff\xff",  # bad chunk
    ):
        with pytest.raises(CodecError):
            C.decompress(C.SNAPPY, bad)


@pytest.mark.parametrize("codec", COMPRESSED)
def test_truncated_raises_codec_error(codec):
    packed = C.compress(codec, MIXED)
    for cut in (1, len(packed) // 2, len(packed) - 1):
        with pytest.raises(CodecError):
            C.decompress(codec, packed[:cut])


@pytest.mark.parametrize("codec", CODECS)
def test_max_size_guards_against_bombs(codec):
    bomb = C.compress(codec, bytes(20 * 1024 * 1024))
    with pytest.raises(CodecError, match="more than|exceeds"):
        C.decompress(codec, bomb, max_size=1024 * 1024)
    assert len(C.decompress(codec, C.compress(codec, bytes(5000)), max_size=5000)) == 5000
    with pytest.raises(CodecError):
        C.decompress(codec, C.compress(codec, bytes(5000)), max_size=4999)


def test_foreign_bombs_are_bounded_too():
    zeros = bytes(8 * 1024 * 1024)
    for codec, packed in [
        (C.SNAPPY, snappy.compress(zeros)),
        (C.SNAPPY, kafka_codec.snappy_encode(zeros)),
        (C.LZ4, lz4.frame.compress(zeros, store_size=False)),
        (C.ZSTD, zstandard.ZstdCompressor(write_content_size=False).compress(zeros)),
        (C.GZIP, gzip.compress(zeros)),
    ]:
        with pytest.raises(CodecError):
            C.decompress(codec, packed, max_size=100_000)


def test_unknown_codec():
    with pytest.raises(CodecError):
        C.decompress(5, b"abc")
    with pytest.raises(CodecError):
        C.compress(7, b"abc")


@settings(max_examples=100)
@given(codec=st.sampled_from(COMPRESSED), data=st.binary(max_size=400))
def test_random_bytes_only_raise_codec_error(codec, data):
    try:
        C.decompress(codec, data, max_size=1 << 20)
    except CodecError:
        pass


@settings(max_examples=100)
@given(codec=st.sampled_from(COMPRESSED), flips=st.lists(st.tuples(st.integers(0), st.integers(0, 7)), min_size=1, max_size=4))
def test_mutated_streams_only_raise_codec_error(codec, flips):
    packed = bytearray(C.compress(codec, TEXT[:5000]))
    for at, bit in flips:
        packed[at % len(packed)] ^= 1 << bit
    try:
        C.decompress(codec, bytes(packed), max_size=1 << 20)
    except CodecError:
        pass
