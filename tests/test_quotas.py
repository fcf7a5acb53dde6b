"""Pure tests of client quotas: Kafka's precedence, DescribeClientQuotas filters, AlterClientQuotas validation, the
section's records, the sampled rate and the throttle time (a fake clock), and the enforcement's accounting."""
from __future__ import annotations

import struct
import types

import pytest
import trio

from trireme.server import dispatch
from trireme.server.deferred import Deferred
from trireme.server.quotas import MAX_SENSORS, SENSOR_EXPIRY_MS, ClientQuotaManager
from trireme.state.client_quotas import (CLIENT_ID, USER, ClientQuotas, QuotaError, SampledRate, record_key,
                                         throttle_time_ms)
from trireme.state.coordinator_records import RecordError
from trireme.wire.codec import message
from trireme.wire.small_produce import encode_small_produce_response, with_throttle

PBR, CBR, RP = "producer_byte_rate", "consumer_byte_rate", "request_percentage"


def set_quota(q: ClientQuotas, pairs, key, value, remove=False):
    results, records = q.alter([(pairs, [(key, value, remove)])])
    assert results == [(None, None)], results
    for k, v in records:
        q.replay(k, v)


# --- precedence ---------------------------------------------------------------------------------------

LEVELS = [  # Kafka's eight levels, most specific first, with the sensor tags a match gives alice/app
    ([(USER, "alice"), (CLIENT_ID, "app")], ("alice", "app")),
    ([(USER, "alice"), (CLIENT_ID, None)], ("alice", "app")),
    ([(USER, "alice")], ("alice", "")),
    ([(USER, None), (CLIENT_ID, "app")], ("alice", "app")),
    ([(USER, None), (CLIENT_ID, None)], ("alice", "app")),
    ([(USER, None)], ("alice", "")),
    ([(CLIENT_ID, "app")], ("", "app")),
    ([(CLIENT_ID, None)], ("", "app")),
]


@pytest.mark.parametrize("level", range(len(LEVELS)))
def test_precedence_takes_the_most_specific_level_set(level):
    q = ClientQuotas()
    for i in range(level, len(LEVELS)):          # this level and every less specific one
        set_quota(q, LEVELS[i][0], PBR, 1000 + i)
    assert q.lookup(PBR, "alice", "app") == (*LEVELS[level][1], 1000.0 + level)
    assert q.client_quota("alice", "app") == {PBR: 1000.0 + level}


def test_precedence_is_per_key_and_other_clients_fall_through():
    q = ClientQuotas()
    set_quota(q, [(USER, "alice"), (CLIENT_ID, "app")], PBR, 100)
    set_quota(q, [(CLIENT_ID, None)], CBR, 200)
    set_quota(q, [(USER, None)], RP, 50)
    assert q.client_quota("alice", "app") == {PBR: 100.0, CBR: 200.0, RP: 50.0}
    assert q.lookup(PBR, "alice", "other") is None                       # exact client id only
    assert q.lookup(PBR, "bob", "app") is None
    assert q.lookup(CBR, "bob", "x") == ("", "x", 200.0)                 # /clients/<default>
    assert q.lookup(RP, "bob", "x") == ("bob", "", 50.0)                 # /users/<default>: per user
    assert ClientQuotas().client_quota("alice", "app") == {}


# --- AlterClientQuotas validation ---------------------------------------------------------------------

