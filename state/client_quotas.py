"""Client quotas as Kafka keeps them: quota values per entity (user, client-id, their defaults), Kafka's precedence, and the sampled rate they are measured with.

An entity is a tuple of (entity type, name) pairs sorted by type; a name of None is the type's default
(``/config/users/<default>``).  :class:`ClientQuotas` is the "client quotas" section of the security
metadata in ``__cluster_metadata`` (the section protocol: state/cluster_metadata.py): its records are
type 14 (Kafka's ClientQuotaRecord's api key), key ClientQuotaKey (entity, quota key), value
ClientQuotaValue, a tombstone removing the quota.  It is changed only by :meth:`ClientQuotas.replay`, and
:meth:`ClientQuotas.alter` computes the records and the per-entry answers of an AlterClientQuotas request
without changing anything (as Kafka's ClientQuotaControlManager), so ``validate_only`` is the same call with
the records dropped.
:class:`SampledRate` is Kafka's Rate over a SampledStat (``quota.window.num`` windows of
``quota.window.size.seconds``); callers pass the time, nothing here reads a clock.
"""
from __future__ import annotations

import ipaddress
import math

from trireme.wire.codec import message

from .cluster_metadata import (CLIENT_QUOTA, MetadataRecordError, decode_key, decode_value, encode_key, encode_value,
                               record_type)

USER, CLIENT_ID, IP = "user", "client-id", "ip"
ENTITY_TYPES = (USER, CLIENT_ID, IP)

PRODUCER_BYTE_RATE = "producer_byte_rate"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
REQUEST_PERCENTAGE = "request_percentage"
# Kafka's keys for user and client-id entities, and which of them must be whole numbers (Kafka's LONG type).
# controller_mutation_rate (KIP-599) and the ip entity's connection_creation_rate (KIP-612) are not enforced
# here, so they are refused as Kafka refuses a key it does not know, rather than stored and ignored.
QUOTA_KEYS = (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, REQUEST_PERCENTAGE)
INTEGRAL_KEYS = frozenset((PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE))
LONG_MAX = float(2 ** 63 - 1)

MATCH_EXACT, MATCH_DEFAULT, MATCH_ANY = 0, 1, 2       # DescribeClientQuotas' match types



class QuotaError(Exception):
    """A request Kafka refuses: ``error`` names the code (INVALID_REQUEST, UNSUPPORTED_VERSION), with a message."""

    def __init__(self, error: str, message: str):
        super().__init__(message)
        self.error = error
        self.message = message


def entity_of(pairs) -> tuple:
    """The canonical entity of (type, name) pairs: sorted by type, a later pair of a type replacing an earlier one
    (Kafka reads a request's entity into a map)."""
    return tuple(sorted(dict(pairs).items()))


def describe_entity(entity: tuple) -> str:
    return "{" + ", ".join(f"{t}={'<default>' if n is None else n}" for t, n in entity) + "}"


def record_key(entity: tuple, key: str) -> bytes:
    """The record key of one quota of one entity (a later record of the same key replaces it)."""
    codec = message("ClientQuotaKey")
    obj = codec.cls(entity=[codec.cls.EntityData(entity_type=t, entity_name=n) for t, n in entity], key=key)
    return encode_key(CLIENT_QUOTA, "ClientQuotaKey", obj)


def record_value(value: float) -> bytes:
    return encode_value("ClientQuotaValue", message("ClientQuotaValue").cls(value=value))


def _parse_record_key(raw) -> tuple[tuple, str]:
    if record_type(raw) != CLIENT_QUOTA:
        raise MetadataRecordError(f"record type {record_type(raw)} is not a client quota")
    k = decode_key(raw, "ClientQuotaKey")
    return entity_of((e.entity_type, e.entity_name) for e in k.entity), k.key


def _parse_record_value(raw) -> float:
    return decode_value(raw, "ClientQuotaValue").value


