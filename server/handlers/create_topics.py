"""CreateTopics: create topics (or only validate them), each with its own error code and message.

Behaviour / version notes:
- v2-7.  timeout_ms is irrelevant: creation is immediate.  Checks per topic, in Kafka's order:
  legal name (INVALID_TOPIC_EXCEPTION), not existing (TOPIC_ALREADY_EXISTS), no collision with
  an existing name differing only in '.' vs '_' (INVALID_TOPIC_EXCEPTION), no null config
  values and every config valid (INVALID_CONFIG), then the layout below.
- num_partitions -1 → num.partitions; 0 or < -1 → INVALID_PARTITIONS.  replication_factor -1 →
  default.replication.factor; it must come to at least 1 and at most the number of live brokers
  of ``broker.cluster`` (0 or < -1, or more than there are → INVALID_REPLICATION_FACTOR with
  Kafka's messages, "Unable to replicate the partition N time(s): The target replication factor
  of N cannot be reached because only M broker(s) are registered."; with the local engine M = 1).
- Manual assignments, as Kafka's KRaft controller: num_partitions and replication_factor must
  both be -1 (else INVALID_REQUEST); each partition lists live brokers, each once, every
  partition as many, and the partition indexes must be 0..n-1 without repeats.  Anything else is
  Kafka's INVALID_REPLICA_ASSIGNMENT with Kafka's message (a broker id that is not live is "no
  such broker is registered").
- The topic registry keeps no replication factor (nor replica lists): the cluster decides each
  partition's replicas (server/cluster.py).  The replication factor is checked and answered, not
  recorded.
- A name given more than once → one INVALID_REQUEST "Duplicate topic name." result for it, after
  the other results, and nothing is created for it (as Kafka).
- validate_only: every check, the same answer (a fresh topic id included), nothing created.
- v5+ results carry num_partitions, replication_factor (the one asked for, the default's, or the
  manual assignment's replicas per partition, as Kafka) and every topic config, sorted by name,
  with value, source (see describe_configs.py), read_only false and is_sensitive false; v7+ the
  topic id.  Failed topics answer topic id zero, -1 counts and no configs.
- ACLs (as Kafka's controller): Create on the cluster allows every topic; otherwise Create on each
  topic, else TOPIC_AUTHORIZATION_FAILED "Authorization failed." for it (after every other result,
  before any check of the topic itself) and it is not created.  A created topic's configs, counts
  and topic_config_error_code NONE need DescribeConfigs on the topic; without it the result has no
  configs, counts -1 and topic_config_error_code TOPIC_AUTHORIZATION_FAILED (the topic id is still
  there).  Neither check of the cluster nor of DescribeConfigs counts as a denial.
"""
from __future__ import annotations

from trireme.server.deferred import Deferred
from trireme.server.dispatch import handles
from trireme.state.acls import CLUSTER_NAME, Operation, ResourceType
from trireme.state.topics import TopicError, validate_config, validate_topic_name
from trireme.wire import error_codes as E

from .describe_configs import topic_config_entries


def assignment_problem(broker_ids, live: set[int], replication_factor: int | None) -> str | None:
    """Why one partition's manual replica list is refused (Kafka's INVALID_REPLICA_ASSIGNMENT message), or None.
    ``live``: the node ids of the live brokers, which an assignment may name."""
    if not broker_ids:
        return "The manual partition assignment includes an empty replica list."
    previous = None
    for broker_id in sorted(broker_ids):
        if broker_id not in live:
            return (f"The manual partition assignment includes broker {broker_id}, but no such broker "
                    "is registered.")
        if broker_id == previous:
            return f"The manual partition assignment includes the broker {broker_id} more than once."
        previous = broker_id
    if replication_factor is not None and len(broker_ids) != replication_factor:
        return (f"The manual partition assignment includes a partition with {len(broker_ids)} replica(s), "
                "but this is not consistent with previous partitions, which have "
                f"{replication_factor} replica(s).")
    return None


def live_brokers(broker) -> set[int]:
    """The node ids of the cluster's live brokers: the ones a topic's replicas may be placed on."""
    return {b.node_id for b in broker.cluster.brokers()}


