"""Produce's fast path (server/handlers/produce.py: produce_small) answers exactly as the general handler does.

Two brokers get the same requests, one through the fast path and one through the codec and ``produce``; their
answers must be the same bytes, whether accepted, refused, a duplicate, or lost to a failed fsync.  Requests of
another shape must be left to the general path untouched.
"""
from __future__ import annotations

import pytest

from broker_runner import run_with_broker
from trireme.server.broker import Broker
from trireme.server.config import Config
from trireme.server.deferred import Deferred
from trireme.server.dispatch import HANDLERS, NOT_HANDLED, Encoded, RequestContext, load_handlers
from trireme.state.storage import MemoryStorage
from trireme.wire import error_codes as E
from trireme.wire import records
from trireme.wire.codec import message

load_handlers()
PRODUCE = HANDLERS[0]
REQUEST = message("ProduceRequest")
HEADER = b"HDR"                        # the body starts after some header bytes, as in a frame


def make(storage=None, **props) -> Broker:
    config = Config(data_dir="/data")
    config.update(props)
    broker = Broker(config, storage or MemoryStorage())
    broker.ensure_topic("t", 2)
    return broker


def body(version, batch, *, topic="t", topic_id=None, acks=-1, partitions=(0,), transactional_id=None) -> bytes:
    cls = REQUEST.cls
    tcls = cls.TopicProduceData
    request = cls(transactional_id=transactional_id, acks=acks, timeout_ms=1000, topic_data=[tcls(
        name=topic, topic_id=topic_id, partition_data=[tcls.PartitionProduceData(index=p, records=batch)
                                                       for p in partitions])])
    return REQUEST.encode_bytes(request, version)


def context(broker, version, frame) -> RequestContext:
    return RequestContext(broker=broker, api_key=0, api_version=version, correlation_id=7, client_id="tests",
                          principal="User:ANONYMOUS", connection=None, frame=frame)


async def answer(result, version) -> bytes:
    """The response body a handler's result comes to (waiting for a Deferred)."""
    if type(result) is Deferred:
        result = await result.wait()
    if type(result) is Encoded:
        return result.body
    return PRODUCE.response.encode_bytes(result, version)


async def fast(broker, version, data: bytes):
    frame = bytearray(HEADER + data)
    result = PRODUCE.fast(context(broker, version, frame), frame, len(HEADER))
    return NOT_HANDLED if result is NOT_HANDLED else await answer(result, version)


async def general(broker, version, data: bytes) -> bytes:
    frame = bytearray(data)
    request, _ = REQUEST.decode(memoryview(frame), version)
    return await answer(PRODUCE.fn(context(broker, version, frame), request), version)


def both(version, batches: list[bytes], **shape) -> list[tuple[bytes, bytes]]:
    """Each batch produced to a fast-path broker and to a general-path one → their answers, pairwise."""
    answers: dict = {fast: [], general: []}
    for path in (fast, general):
        async def main(b, path=path):
            for one in batches:
                answers[path].append(await path(b, version, body(version, one, **shape)))
        run_with_broker(make(), main)
    return list(zip(answers[fast], answers[general]))


def batch(n=1, **kw) -> bytes:
    return bytes(records.build_batch([(None, b"v%d" % i) for i in range(n)], **kw))


def decoded(version, data):
    return message("ProduceResponse").decode(data, version)[0].responses[0].partition_responses[0]


@pytest.mark.parametrize("version", [3, 7, 8, 9, 11, 12])
def test_accepted_batches_are_answered_alike(version):
    pairs = both(version, [batch(1), batch(3), batch(10)])
    for fast_answer, general_answer in pairs:
        assert fast_answer == general_answer
    assert [decoded(version, f).base_offset for f, _ in pairs] == [0, 1, 4]


def test_topic_ids_v13():
    broker = make()
    topic_id = broker.topics.get("t").topic_id
    got = []

    async def main(b):
        got.append(await fast(b, 13, body(13, batch(2), topic=None, topic_id=topic_id)))
        got.append(await general(b, 13, body(13, batch(2), topic=None, topic_id=topic_id)))
    run_with_broker(broker, main)
    response = message("ProduceResponse").decode(got[0], 13)[0]
    assert response.responses[0].topic_id == topic_id
    assert [(p.error_code, p.base_offset) for p in response.responses[0].partition_responses] == [(0, 0)]
    assert got[1] == got[0].replace(bytes.fromhex("0000000000000000" "ffffffffffffffff"),
                                    bytes.fromhex("0000000000000002" "ffffffffffffffff"))   # base offset 2


