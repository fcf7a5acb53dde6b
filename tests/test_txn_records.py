"""Tests for the __transaction_state record codec: byte layouts, versions, tagged fields, tombstones, round trips
and malformed input."""
from __future__ import annotations

import dataclasses
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trireme.state import txn_records as tr
from trireme.state.txn_records import TxnLogValue, TxnRecordError, TxnState
from trireme.wire.codec import message


# --- helpers that spell out Kafka's primitive encodings ---------------------------------------

def kstr(s: str) -> bytes:
    """A classic string: int16 length, UTF-8 bytes."""
    data = s.encode()
    return struct.pack(">h", len(data)) + data


def uvarint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def cstr(s: str) -> bytes:
    """A compact string: uvarint(length + 1), UTF-8 bytes."""
    data = s.encode()
    return uvarint(len(data) + 1) + data


def tag(number: int, payload: bytes) -> bytes:
    """One tagged field: uvarint tag, uvarint size, payload."""
    return uvarint(number) + uvarint(len(payload)) + payload


def ongoing(**changes) -> TxnLogValue:
    """A value in the Ongoing state with partitions a-1, b-0 and b-2."""
    base = dict(producer_id=5, producer_epoch=1, transaction_timeout_ms=60000, state=TxnState.ONGOING,
                partitions=(("b", 2), ("a", 1), ("b", 0)), last_update_timestamp_ms=10, start_timestamp_ms=9)
    base.update(changes)
    return TxnLogValue(**base)


# --- states ----------------------------------------------------------------------------------

def test_state_codes_and_names():
    assert [(s.name, int(s)) for s in TxnState] == [
        ("EMPTY", 0), ("ONGOING", 1), ("PREPARE_COMMIT", 2), ("PREPARE_ABORT", 3),
        ("COMPLETE_COMMIT", 4), ("COMPLETE_ABORT", 5), ("DEAD", 6), ("PREPARE_EPOCH_FENCE", 7)]
    assert TxnState.PREPARE_EPOCH_FENCE.kafka_name == "PrepareEpochFence"
    assert TxnState.EMPTY.kafka_name == "Empty"


def test_value_version_follows_the_transaction_version_feature():
    assert [tr.value_version_for(level) for level in (0, 1, 2, 3)] == [0, 1, 1, 1]


def test_value_normalises_partitions_and_state():
    v = TxnLogValue(producer_id=1, producer_epoch=0, transaction_timeout_ms=1, state=2,
                    partitions=[("b", 1), ("a", 3), ("b", 1), ("a", 0)],
                    last_update_timestamp_ms=0, start_timestamp_ms=0)
    assert v.partitions == (("a", 0), ("a", 3), ("b", 1))
    assert v.state is TxnState.PREPARE_COMMIT
    assert (v.previous_producer_id, v.next_producer_id, v.next_producer_epoch, v.client_transaction_version) \
        == (-1, -1, -1, 0)


# --- byte layouts, written out by hand from the field layout ---------------------------------

def test_key_layout():
    assert tr.encode_txn_key("my-txn") == struct.pack(">h", 0) + kstr("my-txn")
    assert tr.decode_txn_key(struct.pack(">h", 0) + kstr("my-txn")) == "my-txn"


def test_value_v0_layout():
    expected = (struct.pack(">h", 0)                                  # value version
                + struct.pack(">qhib", 5, 1, 60000, 1)                # producer id, epoch, timeout, Ongoing
                + struct.pack(">i", 2)                                # two topics
                + kstr("a") + struct.pack(">ii", 1, 1)                # a: [1]
                + kstr("b") + struct.pack(">iii", 2, 0, 2)            # b: [0, 2]
                + struct.pack(">qq", 10, 9))                          # last update, start
    assert tr.encode_txn_value(ongoing(), version=0) == expected
    assert tr.decode_txn_value(expected) == ongoing()