@pytest.mark.parametrize("pairs, ops, message", [
    ([], [(PBR, 1.0, False)], "Invalid empty client quota entity"),
    ([("group", "g")], [(PBR, 1.0, False)], "Unhandled client quota entity type: group"),
    ([(USER, "")], [(PBR, 1.0, False)], "Empty user not supported"),
    ([("ip", "1.2.3.4"), (USER, "a")], [(PBR, 1.0, False)], "IP entity should not be combined"),
    ([("ip", "not-an-address")], [("connection_creation_rate", 1.0, False)], "not a valid IP"),
    ([("ip", "1.2.3.4")], [("connection_creation_rate", 1.0, False)], "Invalid configuration key"),
    ([(USER, "a")], [("controller_mutation_rate", 1.0, False)], "Invalid configuration key"),
    ([(USER, "a")], [("bogus", 1.0, False)], "Invalid configuration key bogus"),
    ([(USER, "a")], [(PBR, -5.0, False)], "must be greater than 0"),
    ([(USER, "a")], [(RP, 0.0, False)], "must be greater than 0"),
    ([(USER, "a")], [(RP, float("nan"), False)], "must be greater than 0"),
    ([(USER, "a")], [(PBR, 1.5, False)], "cannot be a fractional value"),
    ([(USER, "a")], [(PBR, 1e300, False)], "too large for a LONG"),
    ([(USER, "a")], [(PBR, float("inf"), False)], "too large for a LONG"),
    ([(USER, "a")], [(PBR, 1.0, False), (PBR, 2.0, False)], "Duplicate quota key"),
])
def test_alter_refuses_as_kafka(pairs, ops, message):
    q = ClientQuotas()
    results, records = q.alter([(pairs, ops), ([(USER, "ok")], [(PBR, 10.0, False)])])
    assert results[0][0] == "INVALID_REQUEST" and message in results[0][1]
    assert results[1] == (None, None)                    # the other entry is applied
    assert [k for k, _ in records] == [record_key(((USER, "ok"),), PBR)]


def test_a_double_quota_may_be_unbounded_as_in_kafka():
    q = ClientQuotas()
    set_quota(q, [(USER, "a")], RP, float("inf"))
    assert q.client_quota("a", "c") == {RP: float("inf")}


def test_alter_records_only_changes_and_removes():
    q = ClientQuotas()
    set_quota(q, [(USER, "a")], RP, 12.5)
    assert q.alter([([(USER, "a")], [(RP, 12.5, False)])]) == ([(None, None)], [])     # unchanged: no record
    assert q.alter([([(USER, "a")], [(PBR, 0.0, True)])]) == ([(None, None)], [])      # not set: no record
    assert q.alter([([(USER, "a")], [("bogus", 0.0, True)])]) == ([(None, None)], [])  # removal is not checked
    results, records = q.alter([([(USER, "a")], [(RP, 0.0, True)])])
    assert records == [(record_key(((USER, "a"),), RP), None)]
    q.replay(*records[0])
    assert q.quotas == {}


def test_duplicate_entity_in_one_request_is_refused_the_second_time():
    q = ClientQuotas()
    results, records = q.alter([([(USER, "a")], [(PBR, 1.0, False)]), ([(USER, "a")], [(PBR, 2.0, False)])])
    assert results[0] == (None, None) and results[1][0] == "INVALID_REQUEST"
    assert len(records) == 1


def test_section_records_replay_to_the_same_state():
    q = ClientQuotas()
    set_quota(q, [(USER, "a"), (CLIENT_ID, None)], PBR, 1024)
    set_quota(q, [(CLIENT_ID, "c")], RP, 33.3)
    copy = ClientQuotas()
    for k, v in q.live_records():
        copy.replay(k, v)
    assert copy.quotas == q.quotas and len(q.live_records()) == 2
    key = record_key(((CLIENT_ID, "c"),), RP)
    assert struct.unpack(">h", key[:2])[0] == 14 == ClientQuotas.record_types[0]     # the section's record type
    assert struct.unpack(">hd", dict(q.live_records())[key][:10]) == (0, 33.3)      # ClientQuotaValue v0
    copy.replay(record_key(((USER, "nobody"),), PBR), None)                         # a tombstone of nothing
    assert copy.quotas == q.quotas


@pytest.mark.parametrize("key, value", [
    (b"", None), (b"\x00\x0e\x00", None), (b"\x00\x17" + b"\x00" * 8, None),
    (record_key(((USER, "a"),), PBR), b"\x00"), (record_key(((USER, "a"),), PBR), b"\x00\x00\x01"),
])
def test_replay_refuses_records_it_cannot_read(key, value):
    q = ClientQuotas()
    with pytest.raises(RecordError):
        q.replay(key, value)
    assert q.quotas == {} and q.version == 0


