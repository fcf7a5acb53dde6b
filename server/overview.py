"""What the broker holds, read for people and scrapers (the status page, the metrics): partitions and what pins their last stable offset, consumer group lag, hanging and stuck transactions, listeners and security counters.

Everything here only reads the broker's state, at the moment it is asked (a page view, a scrape),
so the produce and fetch paths pay nothing for it.
"""
from __future__ import annotations

import dataclasses

from trireme.state.txn_records import TxnState
from trireme.wire import error_codes as E

from . import tls

# Coordinator states in which a transaction may still be open on its partitions (markers not all written).
OPEN_STATES = (TxnState.ONGOING, TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)


@dataclasses.dataclass(frozen=True)
class OpenTxn:
    """A transaction open on one partition (in that partition's producer state)."""

    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int                 # of the producer's last marker here (-1: none yet)
    first_offset: int
    last_timestamp: int
    transactional_id: str | None           # the coordinator's transaction it belongs to; None: hanging

    @property
    def hanging(self) -> bool:
        """KIP-664: open here, but the coordinator has no open transaction of this producer with this partition."""
        return self.transactional_id is None


def open_transactions(broker) -> list[OpenTxn]:
    """Every transaction open on a partition, matched with the coordinator's open transactions, oldest first."""
    by_producer = {meta.producer_id: meta for meta in broker.transactions.coordinator.transactions.values()
                   if meta.state in OPEN_STATES}
    out = []
    for (topic, index), partition in broker.partitions.items():
        for entry in partition.producers.entries():
            if entry.current_txn_first_offset is None:
                continue
            meta = by_producer.get(entry.producer_id)
            known = meta is not None and (topic, index) in meta.value.partitions
            out.append(OpenTxn(topic, index, entry.producer_id, entry.producer_epoch, entry.coordinator_epoch,
                               entry.current_txn_first_offset, entry.last_timestamp,
                               meta.transactional_id if known else None))
    return sorted(out, key=lambda t: (t.last_timestamp, t.topic, t.partition, t.producer_id))


def lso_pins(open_txns: list[OpenTxn]) -> dict[tuple[str, int], OpenTxn]:
    """Per partition, the open transaction with the smallest first offset: the one that holds its LSO back."""
    pins: dict[tuple[str, int], OpenTxn] = {}
    for txn in open_txns:
        tp = (txn.topic, txn.partition)
        if tp not in pins or txn.first_offset < pins[tp].first_offset:
            pins[tp] = txn
    return pins


@dataclasses.dataclass(frozen=True)
class OffsetLag:
    topic: str
    partition: int
    committed: int
    high_watermark: int

    @property
    def lag(self) -> int:
        return max(0, self.high_watermark - self.committed)


@dataclasses.dataclass(frozen=True)
class GroupView:
    group_id: str
    state: str
    protocol_type: str
    protocol: str
    members: tuple                          # state.groups.Member, in join order
    offsets: tuple[OffsetLag, ...]          # committed offsets of partitions that exist

    @property
    def lag(self) -> int:
        return sum(o.lag for o in self.offsets)


def groups(broker) -> list[GroupView]:
    """Every live classic group and every group id with committed offsets, with each offset's lag behind the
    high watermark (as ``kafka-consumer-groups.sh --describe`` reports it), by group id."""
    coordinator = broker.groups.coordinator
    out = []
    for group_id in sorted(set(coordinator.groups) | set(coordinator.offsets)):
        group = coordinator.groups.get(group_id)
        if group is not None and group.state == "Dead":
            continue
        offsets = []
        for (topic, index), committed in sorted(coordinator.offsets.get(group_id, {}).items()):
            partition = broker.partition(topic, index)
            if partition is not None:
                offsets.append(OffsetLag(topic, index, committed.offset, partition.log.high_watermark))
        if group is None:
            out.append(GroupView(group_id, "Empty", "", "", (), tuple(offsets)))
        else:
            out.append(GroupView(group_id, str(group.state), group.protocol_type or "", group.protocol_name or "",
                                 tuple(group.members.values()), tuple(offsets)))
    return out