def test_value_v1_layout_with_every_tagged_field():
    value = ongoing(previous_producer_id=4, next_producer_id=6, client_transaction_version=2,
                    next_producer_epoch=0)
    expected = (struct.pack(">h", 1)
                + struct.pack(">qhib", 5, 1, 60000, 1)
                + uvarint(2 + 1)                                      # compact array of two topics
                + cstr("a") + uvarint(1 + 1) + struct.pack(">i", 1) + b"\x00"       # a: [1], no tags
                + cstr("b") + uvarint(2 + 1) + struct.pack(">ii", 0, 2) + b"\x00"   # b: [0, 2], no tags
                + struct.pack(">qq", 10, 9)
                + uvarint(4)                                          # four tagged fields, by tag
                + tag(0, struct.pack(">q", 4))                        # PreviousProducerId
                + tag(1, struct.pack(">q", 6))                        # NextProducerId
                + tag(2, struct.pack(">h", 2))                        # ClientTransactionVersion
                + tag(3, struct.pack(">h", 0)))                       # NextProducerEpoch
    assert tr.encode_txn_value(value, version=1) == expected
    assert tr.decode_txn_value(expected) == value


def test_value_v1_writes_only_non_default_tags():
    expected = (struct.pack(">h", 1) + struct.pack(">qhib", 5, 1, 60000, 1)
                + uvarint(3) + cstr("a") + uvarint(2) + struct.pack(">i", 1) + b"\x00"
                + cstr("b") + uvarint(3) + struct.pack(">ii", 0, 2) + b"\x00"
                + struct.pack(">qq", 10, 9) + uvarint(0))
    assert tr.encode_txn_value(ongoing(), version=1) == expected
    with_epoch = tr.encode_txn_value(ongoing(next_producer_epoch=7), version=1)
    assert with_epoch == expected[:-1] + uvarint(1) + tag(3, struct.pack(">h", 7))


def test_empty_state_writes_a_null_partition_array():
    empty = TxnLogValue(producer_id=3, producer_epoch=0, transaction_timeout_ms=100, state=TxnState.EMPTY,
                        last_update_timestamp_ms=7, start_timestamp_ms=-1)
    assert tr.encode_txn_value(empty, version=0) == (
        struct.pack(">h", 0) + struct.pack(">qhib", 3, 0, 100, 0) + struct.pack(">i", -1)
        + struct.pack(">qq", 7, -1))
    assert tr.encode_txn_value(empty, version=1) == (
        struct.pack(">h", 1) + struct.pack(">qhib", 3, 0, 100, 0) + uvarint(0)
        + struct.pack(">qq", 7, -1) + uvarint(0))
    for version in (0, 1):
        assert tr.decode_txn_value(tr.encode_txn_value(empty, version=version)) == empty


def test_other_states_without_partitions_write_an_empty_array():
    dead = ongoing(state=TxnState.DEAD, partitions=())
    assert tr.encode_txn_value(dead, version=0)[17:21] == struct.pack(">i", 0)
    assert tr.encode_txn_value(dead, version=1)[17:18] == uvarint(1)
    assert tr.decode_txn_value(tr.encode_txn_value(dead, version=1)) == dead


def test_empty_state_with_partitions_cannot_be_written():
    with pytest.raises(TxnRecordError):
        tr.encode_txn_value(ongoing(state=TxnState.EMPTY), version=1)


def test_empty_state_ignores_stored_partitions():
    # Kafka reads no partitions for an Empty transaction, whatever the record holds.
    stored = tr.encode_txn_value(ongoing(), version=0)
    as_empty = stored[:16] + struct.pack(">b", 0) + stored[17:]
    assert tr.decode_txn_value(as_empty) == ongoing(state=TxnState.EMPTY, partitions=())


def test_unknown_encode_versions_are_refused():
    for version in (-1, 2):
        with pytest.raises(TxnRecordError):
            tr.encode_txn_value(ongoing(), version=version)


def test_out_of_range_values_cannot_be_written():
    with pytest.raises(TxnRecordError):
        tr.encode_txn_value(ongoing(producer_epoch=1 << 15), version=0)
    with pytest.raises(TxnRecordError):
        tr.encode_txn_value(ongoing(partitions=(("t", 1 << 31),)), version=1)
    with pytest.raises(TxnRecordError):
        tr.encode_txn_key("x" * 40000)


