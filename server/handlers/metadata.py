"""Metadata: the one broker, its topics (with topic ids) and their partitions, auto-creating on request.

Behaviour / version notes:
- v0-13.  Every partition is led by this node, with replicas and ISR = [this node].
- Null topics (v1+) means all topics; an empty list means none.  v10+ may name topics by id;
  an unknown id gets UNKNOWN_TOPIC_ID.
- Unknown names are created when auto.create.topics.enable and AllowAutoTopicCreation (v4+;
  always allowed before v4) are both true; creation is immediate, so the same response already
  lists the new partitions (Kafka answers LEADER_NOT_AVAILABLE first; clients handle both).  A
  creation the storage fails (disk full) answers that topic KAFKA_STORAGE_ERROR, as Kafka's
  auto-creation passes its CreateTopics error on; nothing of the topic is kept, a retry creates it
  once space is free.
- Leader epochs come from the topic registry and never go down, also across restarts.
- The coordinators' internal topics (`__consumer_offsets`, `__transaction_state`, one partition
  each) are listed with is_internal = true, as on Kafka (aiokafka's and the Java consumer's
  exclude-internal-topics options rely on the flag); naming one never auto-creates it.  Clients
  still cannot write to them (Produce answers INVALID_TOPIC_EXCEPTION).
- Authorized operations are reported when asked for: everything is allowed for now.
- A topic named (or id given) more than once is answered once, as Kafka answers the set of the
  names: the response's size depends on the topics, not on the request's repeats.
"""
import uuid

from trireme.server.dispatch import handles
from trireme.server.listener import advertised_address
from trireme.server.handlers import first_of_each
from trireme.state.topics import TopicError, validate_topic_name
from trireme.wire import error_codes as E

ZERO_UUID = uuid.UUID(int=0)
# READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE, DESCRIBE_CONFIGS, ALTER_CONFIGS
TOPIC_OPERATIONS = sum(1 << op for op in (3, 4, 5, 6, 7, 8, 10, 11))
# CREATE, ALTER, DESCRIBE, CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE
CLUSTER_OPERATIONS = sum(1 << op for op in (5, 7, 8, 9, 10, 11, 12))


@handles("Metadata", 0, 13)
def metadata(ctx, request):
    broker = ctx.broker
    response = ctx.response()
    cls = type(response)
    host, port = advertised_address(ctx)       # of the listener the request came in on
    response.brokers = [cls.MetadataResponseBroker(node_id=broker.node_id, host=host, port=port, rack=None)]
    response.cluster_id = broker.cluster_id
    response.controller_id = broker.node_id
    if ctx.api_version <= 10 and request.include_cluster_authorized_operations:
        response.cluster_authorized_operations = CLUSTER_OPERATIONS
    auto_create = ctx.api_version < 4 or request.allow_auto_topic_creation
    if request.topics is None or (ctx.api_version == 0 and not request.topics):
        topics = [(t.name, t) for t in broker.described_topics()]
        requested = None
    else:
        # as Kafka makes a set of them: one big topic named a million times is listed once
        requested = first_of_each(request.topics, lambda t: t.name if t.name is not None else t.topic_id)
        topics = []
    for entry in requested or ():
        if entry.name is None and entry.topic_id != ZERO_UUID:
            topic = broker.described_topic(topic_id=entry.topic_id)
            if topic is None:
                topics.append((None, E.UNKNOWN_TOPIC_ID.code, entry.topic_id))
                continue
            topics.append((topic.name, topic))
            continue
        name = entry.name
        topic = broker.described_topic(name)
        if topic is None:
            if validate_topic_name(name) is not None:
                topics.append((name, E.INVALID_TOPIC_EXCEPTION.code, ZERO_UUID))
                continue
            if auto_create:
                try:
                    topic = broker.auto_create(name)
                except TopicError as failed:            # the disk is full: retriable, the client asks again
                    topics.append((name, failed.code, ZERO_UUID))
                    continue
            if topic is None:
                topics.append((name, E.UNKNOWN_TOPIC_OR_PARTITION.code, ZERO_UUID))
                continue
        topics.append((name, topic))
    out = []
    for item in topics:
        if len(item) == 3:
            name, error, topic_id = item
            out.append(cls.MetadataResponseTopic(error_code=error, name=name, topic_id=topic_id))
            continue
        name, topic = item
        t = cls.MetadataResponseTopic(error_code=0, name=topic.name, topic_id=topic.topic_id,
                                      is_internal=topic.is_internal)
        t.partitions = [cls.MetadataResponseTopic.MetadataResponsePartition(
            error_code=0, partition_index=i, leader_id=broker.node_id, leader_epoch=topic.leader_epoch,
            replica_nodes=[broker.node_id], isr_nodes=[broker.node_id], offline_replicas=[])
            for i in range(topic.partitions)]
        if ctx.api_version >= 8 and request.include_topic_authorized_operations:
            t.topic_authorized_operations = TOPIC_OPERATIONS
        out.append(t)
    response.topics = out
    return response