@dataclasses.dataclass(frozen=True)
class StuckView:
    """A prepared transaction a partition refused a marker for, for good: it waits for an operator."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool
    refused: tuple[tuple[str, int, str], ...]      # (topic, partition, error name)
    since_ms: int

    @property
    def state(self) -> str:
        return "PrepareCommit" if self.commit else "PrepareAbort"

    def as_json(self) -> dict:
        return {"transactional_id": self.transactional_id, "producer_id": self.producer_id,
                "producer_epoch": self.producer_epoch, "transaction_state": self.state,
                "partitions": ",".join(f"{t}-{p}:{error}" for t, p, error in self.refused),
                "stuck_since_ms": self.since_ms}


def stuck_transactions(broker) -> list[StuckView]:
    """The transactions left prepared because a partition refused a marker for good, by transactional id."""
    return [StuckView(s.job.transactional_id, s.job.producer_id, s.job.producer_epoch, s.job.commit,
                      tuple((t, p, E.for_code(code).name) for (t, p), code in sorted(s.partitions.items())),
                      s.since_ms)
            for s in broker.transactions.stuck_transactions()]


# --- security ---------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ListenerView:
    name: str
    protocol: str                            # PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL
    address: str                             # HOST:PORT as configured
    mechanisms: tuple[str, ...]              # sasl.enabled.mechanisms of a SASL listener
    client_auth: str                         # ssl.client.auth of a TLS listener ("" for none)


@dataclasses.dataclass(frozen=True)
class SecurityView:
    listeners: tuple[ListenerView, ...]
    authorizer: str | None                   # authorizer.class.name when the authorizer is on
    super_users: tuple[str, ...]
    allow_everyone_if_no_acl: bool
    authentications: tuple[tuple[str, str, int, int], ...]          # listener, mechanism, successes, failures
    denied: tuple[tuple[str, str, str, str, int], ...]              # principal, API, type, resource, count: largest
    denied_total: int
    denied_series: int                       # distinct (principal, API, type, resource) counted
    throttled: tuple[tuple[str, str, str, int, int], ...]           # user, client id, quota type, count, ms
    throttled_series: int


def _setting(config, name: str, listener: str | None = None):
    """A property's value whether or not this build knows it (Trireme's property, else the raw Kafka setting)."""
    if listener is not None:
        return config.for_listener(listener, name)
    try:
        return config[name]
    except KeyError:
        raw = config.no_effect.get(name)
        return None if raw is None else raw[0]


def listeners(broker) -> list[ListenerView]:
    """The client listeners (the bound ones when serving, else as configured), with each one's SASL mechanisms and
    client-certificate setting (``ssl.client.auth``)."""
    config = broker.config
    endpoints = getattr(broker, "endpoints", None)
    if endpoints:
        found = [(e.name, e.security_protocol, f"{e.host}:{e.port}") for e in endpoints.values()]
    else:
        found = [(s.name, s.security_protocol, f"{s.host}:{s.port}") for s in getattr(config, "listeners", None) or ()]
    found = found or [("PLAINTEXT", "PLAINTEXT", f"{config.listen_host}:{broker.advertised_port}")]
    out = []
    for name, protocol, address in found:
        mechanisms = ()
        if protocol.startswith("SASL"):
            mechanisms = tuple(m.strip().upper() for m in str(_setting(config, "sasl.enabled.mechanisms", name)
                                                              or "GSSAPI").split(",") if m.strip())
        client_auth = tls.client_auth(config, name, protocol) if protocol.endswith("SSL") else ""
        out.append(ListenerView(name, protocol, address, mechanisms, client_auth))
    return out


def security(broker, max_rows: int) -> SecurityView:
    """What the status page shows of security: listeners, the authorizer, and the security counters (the
    ``max_rows`` largest denied-request and throttled-client series)."""
    m, config, sec = broker.metrics, broker.config, broker.security
    auth: dict[tuple[str, str], list[int]] = {}
    for (listener, mechanism, outcome), n in m.authentications.items():
        auth.setdefault((listener, mechanism), [0, 0])[outcome != "success"] += n
    denied = sorted(m.denied.items(), key=lambda kv: (-kv[1], kv[0]))[:max_rows]
    throttled = sorted(m.throttle_ms.items(), key=lambda kv: (-kv[1], kv[0]))[:max_rows]
    enabled = bool(getattr(sec, "authorizer_enabled", False))
    return SecurityView(
        listeners=tuple(listeners(broker)),
        authorizer=(str(_setting(config, "authorizer.class.name") or "on")) if enabled else None,
        super_users=tuple(u.strip() for u in str(_setting(config, "super.users") or "").split(";") if u.strip()),
        allow_everyone_if_no_acl=str(_setting(config, "allow.everyone.if.no.acl.found")).lower() == "true",
        authentications=tuple((listener, mech, ok, failed) for (listener, mech), (ok, failed) in sorted(auth.items())),
        denied=tuple((*key, n) for key, n in denied),
        denied_total=sum(m.denied.values()),
        denied_series=len(m.denied),
        throttled=tuple((*key, m.throttled[key], ms) for key, ms in throttled),
        throttled_series=len(m.throttle_ms))