# --- versions and tagged fields --------------------------------------------------------------

def test_tagged_fields_are_absent_at_v0():
    tagged = ongoing(previous_producer_id=4, next_producer_id=6, client_transaction_version=2,
                     next_producer_epoch=3)
    assert tr.encode_txn_value(tagged, version=0) == tr.encode_txn_value(ongoing(), version=0)
    assert tr.decode_txn_value(tr.encode_txn_value(tagged, version=0)) == ongoing()


def test_definition_tags_and_defaults():
    spec = {f.name: f for f in message("TransactionLogValue").spec.fields}
    tagged = {name: (f.tag, f.default, f.tagged.low) for name, f in spec.items() if f.tagged is not None}
    assert tagged == {"PreviousProducerId": (0, -1, 1), "NextProducerId": (1, -1, 1),
                      "ClientTransactionVersion": (2, 0, 1), "NextProducerEpoch": (3, -1, 1)}
    assert not any(spec[name].present(0) for name in tagged)
    codec = message("TransactionLogValue")
    assert (codec.min_version, codec.max_version, codec.is_flexible(0), codec.is_flexible(1)) == (0, 1, False, True)


@pytest.mark.parametrize("version", [2, 5, 0x7FFF])
def test_newer_value_versions_read_as_the_latest_known(version):
    value = ongoing(next_producer_id=11, next_producer_epoch=2)
    data = tr.encode_txn_value(value, version=1)
    assert tr.decode_txn_value(struct.pack(">h", version) + data[2:]) == value


def test_unknown_tags_are_skipped():
    # A future writer's extra tags, both at the top level and inside a partition entry, are ignored.
    data = (struct.pack(">h", 1) + struct.pack(">qhib", 5, 1, 60000, 1)
            + uvarint(2) + cstr("a") + uvarint(2) + struct.pack(">i", 1)
            + uvarint(1) + tag(100, b"xyz")
            + struct.pack(">qq", 10, 9)
            + uvarint(3) + tag(1, struct.pack(">q", 6)) + tag(3, struct.pack(">h", 4)) + tag(9, b"\x01\x02"))
    assert tr.decode_txn_value(data) == ongoing(partitions=(("a", 1),), next_producer_id=6, next_producer_epoch=4)


def test_tombstone():
    key, value = tr.txn_tombstone("gone")
    assert value is None and tr.decode_txn_key(key) == "gone"
    assert tr.decode_txn_value(None) is None


def test_txn_record_pairs_key_and_value():
    key, value = tr.txn_record("t1", ongoing(), version=1)
    assert (tr.decode_txn_key(key), tr.decode_txn_value(value)) == ("t1", ongoing())


def test_decoding_accepts_bytearray_and_memoryview():
    data = tr.encode_txn_value(ongoing(), version=1)
    assert tr.decode_txn_value(bytearray(data)) == tr.decode_txn_value(memoryview(data)) == ongoing()
    key = tr.encode_txn_key("k")
    assert tr.decode_txn_key(memoryview(key)) == tr.decode_txn_key(bytearray(key)) == "k"


# --- malformed input -------------------------------------------------------------------------

def test_wrong_key_versions_raise():
    for version in (1, 2, -1, 0x7FFF):
        with pytest.raises(TxnRecordError):
            tr.decode_txn_key(struct.pack(">h", version) + kstr("t"))


def test_negative_value_versions_raise():
    data = tr.encode_txn_value(ongoing(), version=0)
    with pytest.raises(TxnRecordError):
        tr.decode_txn_value(struct.pack(">h", -1) + data[2:])


def test_unknown_status_raises():
    data = tr.encode_txn_value(ongoing(), version=0)
    for status in (8, -1, 127):
        with pytest.raises(TxnRecordError):
            tr.decode_txn_value(data[:16] + struct.pack(">b", status) + data[17:])


def test_null_topic_and_null_key_raise():
    with pytest.raises(TxnRecordError):
        tr.decode_txn_key(struct.pack(">hh", 0, -1))
    data = (struct.pack(">h", 0) + struct.pack(">qhib", 5, 1, 60000, 1) + struct.pack(">i", 1)
            + struct.pack(">h", -1) + struct.pack(">i", 0) + struct.pack(">qq", 10, 9))
    with pytest.raises(TxnRecordError):
        tr.decode_txn_value(data)