def _validate_entity(entity: tuple, raw_types: list[str]) -> str | None:
    """Kafka's validateEntity and configKeysForEntityType → an INVALID_REQUEST message, or None."""
    if not raw_types:
        return "Invalid empty client quota entity"
    for entity_type, name in entity:
        if entity_type not in ENTITY_TYPES:
            return f"Unhandled client quota entity type: {entity_type}"
        if name is not None and name == "":
            return f"Empty {entity_type} not supported"
    types = {t for t, _ in entity}
    if IP in types:
        if types & {USER, CLIENT_ID}:
            return "Invalid quota entity combination, IP entity should not be combined with User or ClientId"
        name = dict(entity)[IP]
        if name is not None:
            try:
                ipaddress.ip_address(name)
            except ValueError:
                return f"{name} is not a valid IP or resolvable host."
    return None


def _validate_value(entity: tuple, key: str, value: float) -> str | None:
    """Kafka's validateQuotaKeyValue → an INVALID_REQUEST message, or None."""
    if any(t == IP for t, _ in entity) or key not in QUOTA_KEYS:
        return f"Invalid configuration key {key}"
    if not value > 0.0:                                  # NaN too
        return f"Quota {key} must be greater than 0"
    if key in INTEGRAL_KEYS:
        if value > LONG_MAX:
            return f"Proposed value for {key} is too large for a LONG."
        if abs(math.fmod(value, 1.0)) > 1e-6:
            return f"{key} cannot be a fractional value."
    return None