# --- DescribeClientQuotas filters ---------------------------------------------------------------------

@pytest.fixture
def described():
    q = ClientQuotas()
    for pairs in ([(USER, "alice")], [(USER, None)], [(USER, "alice"), (CLIENT_ID, "app")],
                  [(USER, "bob"), (CLIENT_ID, None)], [(CLIENT_ID, "app")], [(CLIENT_ID, None)]):
        set_quota(q, pairs, PBR, 1)
    return q


def _names(found):
    return sorted((entity for entity, _ in found), key=repr)


@pytest.mark.parametrize("components, strict, expected", [
    ([], False, 6),
    ([], True, 0),
    ([(USER, 0, "alice")], False, [((USER, "alice"),), ((CLIENT_ID, "app"), (USER, "alice"))]),
    ([(USER, 0, "alice")], True, [((USER, "alice"),)]),
    ([(USER, 1, None)], False, [((USER, None),)]),
    ([(USER, 2, None)], True, [((USER, None),), ((USER, "alice"),)]),
    ([(USER, 2, None), (CLIENT_ID, 1, None)], False, [((CLIENT_ID, None), (USER, "bob"))]),
    ([(CLIENT_ID, 0, "app")], True, [((CLIENT_ID, "app"),)]),
    ([(CLIENT_ID, 2, None)], False, 4),
    ([("ip", 2, None)], False, []),
])
def test_describe_filters(described, components, strict, expected):
    found = described.describe(components, strict)
    if isinstance(expected, int):
        assert len(found) == expected
    else:
        assert _names(found) == sorted(expected, key=repr)
        assert all(values == {PBR: 1.0} for _, values in found)


@pytest.mark.parametrize("components, error", [
    ([("", 2, None)], "INVALID_REQUEST"),
    ([(USER, 2, None), (USER, 0, "a")], "INVALID_REQUEST"),
    ([("group", 2, None)], "UNSUPPORTED_VERSION"),
    ([(USER, 0, None)], "INVALID_REQUEST"),
    ([(USER, 1, "a")], "INVALID_REQUEST"),
    ([(USER, 2, "a")], "INVALID_REQUEST"),
    ([(USER, 9, None)], "INVALID_REQUEST"),
    ([("ip", 2, None), (CLIENT_ID, 2, None)], "INVALID_REQUEST"),
])
def test_describe_refuses_bad_filters(components, error):
    with pytest.raises(QuotaError) as e:
        ClientQuotas().describe(components, False)
    assert e.value.error == error and e.value.message


# --- the sampled rate and the throttle time -----------------------------------------------------------

def test_rate_counts_at_least_num_minus_one_windows():
    r = SampledRate(11, 1000)
    r.record(1000, 0)
    assert r.window_size_ms(0) == 10000 and r.measure(0) == 100.0
    assert r.window_size_ms(500) == 10500                 # elapsed 500 + 10 whole windows assumed
    assert throttle_time_ms(r, 50, 0) == 10000            # (100 - 50) / 50 * 10 s
    assert throttle_time_ms(r, 100, 0) == 0               # at the bound is within it
    assert throttle_time_ms(r, 80, 0) == 2500


def test_rate_reuses_the_oldest_sample_and_expires_old_ones():
    r = SampledRate(11, 1000)
    for t in range(0, 12000, 1000):                       # 12 records, one a window: the first sample is reused
        r.record(10, t)
    assert len(r.starts) == 11 and min(r.starts) == 1000
    assert r.window_size_ms(11000) == 10000 and r.measure(11000) == 11.0
    assert r.measure(30000) == 0.0                        # every sample older than 11 windows: reset


