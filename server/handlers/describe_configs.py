"""DescribeConfigs: every config of a topic, or the static properties of this broker, with their sources.

Behaviour / version notes:
- v1-4 (v0 is not in Kafka 4's definition).  Results come in request order.
- TOPIC (2): every topic config, sorted by name.  Source DYNAMIC_TOPIC_CONFIG (Kafka's
  TOPIC_CONFIG, 1) for a config set on the topic; else STATIC_BROKER_CONFIG (4) when the broker
  property it derives from (log.retention.ms for retention.ms, ...) is set in the broker's config
  file; else DEFAULT_CONFIG (5).  read_only and is_sensitive are false.  Synonyms (when
  include_synonyms) list, as Kafka does, the topic override, then the broker property if set,
  then the broker property's default.  An invalid topic name → INVALID_TOPIC_EXCEPTION; an
  unknown topic → UNKNOWN_TOPIC_OR_PARTITION (null message, as Kafka).
- BROKER (4), resource name = our node id: every property of server.config.PROPERTIES with its
  current value, source STATIC_BROKER_CONFIG when set in the config else DEFAULT_CONFIG, and
  read_only true (nothing can be altered at runtime, see incremental_alter_configs.py).  A secret
  (config.SENSITIVE_PROPERTIES: Kafka's PASSWORD configs, such as ssl.key.password, and trireme.storage.add.scram) has a null value, type PASSWORD and
  is_sensitive true, as Kafka's PASSWORD configs.  The per-listener SSL configs set through
  AlterConfigs (``listener.name.<l>.ssl.keystore.location``, ...) follow, source
  DYNAMIC_BROKER_CONFIG (2), read_only false, secrets (config.SENSITIVE_PROPERTIES) without their value.  An empty
  resource name means the cluster-wide dynamic defaults, as in Kafka: there are none here, so
  the answer is an empty list.  Another id → INVALID_REQUEST "Unexpected broker id, ..."; a
  non-integer name → INVALID_REQUEST "Broker id must be an integer, ...".
- configuration_keys null or empty means every config (Kafka treats both alike); otherwise only
  the names listed that exist.
- config_type (v3+) is Kafka's ConfigType number.  documentation (v3+) is sent only when
  include_documentation is true: the property's description for broker configs, null for topic
  configs.
- Other resource types (GROUP, CLIENT_METRICS, BROKER_LOGGER, unknown) → INVALID_REQUEST
  "Unsupported resource type: ...".
- A resource asked for a second time (same type, name and configuration_keys) → INVALID_REQUEST
  "Duplicate resource" for the repeat (Kafka describes it again).  Each repeat of the broker
  resource cost 8.5 KiB of answer for 5 bytes of request: a 1 MiB request built a 1.7 GB response
  on the event loop.  Clients do not repeat a resource (librdkafka even refuses a second BROKER
  resource in one call: "Only one ConfigResource of type BROKER is allowed per call").
- ACLs (as Kafka's ConfigHelper), per resource: BROKER, BROKER_LOGGER and CLIENT_METRICS need
  DescribeConfigs on the cluster (else CLUSTER_AUTHORIZATION_FAILED), TOPIC DescribeConfigs on the
  topic (else TOPIC_AUTHORIZATION_FAILED, whether it exists or not), GROUP DescribeConfigs on the
  group (else GROUP_AUTHORIZATION_FAILED).  A refused resource answers with Kafka's message for the
  code ("Topic authorization failed.", ...) and no configs, after the results of the others, as
  Kafka orders them.  Unknown resource types are not checked.
"""
from __future__ import annotations

import re
from typing import NamedTuple

from trireme.server.config import PROPERTIES, SENSITIVE_PROPERTIES
from trireme.server.dispatch import handles
from trireme.state.acls import CLUSTER_NAME, Operation, ResourceType
from trireme.state.topics import TOPIC_CONFIGS, validate_topic_name
from trireme.wire import error_codes as E

DUPLICATE = "Duplicate resource"
RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4
RESOURCE_TYPE_NAMES = {0: "UNKNOWN", 2: "TOPIC", 4: "BROKER", 8: "BROKER_LOGGER", 16: "CLIENT_METRICS",
                       32: "GROUP"}

# Config resource type → (ACL resource type, whether the ACL resource is named by the config resource,
# error when refused): what Kafka checks for DescribeConfigs (operation DescribeConfigs) and for
# AlterConfigs/IncrementalAlterConfigs (operation AlterConfigs).
CONFIG_ACLS = {
    2: (ResourceType.TOPIC, True, E.TOPIC_AUTHORIZATION_FAILED),
    4: (ResourceType.CLUSTER, False, E.CLUSTER_AUTHORIZATION_FAILED),
    8: (ResourceType.CLUSTER, False, E.CLUSTER_AUTHORIZATION_FAILED),
    16: (ResourceType.CLUSTER, False, E.CLUSTER_AUTHORIZATION_FAILED),
    32: (ResourceType.GROUP, True, E.GROUP_AUTHORIZATION_FAILED),
}
AUTHORIZATION_MESSAGES = {E.TOPIC_AUTHORIZATION_FAILED.code: "Topic authorization failed.",
                          E.CLUSTER_AUTHORIZATION_FAILED.code: "Cluster authorization failed.",
                          E.GROUP_AUTHORIZATION_FAILED.code: "Group authorization failed."}


