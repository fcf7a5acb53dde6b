"""Client quota enforcement as Kafka's ClientQuotaManager does it: each answer's cost recorded in its client's sensor, throttle_time_ms set, and the connection muted for that long (KIP-219).

Three quotas, each looked up with Kafka's precedence in the ``client quotas`` section of the security metadata
(state/client_quotas.py): ``producer_byte_rate`` charges a Produce request's size, ``consumer_byte_rate`` a
Fetch answer's record bytes, ``request_percentage`` every request's handler time (as a percentage of one
thread: 100 is one thread all the time; a Produce with acks=0 is not charged, as in Kafka).  A client over a
quota gets Kafka's throttle time (how long its rate needs to come back to the quota; a request-quota throttle
at most one window) in the answer's ``throttle_time_ms``, and its connection reads no further request for
that long.  A throttled Fetch is answered empty (its bytes are not charged) and asks for no more than the
quota allows in ``quota.window.num - 1`` windows, as Kafka.

When no quota is set anywhere nothing is looked up (``enabled`` is false); a client with no quota of its own
costs one dictionary look-up per request.  A sensor nothing was recorded in for an hour is dropped (Kafka's
inactive sensor expiry), and there are at most MAX_SENSORS of them.
"""
from __future__ import annotations

import time

import trio

from trireme.state.client_quotas import (CONSUMER_BYTE_RATE, PRODUCER_BYTE_RATE, REQUEST_PERCENTAGE, SampledRate,
                                         record_and_throttle)
from trireme.wire.small_produce import with_throttle

from .deferred import Deferred
from .dispatch import Encoded

PRODUCE, FETCH, REQUEST = "Produce", "Fetch", "Request"        # Kafka's quota types (its metric groups)
_KEYS = ((PRODUCE, PRODUCER_BYTE_RATE), (FETCH, CONSUMER_BYTE_RATE), (REQUEST, REQUEST_PERCENTAGE))
SENSOR_EXPIRY_MS = 3600 * 1000          # Kafka's InactiveSensorExpirationTimeSeconds
SWEEP_INTERVAL_MS = 60 * 1000
MAX_SENSORS = 10000                     # client ids are the client's to choose: the sensors they make are bounded
MAX_RESOLVED = 10000
# Kafka's authenticator answers these itself, before (or, re-authenticating, beside) its request handlers: not charged
NOT_CHARGED = frozenset(("SaslHandshake", "SaslAuthenticate"))


def monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


def _user(principal: str) -> str:
    return principal.partition(":")[2] if ":" in principal else principal


def _record_bytes(response) -> int:
    """The record bytes of a FetchResponse (what consumer_byte_rate counts)."""
    return sum(len(p.records) for t in response.responses for p in t.partitions if p.records is not None)