def _layout(broker, t) -> tuple[int, int]:
    """(partitions, replication factor) to create with; raises TopicError when the layout is refused."""
    if t.assignments:
        live = live_brokers(broker)
        if t.replication_factor != -1:
            raise TopicError(E.INVALID_REQUEST.code, "A manual partition assignment was specified, but "
                                                     "replication factor was not set to -1.")
        if t.num_partitions != -1:
            raise TopicError(E.INVALID_REQUEST.code, "A manual partition assignment was specified, but "
                                                     "numPartitions was not set to -1.")
        seen: set[int] = set()
        replicas = None
        for a in t.assignments:
            if a.partition_index in seen:
                raise TopicError(E.INVALID_REPLICA_ASSIGNMENT.code,
                                 f"Found multiple manual partition assignments for partition {a.partition_index}")
            problem = assignment_problem(a.broker_ids, live, replicas)
            if problem is not None:
                raise TopicError(E.INVALID_REPLICA_ASSIGNMENT.code, problem)
            replicas = len(a.broker_ids)
            seen.add(a.partition_index)
        if seen != set(range(len(seen))):
            raise TopicError(E.INVALID_REPLICA_ASSIGNMENT.code,
                             "partitions should be a consecutive 0-based integer sequence")
        return len(seen), replicas
    if t.replication_factor < -1 or t.replication_factor == 0:
        raise TopicError(E.INVALID_REPLICATION_FACTOR.code,
                         "Replication factor must be larger than 0, or -1 to use the default value.")
    if t.num_partitions < -1 or t.num_partitions == 0:
        raise TopicError(E.INVALID_PARTITIONS.code, "Number of partitions was set to an invalid non-positive value.")
    rf = broker.config["default.replication.factor"] if t.replication_factor == -1 else t.replication_factor
    registered = len(broker.cluster.brokers())
    if rf <= 0 or rf > registered:
        reason = ("Replication factor must be larger than 0." if rf <= 0 else
                  f"The target replication factor of {rf} cannot be reached because only {registered} broker(s) "
                  "are registered.")
        raise TopicError(E.INVALID_REPLICATION_FACTOR.code, f"Unable to replicate the partition {rf} time(s): {reason}")
    return broker.config["num.partitions"] if t.num_partitions == -1 else t.num_partitions, rf


async def _create(broker, t, validate_only: bool):
    name = t.name
    problem = validate_topic_name(name)
    if problem is not None:
        raise TopicError(E.INVALID_TOPIC_EXCEPTION.code, problem)
    if name in broker.topics:
        raise TopicError(E.TOPIC_ALREADY_EXISTS.code, f"Topic '{name}' already exists.")
    key = name.replace(".", "_")
    for other in broker.topics.all():
        if other.name.replace(".", "_") == key:
            raise TopicError(E.INVALID_TOPIC_EXCEPTION.code, f"Topic '{name}' collides with existing topic: {other.name}")
    nulls = [c.name for c in t.configs if c.value is None]
    if nulls:
        raise TopicError(E.INVALID_CONFIG.code, "Null value not supported for topic configs: " + ",".join(nulls))
    configs = {c.name: c.value for c in t.configs}
    for config_name, value in configs.items():
        problem = validate_config(config_name, value)
        if problem is not None:
            raise TopicError(E.INVALID_CONFIG.code, problem)
    partitions, replication_factor = _layout(broker, t)
    return await broker.create_topic(name, partitions, configs, validate_only=validate_only,
                                     replication_factor=replication_factor), replication_factor


@handles("CreateTopics", 2, 7)
def create_topics(ctx, request):
    broker = ctx.broker
    response = ctx.response()
    rcls = type(response).CreatableTopicResult
    ccls = rcls.CreatableTopicConfigs
    counts: dict[str, int] = {}
    for t in request.topics:
        counts[t.name] = counts.get(t.name, 0) + 1
    unique = [name for name, count in counts.items() if count == 1]
    if ctx.authorize(Operation.CREATE, ResourceType.CLUSTER, CLUSTER_NAME, log_if_denied=False):
        creatable = set(unique)
    else:
        creatable = {name for name in unique if ctx.authorize(Operation.CREATE, ResourceType.TOPIC, name)}
    describable = {name for name in unique
                   if ctx.authorize(Operation.DESCRIBE_CONFIGS, ResourceType.TOPIC, name, log_if_denied=False)}

    async def create():
        for t in request.topics:
            if t.name not in creatable:
                continue
            try:
                topic, replication_factor = await _create(broker, t, request.validate_only)
            except TopicError as refused:
                response.topics.append(rcls(name=t.name, error_code=refused.code, error_message=refused.message))
                continue
            if t.name not in describable:
                response.topics.append(rcls(name=t.name, topic_id=topic.topic_id, error_code=0, error_message=None,
                                            topic_config_error_code=E.TOPIC_AUTHORIZATION_FAILED.code,
                                            num_partitions=-1, replication_factor=-1))
                continue
            result = rcls(name=t.name, topic_id=topic.topic_id, error_code=0, error_message=None,
                          topic_config_error_code=0, num_partitions=topic.partitions,
                          replication_factor=replication_factor)
            result.configs = [ccls(name=e.name, value=e.value, read_only=False, config_source=e.source,
                                   is_sensitive=False) for e in topic_config_entries(broker, topic)]
            response.topics.append(result)
        for name, count in counts.items():
            if count > 1:
                response.topics.append(rcls(name=name, error_code=E.INVALID_REQUEST.code,
                                            error_message="Duplicate topic name."))
        for name in unique:
            if name not in creatable:
                response.topics.append(rcls(name=name, error_code=E.TOPIC_AUTHORIZATION_FAILED.code,
                                            error_message="Authorization failed."))
        return response
    return Deferred(create)
