"""IncrementalAlterConfigs: set, delete, append to or subtract from topic configs.

Behaviour / version notes:
- v0-1.  Each resource succeeds or fails as a whole; results come in request order.
- TOPIC (2): operations SET (0), DELETE (1), APPEND (2), SUBTRACT (3; list configs only) applied
  with the topic registry's rules; an unknown config, an invalid value or APPEND/SUBTRACT on a
  non-list config → INVALID_CONFIG with the reason; an unknown operation → INVALID_REQUEST.
  Changes to retention.* and segment.bytes take effect on the partition logs at once.  An
  invalid topic name → INVALID_TOPIC_EXCEPTION; an unknown topic → UNKNOWN_TOPIC_OR_PARTITION.
- As Kafka checks before anything else: a resource named twice → INVALID_REQUEST "Each resource
  must appear at most once." for both; a config named twice in one resource → INVALID_REQUEST
  "Error due to duplicate config keys"; a null value for anything but DELETE → INVALID_REQUEST
  "Null value not supported for : <names>".
- BROKER (4), named by this node's id: Kafka's per-listener dynamic SSL configs
  ``listener.name.<listener>.<config>`` for the key material (tls.RECONFIGURABLE: keystore
  location/key/chain/password, truststore location/certificates) of an SSL or SASL_SSL listener:
  the listener's new SSL context is built and checked first (files readable, key and certificate
  matching, the same subject unless ssl.allow.dn.changes) — a problem → INVALID_REQUEST "Invalid
  config value for resource ..." with the reason, as a Kafka broker answers, and the old context
  stays; else new connections use it and open ones keep theirs.  DELETE goes back to the static
  setting; APPEND/SUBTRACT → INVALID_CONFIG.  The cluster-wide default (empty name) → INVALID_REQUEST
  "Cannot update these configs at default cluster level, broker id must be specified"; an SSL config
  without the listener prefix → INVALID_REQUEST (Kafka: "only per-listener"); every other broker
  config → INVALID_REQUEST — they are static here (read from the config file at start).  Other
  resource types → INVALID_REQUEST.
- validate_only: every check, the same answer, nothing changed.
- The legacy AlterConfigs (alter_configs.py) goes through the same checks (alter_resources).
- ACLs (as Kafka's broker and controller), per resource, after the duplicate and null checks above:
  AlterConfigs on the cluster for BROKER, BROKER_LOGGER and CLIENT_METRICS (else
  CLUSTER_AUTHORIZATION_FAILED), on the topic for TOPIC (else TOPIC_AUTHORIZATION_FAILED, whether it
  exists or not), on the group for GROUP (else GROUP_AUTHORIZATION_FAILED), each with Kafka's
  message for the code (BROKER_LOGGER: null, as Kafka's broker answers it); a refused resource is
  not changed.  Legacy AlterConfigs does not check BROKER_LOGGER: Kafka refuses that type with
  INVALID_REQUEST first.
"""
from __future__ import annotations

import logging

from trireme.server.config import LISTENER_PREFIX, ConfigError
from trireme.server.deferred import Deferred
from trireme.server.dispatch import handles
from trireme.server.tls import RECONFIGURABLE
from trireme.state.acls import Operation
from trireme.state.topics import TopicError, validate_topic_name
from trireme.wire import error_codes as E

from .describe_configs import (AUTHORIZATION_MESSAGES, RESOURCE_BROKER, RESOURCE_TOPIC, RESOURCE_TYPE_NAMES,
                               config_refusal)

RESOURCE_BROKER_LOGGER = 8

OP_SET = 0
OP_DELETE = 1

log = logging.getLogger("trireme.config")


async def _alter(broker, resource, ops, validate_only: bool, whole_set: bool, ctx) -> None:
    """Check one resource's ``(name, op, value)`` operations as Kafka does, then apply them (or only check).
    ``whole_set`` (AlterConfigs): the configs given replace the topic's overrides, the others are deleted."""
    names = [name for name, _, _ in ops]
    if len(set(names)) != len(names):
        raise TopicError(E.INVALID_REQUEST.code, "Error due to duplicate config keys")
    nulls = [name for name, op, value in ops if op != OP_DELETE and value is None]
    if nulls:
        raise TopicError(E.INVALID_REQUEST.code, "Null value not supported for : " + ", ".join(nulls))
    logger = resource.resource_type == RESOURCE_BROKER_LOGGER
    refused = not (logger and whole_set) and \
        config_refusal(ctx, Operation.ALTER_CONFIGS, resource.resource_type, resource.resource_name)
    if refused:          # BROKER_LOGGER is refused by the broker itself, with no message (Kafka's default text)
        raise TopicError(refused.code, None if logger else AUTHORIZATION_MESSAGES[refused.code])
    if resource.resource_type == RESOURCE_BROKER:
        _alter_listener_ssl(broker, resource.resource_name, ops, validate_only, whole_set)
        return
    if resource.resource_type != RESOURCE_TOPIC:
        kind = RESOURCE_TYPE_NAMES.get(resource.resource_type, "UNKNOWN")
        raise TopicError(E.INVALID_REQUEST.code, f"Unsupported resource type: {kind}")
    name = resource.resource_name
    problem = validate_topic_name(name)
    if problem is not None:
        raise TopicError(E.INVALID_TOPIC_EXCEPTION.code, problem)
    if broker.topics.get(name) is None:
        raise TopicError(E.UNKNOWN_TOPIC_OR_PARTITION.code, f"The topic '{name}' does not exist.")
    await broker.alter_topic_configs(name, ops, validate_only=validate_only, whole_set=whole_set)