@pytest.mark.parametrize("version", [8, 9])
def test_refused_batches_are_answered_alike(version):
    good = bytearray(batch(2))
    bad_crc = bytearray(good)
    bad_crc[-1] ^= 0xFF
    cases = [bytes(bad_crc), b"\x00" * 70, batch(1, control=True)]
    for fast_answer, general_answer in both(version, cases):
        assert fast_answer == general_answer
        assert decoded(version, fast_answer).error_code in (E.CORRUPT_MESSAGE.code, E.INVALID_RECORD.code)
        assert decoded(version, fast_answer).record_errors


def test_idempotent_duplicates_are_answered_alike():
    first = batch(2, producer_id=5, producer_epoch=0, base_sequence=0)
    pairs = both(9, [first, first, batch(1, producer_id=5, producer_epoch=0, base_sequence=7)])
    for fast_answer, general_answer in pairs:
        assert fast_answer == general_answer
    assert [(decoded(9, f).error_code, decoded(9, f).base_offset) for f, _ in pairs] == [
        (0, 0), (0, 0), (E.OUT_OF_ORDER_SEQUENCE_NUMBER.code, -1)]


def test_a_failed_fsync_is_answered_alike():
    answers = []
    for path in (fast, general):
        storage = MemoryStorage()
        broker = make(storage)

        async def main(b, path=path, storage=storage):
            storage.fail_next_sync()
            answers.append(await path(b, 9, body(9, batch(1))))
        run_with_broker(broker, main)
    assert answers[0] == answers[1]
    part = decoded(9, answers[0])
    assert (part.error_code, part.base_offset) == (E.KAFKA_STORAGE_ERROR.code, -1)


@pytest.mark.parametrize("shape", [
    {"acks": 0}, {"acks": 2}, {"topic": "missing"}, {"topic": "__consumer_offsets"}, {"partitions": (0, 1)},
    {"partitions": (5,)}, {"transactional_id": "tx"}])
def test_other_shapes_are_left_to_the_general_path(shape):
    broker = make()
    appended = broker.partition("t", 0).log.log_end_offset

    async def main(b):
        assert await fast(b, 9, body(9, batch(1), **shape)) is NOT_HANDLED
    run_with_broker(broker, main)
    assert broker.partition("t", 0).log.log_end_offset == appended           # nothing was appended


def test_a_transactional_batch_without_transactional_id_is_left_to_the_general_path():
    broker = make()

    async def main(b):
        tx = batch(1, producer_id=3, producer_epoch=0, base_sequence=0, transactional=True)
        assert await fast(b, 9, body(9, tx)) is NOT_HANDLED
    run_with_broker(broker, main)


def test_a_refusal_is_answered_at_once():
    """Nothing waits for a flush: the answer is the response object, not a Deferred."""
    broker = make()
    frame = bytearray(HEADER + body(9, b"\x00" * 70))
    result = PRODUCE.fast(context(broker, 9, frame), frame, len(HEADER))
    assert type(result) is message("ProduceResponse").cls


@pytest.mark.parametrize("props", [{"trireme.fsync.enable": False}, {"log.flush.interval.messages": 1000}])
def test_an_answer_durable_already_is_answered_at_once_as_the_general_path_answers(props):
    """Without an fsync to wait for (fsync off, Kafka's flush policy) an accepted batch's answer is the encoded
    answer itself, not a Deferred; the general path's Deferred, ready at once, answers the same bytes."""
    got = {}
    for path in (fast, general):
        async def main(b, path=path):
            got[path] = [await path(b, 9, body(9, batch(2))) for _ in range(2)]
        run_with_broker(make(**props), main)
    assert got[fast] == got[general]
    assert [decoded(9, a).base_offset for a in got[fast]] == [0, 2]

    async def at_once(b):
        frame = bytearray(HEADER + body(9, batch(2)))
        assert type(PRODUCE.fast(context(b, 9, frame), frame, len(HEADER))) is Encoded
    run_with_broker(make(**props), at_once)


def test_the_wait_for_durability_holds_no_part_of_the_frame():
    """The frame is freed when the request has been handled, as the general path frees it: a 1 MB frame kept
    until its fsync made the allocator map fresh memory for every large request (measured: 15-30 % more
    event-loop CPU for 1 MB batches)."""
    broker = make()
    frame = bytearray(HEADER + body(9, batch(3)))
    ctx = context(broker, 9, frame)
    result = PRODUCE.fast(ctx, frame, len(HEADER))
    assert type(result) is Deferred
    held = [cell.cell_contents for fn in (result.wait, result.ready) for cell in fn.__closure__ or ()]
    assert held and not any(x is frame or x is ctx or isinstance(x, memoryview) for x in held)