def test_rate_adds_within_a_window_and_rounds_half_up():
    r = SampledRate(2, 1000)
    r.record(300, 0)
    r.record(300, 999)                                    # same window
    assert r.values == [600.0]
    r.record(1, 1000)                                     # a new one
    assert r.values == [600.0, 1.0] and r.window_size_ms(1000) == 1000
    half = SampledRate(2, 1000)
    half.record(1000.5, 0)                                # 1000.5 B/s against 1000: 0.5 ms → 1, as Java's Math.round
    assert throttle_time_ms(half, 1000, 0) == 1


# --- enforcement accounting (server/quotas.py) with a fake clock --------------------------------------

class FakeMetrics:
    def __init__(self):
        self.throttles = []

    def client_throttled(self, user, client_id, quota_type, throttle_ms):
        self.throttles.append((user, client_id, quota_type, throttle_ms))

    def forget_throttled(self, user, client_id, quota_type):
        self.throttles = [t for t in self.throttles if t[:3] != (user, client_id, quota_type)]


def manager():
    q = ClientQuotas()
    clock = types.SimpleNamespace(now=0)
    metrics = FakeMetrics()
    m = ClientQuotaManager({"quota.window.num": 11, "quota.window.size.seconds": 1}, q, metrics,
                           clock=lambda: clock.now)
    return m, q, clock, metrics


def conn(principal="User:alice"):
    return types.SimpleNamespace(principal=principal, throttled_until=0.0)


PRODUCE_RESPONSE = message("ProduceResponse").cls
FETCH_RESPONSE = message("FetchResponse").cls


async def _charge_produce(m, c, size, client="app"):
    return m.charge(c, "Produce", 9, client, size, 0.0, PRODUCE_RESPONSE(responses=[], throttle_time_ms=0))


def test_enabled_only_while_some_quota_is_set():
    m, q, _, _ = manager()
    assert not m.enabled
    set_quota(q, [(CLIENT_ID, "x")], PBR, 1)
    assert m.enabled
    set_quota(q, [(CLIENT_ID, "x")], PBR, None, remove=True)
    assert not m.enabled


def test_produce_over_its_byte_rate_is_throttled_and_muted():
    m, q, clock, metrics = manager()
    set_quota(q, [(USER, "alice")], PBR, 100)
    c = conn()

    async def run():
        r = await _charge_produce(m, c, 500)           # 500 B over 10 s: 50 B/s, within
        assert r.throttle_time_ms == 0 and c.throttled_until == 0.0
        clock.now = 100
        r = await _charge_produce(m, c, 1000)          # 1500 B over 10.1 s: 148.5 B/s
        assert r.throttle_time_ms == round((1500 / 10.1 - 100) / 100 * 10100)
        assert c.throttled_until > trio.current_time()
        assert metrics.throttles == [("alice", "", "Produce", r.throttle_time_ms)]
        # another client id of alice shares the user-level sensor
        r = await _charge_produce(m, conn(), 10, client="other")
        assert r.throttle_time_ms > 0
        # a client no quota applies to is not charged
        assert (await _charge_produce(m, conn("User:bob"), 10 ** 9)).throttle_time_ms == 0
    trio.run(run)
    assert set(m.sensors) == {("Produce", "alice", "")}


def test_fast_path_answer_gets_its_throttle():
    m, q, clock, _ = manager()
    set_quota(q, [(CLIENT_ID, None)], PBR, 1)
    for version in (3, 8, 9, 12):
        body = encode_small_produce_response(version, "t", None, 0, 5, -1, 0)
        c = conn()
        out = trio.run(lambda: _async(m.charge, c, "Produce", version, f"c{version}", 100, 0.0,
                                      dispatch.Encoded(body)))
        codec = message("ProduceResponse")
        decoded, _ = codec.decode(memoryview(out.body), version)
        assert decoded.throttle_time_ms == 90000            # 100 B over 10 s = 10 B/s against 1: (10-1)/1 × 10 s
        assert out.body == with_throttle(body, version, decoded.throttle_time_ms)
        assert decoded.responses[0].partition_responses[0].base_offset == 5


async def _async(fn, *args):
    return fn(*args)


