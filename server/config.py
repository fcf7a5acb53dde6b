"""Broker configuration under Kafka's own property names, read from a flat TOML or a server.properties file.

Defaults are Apache Kafka's unless noted.  Keys starting with ``trireme.`` are ours: they cover
what Kafka has no name for (fsync policy, shutdown grace).

One rule for every source (--config, --set, the test fixture): a property in PROPERTIES is checked and used; a
name Kafka's broker defines (kafka_broker_properties.py) is accepted and reported once at start-up as having no
effect here; any other name, or a value out of its type or range, refuses to start with one line naming the
source, the property and what is allowed (docs/operations.md, "Configuration").
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import logging
import tomllib
from typing import Any

from trireme.state.topics import validate_config

from .kafka_broker_properties import KAFKA_BROKER_PREFIXES, KAFKA_BROKER_PROPERTIES

# topic config → the broker property that sets its default
TOPIC_DEFAULT_PROPERTIES = {
    "retention.ms": "log.retention.ms",
    "retention.bytes": "log.retention.bytes",
    "segment.bytes": "log.segment.bytes",
    "cleanup.policy": "log.cleanup.policy",
    "max.message.bytes": "message.max.bytes",
    "message.timestamp.type": "log.message.timestamp.type",
    "compression.type": "compression.type",
}

log = logging.getLogger("trireme.config")

# name → (default, description)
PROPERTIES: dict[str, tuple[Any, str]] = {
    "node.id": (1, "This broker's id."),
    "num.partitions": (1, "Partitions of an auto-created topic, or of CreateTopics with -1."),
    "default.replication.factor": (1, "Only 1 is possible on a single node."),
    "auto.create.topics.enable": (True, "Create unknown topics on Metadata/Produce requests."),
    "delete.topic.enable": (True, "Allow DeleteTopics."),
    "log.retention.ms": (604800000, "Default retention.ms of topics (Kafka: 168 hours); wins over "
                                    "log.retention.minutes and log.retention.hours.  -1: no time limit."),
    "log.retention.minutes": (None, "Default retention of topics in minutes, when log.retention.ms is unset "
                                    "(-1: no time limit)."),
    "log.retention.hours": (168, "Default retention of topics in hours, when log.retention.ms and "
                                 "log.retention.minutes are unset (-1: no time limit)."),
    "log.retention.bytes": (-1, "Default retention.bytes of topics (-1: no size limit)."),
    "log.segment.bytes": (1073741824, "Default segment.bytes of topics."),
    "log.retention.check.interval.ms": (300000, "How often retention runs."),
    "log.message.timestamp.type": ("CreateTime", "Default message.timestamp.type of topics."),
    "log.cleanup.policy": ("delete", "Default cleanup.policy of topics."),
    "message.max.bytes": (1048588, "Default max.message.bytes of topics (largest record batch)."),
    "compression.type": ("producer", "Default compression.type of topics."),
    "socket.request.max.bytes": (104857600, "Largest request frame; larger ones close the connection."),
    "fetch.max.bytes": (57671680, "Upper bound on a Fetch response's size."),
    "queued.max.request.bytes": (
        268435456, "Request bytes the broker holds at once, received or being handled (Kafka: -1, unbounded); "
                   "when reached, connections stop reading until requests finish.  -1: no limit."),
    "trireme.queued.max.request.bytes.per.connection": (
        16777216, "Request bytes one connection may hold before it stops reading new requests until its "
                  "earlier ones are answered (one request of any size up to socket.request.max.bytes goes "
                  "through)."),
    "trireme.request.receive.timeout.ms": (
        60000, "A request frame must arrive whole within this time of its size prefix, else the connection "
               "is closed."),
    "trireme.queued.max.response.bytes": (
        268435456, "Response bytes waiting to be written, broker-wide; when reached, connections with "
                   "unwritten responses stop reading new requests.  -1: no limit."),
    "trireme.queued.max.response.bytes.per.connection": (
        16777216, "Unwritten response bytes after which a connection stops reading new requests until the "
                  "client reads (Kafka mutes the channel)."),
    "trireme.response.send.timeout.ms": (
        60000, "A client that reads nothing of a pending response for this long is disconnected."),
    "connections.max.idle.ms": (600000, "Close connections with no request in progress and no traffic for this long."),
    "max.connections": (4096, "Connections at once (also kept below the open files limit, leaving room for logs); "
                              "further ones are closed at once (Kafka: 2147483647)."),
    "max.connections.per.ip": (2048, "Connections at once from one IP address (Kafka: 2147483647)."),
    "max.connections.per.ip.overrides": ("", "Per-IP exceptions: HOST:COUNT,HOST:COUNT."),
    "max.connection.creation.rate": (
        1000, "New connections accepted per second; faster ones wait in the listen backlog (Kafka: 2147483647)."),
    "trireme.max.partitions": (
        20000, "Partitions of all topics together; CreateTopics/CreatePartitions/auto-creation beyond it are "
               "refused with POLICY_VIOLATION."),
    "trireme.log.max.open.files": (
        4096, "Segment files the logs keep open at once (least recently used closed first, reopened on "
              "demand); at most half the open files limit."),
    "producer.id.expiration.ms": (86400000, "Idempotent producer state expires after this idle time."),
    "transactional.id.expiration.ms": (604800000, "Transactional id expiry."),
    "transaction.max.timeout.ms": (900000, "Largest transaction timeout a producer may ask for."),
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": (
        10000, "How often open transactions past their timeout are looked for and aborted."),
    "transaction.remove.expired.transaction.cleanup.interval.ms": (
        3600000, "How often transactional ids past transactional.id.expiration.ms are removed."),
    "transaction.version": (
        2, "Level of the transaction.version feature finalized when the data directory is new (as Kafka's "
           "`kafka-storage format --feature`): 0 classic, 1 flexible transaction-log records, 2 transactions "
           "V2 (KIP-890).  Later changes go through UpdateFeatures."),
    "transaction.two.phase.commit.enable": (False, "Allow two-phase-commit transactions (KIP-939)."),
    "unstable.api.versions.enable": (
        False, "Also serve and advertise the versions Kafka's definitions mark unstable (latestVersionUnstable: "
               "InitProducerId v6, KIP-939 two-phase commit), as Kafka's internal property does."),
    "group.initial.rebalance.delay.ms": (3000, "Delay before the first rebalance of an empty group."),
    "group.min.session.timeout.ms": (6000, "Smallest session timeout a consumer may ask for."),
    "group.max.session.timeout.ms": (1800000, "Largest session timeout a consumer may ask for."),
    "offsets.retention.minutes": (10080, "Committed offsets of empty groups expire after this."),
    "offsets.retention.check.interval.ms": (600000, "How often expired committed offsets are removed."),
    "log.flush.interval.messages": (
        9223372036854775807, "Opt in to Kafka's flush policy: acknowledge after the write and fsync once this "
                             "many messages are unflushed (also at segment rolls and shutdown).  Unset: fsync "
                             "before every acknowledgement."),
    "log.flush.interval.ms": (
        9223372036854775807, "Opt in to Kafka's flush policy: acknowledge after the write and fsync every this "
                             "many ms.  Unset: fsync before every acknowledgement."),
    "listeners": ("", "Kafka's listener list: one PLAINTEXT://HOST:PORT (an empty host binds every interface); "
                      "the same as --listen, which wins.  Other security protocols are refused."),
    "advertised.listeners": ("", "PLAINTEXT://HOST:PORT clients are told to connect to; the same as --advertised, "
                                 "which wins."),
    # --- TLS and listeners (security protocols, certificates, principal mapping)
    # --- SASL (mechanisms, JAAS, re-authentication, failed logins)
    "trireme.debug.transaction.marker.delay.ms": (
        0, "Fault injection for crash tests: wait this long before each WriteTxnMarkers request the "
           "coordinator sends, and send one partition per request.  0 (off) in production."),
    "trireme.debug.transaction.marker.refuse": (
        "", "Fault injection for tests of stuck transactions: the coordinator's own markers for these partitions "
            "(a comma list of TOPIC-PARTITION) are answered TRANSACTION_COORDINATOR_FENCED instead of being sent; "
            "an operator's `trireme transactions complete` is not affected.  Empty (off) in production."),
    # --- authorizer (ACLs, super users, the first SCRAM user)
    "trireme.fsync.enable": (True, "fsync before answering acks=1/all produce requests. false trades "
                                   "crash safety of acknowledged data for speed (Kafka's own default)."),
    "trireme.fsync.threads": (4, "How many partitions a group commit fsyncs at once (1-64; 1: one after "
                                 "another).  More make a round as long as its slowest fsync, not their sum, "
                                 "for some CPU per round."),
    # --- client quotas
    "trireme.shutdown.grace.ms": (5000, "On SIGTERM, how long in-flight requests may take to finish."),
    "trireme.log.level": ("INFO", "Log level of the structured logs on stderr."),
    "trireme.metrics.listen": ("", "HOST:PORT for a Prometheus endpoint (GET /metrics); :PORT binds 127.0.0.1; "
                                   "empty: off."),
    "trireme.metrics.group.lag.max.groups": (
        100, "trireme_group_lag reports the consumer groups with the largest lag, at most this many."),
    "trireme.metrics.security.max.series": (
        100, "The security metrics labelled by principal, resource or client (denied requests, throttled clients) "
             "report the series with the largest counts, at most this many per metric."),
    "trireme.status.listen": ("", "HOST:PORT for the status page (open http://HOST:PORT/ in a browser); :PORT "
                                  "binds 127.0.0.1; the same address as trireme.metrics.listen serves both; "
                                  "empty: off."),
    "trireme.status.actions.enable": (
        False, "Let the status page abort transactions (POST with the page's per-process token)."),
}


INT_MAX = 2**31 - 1
LONG_MAX = 2**63 - 1
# Integer properties that only make sense within a range: (lowest, highest) (Kafka's validators where it has one);
# other integers are Java longs.
RANGES = {
    "trireme.fsync.threads": (1, 64),
    "node.id": (0, INT_MAX),
    "num.partitions": (1, INT_MAX),
    "default.replication.factor": (1, 1),
    "log.retention.minutes": (-1, INT_MAX),
    "log.retention.hours": (-1, INT_MAX),
    "log.retention.check.interval.ms": (1, LONG_MAX),
    "socket.request.max.bytes": (1, INT_MAX),
    "fetch.max.bytes": (1024, INT_MAX),
    "max.connections": (0, INT_MAX),
    "max.connections.per.ip": (0, INT_MAX),
    "max.connection.creation.rate": (0, INT_MAX),
    "connections.max.idle.ms": (1, LONG_MAX),
    "trireme.max.partitions": (1, INT_MAX),
    "trireme.log.max.open.files": (1, INT_MAX),
    "producer.id.expiration.ms": (1, INT_MAX),
    "transactional.id.expiration.ms": (1, INT_MAX),
    "transaction.max.timeout.ms": (1, INT_MAX),
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": (1, INT_MAX),
    "transaction.remove.expired.transaction.cleanup.interval.ms": (1, INT_MAX),
    "transaction.version": (0, 2),
    "group.initial.rebalance.delay.ms": (0, INT_MAX),
    "group.min.session.timeout.ms": (0, INT_MAX),
    "group.max.session.timeout.ms": (0, INT_MAX),
    "offsets.retention.minutes": (1, INT_MAX),
    "offsets.retention.check.interval.ms": (1, LONG_MAX),
    "log.flush.interval.messages": (1, LONG_MAX),
    "log.flush.interval.ms": (0, LONG_MAX),
    "trireme.request.receive.timeout.ms": (1, LONG_MAX),
    "trireme.response.send.timeout.ms": (1, LONG_MAX),
    "trireme.shutdown.grace.ms": (0, LONG_MAX),
    "trireme.metrics.group.lag.max.groups": (0, INT_MAX),
    "trireme.metrics.security.max.series": (0, INT_MAX),
    # --- TLS and listeners (security protocols, certificates, principal mapping)
    # --- SASL (mechanisms, JAAS, re-authentication, failed logins)
    "trireme.debug.transaction.marker.delay.ms": (0, LONG_MAX),
}
# String properties with a fixed set of values (any case; kept upper case).
CHOICES = {"trireme.log.level": ("DEBUG", "INFO", "WARNING", "WARN", "ERROR", "CRITICAL")}
# Kafka's other forms of a property in other units, most precise first: (name, factor to the property's unit).
# Kafka's precedence: the most precise form set wins; a negative value means no limit (-1).
UNIT_FORMS = {"log.retention.ms": (("log.retention.ms", 1), ("log.retention.minutes", 60_000),
                                   ("log.retention.hours", 3_600_000))}
# Kafka properties accepted without effect that concern security: said in a warning of their own, since a user
# may believe them in force.
SECURITY_PREFIXES = ("ssl.", "sasl.", "listener.name.", "authorizer.", "super.users", "allow.everyone.",
                     "principal.builder.", "security.", "delegation.token.", "password.encoder.")
# Kafka's per-listener overrides: listener.name.<listener>.<property> (Config.for_listener).
LISTENER_PREFIX = "listener.name."
# String properties that hold a comma list of TOPIC-PARTITION (see :func:`partition_list`).
PARTITION_LISTS = frozenset({"trireme.debug.transaction.marker.refuse"})


class ConfigError(ValueError):
    pass


def _coerce(name: str, value: Any) -> Any:
    default = PROPERTIES[name][0]
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("true", "false"):
            return text == "true"
        raise ConfigError(f"{name} must be true or false, not {value!r}")
    if isinstance(default, int) or default is None:
        try:
            if isinstance(value, (bool, float)):
                raise ValueError
            number = int(str(value).strip())
        except ValueError:
            raise ConfigError(f"{name} must be an integer, not {value!r}") from None
        lowest, highest = RANGES.get(name, (-LONG_MAX - 1, LONG_MAX))
        if not lowest <= number <= highest:
            raise ConfigError(f"{name} must be from {lowest} to {highest}, not {number}")
        _check_topic_default(name, str(number))
        return number
    text = str(value).strip()
    if name in PARTITION_LISTS:
        partition_list(text, name)
    if name in CHOICES:
        if text.upper() not in CHOICES[name]:
            raise ConfigError(f"{name} must be one of {', '.join(CHOICES[name])}, not {value!r}")
        text = text.upper()
    _check_topic_default(name, text)
    return text


def _check_topic_default(name: str, text: str) -> None:
    """A broker property that is the default of a topic config is held to that config's rule."""
    for topic_key, broker_key in TOPIC_DEFAULT_PROPERTIES.items():
        if broker_key == name:
            problem = validate_config(topic_key, text)
            if problem is not None:
                raise ConfigError(f"{name} must be a valid {topic_key} ({problem}), not {text!r}")


