"""The coordinator's marker retries on trio's virtual clock: retriable errors back off (bounded) and are logged once a minute, not per attempt."""
from __future__ import annotations

import logging

import trio
import trio.testing

from trireme.server import transactions
from trireme.server.broker import Broker
from trireme.server.config import Config
from trireme.server.peers import PeerUnavailable
from trireme.state.storage import MemoryStorage
from trireme.state.transactions import MarkerJob
from trireme.wire import error_codes as E
from trireme.wire.codec import message

_RESPONSE = message("WriteTxnMarkersResponse").cls
_RESULT = _RESPONSE.WritableTxnMarkerResult
_TOPIC = _RESULT.WritableTxnMarkerTopicResult


class OfflinePartitionPeer:
    """Answers WriteTxnMarkers as a leader whose partition t-1 is offline (KAFKA_STORAGE_ERROR) until ``back``."""

    def __init__(self):
        self.back = False
        self.calls: list[float] = []

    async def call(self, api, version, request):
        assert api == "WriteTxnMarkers"
        self.calls.append(trio.current_time())
        out = _RESPONSE()
        for marker in request.markers:
            result = _RESULT(producer_id=marker.producer_id)
            for t in marker.topics:
                result.topics.append(_TOPIC(name=t.name, partitions=[_TOPIC.WritableTxnMarkerPartitionResult(
                    partition_index=p, error_code=E.KAFKA_STORAGE_ERROR.code if (t.name, p) == ("t", 1)
                    and not self.back else 0) for p in t.partition_indexes]))
            out.markers.append(result)
        return out


def test_an_offline_partition_is_retried_with_backoff_and_logged_once_a_minute(caplog):
    service = Broker(Config(data_dir="/data"), MemoryStorage()).transactions
    peer = OfflinePartitionPeer()
    service.peer = lambda node_id: peer
    job = MarkerJob("tx", producer_id=4242, producer_epoch=0, commit=True, partitions=(("t", 0), ("t", 1)))
    result = {}

    async def main():
        async with trio.open_nursery() as nursery:
            async def send():
                result["refused"] = await service._send_markers(job)
                result["done_at"] = trio.current_time()
            nursery.start_soon(send)
            await trio.sleep(120)                           # two minutes offline
            peer.back = True

    with caplog.at_level(logging.WARNING, logger="trireme.transactions"):
        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert result["refused"] == {}                          # written once the partition is back
    assert 120 < result["done_at"] <= 120 + transactions.MARKER_RETRY_MAX_BACKOFF_S
    # 0.1 s doubling up to 5 s: 6.3 s for the first seven attempts, then one every 5 s (it was 10 a second).
    assert 28 <= len(peer.calls) <= 31, len(peer.calls)
    gaps = [b - a for a, b in zip(peer.calls, peer.calls[1:])]
    assert [round(g, 6) for g in gaps[:7]] == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0]
    assert max(gaps) == transactions.MARKER_RETRY_MAX_BACKOFF_S
    lines = [r.getMessage() for r in caplog.records if "tx" in r.getMessage()]
    assert len(lines) == 2 and all("KAFKA_STORAGE_ERROR" in line for line in lines), lines   # at 0 s and 60 s


class UnreachablePeer(OfflinePartitionPeer):
    """A leader's broker that cannot be reached (PeerUnavailable, as a network peer raises it) for its first
    ``failures`` calls, then writes every marker."""

    def __init__(self, failures: int):
        super().__init__()
        self.back = True
        self.failures = failures

    async def call(self, api, version, request):
        if len(self.calls) < self.failures:
            self.calls.append(trio.current_time())
            raise PeerUnavailable(7, "cannot connect", E.NETWORK_EXCEPTION.code)
        return await super().call(api, version, request)


def test_an_unreachable_leader_is_retried_with_backoff(caplog):
    service = Broker(Config(data_dir="/data"), MemoryStorage()).transactions
    peer = UnreachablePeer(failures=3)
    asked = []
    service.peer = lambda node_id: asked.append(node_id) or peer
    job = MarkerJob("tx", producer_id=4242, producer_epoch=0, commit=True, partitions=(("t", 0), ("t", 1)))
    result = {}

    async def main():
        result["refused"] = await service._send_markers(job)

    with caplog.at_level(logging.INFO, logger="trireme.transactions"):
        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert result["refused"] == {}                          # written once the broker could be reached
    assert len(peer.calls) == 4 and set(asked) == {service.leader_node("t", 0)}
    gaps = [b - a for a, b in zip(peer.calls, peer.calls[1:])]
    assert [round(g, 6) for g in gaps] == [0.1, 0.2, 0.4]
    lines = [r.getMessage() for r in caplog.records]
    assert sum("markers to node 1 not sent: node 7: cannot connect" in line for line in lines) == 3, lines
    retrying = [line for line in lines if "NETWORK_EXCEPTION" in line]
    assert len(retrying) == 1 and "t-0, t-1" in retrying[0], lines         # logged once, not per attempt
