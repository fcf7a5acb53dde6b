"""AlterConfigs: the legacy whole-set config change (kafka-python's admin alter_configs, older tools).

Behaviour / version notes:
- v0-2, as Kafka 4 brokers list it.  Each resource succeeds or fails as a whole; results in request order.
- TOPIC (2): the configs given become the topic's whole set of overrides: each is set, and every
  override not named reverts to its default (Kafka's legacy semantics, unlike IncrementalAlterConfigs).
  Validated exactly as IncrementalAlterConfigs (the same code, incremental_alter_configs.py): a resource
  named twice → INVALID_REQUEST for both, a config named twice → INVALID_REQUEST, a null value →
  INVALID_REQUEST "Null value not supported for : <names>", an unknown config or invalid value →
  INVALID_CONFIG, an invalid topic name → INVALID_TOPIC_EXCEPTION, an unknown topic →
  UNKNOWN_TOPIC_OR_PARTITION.
- BROKER (4): the per-listener dynamic SSL configs as IncrementalAlterConfigs takes them (the configs
  given are the listener's whole dynamic set); other broker configs are static here → INVALID_REQUEST;
  other resource types → INVALID_REQUEST.
- validate_only: every check, the same answer, nothing changed.
- ACLs: AlterConfigs on the cluster (BROKER, BROKER_LOGGER, CLIENT_METRICS), the topic or the group,
  after the duplicate and null checks, exactly as IncrementalAlterConfigs (see there).
"""
from __future__ import annotations

from trireme.server.dispatch import handles

from .incremental_alter_configs import OP_SET, alter_resources


@handles("AlterConfigs", 0, 2)
def alter_configs(ctx, request):
    return alter_resources(ctx, request, lambda r: [(c.name, OP_SET, c.value) for c in r.configs], whole_set=True)
