"""A flush round waits for the rest of a pipelining client's burst of requests (Broker.gather_burst), so one fsync
covers it; the connection tells a burst from its sends and reads (Connection._burst_read)."""
import types

import trio
import trio.testing

from broker_runner import run_with_broker
from trireme.server import connection as C
from trireme.server import broker as B
from trireme.server.broker import Broker
from trireme.server.clock import now_ms
from trireme.server.config import Config
from trireme.wire import records as rec


class _Client:
    """What the broker knows of a connection in a burst."""

    bursts_gathered = True


def _broker(tmp_path, **props):
    config = Config(data_dir=str(tmp_path))
    config.update(props)
    broker = Broker(config)
    broker.ensure_topic("t", 1)
    return broker, broker.partition("t", 0)


def _append(broker, p) -> int:
    data = bytearray(rec.build_batch([(None, b"v")]))
    _, last, _ = p.log.append(data, rec.validate_batches(data), now_ms())
    broker.appended(p)
    return last


def _rounds(broker) -> int:
    return broker.metrics.fsync.count


def test_a_round_waits_for_the_burst_and_covers_it_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(B, "BURST_WAIT_S", 60.0)           # however slow the machine, the burst ends it first
    broker, p = _broker(tmp_path)
    client = _Client()

    async def body(b):
        b.burst_begins(client)
        first = _append(b, p)
        await trio.testing.wait_all_tasks_blocked()         # the flusher waits for the burst
        assert p.log.durable_offset == 0
        second = _append(b, p)
        b.burst_ends(client)
        with trio.fail_after(10):                           # the burst's end, not the 60 s, ends the wait
            assert await b.wait_durable(p, first) and await b.wait_durable(p, second)
        assert _rounds(b) == 1
    run_with_broker(broker, body)
    assert client.bursts_gathered


def test_without_a_burst_the_round_starts_at_once(tmp_path):
    broker, p = _broker(tmp_path)

    async def body(b):
        first = _append(b, p)
        await trio.testing.wait_all_tasks_blocked()         # the round of the first is under way
        second = _append(b, p)
        assert await b.wait_durable(p, second)
        assert p.log.durable_offset == 2 and _rounds(b) == 2 and first == 0
    run_with_broker(broker, body)


def test_a_burst_that_does_not_come_whole_is_waited_for_once(tmp_path):
    broker, p = _broker(tmp_path)
    client = _Client()

    async def body(b):
        b.burst_begins(client)
        assert await b.wait_durable(p, _append(b, p))       # after at most BURST_WAIT_S
        assert not client.bursts_gathered and not b._bursts
    run_with_broker(broker, body)


def test_no_burst_is_waited_for_when_answers_do_not_wait_for_the_flush(tmp_path):
    for props in ({"trireme.fsync.enable": False}, {"log.flush.interval.messages": 10}):
        broker, _ = _broker(tmp_path / next(iter(props)), **props)
        broker.burst_begins(_Client())
        assert not broker._bursts


class _Broker:
    def __init__(self):
        self.events = []

    def burst_begins(self, conn):
        self.events.append("begins")

    def burst_ends(self, conn):
        self.events.append("ends")


def _connection() -> types.SimpleNamespace:
    conn = types.SimpleNamespace(broker=_Broker(), _burst_expected=0, _burst_seen=0, _burst_started=0.0,
                                 bursts_gathered=True)
    conn._burst_read = types.MethodType(C.Connection._burst_read, conn)
    return conn


def test_the_connection_reports_a_burst_after_a_send_of_several_answers(monkeypatch):
    now = [10.0]
    monkeypatch.setattr(C.time, "perf_counter", lambda: now[0])
    conn = _connection()
    conn._burst_expected = 3                   # what Connection._sent sets after sending 3 produce answers at once
    conn._burst_read()
    assert conn.broker.events == ["begins"]
    now[0] += C.BURST_WINDOW_S / 2
    conn._burst_read()
    conn._burst_read()
    assert conn.broker.events == ["begins", "ends"] and conn.bursts_gathered and conn._burst_expected == 0


def test_a_slow_burst_is_not_waited_for_next_time(monkeypatch):
    now = [10.0]
    monkeypatch.setattr(C.time, "perf_counter", lambda: now[0])
    conn = _connection()
    conn._burst_expected = 2
    conn._burst_read()
    now[0] += C.BURST_WINDOW_S * 2
    conn._burst_read()
    assert not conn.bursts_gathered
    conn._burst_expected = 2
    conn._burst_seen = 0
    conn._burst_read()
    assert conn.broker.events == ["begins", "ends"]     # not waited for; timed again
    conn._burst_read()
    assert conn.bursts_gathered                          # this one came at once: waited for next time


def test_only_a_send_of_several_produce_answers_starts_a_burst():
    metrics = types.SimpleNamespace(observe_phase=lambda *a: None, observe_latency=lambda *a: None)
    broker = _Broker()
    broker.metrics = metrics
    conn = types.SimpleNamespace(broker=broker, _burst_expected=0, _burst_seen=5, outstanding=10, response_bytes=100,
                                 limits=types.SimpleNamespace(responses=types.SimpleNamespace(release=lambda n: None)))
    sent = types.MethodType(C.Connection._sent, conn)

    def answer(api):
        return C._Outgoing([b"x" * 10], 10, api, 0.0, None)
    sent([answer("Produce"), answer("Fetch"), answer(None)], 0.0)
    assert (conn._burst_expected, broker.events) == (0, [])         # one produce answer: nothing to follow
    sent([answer("Produce"), answer("Fetch"), answer("Produce")], 0.0)
    assert (conn._burst_expected, conn._burst_seen, broker.events) == (2, 0, ["ends"])