def test_non_bytes_raise():
    with pytest.raises(TxnRecordError):
        tr.decode_txn_value("not bytes")
    with pytest.raises(TxnRecordError):
        tr.decode_txn_key(12)


def _truncations(data: bytes):
    return [data[:n] for n in range(len(data))]


@pytest.mark.parametrize("version", [0, 1])
def test_values_truncated_at_every_length_raise(version):
    value = ongoing(previous_producer_id=4, next_producer_id=6, client_transaction_version=2,
                    next_producer_epoch=1)
    for prefix in _truncations(tr.encode_txn_value(value, version=version)):
        with pytest.raises(TxnRecordError):
            tr.decode_txn_value(prefix)


def test_keys_truncated_at_every_length_raise():
    for prefix in _truncations(tr.encode_txn_key("transactional-id-é")):
        with pytest.raises(TxnRecordError):
            tr.decode_txn_key(prefix)


@given(st.binary(max_size=80))
def test_arbitrary_bytes_decode_or_raise_txn_record_error(data):
    for decode in (tr.decode_txn_key, tr.decode_txn_value):
        try:
            decode(data)
        except TxnRecordError:
            pass


@given(st.sampled_from([0, 1]), st.data())
def test_corrupted_values_decode_or_raise_txn_record_error(version, data):
    encoded = bytearray(tr.encode_txn_value(ongoing(next_producer_epoch=5, previous_producer_id=2),
                                            version=version))
    index = data.draw(st.integers(0, len(encoded) - 1))
    encoded[index] = data.draw(st.integers(0, 255))
    try:
        result = tr.decode_txn_value(bytes(encoded))
    except TxnRecordError:
        return
    assert isinstance(result, TxnLogValue)


# --- round trips -----------------------------------------------------------------------------

int16 = st.integers(-(2**15), 2**15 - 1)
int32 = st.integers(-(2**31), 2**31 - 1)
int64 = st.integers(-(2**63), 2**63 - 1)
topics = st.text(max_size=12)


@st.composite
def txn_values(draw) -> TxnLogValue:
    state = draw(st.sampled_from(TxnState))
    partitions = () if state is TxnState.EMPTY else draw(
        st.lists(st.tuples(topics, int32), max_size=8))
    return TxnLogValue(
        producer_id=draw(int64), previous_producer_id=draw(int64), next_producer_id=draw(int64),
        producer_epoch=draw(int16), next_producer_epoch=draw(int16), transaction_timeout_ms=draw(int32),
        state=state, partitions=partitions, last_update_timestamp_ms=draw(int64),
        start_timestamp_ms=draw(int64), client_transaction_version=draw(int16))


@given(txn_values())
def test_round_trip_v1(value):
    assert tr.decode_txn_value(tr.encode_txn_value(value, version=1)) == value


@given(txn_values())
def test_round_trip_v0_drops_tagged_fields(value):
    expected = dataclasses.replace(value, previous_producer_id=-1, next_producer_id=-1,
                                   next_producer_epoch=-1, client_transaction_version=0)
    assert tr.decode_txn_value(tr.encode_txn_value(value, version=0)) == expected


@given(txn_values(), st.sampled_from([0, 1]))
def test_partitions_are_grouped_by_topic_in_order(value, version):
    codec = message("TransactionLogValue")
    raw, _ = codec.decode(tr.encode_txn_value(value, version=version)[2:], version)
    if value.state is TxnState.EMPTY:
        assert raw.transaction_partitions is None
        return
    names = [entry.topic for entry in raw.transaction_partitions]
    assert names == sorted(set(names))
    for entry in raw.transaction_partitions:
        assert entry.partition_ids == sorted(set(entry.partition_ids))


@given(st.text(max_size=40))
def test_key_round_trip(transactional_id):
    assert tr.decode_txn_key(tr.encode_txn_key(transactional_id)) == transactional_id