def is_kafka_property(name: str) -> bool:
    """Whether Kafka's broker defines ``name`` (see kafka_broker_properties.py)."""
    return name in KAFKA_BROKER_PROPERTIES or name.startswith(KAFKA_BROKER_PREFIXES)


def unknown_property(name: str, value: Any, source: str) -> ConfigError:
    """The one-line refusal of a name neither Trireme nor Kafka's broker defines, with the nearest known name."""
    if isinstance(value, dict):       # TOML read `num.partitions = 3` as the table num = {partitions = 3}
        dotted, inner = name, value
        while isinstance(inner, dict) and len(inner) == 1:
            (key, inner), = inner.items()
            dotted += "." + key
        shown = "..." if isinstance(inner, dict) else json.dumps(inner)     # TOML's spelling: true, "text", 3
        return ConfigError(f"{source}: unknown property {name!r} (a TOML table): quote dotted keys in TOML: "
                           f"\"{dotted}\" = {shown}")
    known = sorted(set(PROPERTIES) | KAFKA_BROKER_PROPERTIES)
    nearest = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = f"did you mean {nearest[0]}?" if nearest else "see trireme serve --help"
    return ConfigError(f"{source}: unknown property {name!r}, neither Trireme's nor Kafka's: {hint}")


def partition_list(text: str, name: str = "value") -> frozenset[tuple[str, int]]:
    """A comma list of TOPIC-PARTITION (``orders-0,orders-3``; empty: none) → {(topic, partition)}."""
    out = set()
    for item in filter(None, (part.strip() for part in text.split(","))):
        topic, sep, index = item.rpartition("-")
        if not sep or not topic or not index.isdigit():
            raise ConfigError(f"{name} must be a comma list of TOPIC-PARTITION, not {item!r}")
        out.add((topic, int(index)))
    return frozenset(out)