def test_request_percentage_throttle_is_at_most_one_window():
    m, q, _, metrics = manager()
    set_quota(q, [(USER, None)], RP, 1)
    c = conn()
    response = message("MetadataResponse").cls(throttle_time_ms=0)
    out = trio.run(lambda: _async(m.charge, c, "Metadata", 12, "app", 50, 5.0, response))
    assert out.throttle_time_ms == 1000                    # 500 %·s over 10 s = 50 % against 1 %: capped
    assert metrics.throttles == [("alice", "", "Request", 1000)]
    # acks=0 produce: no answer, no request quota charged
    before = m.sensors[("Request", "alice", "")].values[:]
    assert trio.run(lambda: _async(m.charge, c, "Produce", 9, "app", 50, 5.0, None)) is None
    assert m.sensors[("Request", "alice", "")].values == before


def test_throttled_fetch_is_answered_empty_and_not_charged():
    m, q, clock, metrics = manager()
    set_quota(q, [(CLIENT_ID, "app")], CBR, 100)
    assert m.fetch_max_bytes("User:alice", "app", 10 ** 6) == 1000          # 100 B/s × 10 windows
    assert m.fetch_max_bytes("User:alice", "other", 10 ** 6) == 10 ** 6
    t = FETCH_RESPONSE.FetchableTopicResponse
    p = t.PartitionData

    def fetched(n):
        return FETCH_RESPONSE(throttle_time_ms=0, responses=[t(topic="t", partitions=[p(records=b"x" * n)])])

    c = conn()

    async def run():
        inner = Deferred(_value(fetched(900)), poll=True)
        wrapped = m.charge(c, "Fetch", 12, "app", 60, 0.0, inner)
        assert type(wrapped) is Deferred and wrapped.poll
        r = await wrapped.wait()
        assert r.throttle_time_ms == 0 and len(r.responses) == 1           # 90 B/s
        r = m.charge(c, "Fetch", 12, "app", 60, 0.0, fetched(900))
        assert r.throttle_time_ms == 8000 and r.responses == []             # 180 B/s: (180-100)/100 × 10 s
    trio.run(run)
    sensor = m.sensors[("Fetch", "", "app")]
    assert sum(sensor.values) == 900                                        # the throttled 900 B taken back


def _value(v):
    async def wait():
        return v
    return wait


def test_sensors_expire_after_an_hour_and_are_bounded():
    m, q, clock, _ = manager()
    set_quota(q, [(CLIENT_ID, None)], PBR, 10 ** 9)

    async def run():
        for i in range(5):
            await _charge_produce(m, conn(), 1, client=f"c{i}")
        clock.now = SENSOR_EXPIRY_MS + 1
        await _charge_produce(m, conn(), 1, client="late")
        assert set(k[2] for k in m.sensors) == {"late"}
        for i in range(MAX_SENSORS + 10):
            clock.now += 1
            await _charge_produce(m, conn(), 1, client=f"d{i}")
        assert len(m.sensors) <= MAX_SENSORS
    trio.run(run)


def test_throttle_counters_go_with_their_sensor():
    """Review finding 2: a client's throttle counters (Metrics.throttled / throttle_ms, keyed by the client id it
    chose) are dropped when its quota sensor is swept (idle for an hour), so they are bounded by the sensors."""
    from trireme.server.metrics import Metrics
    q = ClientQuotas()
    clock = types.SimpleNamespace(now=0)
    metrics = Metrics()
    m = ClientQuotaManager({"quota.window.num": 11, "quota.window.size.seconds": 1}, q, metrics,
                           clock=lambda: clock.now)
    set_quota(q, [(CLIENT_ID, None)], PBR, 1)

    async def run():
        r = await _charge_produce(m, conn(), 10_000, client="idle")
        assert r.throttle_time_ms > 0
        assert set(metrics.throttled) == {("", "idle", "Produce")} == set(metrics.throttle_ms)
        clock.now = SENSOR_EXPIRY_MS + 1
        r = await _charge_produce(m, conn(), 10_000, client="busy")
        assert r.throttle_time_ms > 0
        assert set(metrics.throttled) == {("", "busy", "Produce")} == set(metrics.throttle_ms)
    trio.run(run)