class ClientQuotas:
    """The quotas set with AlterClientQuotas: entity → {quota key: value}."""

    record_types = (CLIENT_QUOTA,)

    def __init__(self, max_entities: int = 100000):
        self.max_entities = max_entities       # AlterClientQuotas adds no entity past this (replay is not bounded)
        self.quotas: dict[tuple, dict[str, float]] = {}
        self.version = 0                   # changes with every replayed record (lookup caches compare it)
        self.listeners: list = []          # called with no argument after each change

    # --- the durable section
    def replay(self, key: bytes, value: bytes | None) -> None:
        """Apply one record of this section: a quota set, or removed (a tombstone: None).  RecordError for bytes
        that do not decode (nothing changes)."""
        entity, quota_key = _parse_record_key(key)
        number = None if value is None else _parse_record_value(value)
        if value is None:
            values = self.quotas.get(entity)
            if values is not None:
                values.pop(quota_key, None)
                if not values:
                    del self.quotas[entity]
        else:
            self.quotas.setdefault(entity, {})[quota_key] = number
        self.version += 1
        for listener in self.listeners:
            listener()

    def live_records(self) -> list[tuple[bytes, bytes]]:
        """The records that rebuild this state (compaction): one per quota set."""
        return [(record_key(entity, k), record_value(v))
                for entity, values in self.quotas.items() for k, v in values.items()]

    # --- AlterClientQuotas
    def alter(self, entries) -> tuple[list[tuple[str | None, str | None]], list[tuple[bytes, bytes | None]]]:
        """The answer and the records of an AlterClientQuotas request, changing nothing.  ``entries``: a list of
        (entity pairs [(type, name)], ops [(key, value, remove)]).  → one (error, message) per entry, in order
        (error None: accepted; else "INVALID_REQUEST", or "POLICY_VIOLATION" for an entry that would add an entity
        past ``max_entities``), and the records to append (then :meth:`replay`)."""
        results: list[tuple[str | None, str | None]] = []
        records: list[tuple[bytes, bytes | None]] = []
        seen: set[tuple] = set()
        entities = len(self.quotas)
        for pairs, ops in entries:
            pairs = list(pairs)
            entity = entity_of(pairs)
            if entity in seen:
                results.append(("INVALID_REQUEST", f"Ignoring duplicate entity {describe_entity(entity)}"))
                continue
            seen.add(entity)
            failed = _validate_entity(entity, [t for t, _ in pairs])
            changes: dict[str, float | None] = {}
            if failed is None:
                for key, value, remove in ops:
                    if key in changes:
                        failed = (f"Duplicate quota key {key} not updating quota for this entity "
                                  f"{describe_entity(entity)}")
                        break
                    changes[key] = None if remove else float(value)
            if failed is None:
                current = self.quotas.get(entity, {})
                mine = []
                for key, value in changes.items():
                    if value is None:
                        if key in current:
                            mine.append((record_key(entity, key), None))
                        continue
                    failed = _validate_value(entity, key, value)
                    if failed is not None:
                        break
                    if current.get(key) != value:
                        mine.append((record_key(entity, key), record_value(value)))
                if failed is None and mine and not current and any(v is not None for _, v in mine):
                    if entities >= self.max_entities:
                        results.append(("POLICY_VIOLATION", f"this broker keeps the quotas of at most "
                                                            f"{self.max_entities} entities "
                                                            f"(trireme.max.client.quota.entities)"))
                        continue
                    entities += 1
                if failed is None:
                    records.extend(mine)
            results.append((None, None) if failed is None else ("INVALID_REQUEST", failed))
        return results, records

    # --- DescribeClientQuotas
    def describe(self, components, strict: bool) -> list[tuple[tuple, dict[str, float]]]:
        """The entities matching a DescribeClientQuotas filter, with their quotas.  ``components``: (entity type,
        match type, match).  Raises QuotaError for a filter Kafka refuses."""
        exact: dict[str, str | None] = {}
        any_of: set[str] = set()
        for entity_type, match_type, match in components:
            if not entity_type:
                raise QuotaError("INVALID_REQUEST", "Invalid empty entity type.")
            if entity_type in exact or entity_type in any_of:
                raise QuotaError("INVALID_REQUEST",
                                 f"Entity type {entity_type} cannot appear more than once in the filter.")
            if entity_type not in ENTITY_TYPES:
                raise QuotaError("UNSUPPORTED_VERSION", f"Unsupported entity type {entity_type}")
            if match_type == MATCH_EXACT:
                if match is None:
                    raise QuotaError("INVALID_REQUEST", f"Request specified MATCH_TYPE_EXACT, but set match "
                                                        f"string to null for entity type {entity_type}")
                exact[entity_type] = match
            elif match_type == MATCH_DEFAULT:
                if match is not None:
                    raise QuotaError("INVALID_REQUEST", f"Request specified MATCH_TYPE_DEFAULT, but also "
                                                        f"specified a match string for entity type {entity_type}")
                exact[entity_type] = None
            elif match_type == MATCH_ANY:
                if match is not None:
                    raise QuotaError("INVALID_REQUEST", f"Request specified MATCH_TYPE_SPECIFIED, but also "
                                                        f"specified a match string for entity type {entity_type}")
                any_of.add(entity_type)
            else:
                raise QuotaError("INVALID_REQUEST", f"Unexpected match type {match_type}")
        types = set(exact) | any_of
        if IP in types and types & {USER, CLIENT_ID}:
            raise QuotaError("INVALID_REQUEST", "Invalid entity filter component combination. IP filter component "
                                                "should not be used with user or clientId filter component.")
        found = []
        for entity, values in self.quotas.items():
            names = dict(entity)
            if strict and len(names) != len(types):
                continue
            if all(t in names and names[t] == n for t, n in exact.items()) and all(t in names for t in any_of):
                found.append((entity, dict(values)))
        return found

    # --- lookup (Kafka's DefaultQuotaCallback)
    def lookup(self, quota_key: str, user: str, client_id: str) -> tuple[str, str, float] | None:
        """The quota ``quota_key`` of a client by Kafka's precedence → (user tag, client-id tag, value): the tags
        name the sensor the client shares (a user-level quota is shared by all of that user's client ids, a
        client-id-level one by all users of that client id), or None when no level has that key."""
        quotas = self.quotas
        for entity, tags in (
                (((CLIENT_ID, client_id), (USER, user)), (user, client_id)),    # 1 /users/<user>/clients/<client-id>
                (((CLIENT_ID, None), (USER, user)), (user, client_id)),         # 2 /users/<user>/clients/<default>
                (((USER, user),), (user, "")),                                  # 3 /users/<user>
                (((CLIENT_ID, client_id), (USER, None)), (user, client_id)),    # 4 /users/<default>/clients/<client-id>
                (((CLIENT_ID, None), (USER, None)), (user, client_id)),         # 5 /users/<default>/clients/<default>
                (((USER, None),), (user, "")),                                  # 6 /users/<default>
                (((CLIENT_ID, client_id),), ("", client_id)),                   # 7 /clients/<client-id>
                (((CLIENT_ID, None),), ("", client_id))):                       # 8 /clients/<default>
            values = quotas.get(entity)
            if values is not None and quota_key in values:
                return tags[0], tags[1], values[quota_key]
        return None

    def client_quota(self, user: str, client_id: str) -> dict[str, float]:
        """Every quota key that applies to this client → its value (Security.client_quota)."""
        found = {}
        for key in QUOTA_KEYS:
            hit = self.lookup(key, user, client_id)
            if hit is not None:
                found[key] = hit[2]
        return found


