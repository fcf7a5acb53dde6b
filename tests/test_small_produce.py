"""wire/small_produce.py against the compiled codec, which defines the bytes: the same fields read, nothing read that
the codec refuses or reads otherwise, the same answer written."""
from __future__ import annotations

import uuid

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trireme.wire import small_produce as S
from trireme.wire.codec import message
from trireme.wire.primitives import CodecError

REQUEST = message("ProduceRequest")
RESPONSE = message("ProduceResponse")
VERSIONS = st.integers(3, 13)
NAMES = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=0, max_size=140)
INT32 = st.integers(-2**31, 2**31 - 1)
INT64 = st.integers(-2**63, 2**63 - 1)


def request_body(version, *, name="t", topic_id=None, index=0, records=b"batch", acks=-1, timeout=30000,
                 transactional_id=None, partitions=1, topics=1) -> bytes:
    cls = REQUEST.cls
    topic_cls = cls.TopicProduceData
    part_cls = topic_cls.PartitionProduceData
    body = cls(transactional_id=transactional_id, acks=acks, timeout_ms=timeout, topic_data=[
        topic_cls(name=name, topic_id=topic_id or uuid.UUID(int=0),
                  partition_data=[part_cls(index=index + i, records=records) for i in range(partitions)])
        for _ in range(topics)])
    return REQUEST.encode_bytes(body, version)


def generic(body: bytes, version: int):
    """What the codec reads, in SmallProduce's terms (None if it is not the small shape), or CodecError."""
    try:
        request, end = REQUEST.decode(memoryview(bytearray(body)), version)
    except CodecError:
        return CodecError
    if end != len(body) or request.transactional_id is not None or len(request.topic_data) != 1:
        return None
    [topic] = request.topic_data
    if len(topic.partition_data) != 1 or not topic.partition_data[0].records:
        return None
    [part] = topic.partition_data
    return (request.acks, request.timeout_ms, topic.name if version < 13 else None,
            topic.topic_id if version >= 13 else None, part.index, bytes(part.records))


def fast(body: bytes, version: int, pos: int = 0):
    small = S.read_small_produce(bytearray(body), pos, version)
    if small is None:
        return None
    return small._replace(records=bytes(small.records))


@settings(max_examples=300, deadline=None)
@given(version=VERSIONS, name=NAMES, topic_id=st.uuids(), index=INT32, acks=st.integers(-32768, 32767),
       timeout=INT32, records=st.binary(min_size=1, max_size=300))
def test_the_small_shape_is_read_as_the_codec_reads_it(version, name, topic_id, index, acks, timeout, records):
    body = request_body(version, name=name, topic_id=topic_id, index=index, records=records, acks=acks,
                        timeout=timeout)
    want = generic(body, version)
    got = fast(body, version)
    if got is None:                 # not expected: v9-12 names of 127+ bytes, once left to the codec, are read too
        assert version in range(9, 13) and len(name.encode()) >= 127
    else:
        assert tuple(got) == want


@settings(max_examples=200, deadline=None)
@given(version=VERSIONS, shape=st.sampled_from(["two partitions", "two topics", "transactional", "no records"]))
def test_other_shapes_are_left_to_the_codec(version, shape):
    kwargs = {"two partitions": {"partitions": 2}, "two topics": {"topics": 2},
              "transactional": {"transactional_id": "tx"}, "no records": {"records": None}}[shape]
    assert fast(request_body(version, **kwargs), version) is None


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(version=VERSIONS, data=st.data())
def test_nothing_the_codec_refuses_or_reads_otherwise_is_read(version, data):
    """Mutated and truncated small requests: whenever the fast reader accepts bytes, the codec reads the same."""
    body = bytearray(request_body(version, name=data.draw(NAMES), records=data.draw(st.binary(min_size=1,
                                                                                              max_size=40))))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(body) - 1))
        body[at] = data.draw(st.integers(0, 255))
    body = body[:data.draw(st.integers(0, len(body)))] + data.draw(st.binary(max_size=3))
    got = fast(bytes(body), version)
    if got is not None:
        assert tuple(got) == generic(bytes(body), version)


@given(version=VERSIONS, any_bytes=st.binary(max_size=60))
@settings(max_examples=300, deadline=None)
def test_any_bytes(version, any_bytes):
    got = fast(any_bytes, version)
    if got is not None:
        assert tuple(got) == generic(any_bytes, version)


def test_the_body_is_read_where_it_starts_and_records_view_the_frame():
    body = request_body(9, name="orders", index=3, records=b"0123456789")
    frame = bytearray(b"HEADER" + body)
    small = S.read_small_produce(frame, 6, 9)
    assert (small.topic, small.partition, bytes(small.records)) == ("orders", 3, b"0123456789")
    small.records[0:1] = b"X"                       # the batch is rewritten in place (leader epoch, offsets)
    assert b"X123456789" in frame and b"0123456789" not in frame


def test_topic_ids_are_read_right_past_the_bound_of_the_cache():
    ids = [uuid.uuid4() for _ in range(S._TOPIC_IDS_MAX + 10)]
    for topic_id in ids + ids[:5]:
        assert fast(request_body(13, topic_id=topic_id), 13).topic_id == topic_id
        assert len(S._TOPIC_IDS) <= S._TOPIC_IDS_MAX


@settings(max_examples=300, deadline=None)
@given(version=VERSIONS, name=NAMES, topic_id=st.uuids(), index=INT32, base=INT64, append_time=INT64,
       start=INT64)
def test_the_answer_is_the_codecs(version, name, topic_id, index, base, append_time, start):
    cls = RESPONSE.cls
    out = cls.TopicProduceResponse(name=name, topic_id=topic_id)
    part = cls.TopicProduceResponse.PartitionProduceResponse(index=index, base_offset=base)
    part.log_append_time_ms = append_time
    part.log_start_offset = start
    out.partition_responses.append(part)
    response = cls()
    response.responses.append(out)
    assert S.encode_small_produce_response(version, name, topic_id, index, base, append_time, start) == \
        b"".join(RESPONSE.encode(response, version))


def test_golden_answer_v9():
    assert S.encode_small_produce_response(9, "tp", None, 1, 7, -1, 0).hex() == (
        "02" "03" "7470" "02" "00000001" "0000" "0000000000000007" "ffffffffffffffff" "0000000000000000"
        "01" "00" "00" "00" "00000000" "00")
