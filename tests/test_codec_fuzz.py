"""Decoding untrusted bytes: for every request message at every version, random bytes and mutated
valid encodings (bit flips, truncations, inflated length prefixes, inserted/deleted bytes) must
either decode or raise CodecError — never another exception, never hang, never allocate much.

Whatever does decode must re-encode, and that encoding must be a fixed point (decode → encode
gives the same bytes again).  The whole file is bounded to roughly 30 seconds.
"""
from __future__ import annotations

import os
import random
import struct
import sys
import time
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.dirname(__file__))
from strategies import all_messages, message_strategy  # noqa: E402

from trireme.wire.codec import message  # noqa: E402
from trireme.wire.primitives import CodecError  # noqa: E402

REQUESTS = [p for p in all_messages() if p[0].endswith("Request")]
RESPONSES = [p for p in all_messages() if p[0].endswith("Response")]

# Length prefixes a hostile client might send, written over every offset of a valid encoding.
INFLATED = [
    bytes.fromhex("7fffffff"),        # int32 array count / bytes length: 2 GiB
    bytes.fromhex("80000000"),        # int32 min
    bytes.fromhex("fffffffe"),        # -2: negative but not null
    bytes.fromhex("ffffffff"),        # -1: null
    bytes.fromhex("7fff"),            # int16 string length: 32 KiB
    bytes.fromhex("8000"),
    bytes.fromhex("ffffffff0f"),      # compact length 2^32-1
    bytes.fromhex("ffffffff07"),      # compact length 2^31-1
    bytes.fromhex("ffffffffff"),      # varint too long
    bytes.fromhex("80808080808001"),  # over-long varint encoding
]

MAX_DECODE_SECONDS = 0.5
MAX_DECODE_BYTES = 2 << 20            # peak allocation allowed for one decode of a small buffer