# --- the handlers (through the codec, as tests/test_admin_handlers.py) --------------------------------

from tests.test_admin_handlers import broker, handler, req, versions  # noqa: E402,F401  (the broker fixture)
from trireme.server.dispatch import RequestContext  # noqa: E402
from trireme.wire import error_codes as E  # noqa: E402


def call(broker, api, version, request):
    """test_admin_handlers.call, with a Deferred answer waited for."""
    h = handler(api)
    frame = bytearray(h.request.encode_bytes(request, version))
    decoded, _ = h.request.decode(frame, version)
    ctx = RequestContext(broker=broker, api_key=h.api_key, api_version=version, correlation_id=7,
                         client_id="tests", principal="User:ANONYMOUS", connection=None, frame=frame)
    response = h.fn(ctx, decoded)
    if type(response) is Deferred:
        response = trio.run(response.wait)
    out, _ = h.response.decode(h.response.encode_bytes(response, version), version)
    return out

ACQ, DCQ = req("AlterClientQuotas"), req("DescribeClientQuotas")


def alter(broker, version, entries, validate_only=False):
    return call(broker, "AlterClientQuotas", version, ACQ(validate_only=validate_only, entries=[
        ACQ.EntryData(entity=[ACQ.EntryData.EntityData(entity_type=t, entity_name=n) for t, n in entity],
                      ops=[ACQ.EntryData.OpData(key=k, value=v, remove=r) for k, v, r in ops])
        for entity, ops in entries]))


def describe(broker, version, components, strict=False):
    r = call(broker, "DescribeClientQuotas", version, DCQ(strict=strict, components=[
        DCQ.ComponentData(entity_type=t, match_type=m, match=v) for t, m, v in components]))
    assert r.error_code == 0, r
    return {tuple((e.entity_type, e.entity_name) for e in x.entity): {v.key: v.value for v in x.values}
            for x in r.entries}


@pytest.mark.parametrize("version", versions("AlterClientQuotas"))
def test_alter_then_describe(broker, version):
    entries = [([(USER, "alice"), (CLIENT_ID, None)], [(PBR, 1024.0, False), (RP, 12.5, False)]),
               ([(CLIENT_ID, "app")], [(CBR, 2048.0, False)]),
               ([(USER, "bob")], [(PBR, -1.0, False)]),
               ([(USER, "carol")], [("controller_mutation_rate", 1.0, False)])]
    r = alter(broker, version, entries, validate_only=True)
    assert [x.error_code for x in r.entries] == [0, 0, E.INVALID_REQUEST.code, E.INVALID_REQUEST.code]
    assert [x.error_message is None for x in r.entries] == [True, True, False, False]
    assert [[(e.entity_type, e.entity_name) for e in x.entity] for x in r.entries] == [e for e, _ in entries]
    assert describe(broker, version, []) == {}                             # validate_only changed nothing
    r = alter(broker, version, entries)
    assert [x.error_code for x in r.entries] == [0, 0, E.INVALID_REQUEST.code, E.INVALID_REQUEST.code]
    assert describe(broker, version, []) == {
        (("user", "alice"), ("client-id", None)): {PBR: 1024.0, RP: 12.5},
        (("client-id", "app"),): {CBR: 2048.0}}
    assert list(describe(broker, version, [(CLIENT_ID, 1, None)])) == [(("user", "alice"), ("client-id", None))]
    assert describe(broker, version, [(CLIENT_ID, 0, "app")], strict=True) == {(("client-id", "app"),): {CBR: 2048.0}}
    assert broker.security.client_quota("alice", "x") == {PBR: 1024.0, RP: 12.5}
    assert broker.quotas.enabled
    r = alter(broker, version, [([(USER, "alice"), (CLIENT_ID, None)], [(PBR, 0.0, True), (RP, 0.0, True)]),
                                ([(CLIENT_ID, "app")], [(CBR, 0.0, True)])])
    assert [x.error_code for x in r.entries] == [0, 0]
    assert describe(broker, version, []) == {} and not broker.quotas.enabled