def _alter_listener_ssl(broker, resource_name: str, ops, validate_only: bool, whole_set: bool) -> None:
    """Kafka's dynamic per-listener SSL configs on the BROKER resource: certificates reloaded without a restart."""
    changes: dict[str, dict[str, str | None]] = {}
    static = []
    for name, op, value in ops:
        listener, _, config = name[len(LISTENER_PREFIX):].partition(".") if name.startswith(LISTENER_PREFIX) \
            else ("", "", name)
        if not listener or config not in RECONFIGURABLE:
            static.append(name)
            continue
        if op not in (OP_SET, OP_DELETE):
            raise TopicError(E.INVALID_CONFIG.code, f"Config value append/subtract is not allowed for config {name} "
                                                    f"as it is not a list")
        changes.setdefault(listener.upper(), {})[config] = value if op == OP_SET else None
    if static or not ops:
        unprefixed = [n for n in static if n in RECONFIGURABLE]
        if unprefixed:
            raise TopicError(E.INVALID_REQUEST.code, f"These security configs can be dynamically updated only "
                                                     f"per-listener using the listener prefix: {', '.join(unprefixed)}")
        raise TopicError(E.INVALID_REQUEST.code, "Broker configs are static here: set them in the broker's "
                                                 "config file and restart it (only listener.name.<listener>.ssl.* "
                                                 "key material can change at runtime).")
    if resource_name == "":
        raise TopicError(E.INVALID_REQUEST.code, f"Cannot update these configs at default cluster level, broker id "
                                                 f"must be specified: {', '.join(n for n, _, _ in ops)}")
    if resource_name != str(broker.node_id):
        raise TopicError(E.INVALID_REQUEST.code, f"Unexpected broker id, expected {broker.node_id} or empty string, "
                                                 f"but received {resource_name}")
    endpoints = getattr(broker, "endpoints", {})
    contexts = []
    for listener, settings in changes.items():
        endpoint = endpoints.get(listener)
        if endpoint is None or endpoint.tls is None:
            raise TopicError(E.INVALID_REQUEST.code, f"Listener {listener} is not an SSL or SASL_SSL listener of "
                                                     f"this broker")
        tls = endpoint.tls
        overrides = {} if whole_set else dict(tls.overrides)
        overrides.update(settings)
        if whole_set:       # AlterConfigs: the settings given are the whole dynamic set, the others go back
            overrides.update({name: None for name in tls.overrides if name not in settings})
        try:
            tls.check(overrides)
        except ConfigError as e:
            raise TopicError(E.INVALID_REQUEST.code, f"Invalid config value for resource "
                                                     f"ConfigResource(type=BROKER, name='{resource_name}'): "
                                                     f"listener {listener}: {e}") from None
        contexts.append((tls, overrides))
    if not validate_only:
        for tls, overrides in contexts:
            tls.reload(overrides)
            log.info("listener %s: SSL context reloaded (%s)", tls.listener, ", ".join(sorted(tls.overrides)) or
                     "static settings")


def alter_resources(ctx, request, ops_of, whole_set: bool = False) -> object:
    """The answer to IncrementalAlterConfigs or AlterConfigs (``whole_set``): each resource checked and changed
    on its own, in request order; ``ops_of(resource)`` gives its ``(name, op, value)`` operations."""
    response = ctx.response()
    rcls = type(response).AlterConfigsResourceResponse
    seen: dict[tuple[int, str], int] = {}
    for r in request.resources:
        key = (r.resource_type, r.resource_name)
        seen[key] = seen.get(key, 0) + 1

    async def alter():
        for r in request.resources:
            result = rcls(error_code=0, error_message=None, resource_type=r.resource_type,
                          resource_name=r.resource_name)
            response.responses.append(result)
            if seen[(r.resource_type, r.resource_name)] > 1:
                result.error_code = E.INVALID_REQUEST.code
                result.error_message = "Each resource must appear at most once."
                continue
            try:
                await _alter(ctx.broker, r, ops_of(r), request.validate_only, whole_set, ctx)
            except TopicError as refused:
                result.error_code, result.error_message = refused.code, refused.message
        return response
    return Deferred(alter)


@handles("IncrementalAlterConfigs", 0, 1)
def incremental_alter_configs(ctx, request):
    return alter_resources(ctx, request, lambda r: [(c.name, c.config_operation, c.value) for c in r.configs])