def config_refusal(ctx, operation, resource_type: int, resource_name: str):
    """The error (a KafkaError) refusing ``operation`` on a config resource, or None when allowed (or when the
    resource type is not one Kafka checks)."""
    acl = CONFIG_ACLS.get(resource_type)
    if acl is None:
        return None
    acl_type, named, error = acl
    return None if ctx.authorize(operation, acl_type, resource_name if named else CLUSTER_NAME) else error

# DescribeConfigs ConfigSource values.
SOURCE_TOPIC_CONFIG = 1
SOURCE_DYNAMIC_BROKER_CONFIG = 2
SOURCE_STATIC_BROKER_CONFIG = 4
SOURCE_DEFAULT_CONFIG = 5

# DescribeConfigs ConfigType values.
TYPE_BOOLEAN, TYPE_STRING, TYPE_INT, TYPE_LONG, TYPE_LIST, TYPE_PASSWORD = 1, 2, 3, 5, 7, 9

# The broker property each topic config takes its default from (Kafka's synonym names).  Only
# those in server.config.PROPERTIES can be set here; the others always have the topic default.
BROKER_SYNONYMS = {
    "cleanup.policy": "log.cleanup.policy",
    "compression.type": "compression.type",
    "delete.retention.ms": "log.cleaner.delete.retention.ms",
    "file.delete.delay.ms": "log.segment.delete.delay.ms",
    "index.interval.bytes": "log.index.interval.bytes",
    "max.compaction.lag.ms": "log.cleaner.max.compaction.lag.ms",
    "max.message.bytes": "message.max.bytes",
    "message.timestamp.type": "log.message.timestamp.type",
    "min.cleanable.dirty.ratio": "log.cleaner.min.cleanable.ratio",
    "min.compaction.lag.ms": "log.cleaner.min.compaction.lag.ms",
    "min.insync.replicas": "min.insync.replicas",
    "preallocate": "log.preallocate",
    "retention.bytes": "log.retention.bytes",
    "retention.ms": "log.retention.ms",
    "segment.bytes": "log.segment.bytes",
    "segment.index.bytes": "log.index.size.max.bytes",
    "segment.jitter.ms": "log.roll.jitter.ms",
    "segment.ms": "log.roll.ms",
    "unclean.leader.election.enable": "unclean.leader.election.enable",
}

# Broker properties whose Kafka type is not what their Python default suggests.
_BROKER_TYPES = {"log.retention.ms": TYPE_LONG, "log.retention.bytes": TYPE_LONG,
                 "log.retention.check.interval.ms": TYPE_LONG, "log.cleanup.policy": TYPE_LIST,
                 "log.retention.minutes": TYPE_INT, "log.retention.hours": TYPE_INT}

_JAVA_INT = re.compile(r"[+-]?[0-9]+")


class ConfigEntry(NamedTuple):
    name: str
    value: str | None
    source: int
    synonyms: list[tuple[str, str | None, int]]   # (name, value, source), most specific first
    config_type: int
    read_only: bool
    documentation: str | None