FUZZ = settings(max_examples=8, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _id(pair):
    return f"{pair[0]}-v{pair[1]}"


def check_decode(name: str, version: int, buf: bytes):
    """Decode ``buf``: CodecError is fine, anything else fails; a success must re-encode to a fixed point."""
    codec = message(name)
    start = time.process_time()
    try:
        obj, end = codec.decode(buf, version)
    except CodecError:
        return None
    except Exception as e:  # noqa: BLE001 - the point of the test
        pytest.fail(f"{name} v{version}: {type(e).__name__}: {e} decoding {buf.hex()}")
    finally:
        elapsed = time.process_time() - start
        assert elapsed < MAX_DECODE_SECONDS, f"{name} v{version} took {elapsed:.2f}s on {buf.hex()}"
    assert 0 <= end <= len(buf)
    try:
        again = codec.encode_bytes(obj, version)
        obj2, end2 = codec.decode(again, version)
    except Exception as e:  # noqa: BLE001
        pytest.fail(f"{name} v{version}: decoded {buf.hex()} but re-encoding failed: {type(e).__name__}: {e}")
    assert end2 == len(again)
    assert codec.encode_bytes(obj2, version) == again, f"{name} v{version}: not a fixed point from {buf.hex()}"
    return obj


def mutations(valid: bytes, rng: random.Random):
    """Mutated copies of a valid encoding."""
    n = len(valid)
    # Every truncation (or an even spread of them for long encodings).
    cuts = range(n) if n <= 96 else sorted({rng.randrange(n) for _ in range(96)} | {0, n - 1})
    for cut in cuts:
        yield valid[:cut]
    # Single bit flips.
    for _ in range(24):
        if n:
            i = rng.randrange(n)
            b = bytearray(valid)
            b[i] ^= 1 << rng.randrange(8)
            yield bytes(b)
    # Inflated length prefixes, written over (and inserted at) every offset.
    offsets = range(n) if n <= 64 else sorted(rng.sample(range(n), 64))
    for i in offsets:
        for pattern in INFLATED:
            yield valid[:i] + pattern + valid[i + len(pattern):]
        yield valid[:i] + INFLATED[0] + valid[i:]
    # Inserted and deleted bytes, and random tails.
    for _ in range(8):
        i = rng.randrange(n + 1)
        yield valid[:i] + bytes([rng.randrange(256)]) + valid[i:]
        if n:
            yield valid[:i] + valid[i + 1:]
        yield valid + rng.randbytes(rng.randrange(1, 16))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name,version", REQUESTS, ids=[_id(p) for p in REQUESTS])
@FUZZ
@given(data=st.data())
def test_mutated_requests_raise_only_codec_error(name, version, data):
    obj = data.draw(message_strategy(name, version), label="obj")
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    rng = random.Random(seed)
    valid = message(name).encode_bytes(obj, version)
    assert check_decode(name, version, valid) is not None
    for buf in mutations(valid, rng):
        check_decode(name, version, buf)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name,version", REQUESTS + RESPONSES, ids=[_id(p) for p in REQUESTS + RESPONSES])
def test_random_bytes_raise_only_codec_error(name, version):
    rng = random.Random(f"{name}/{version}")
    for _ in range(30):
        check_decode(name, version, rng.randbytes(rng.randrange(0, 48)))
    # Structured noise: mostly small ints / short lengths, which get much deeper into a decoder.
    for _ in range(30):
        parts = []
        for _ in range(rng.randrange(1, 24)):
            kind = rng.randrange(4)
            if kind == 0:
                parts.append(struct.pack(">i", rng.choice([0, 1, 2, -1, 0x7FFFFFFF])))
            elif kind == 1:
                parts.append(struct.pack(">h", rng.choice([0, 1, 3, -1, 0x7FFF])))
            elif kind == 2:
                parts.append(bytes([rng.choice([0, 1, 2, 3, 0x80, 0xFF])]))
            else:
                parts.append(rng.randbytes(rng.randrange(1, 6)))
        check_decode(name, version, b"".join(parts))


@pytest.mark.timeout(120)
def test_inflated_lengths_do_not_allocate():
    """With tracemalloc watching: a small frame claiming huge counts/lengths must fail fast, small."""
    tracemalloc.start()
    try:
        for name, version in REQUESTS:
            codec = message(name)
            valid = codec.encode_bytes(codec.cls(), version)
            for i in range(len(valid) + 1):
                for pattern in INFLATED[:4] + INFLATED[6:8]:
                    for buf in (valid[:i] + pattern + valid[i + len(pattern):], valid[:i] + pattern + valid[i:]):
                        tracemalloc.reset_peak()
                        base = tracemalloc.get_traced_memory()[0]
                        try:
                            codec.decode(buf, version)
                        except CodecError:
                            pass
                        peak = tracemalloc.get_traced_memory()[1] - base
                        assert peak < MAX_DECODE_BYTES, f"{name} v{version}: {peak} bytes decoding {buf.hex()}"
    finally:
        tracemalloc.stop()


def test_huge_array_count_in_tiny_frame():
    """The classic attack: a 0x7fffffff element count with nothing after it."""
    codec = message("MetadataRequest")
    for version, buf in ((1, "7fffffff"), (9, "ffffffff0f" "00" "00" "00"), (0, "7fffffff" "0001")):
        with pytest.raises(CodecError):
            codec.decode(bytes.fromhex(buf), version)
    produce = message("ProduceRequest")
    # TransactionalId null, acks, timeout, one topic "t", 0x7fffffff partitions.
    with pytest.raises(CodecError):
        produce.decode(bytes.fromhex("ffff" "ffff" "000003e8" "00000001" "000174" "7fffffff"), 3)
    # Records claiming 2 GiB.
    with pytest.raises(CodecError):
        produce.decode(bytes.fromhex("ffff" "ffff" "000003e8" "00000001" "000174" "00000001" "00000000" "7fffffff"), 3)


def test_unknown_version_is_a_codec_error():
    with pytest.raises(CodecError):
        message("FetchRequest").decode(b"", 999)


from trireme.wire import headers as H  # noqa: E402


def test_request_header_fuzz():
    rng = random.Random(7)
    valid = [H.encode_request_header(18, 3, 5, "client-1", True), H.encode_request_header(3, 1, 5, None, False)]
    bufs = [rng.randbytes(rng.randrange(0, 24)) for _ in range(300)]
    for v in valid:
        bufs += list(mutations(v, rng))
    for buf in bufs:
        for flexible in (False, True):
            try:
                hdr = H.decode_request_header(buf, flexible)
            except CodecError:
                continue
            except Exception as e:  # noqa: BLE001
                pytest.fail(f"{type(e).__name__}: {e} decoding header {buf.hex()}")
            assert 0 <= hdr.size <= len(buf)
        try:
            H.peek_api(buf)
        except CodecError:
            pass


def test_transactional_frames_mutated_decode_or_raise_codec_error():
    """The transactional fuzzer's frames (compat_tests/txn_fuzz.py: every transactional API at several versions,
    fields set to boundary values and other ids, byte flips, truncations, splices) through the header and body
    decoders: CodecError or a request that re-encodes to a fixed point.  The broker side is
    compat_tests/test_fuzz_transactions.py."""
    from compat_tests.txn_fuzz import API_KEYS, Scene, mutate, templates
    scene = Scene({"fz-a": (1000, 0), "fz-b": (1001, 32766)}, ["fz-t"], ["committed"], "fz-group")
    rng = random.Random(int(os.environ.get("TRIREME_FUZZ_SEED", "20")))
    decoded = 0
    for i in range(int(os.environ.get("TRIREME_FUZZ_FRAMES", "3000"))):
        api, version, obj = rng.choice(templates(scene, rng))
        _, data = mutate(api, version, obj, scene, rng, i)
        body = data[4:]
        if len(body) < 4:
            continue
        api_key, api_version = struct.unpack_from(">hh", body)
        codec = message(api + "Request")
        if api_key != API_KEYS[api] or not codec.min_version <= api_version <= codec.max_version:
            continue                        # a flipped key or version: the broker refuses the header
        try:
            head = H.decode_request_header(body, codec.is_flexible(api_version))
        except CodecError:
            continue
        if check_decode(api + "Request", api_version, bytes(body[head.size:])) is not None:
            decoded += 1
    assert decoded > 100                    # most field mutations stay decodable
