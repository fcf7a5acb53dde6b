"""Kafka's record-batch compression codecs (gzip, snappy, LZ4, zstd): compress and bounded decompress."""
from __future__ import annotations

import struct
import zlib

import cramjam

from trireme.wire.primitives import CodecError

NONE = 0
GZIP = 1
SNAPPY = 2
LZ4 = 3
ZSTD = 4

CODEC_NAMES = {NONE: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}

_GZIP_DEFAULT_LEVEL = 6  # Java's Deflater.DEFAULT_COMPRESSION
_ZSTD_DEFAULT_LEVEL = 3  # Kafka's compression.zstd.level default

_I32 = struct.Struct(">i")
_U32_LE = struct.Struct("<I")


def compress(codec: int, data, level: int | None = None) -> bytes:
    """Compress `data` (any bytes-like object) with `codec`; `level` None picks the codec's default."""
    if codec == NONE:
        return bytes(data)
    if codec == GZIP:
        return zlib.compress(data, _GZIP_DEFAULT_LEVEL if level is None else level, wbits=31)
    if codec == SNAPPY:
        return _xerial_compress(data)
    if codec == LZ4:
        return _lz4_frame_compress(data, level)
    if codec == ZSTD:
        return bytes(cramjam.zstd.compress(data, level=_ZSTD_DEFAULT_LEVEL if level is None else level))
    raise CodecError(f"unknown compression codec {codec}")


def decompress(codec: int, data, max_size: int | None = None) -> bytes | bytearray:
    """Decompress `data` (any bytes-like object) compressed with `codec`.

    Returns bytes or a bytearray. Raises CodecError on any malformed input, on an unknown codec,
    and when the output would exceed `max_size` bytes (a decompression-bomb guard).
    """
    if codec == NONE:
        if max_size is not None and len(data) > max_size:
            raise CodecError(f"uncompressed data exceeds {max_size} bytes")
        return bytes(data)
    if codec == GZIP:
        return _gzip_decompress(data, max_size)
    if codec == SNAPPY:
        return _snappy_decompress(data, max_size)
    if codec == LZ4:
        return _cramjam_decompress(cramjam.lz4, "lz4", data, max_size)
    if codec == ZSTD:
        return _cramjam_decompress(cramjam.zstd, "zstd", data, max_size)
    raise CodecError(f"unknown compression codec {codec}")


# --- gzip ---------------------------------------------------------------------------------------

def _gzip_decompress(data, max_size: int | None) -> bytes:
    """Inflate one or more concatenated gzip members, never producing more than max_size + 1 bytes."""
    parts = []
    total = 0
    rest = data
    try:
        while True:
            inflater = zlib.decompressobj(wbits=31)
            limit = 0 if max_size is None else max_size - total + 1
            part = inflater.decompress(rest, limit)
            total += len(part)
            if max_size is not None and total > max_size:
                raise CodecError(f"gzip data decompresses to more than {max_size} bytes")
            if not inflater.eof:
                raise CodecError("gzip data is truncated")
            parts.append(part)
            rest = inflater.unused_data
            if not rest:
                break
    except zlib.error as exc:
        raise CodecError(f"invalid gzip data: {exc}") from None
    return parts[0] if len(parts) == 1 else b"".join(parts)


# --- snappy: raw, and the xerial framing written by the Java client --------------------------------

_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)  # format version 1, compatible with 1
_XERIAL_BLOCK_SIZE = 32 * 1024  # what xerial's SnappyOutputStream (and so the Java client) uses


def _xerial_compress(data) -> bytes:
    """Snappy in xerial framing: the magic header, then length-prefixed raw snappy blocks of 32 KiB input."""
    view = memoryview(data)
    parts = [_XERIAL_HEADER]
    for start in range(0, max(len(view), 1), _XERIAL_BLOCK_SIZE):
        block = cramjam.snappy.compress_raw(view[start:start + _XERIAL_BLOCK_SIZE])
        parts.append(_I32.pack(len(block)))
        parts.append(block)
    return b"".join(parts)


def _snappy_decompress(data, max_size: int | None) -> bytearray:
    view = memoryview(data)
    try:
        if len(view) >= len(_XERIAL_HEADER) and view[:8] == _XERIAL_MAGIC:
            return _xerial_decompress(view, max_size)
        size = cramjam.snappy.decompress_raw_len(view)
        _check_size(size, max_size, "snappy")
        out = bytearray(size)
        if cramjam.snappy.decompress_raw_into(view, out) != size:
            raise CodecError("snappy data is shorter than its declared length")
        return out
    except cramjam.DecompressionError as exc:
        raise CodecError(f"invalid snappy data: {exc}") from None


