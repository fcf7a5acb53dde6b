"""The coordinator's marker retries, in an in-process broker on trio's virtual clock: retriable errors back off (bounded) and are logged once a minute, not per attempt."""
from __future__ import annotations

import logging

import trio
import trio.testing

from trireme.server import transactions
from trireme.server.broker import Broker
from trireme.server.config import Config
from trireme.server.dispatch import load_handlers
from trireme.state.storage import MemoryStorage
from trireme.state.transactions import MarkerJob

load_handlers()


def test_an_offline_partition_is_retried_with_backoff_and_logged_once_a_minute(caplog):
    broker = Broker(Config(data_dir="/data"), MemoryStorage())
    broker.create_topic("t", 2)
    offline = broker.partition("t", 1)
    offline.storage_error = "OSError('test')"                 # WriteTxnMarkers answers KAFKA_STORAGE_ERROR
    job = MarkerJob("tx", producer_id=4242, producer_epoch=0, commit=True, partitions=(("t", 0), ("t", 1)))
    calls = []
    call = broker.local_peer.call

    async def counting(api, version, request):
        calls.append(trio.current_time())
        return await call(api, version, request)
    broker.local_peer.call = counting
    result = {}

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            started = trio.current_time()

            async def send():
                result["refused"] = await broker.transactions._send_markers(job)
                result["done_at"] = trio.current_time() - started
            nursery.start_soon(send)
            await trio.sleep(120)                           # two minutes of virtual time offline
            offline.storage_error = None
            await trio.sleep(10)
            nursery.cancel_scope.cancel()

    with caplog.at_level(logging.WARNING, logger="trireme.transactions"):
        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert result["refused"] == {}                          # written once the partition is back
    assert 120 <= result["done_at"] <= 120 + transactions.MARKER_RETRY_MAX_BACKOFF_S + 1
    # 0.1 s doubling up to 5 s: 6.3 s for the first seven attempts, then one every 5 s (it was 10 a second).
    assert 25 <= len(calls) <= 40, len(calls)
    gaps = [b - a for a, b in zip(calls, calls[1:])]
    assert max(gaps) <= transactions.MARKER_RETRY_MAX_BACKOFF_S + 0.01
    lines = [r.getMessage() for r in caplog.records if "tx" in r.getMessage()]
    assert len(lines) == 2 and all("KAFKA_STORAGE_ERROR" in line for line in lines), lines   # at 0 s and 60 s