class ClientQuotaManager:
    def __init__(self, config, quotas, metrics, clock=monotonic_ms):
        self.num = config["quota.window.num"]
        self.window_ms = config["quota.window.size.seconds"] * 1000
        self.quotas = quotas                    # state.client_quotas.ClientQuotas
        self.metrics = metrics
        self.clock = clock
        self.sensors: dict[tuple[str, str, str], SampledRate] = {}
        self._resolved: dict[tuple[str, str], tuple | None] = {}
        self._next_sweep = 0
        self.enabled = False
        quotas.listeners.append(self._changed)
        self._changed()

    def _changed(self) -> None:
        self.enabled = bool(self.quotas.quotas)
        self._resolved.clear()

    def _limits(self, principal: str, client_id: str) -> tuple | None:
        """Per quota type: (sensor key, bound) or None; None for a client no quota applies to."""
        key = (principal, client_id)
        found = self._resolved.get(key, False)
        if found is not False:
            return found
        user = _user(principal)
        limits = []
        for quota_type, quota_key in _KEYS:
            hit = self.quotas.lookup(quota_key, user, client_id)
            limits.append(None if hit is None else ((quota_type, hit[0], hit[1]), hit[2]))
        found = None if limits == [None, None, None] else tuple(limits)
        if len(self._resolved) >= MAX_RESOLVED:
            self._resolved.clear()
        self._resolved[key] = found
        return found

    def _sensor(self, key: tuple, now: int) -> SampledRate:
        sensor = self.sensors.get(key)
        if sensor is None:
            if now >= self._next_sweep or len(self.sensors) >= MAX_SENSORS:
                self._sweep(now)
            sensor = self.sensors[key] = SampledRate(self.num, self.window_ms)
        return sensor

    def _sweep(self, now: int) -> None:
        """Drop sensors idle for an hour; over MAX_SENSORS, also the least recently used half.  A dropped sensor's
        throttle counters go too (Metrics.forget_throttled): they are bounded by the sensors."""
        self._next_sweep = now + SWEEP_INTERVAL_MS
        sensors = self.sensors
        for key in [k for k, s in sensors.items() if now - s.last_ms >= SENSOR_EXPIRY_MS]:
            self._drop(key)
        if len(sensors) >= MAX_SENSORS:
            for key in sorted(sensors, key=lambda k: sensors[k].last_ms)[:len(sensors) // 2]:
                self._drop(key)

    def _drop(self, key: tuple) -> None:
        del self.sensors[key]
        quota_type, user, client_id = key
        self.metrics.forget_throttled(user, client_id, quota_type)

    def record(self, limit, value: float, now: int, bounded: bool = False) -> int:
        """Record ``value`` in the sensor of ``limit`` ((sensor key, bound)) → the throttle time in ms (0: within)."""
        sensor = self.sensors.get(limit[0])
        if sensor is None:
            sensor = self._sensor(limit[0], now)
        throttle = record_and_throttle(sensor, value, now, limit[1])
        return throttle if not bounded or throttle <= self.window_ms else self.window_ms

    def unrecord(self, limit, value: float, now: int) -> None:
        self._sensor(limit[0], now).record(-value, now)

    def fetch_max_bytes(self, principal: str, client_id: str | None, max_bytes: int) -> int:
        """A Fetch's max_bytes, lowered to what the client's consumer_byte_rate allows in num - 1 windows."""
        limits = self._limits(principal, client_id or "")
        if limits is None or limits[1] is None:
            return max_bytes
        return min(max_bytes, int(limits[1][1] * (self.num - 1) * self.window_ms / 1000))

    def charge(self, conn, api: str, version: int, client_id: str | None, request_size: int,
               handler_seconds: float, result):
        """What the connection calls once a handler returned ``result`` (only while ``enabled``): the request's
        cost recorded, the connection muted if that takes the client over a quota, and the answer (or the
        Deferred's) given its throttle time.  A Produce is charged here, when it is read, so that a client's
        pipelined requests wait out the throttle its earlier ones earned; a Fetch once its answer is known."""
        client = client_id or ""
        limits = self._resolved.get((conn.principal, client), False)
        if limits is False:
            limits = self._limits(conn.principal, client)
        if limits is None or api in NOT_CHARGED:
            return result
        if api == FETCH:
            if type(result) is Deferred:
                return _then(result, lambda value: self._fetch_answer(conn, limits, version, handler_seconds, value))
            return self._fetch_answer(conn, limits, version, handler_seconds, result)
        now = self.clock()
        produce, _, request = limits
        throttle, limit, quota_type = 0, None, REQUEST
        if request is not None and (result is not None or api != PRODUCE):       # acks=0: no request quota
            throttle, limit = self.record(request, handler_seconds * 100.0, now, bounded=True), request
        if api == PRODUCE and produce is not None:
            charged = self.record(produce, request_size, now)
            if charged > throttle:
                throttle, limit, quota_type = charged, produce, PRODUCE
        if throttle <= 0:
            return result
        self._throttle(conn, limit, quota_type, throttle)
        if type(result) is Deferred:
            return _then(result, lambda value: _with_throttle_time(value, version, throttle))
        return _with_throttle_time(result, version, throttle)

    def _fetch_answer(self, conn, limits, version: int, handler_seconds: float, response):
        """Charge a Fetch's answer: a throttled one is sent empty and its bytes are not counted (Kafka)."""
        if response is None:
            return None
        now = self.clock()
        _, fetch, request = limits
        throttle, limit, quota_type = 0, None, REQUEST
        if request is not None:
            throttle, limit = self.record(request, handler_seconds * 100.0, now, bounded=True), request
        fetched = 0
        if fetch is not None:
            fetched = _record_bytes(response)
            charged = self.record(fetch, fetched, now)
            if charged > throttle:
                throttle, limit, quota_type = charged, fetch, FETCH
        if throttle <= 0:
            return response
        if fetch is not None:
            self.unrecord(fetch, fetched, now)
        self._throttle(conn, limit, quota_type, throttle)
        response.responses = []
        return _with_throttle_time(response, version, throttle)

    def _throttle(self, conn, limit, quota_type: str, throttle_ms: int) -> None:
        """Mute ``conn`` for ``throttle_ms`` (KIP-219) and count it."""
        tags = limit[0]
        self.metrics.client_throttled(tags[1], tags[2], quota_type, throttle_ms)
        until = trio.current_time() + throttle_ms / 1000
        if until > conn.throttled_until:
            conn.throttled_until = until


def _then(deferred: Deferred, finish) -> Deferred:
    """``deferred`` with ``finish`` applied to its answer (its poll and ready unchanged)."""
    async def wait():
        return finish(await deferred.wait())
    return Deferred(wait, poll=deferred.poll, ready=deferred.ready)


def _with_throttle_time(response, version: int, throttle_ms: int):
    """``response`` (None, a response object or the Produce fast path's Encoded answer) with its ThrottleTimeMs."""
    if response is None:
        return None
    if type(response) is Encoded:                   # Produce's fast path (wire/small_produce.py)
        return Encoded(with_throttle(response.body, version, throttle_ms))
    if hasattr(response, "throttle_time_ms"):
        response.throttle_time_ms = throttle_ms
    return response


async def wait_throttled(conn) -> bool:
    """KIP-219: read no request from a throttled client until its throttle time is over.  False when that is more
    than connections.max.idle.ms away: the connection is then closed once it has been muted that long, as Kafka's
    idle expiry closes a muted channel (a byte-rate throttle has no bound of its own)."""
    give_up = trio.current_time() + conn.limits.idle_timeout
    while trio.current_time() < conn.throttled_until:
        if conn.throttled_until > give_up:
            await trio.sleep_until(give_up)
            return False
        await trio.sleep_until(conn.throttled_until)
    conn.throttled_until = 0.0
    return True
