"""Fetch's leader-epoch checks (server/handlers/fetch.py): CurrentLeaderEpoch errors answered at once, and
LastFetchedEpoch (v12+) checked as Kafka's Partition.readRecords checks it (diverging epoch, OFFSET_OUT_OF_RANGE)."""
from __future__ import annotations

import pytest
import trio

from tests.test_admin_handlers import append, handler, make_broker, req
from trireme.server.deferred import Deferred
from trireme.server.dispatch import RequestContext
from trireme.wire import error_codes as E

F = req("Fetch")


@pytest.fixture
def broker(tmp_path):
    b = make_broker(tmp_path / "data")
    b.ensure_topic("t", 1)
    append(b, "t", 0, 5)
    yield b
    b.close()


def fetch(broker, version, *, offset, current=-1, last_fetched=-1, max_wait_ms=10_000):
    """The handler's answer: a response (answered at once) or a Deferred (a long poll)."""
    h = handler("Fetch")
    topic_id = broker.topics.get("t").topic_id
    partition = F.FetchTopic.FetchPartition(partition=0, current_leader_epoch=current, fetch_offset=offset,
                                            last_fetched_epoch=last_fetched, log_start_offset=-1,
                                            partition_max_bytes=1 << 20)
    request = F(replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=1 << 20, isolation_level=0,
                session_id=0, session_epoch=-1, topics=[F.FetchTopic(topic="t", topic_id=topic_id,
                                                                      partitions=[partition])],
                forgotten_topics_data=[], rack_id="")
    frame = bytearray(h.request.encode_bytes(request, version))
    decoded, _ = h.request.decode(frame, version)
    ctx = RequestContext(broker=broker, api_key=h.api_key, api_version=version, correlation_id=7, client_id="tests",
                         principal="User:ANONYMOUS", connection=None, frame=frame)

    async def answer():                 # a long poll reads trio's clock
        return h.fn(ctx, decoded)
    return trio.run(answer)


def only(response):
    return response.responses[0].partitions[0]


@pytest.mark.parametrize("current,error", [(1, E.UNKNOWN_LEADER_EPOCH), (0, None)])
def test_an_epoch_error_is_answered_at_once_not_after_max_wait(broker, current, error):
    answer = fetch(broker, 12, offset=5, current=current)       # at the log end: nothing to read
    if error is None:
        assert isinstance(answer, Deferred)                     # the right epoch waits for data, as before
    else:
        assert not isinstance(answer, Deferred)
        assert only(answer).error_code == error.code


def test_a_fetch_past_the_end_of_its_last_fetched_epoch_gets_the_diverging_epoch(broker):
    epoch = broker.partition("t", 0).leader_epoch
    answer = fetch(broker, 12, offset=8, last_fetched=epoch)
    assert not isinstance(answer, Deferred)
    p = only(answer)
    assert (p.error_code, p.diverging_epoch.epoch, p.diverging_epoch.end_offset, bytes(p.records)) == \
        (0, epoch, 5, b"")
    # v11 has no such field: past the log end is out of range
    assert only(fetch(broker, 11, offset=8, last_fetched=epoch, max_wait_ms=0)).error_code == \
        E.OFFSET_OUT_OF_RANGE.code


def test_an_unknown_last_fetched_epoch_is_offset_out_of_range(broker):
    epoch = broker.partition("t", 0).leader_epoch
    answer = fetch(broker, 12, offset=2, last_fetched=epoch + 1)
    assert not isinstance(answer, Deferred)
    assert only(answer).error_code == E.OFFSET_OUT_OF_RANGE.code


def test_a_last_fetched_epoch_that_agrees_reads_as_usual(broker):
    epoch = broker.partition("t", 0).leader_epoch
    p = only(fetch(broker, 12, offset=2, last_fetched=epoch))
    assert (p.error_code, p.diverging_epoch.epoch) == (0, -1)
    assert len(p.records) > 0