def parse_properties(text: str) -> dict[str, str]:
    """Java-style ``key=value`` (or ``key: value``) lines; ``#`` and ``!`` start comments."""
    out = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        for sep in ("=", ":"):
            if sep in line:
                key, value = line.split(sep, 1)
                out[key.strip()] = value.strip()
                break
        else:
            out[line] = ""
    return out


def read_config_file(path: str) -> dict[str, Any]:
    with open(path, "rb") as f:
        raw = f.read()
    if path.endswith(".toml"):
        try:
            return tomllib.loads(raw.decode("utf-8"))
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: {e}") from None
    return parse_properties(raw.decode("utf-8"))


@dataclasses.dataclass
class Config:
    data_dir: str
    listen_host: str = "127.0.0.1"
    listen_port: int = 9092
    advertised_host: str | None = None
    advertised_port: int | None = None
    values: dict[str, Any] = dataclasses.field(default_factory=dict)
    # Kafka properties set that have no effect here: name → (value as given, source).
    no_effect: dict[str, tuple[str, str]] = dataclasses.field(default_factory=dict)
    # Where each property in ``values`` was set (a file's path, --set, the fixture).
    sources: dict[str, str] = dataclasses.field(default_factory=dict)
    # Kafka's per-listener overrides as given: listener.name.<listener>.<property> (listener lower case) → value.
    listener_values: dict[str, str] = dataclasses.field(default_factory=dict)

    def __getitem__(self, name: str) -> Any:
        if name in UNIT_FORMS:
            setting = self.setting(name)
            if setting is not None:
                form, value = setting
                return -1 if value < 0 else value * dict(UNIT_FORMS[name])[form]
        if name in self.values:
            return self.values[name]
        return PROPERTIES[name][0]

    def setting(self, name: str) -> tuple[str, Any] | None:
        """The explicit setting that decides ``name``, as (the name set, its value): for a property with forms in
        other units (log.retention.ms/minutes/hours) the most precise form set; None when it has its default."""
        for form, _ in UNIT_FORMS.get(name, ((name, 1),)):
            if form in self.values:
                return form, self.values[form]
        return None

    def is_set(self, name: str) -> bool:
        return self.setting(name) is not None

    def set(self, name: str, value: Any, source: str = "--set") -> None:
        """Apply one property from ``source`` (a file's path, --set, the fixture): used if Trireme has it,
        noted as without effect if only Kafka's broker has it, else refused (ConfigError, one line)."""
        if name.startswith(LISTENER_PREFIX) and not isinstance(value, dict):
            listener, sep, prop = name[len(LISTENER_PREFIX):].partition(".")
            if not sep or not listener or not prop:
                raise ConfigError(f"{source}: {name!r}: expected listener.name.<listener>.<property>")
            self.listener_values[f"{LISTENER_PREFIX}{listener.lower()}.{prop}"] = str(value)
            self.sources[name] = source
            if prop not in PROPERTIES:
                self.no_effect[name] = (str(value), source)
        elif name in PROPERTIES:
            try:
                self.values[name] = _coerce(name, value)
            except ConfigError as e:
                raise ConfigError(f"{source}: {e}") from None
            self.sources[name] = source
        elif is_kafka_property(name) and not isinstance(value, dict):
            self.no_effect[name] = (str(value), source)
        else:
            raise unknown_property(name, value, source)

    def for_listener(self, listener: str, name: str) -> Any:
        """Property ``name`` as it applies to ``listener``: Kafka's override listener.name.<listener>.<name> when
        set (a string, as given), else the broker-wide value (``self[name]`` for Trireme's properties, else the raw
        value set, else None).  For SASL, ``name`` carries the mechanism as Kafka's does:
        ``scram-sha-512.sasl.jaas.config``."""
        override = self.listener_values.get(f"{LISTENER_PREFIX}{listener.lower()}.{name}")
        if override is not None:
            return override
        if name in PROPERTIES:
            return self[name]
        raw = self.no_effect.get(name)
        return None if raw is None else raw[0]

    def update(self, mapping: dict[str, Any], source: str = "--set") -> None:
        for name, value in mapping.items():
            self.set(name, value, source)

    def report_no_effect(self) -> None:
        """Log, once at start-up, the Kafka properties that were set but mean nothing here."""
        names = sorted(self.no_effect)
        secure = [n for n in names if n.startswith(SECURITY_PREFIXES)]
        other = [n for n in names if n not in secure]
        if other:
            log.info("no effect here (Kafka properties Trireme does not use): %s", ", ".join(other))
        if secure:
            log.warning("no effect here: %s; Trireme has no TLS, SASL or ACLs yet: connections are plaintext "
                        "and every client may do everything", ", ".join(secure))

    def listener(self, name: str) -> tuple[str, int] | None:
        """HOST, PORT of the client listener in ``listeners`` / ``advertised.listeners`` (None when unset): the
        controller listeners (controller.listener.names) are left out, the rest must be one PLAINTEXT listener
        (listener.security.protocol.map names the protocol of a listener with another name)."""
        value = self[name]
        if not value:
            return None
        controllers = {n.strip().upper() for n in self.no_effect.get("controller.listener.names", ("", ""))[0]
                       .split(",") if n.strip()}
        protocols = {p: p for p in ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")}
        for pair in self.no_effect.get("listener.security.protocol.map", ("", ""))[0].split(","):
            listener_name, sep, protocol = pair.partition(":")
            if sep:
                protocols[listener_name.strip().upper()] = protocol.strip().upper()
        try:
            return listener_address(name, value, controllers, protocols)
        except ConfigError as e:
            raise ConfigError(f"{self.sources.get(name, '--set')}: {e}") from None


def parse_host_port(text: str, default_host: str = "0.0.0.0") -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"expected HOST:PORT, got {text!r}")
    if int(port) > 65535:
        raise ConfigError(f"port out of range (0-65535) in {text!r}")
    return host.strip("[]") or default_host, int(port)