def _xerial_decompress(view: memoryview, max_size: int | None) -> bytearray:
    """Decode every block first for its declared size, so the output is allocated once and checked up front."""
    blocks = []
    total = 0
    pos = len(_XERIAL_HEADER)
    end = len(view)
    while pos < end:
        if end - pos < 4:
            raise CodecError("xerial snappy block length is truncated")
        (length,) = _I32.unpack_from(view, pos)
        pos += 4
        if length < 0 or length > end - pos:
            raise CodecError(f"xerial snappy block of {length} bytes overruns the data")
        block = view[pos:pos + length]
        size = cramjam.snappy.decompress_raw_len(block)
        total += size
        _check_size(total, max_size, "snappy")
        blocks.append((block, size))
        pos += length
    out = bytearray(total)
    out_view = memoryview(out)
    at = 0
    for block, size in blocks:
        if cramjam.snappy.decompress_raw_into(block, out_view[at:at + size]) != size:
            raise CodecError("xerial snappy block is shorter than its declared length")
        at += size
    return out


# --- LZ4 frame (KIP-57) -----------------------------------------------------------------------------

_LZ4_MAGIC = 0x184D2204
_LZ4_FLG = 0x60  # version 01, independent blocks, no block/content checksums, no content size
_LZ4_BD = 0x40  # 64 KiB maximum block size, as the Java client writes
_LZ4_BLOCK_SIZE = 64 * 1024
_LZ4_UNCOMPRESSED_BIT = 0x80000000
_LZ4_END_MARK = b"\x00\x00\x00\x00"


def _xxh32(data: bytes, seed: int = 0) -> int:
    """XXH32 of a short (< 16 bytes) input: all the LZ4 frame descriptor checksum needs."""
    if len(data) >= 16:
        raise ValueError("_xxh32 only handles inputs shorter than 16 bytes")
    p1, p2, p3, p4, p5 = 2654435761, 2246822519, 3266489917, 668265263, 374761393
    mask = 0xFFFFFFFF
    h = (seed + p5 + len(data)) & mask
    i = 0
    while i + 4 <= len(data):
        h = (h + _U32_LE.unpack_from(data, i)[0] * p3) & mask
        h = (((h << 17) | (h >> 15)) & mask) * p4 & mask
        i += 4
    while i < len(data):
        h = (h + data[i] * p5) & mask
        h = (((h << 11) | (h >> 21)) & mask) * p1 & mask
        i += 1
    h ^= h >> 15
    h = (h * p2) & mask
    h ^= h >> 13
    h = (h * p3) & mask
    return h ^ (h >> 16)


_LZ4_DESCRIPTOR = bytes((_LZ4_FLG, _LZ4_BD))
_LZ4_FRAME_HEADER = _U32_LE.pack(_LZ4_MAGIC) + _LZ4_DESCRIPTOR + bytes(((_xxh32(_LZ4_DESCRIPTOR) >> 8) & 0xFF,))


def _lz4_frame_compress(data, level: int | None) -> bytes:
    """An LZ4 frame of independent 64 KiB blocks, each stored raw when compression doesn't shrink it."""
    view = memoryview(data)
    if level is None:
        options = {"mode": "default"}
    else:
        options = {"mode": "high_compression", "compression": level}
    parts = [_LZ4_FRAME_HEADER]
    for start in range(0, len(view), _LZ4_BLOCK_SIZE):
        chunk = view[start:start + _LZ4_BLOCK_SIZE]
        block = cramjam.lz4.compress_block(chunk, store_size=False, **options)
        if len(block) < len(chunk):
            parts.append(_U32_LE.pack(len(block)))
            parts.append(block)
        else:
            parts.append(_U32_LE.pack(len(chunk) | _LZ4_UNCOMPRESSED_BIT))
            parts.append(chunk)
    parts.append(_LZ4_END_MARK)
    return b"".join(parts)


# --- LZ4 and zstd decompression through cramjam ----------------------------------------------------

_FIRST_GUESS_RATIO = 8
_MIN_FIRST_GUESS = 64 * 1024
_GROWTH = 4


def _cramjam_decompress(codec, name: str, data, max_size: int | None) -> bytes | bytearray:
    """Decompress whole frames (any content-size/checksum/linking options); bounded by max_size if given.

    Bounded decompression writes into a fixed buffer, so a bomb can't allocate past max_size; a too-small
    guess is retried in a buffer _GROWTH times larger (cramjam can't resume), capped at max_size.
    """
    try:
        if max_size is None:
            return bytes(codec.decompress(data))
        size = min(max_size, max(len(data) * _FIRST_GUESS_RATIO, _MIN_FIRST_GUESS))
        while True:
            out = bytearray(size)
            try:
                written = codec.decompress_into(data, out)
            except cramjam.DecompressionError as exc:
                if "whole buffer" not in str(exc):
                    raise
                if size >= max_size:
                    raise CodecError(f"{name} data decompresses to more than {max_size} bytes") from None
                size = min(max_size, size * _GROWTH)
                continue
            del out[written:]
            return out
    except cramjam.DecompressionError as exc:
        raise CodecError(f"invalid {name} data: {exc}") from None


def _check_size(size: int, max_size: int | None, name: str) -> None:
    if max_size is not None and size > max_size:
        raise CodecError(f"{name} data decompresses to more than {max_size} bytes")