def broker_value(value) -> str | None:
    """A broker property as Kafka prints it (None: unset)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def topic_config_entries(broker, topic) -> list[ConfigEntry]:
    """Every config of ``topic`` with its effective value, source and synonyms, sorted by name."""
    effective = broker.topic_config(topic)
    entries = []
    for name in sorted(TOPIC_CONFIGS):
        spec = TOPIC_CONFIGS[name]
        synonyms: list[tuple[str, str | None, int]] = []
        if name in topic.configs:
            synonyms.append((name, topic.configs[name], SOURCE_TOPIC_CONFIG))
        prop = BROKER_SYNONYMS.get(name)
        if prop is not None:
            if prop in PROPERTIES:
                setting = broker.config.setting(prop)     # log.retention.hours for retention.ms, ...
                if setting is not None:
                    synonyms.append((setting[0], broker_value(setting[1]), SOURCE_STATIC_BROKER_CONFIG))
                synonyms.append((prop, broker_value(PROPERTIES[prop][0]), SOURCE_DEFAULT_CONFIG))
            else:
                synonyms.append((prop, spec.default, SOURCE_DEFAULT_CONFIG))
        source = synonyms[0][2] if synonyms else SOURCE_DEFAULT_CONFIG
        entries.append(ConfigEntry(name, effective[name], source, synonyms, spec.config_type, False, None))
    return entries


def broker_config_entries(broker) -> list[ConfigEntry]:
    """Every broker property with its current value and source, sorted by name."""
    explicit = broker.config.values
    entries = []
    for name in sorted(PROPERTIES):
        default, doc = PROPERTIES[name]
        synonyms = []
        if name in explicit:
            synonyms.append((name, broker_value(explicit[name]), SOURCE_STATIC_BROKER_CONFIG))
        elif broker.config.is_set(name):          # log.retention.ms from log.retention.hours: its effective value
            synonyms.append((name, broker_value(broker.config[name]), SOURCE_STATIC_BROKER_CONFIG))
        synonyms.append((name, broker_value(default), SOURCE_DEFAULT_CONFIG))
        if name in SENSITIVE_PROPERTIES:          # a secret: never told (Kafka's PASSWORD configs)
            synonyms = [(n, None, source) for n, _, source in synonyms]
            ctype = TYPE_PASSWORD
        elif name in _BROKER_TYPES:
            ctype = _BROKER_TYPES[name]
        elif isinstance(default, bool):
            ctype = TYPE_BOOLEAN
        elif isinstance(default, int):
            ctype = TYPE_INT
        else:
            ctype = TYPE_STRING
        entries.append(ConfigEntry(name, synonyms[0][1], synonyms[0][2], synonyms, ctype, True, doc))
    for endpoint in getattr(broker, "endpoints", {}).values():     # the per-listener SSL configs set at runtime
        for config, value in (endpoint.tls.overrides.items() if endpoint.tls is not None else ()):
            name = f"listener.name.{endpoint.name.lower()}.{config}"
            secret = config in SENSITIVE_PROPERTIES
            shown = None if secret else value
            entries.append(ConfigEntry(name, shown, SOURCE_DYNAMIC_BROKER_CONFIG,
                                       [(name, shown, SOURCE_DYNAMIC_BROKER_CONFIG)],
                                       TYPE_PASSWORD if secret else TYPE_STRING, False, None))
    entries.sort(key=lambda e: e.name)
    return entries


class _RefusedResource(Exception):
    def __init__(self, code: int, message: str | None):
        super().__init__(message)
        self.code = code
        self.message = message


def _entries_for(broker, resource) -> list[ConfigEntry]:
    rtype, rname = resource.resource_type, resource.resource_name
    if rtype == RESOURCE_TOPIC:
        problem = validate_topic_name(rname)
        if problem is not None:
            raise _RefusedResource(E.INVALID_TOPIC_EXCEPTION.code, problem)
        topic = broker.topics.get(rname)
        if topic is None:
            raise _RefusedResource(E.UNKNOWN_TOPIC_OR_PARTITION.code, None)
        return topic_config_entries(broker, topic)
    if rtype == RESOURCE_BROKER:
        if rname == "":
            return []            # no dynamic cluster-wide defaults exist here
        if not _JAVA_INT.fullmatch(rname) or not -2**31 <= int(rname) < 2**31:
            raise _RefusedResource(E.INVALID_REQUEST.code, f"Broker id must be an integer, but it is: {rname}")
        if int(rname) != broker.node_id:
            raise _RefusedResource(E.INVALID_REQUEST.code, f"Unexpected broker id, expected {broker.node_id} "
                                                           f"or empty string, but received {rname}")
        return broker_config_entries(broker)
    raise _RefusedResource(E.INVALID_REQUEST.code,
                           f"Unsupported resource type: {RESOURCE_TYPE_NAMES.get(rtype, 'UNKNOWN')}")


@handles("DescribeConfigs", 1, 4)
def describe_configs(ctx, request):
    response = ctx.response()
    rcls = type(response).DescribeConfigsResult
    ccls = rcls.DescribeConfigsResourceResult
    scls = ccls.DescribeConfigsSynonym
    with_docs = ctx.api_version >= 3 and request.include_documentation
    seen = set()
    denied = []
    refusals: dict[tuple[int, str], object] = {}       # each resource is asked once, however often it is named
    for resource in request.resources:
        named = (resource.resource_type, resource.resource_name)
        if named not in refusals:
            refusals[named] = config_refusal(ctx, Operation.DESCRIBE_CONFIGS, *named)
        error = refusals[named]
        if error is not None:
            denied.append(rcls(error_code=error.code, error_message=AUTHORIZATION_MESSAGES[error.code],
                                resource_type=resource.resource_type, resource_name=resource.resource_name,
                                configs=[]))
            continue
        result = rcls(error_code=0, error_message=None, resource_type=resource.resource_type,
                      resource_name=resource.resource_name)
        response.results.append(result)
        key = (resource.resource_type, resource.resource_name,
               frozenset(resource.configuration_keys) if resource.configuration_keys else None)
        if key in seen:
            result.error_code, result.error_message = E.INVALID_REQUEST.code, DUPLICATE
            continue
        seen.add(key)
        try:
            entries = _entries_for(ctx.broker, resource)
        except _RefusedResource as refused:
            result.error_code, result.error_message = refused.code, refused.message
            continue
        keys = resource.configuration_keys
        if keys:
            wanted = set(keys)
            entries = [e for e in entries if e.name in wanted]
        for e in entries:
            result.configs.append(ccls(
                name=e.name, value=e.value, read_only=e.read_only, config_source=e.source,
                is_default=e.source == SOURCE_DEFAULT_CONFIG, is_sensitive=e.config_type == TYPE_PASSWORD,
                synonyms=[scls(name=n, value=v, source=s) for n, v, s in e.synonyms]
                if request.include_synonyms else [],
                config_type=e.config_type, documentation=e.documentation if with_docs else None))
    response.results += denied
    return response