def listener_address(name: str, value: str, controllers: frozenset[str] | set[str] = frozenset(),
                     protocols: dict[str, str] | None = None) -> tuple[str, int]:
    """HOST, PORT of Kafka's ``listeners`` / ``advertised.listeners`` value: exactly one PLAINTEXT listener, besides
    the ``controllers`` (listener names, upper case) which are left out.  ``protocols``: listener name → security
    protocol (default: each name is its protocol)."""
    entries = []
    for entry in (e.strip() for e in value.split(",") if e.strip()):
        scheme, sep, _ = entry.partition("://")
        if not sep:
            raise ConfigError(f"{name}: expected NAME://HOST:PORT, got {entry!r}")
        if scheme.upper() in controllers:
            continue
        protocol = (protocols or {}).get(scheme.upper(), scheme.upper() if protocols is None else None)
        if protocol is None:
            raise ConfigError(f"{name}: {entry!r}: listener.security.protocol.map gives no security protocol for "
                              f"listener {scheme}")
        if protocol != "PLAINTEXT":
            raise ConfigError(f"{name}: {entry!r} is not supported: Trireme has no TLS or SASL yet and serves one "
                              f"PLAINTEXT listener (a controller listener is named in controller.listener.names)")
        entries.append(entry)
    if len(entries) != 1:
        raise ConfigError(f"{name}: Trireme serves exactly one PLAINTEXT listener, got {value!r}")
    address = entries[0].partition("://")[2]
    if name == "advertised.listeners" and address.startswith(":"):
        raise ConfigError(f"{name}: {entries[0]!r} needs a host clients can connect to")
    return parse_host_port(address)


def parse_topic_spec(text: str) -> tuple[str, int, dict[str, str]]:
    """``NAME[:PARTITIONS[:KEY=VALUE,KEY=VALUE...]]`` (``trireme serve --topic``) → (name, partitions, configs).
    Partitions default to -1 (num.partitions); a comma inside a value (``cleanup.policy=compact,delete``) is kept."""
    name, _, rest = text.partition(":")
    count, _, settings = rest.partition(":")
    try:
        partitions = int(count) if count else -1
    except ValueError:
        raise ConfigError(f"--topic {text!r}: partitions must be an integer") from None
    configs: dict[str, str] = {}
    key = None
    for piece in settings.split(",") if settings else ():
        if "=" in piece:
            key, _, value = piece.partition("=")
            configs[key.strip()] = value.strip()
        elif key is None:
            raise ConfigError(f"--topic {text!r}: expected KEY=VALUE, got {piece!r}")
        else:
            configs[key.strip()] += "," + piece.strip()
    if not name:
        raise ConfigError(f"--topic {text!r}: a topic name is needed")
    return name, partitions, configs