def test_describe_bad_filter_answers_the_whole_request(broker):
    r = call(broker, "DescribeClientQuotas", 1, DCQ(strict=False, components=[
        DCQ.ComponentData(entity_type="group", match_type=2, match=None)]))
    assert (r.error_code, r.entries) == (E.UNSUPPORTED_VERSION.code, None) and r.error_message


def test_without_cluster_permissions(broker, monkeypatch):
    asked = []

    def deny(principal, host, operation, resource_type, name):
        asked.append((operation.name, resource_type.name, name))
        return False
    monkeypatch.setattr(broker.security, "authorize", deny)
    r = alter(broker, 1, [([(USER, "alice")], [(PBR, 1024.0, False)])])
    assert [(x.error_code, [(e.entity_type, e.entity_name) for e in x.entity]) for x in r.entries] == [
        (E.CLUSTER_AUTHORIZATION_FAILED.code, [("user", "alice")])]
    assert broker.security.client_quotas.quotas == {}
    r = call(broker, "DescribeClientQuotas", 1, DCQ(strict=False, components=[]))
    assert (r.error_code, r.entries) == (E.CLUSTER_AUTHORIZATION_FAILED.code, None)
    assert asked == [("ALTER_CONFIGS", "CLUSTER", "kafka-cluster"), ("DESCRIBE_CONFIGS", "CLUSTER", "kafka-cluster")]


def test_a_produce_waiting_for_its_fsync_mutes_the_connection_at_once():
    """Charged when read, not when answered: a pipelined request behind it waits out its throttle."""
    m, q, clock, metrics = manager()
    set_quota(q, [(CLIENT_ID, "app")], PBR, 10)
    c = conn()

    async def run():
        durable = trio.Event()

        async def wait():
            await durable.wait()
            return PRODUCE_RESPONSE(responses=[], throttle_time_ms=0)
        wrapped = m.charge(c, "Produce", 9, "app", 1000, 0.0, Deferred(wait, ready=durable.is_set))
        assert c.throttled_until > trio.current_time()                 # before the answer exists
        assert metrics.throttles == [("", "app", "Produce", 90000)]    # 100 B/s against 10: (100-10)/10 × 10 s
        assert wrapped.ready is not None and not wrapped.ready()
        durable.set()
        assert (await wrapped.wait()).throttle_time_ms == 90000
    trio.run(run)


def test_entities_are_bounded():
    q = ClientQuotas(max_entities=2)
    set_quota(q, [(USER, "a")], PBR, 1)
    results, records = q.alter([([(USER, "b")], [(PBR, 1.0, False)]), ([(USER, "c")], [(PBR, 1.0, False)]),
                                ([(USER, "a")], [(RP, 5.0, False)]), ([(USER, "d")], [(PBR, 0.0, True)])])
    assert [r[0] for r in results] == [None, "POLICY_VIOLATION", None, None]     # a's new key, d's no-op: no entity
    assert "trireme.max.client.quota.entities" in results[1][1] and len(records) == 2


def test_alter_when_the_metadata_log_cannot_be_written(broker, monkeypatch):
    from trireme.server.cluster_metadata import MetadataUnavailable

    async def unavailable(decide):
        raise MetadataUnavailable("no space left on device")
    monkeypatch.setattr(broker.security, "update", unavailable)
    r = alter(broker, 1, [([(USER, "alice")], [(PBR, 1024.0, False)]), ([(USER, "bob")], [(PBR, -1.0, False)])])
    assert [x.error_code for x in r.entries] == [E.KAFKA_STORAGE_ERROR.code] * 2
    assert "not stored" in r.entries[0].error_message
    assert broker.security.client_quotas.quotas == {} and not broker.quotas.enabled