class SampledRate:
    """Kafka's Rate over a windowed sum: ``record`` adds a value to the current sample (a new one starts once the
    current is ``window_ms`` old, reusing the oldest of ``num`` samples), ``measure`` divides the sum of the
    samples not older than ``num`` windows by the elapsed time, counted as at least ``num - 1`` whole windows."""

    __slots__ = ("num", "window_ms", "starts", "values", "current", "last_ms")

    def __init__(self, num: int, window_ms: int):
        self.num = num
        self.window_ms = window_ms
        self.starts: list[int] = []
        self.values: list[float] = []
        self.current = 0
        self.last_ms = 0                 # when something was last recorded (sensor expiry)

    def record(self, value: float, now_ms: int) -> None:
        starts = self.starts
        if not starts:
            starts.append(now_ms)
            self.values.append(0.0)
        elif now_ms - starts[self.current] >= self.window_ms:
            self.current = (self.current + 1) % self.num
            if self.current >= len(starts):
                starts.append(now_ms)
                self.values.append(0.0)
            else:
                starts[self.current] = now_ms
                self.values[self.current] = 0.0
        self.values[self.current] += value
        self.last_ms = now_ms

    def window_size_ms(self, now_ms: int) -> int:
        """The time the rate is measured over (Kafka's Rate.windowSize), samples ``num`` windows old reset first."""
        starts = self.starts
        if not starts:
            return max((self.num - 1) * self.window_ms, 1)
        oldest = min(starts)
        if now_ms - oldest >= self.num * self.window_ms:          # Kafka's purgeObsoleteSamples
            expire = self.num * self.window_ms
            for i, start in enumerate(starts):
                if now_ms - start >= expire:
                    starts[i] = now_ms
                    self.values[i] = 0.0
            oldest = min(starts)
        elapsed = now_ms - oldest
        full = elapsed // self.window_ms
        if full < self.num - 1:
            elapsed += (self.num - 1 - full) * self.window_ms
        return max(elapsed, 1)

    def measure(self, now_ms: int) -> float:
        """The rate per second."""
        window = self.window_size_ms(now_ms)
        return sum(self.values) * 1000.0 / window


def throttle_time_ms(rate: SampledRate, bound: float, now_ms: int) -> int:
    """How long a client over ``bound`` must wait for its rate to come back to it (Kafka's QuotaUtils.throttleTime):
    the excess over the bound as a fraction of it, times the window the rate is measured over; 0 within it."""
    window = rate.window_size_ms(now_ms)
    value = sum(rate.values) * 1000.0 / window
    if value <= bound:
        return 0
    return math.floor((value - bound) / bound * window + 0.5)


def record_and_throttle(rate: SampledRate, value: float, now_ms: int, bound: float) -> int:
    """``rate.record(value, now_ms)`` then :func:`throttle_time_ms` (what a quota check does per request)."""
    rate.record(value, now_ms)
    return throttle_time_ms(rate, bound, now_ms)
