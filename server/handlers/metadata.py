"""Metadata: the live brokers, the topics (with topic ids) and who leads their partitions, auto-creating on request.

Behaviour / version notes:
- v0-13.  Brokers and leaders come from ``broker.cluster`` (server/cluster.py, through
  server/routing.py): every live broker at its advertised address on the listener the request
  came in on (one without that listener is left out, as Kafka does), with its rack; the
  controller id is the cluster's.  Each partition: its leader and leader epoch, replicas and ISR
  the brokers the cluster lists for it (leader first), no offline replicas.  No leader →
  LEADER_NOT_AVAILABLE with leader -1 (a leader that is not live keeps its epoch and replicas;
  one live but not on this listener → LISTENER_NOT_FOUND), as Kafka's metadata cache answers.
  With the local engine (LocalCluster) this node leads every partition, replicas and ISR = [it].
- Null topics (v1+) means all topics; an empty list means none.  v10+ may name topics by id;
  an unknown id gets UNKNOWN_TOPIC_ID.
- Unknown names are created when auto.create.topics.enable and AllowAutoTopicCreation (v4+;
  always allowed before v4) are both true; creation is immediate, so the same response already
  lists the new partitions (Kafka answers LEADER_NOT_AVAILABLE first; clients handle both).  A
  creation the storage fails (disk full) answers that topic KAFKA_STORAGE_ERROR, as Kafka's
  auto-creation passes its CreateTopics error on; nothing of the topic is kept, a retry creates it
  once space is free.  On a broker that is not the controller (a cluster), the controller creates it:
  that topic is answered LEADER_NOT_AVAILABLE and CreateTopics goes to the controller in the background
  with the client's principal in an Envelope (server/forwarding.py), as Kafka's AutoTopicCreationManager.
- Leader epochs come from the topic registry and never go down, also across restarts.
- The coordinators' internal topics (`__consumer_offsets`, `__transaction_state`, one partition
  each) are listed with is_internal = true, as on Kafka (aiokafka's and the Java consumer's
  exclude-internal-topics options rely on the flag); naming one never auto-creates it.  Clients
  still cannot write to them (Produce answers INVALID_TOPIC_EXCEPTION).
- Authorization (Kafka's handleTopicMetadataRequest): Describe on each topic.  All topics (null, or
  an empty list in v0): the topics the principal may not describe are left out (no denial counted).
  Named: such a topic answers TOPIC_AUTHORIZATION_FAILED with no partitions and a zero topic id,
  whether or not it exists; named by id, the answer keeps the id and has no name (UNKNOWN_TOPIC_ID
  for an id naming no topic comes first).  Auto-creation (when it applies) also needs Create on the
  cluster (asked once) or else on the topic; without it TOPIC_AUTHORIZATION_FAILED, nothing created.
- Authorized operations, when asked for: the cluster's (v8-10) are Kafka's bit set of the supported
  cluster operations the principal may do when it may Describe the cluster, else 0; each topic's
  (v8+) are the bit set of its supported operations, for every topic answered except the refused
  ones and unknown ids (which keep the schema's default).  Without an authorizer: every supported
  operation.
- A topic named (or id given) more than once is answered once, as Kafka answers the set of the
  names: the response's size depends on the topics, not on the request's repeats.
"""
import uuid

from trireme.server import forwarding
from trireme.server.deferred import Deferred
from trireme.server.dispatch import API_KEYS, handles
from trireme.server.authorized_operations import SUPPORTED_OPERATIONS, authorized_operations
from trireme.server.handlers import first_of_each
from trireme.server.routing import DescribedCluster
from trireme.state.acls import CLUSTER_NAME, Operation, ResourceType
from trireme.state.topics import TopicError, validate_topic_name
from trireme.wire import error_codes as E

ZERO_UUID = uuid.UUID(int=0)
CREATE_TOPICS = API_KEYS["CreateTopics"]
# Every supported operation: what the bit sets are without an authorizer (or with every permission).
TOPIC_OPERATIONS = sum(1 << op for op in SUPPORTED_OPERATIONS[ResourceType.TOPIC])
CLUSTER_OPERATIONS = sum(1 << op for op in SUPPORTED_OPERATIONS[ResourceType.CLUSTER])


@handles("Metadata", 0, 13)
def metadata(ctx, request):
    broker = ctx.broker
    version = ctx.api_version
    response = ctx.response()
    cls = type(response)
    cluster = DescribedCluster(ctx)             # the brokers at their addresses on the request's listener
    response.brokers = [cls.MetadataResponseBroker(node_id=b.node_id, host=b.host, port=b.port, rack=b.rack)
                        for b in cluster.brokers]
    response.cluster_id = broker.cluster_id
    response.controller_id = broker.cluster.controller_id
    if 8 <= version <= 10 and request.include_cluster_authorized_operations:
        response.cluster_authorized_operations = (
            authorized_operations(ctx, ResourceType.CLUSTER, CLUSTER_NAME)
            if ctx.authorize(Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME) else 0)
    auto_create = ctx.api_version < 4 or request.allow_auto_topic_creation
    may_create = _CreatePermission(ctx)
    # (name, topic or None, error, topic id, whether its authorized operations are reported)
    topics: list[tuple[str | None, object, int, uuid.UUID, bool]] = []
    if request.topics is None or (version == 0 and not request.topics):
        # All topics: those the principal may not describe are left out, no denial reported (Kafka's logIfDenied).
        topics = [(t.name, t, 0, t.topic_id, True) for t in broker.described_topics()
                  if ctx.authorize(Operation.DESCRIBE, ResourceType.TOPIC, t.name, log_if_denied=False)]
        requested = ()
    else:
        # as Kafka makes a set of them: one big topic named a million times is listed once
        requested = first_of_each(request.topics, lambda t: t.name if t.name is not None else t.topic_id)
    for entry in requested:
        if entry.name is None and entry.topic_id != ZERO_UUID:
            topic = broker.described_topic(topic_id=entry.topic_id)
            if topic is None:
                topics.append((None, None, E.UNKNOWN_TOPIC_ID.code, entry.topic_id, False))
            elif not ctx.authorize(Operation.DESCRIBE, ResourceType.TOPIC, topic.name):
                # topic ids are not secret: the id is answered, the name is not
                topics.append((None, None, E.TOPIC_AUTHORIZATION_FAILED.code, entry.topic_id, False))
            else:
                topics.append((topic.name, topic, 0, topic.topic_id, True))
            continue
        name = entry.name
        if name is None:                                # neither a name nor an id
            topics.append((name, None, E.INVALID_TOPIC_EXCEPTION.code, ZERO_UUID, False))
            continue
        if not ctx.authorize(Operation.DESCRIBE, ResourceType.TOPIC, name):
            topics.append((name, None, E.TOPIC_AUTHORIZATION_FAILED.code, ZERO_UUID, False))
            continue
        topic = broker.described_topic(name)
        if topic is None:
            if auto_create and broker.config["auto.create.topics.enable"] and not may_create(name):
                topics.append((name, None, E.TOPIC_AUTHORIZATION_FAILED.code, ZERO_UUID, False))
                continue
            if validate_topic_name(name) is not None:
                topics.append((name, None, E.INVALID_TOPIC_EXCEPTION.code, ZERO_UUID, True))
                continue
            if auto_create and broker.config["auto.create.topics.enable"]:
                if forwarding.is_forwarded(broker, CREATE_TOPICS):
                    # the controller creates it (Kafka's AutoTopicCreationManager): the client asks again
                    broker.auto_creation.create(name, ctx)
                    topics.append((name, None, E.LEADER_NOT_AVAILABLE.code, ZERO_UUID, True))
                    continue
                topics.append((name, _AUTO_CREATE, 0, ZERO_UUID, True))
                continue
            topics.append((name, None, E.UNKNOWN_TOPIC_OR_PARTITION.code, ZERO_UUID, True))
            continue
        topics.append((name, topic, 0, topic.topic_id, True))
    creating = [i for i, entry in enumerate(topics) if entry[1] is _AUTO_CREATE]
    if not creating:
        return _answer(ctx, request, response, topics)

    async def create():
        """The topics to auto-create, each once its record is durable, then the answer."""
        for i in creating:
            name = topics[i][0]
            try:
                topic = await broker.auto_create(name)
            except TopicError as failed:                # the disk is full: retriable, the client asks again
                topics[i] = (name, None, failed.code, ZERO_UUID, True)
                continue
            topics[i] = ((name, None, E.UNKNOWN_TOPIC_OR_PARTITION.code, ZERO_UUID, True) if topic is None
                         else (name, topic, 0, topic.topic_id, True))
        return _answer(ctx, request, response, topics)
    return Deferred(create)


_AUTO_CREATE = object()         # a topic entry whose topic is auto-created before the answer


def _answer(ctx, request, response, topics):
    cls = type(response)
    cluster = DescribedCluster(ctx)
    with_operations = ctx.api_version >= 8 and request.include_topic_authorized_operations
    out = []
    for name, topic, error, topic_id, described in topics:
        t = cls.MetadataResponseTopic(error_code=error, name=name, topic_id=topic_id)
        if topic is not None:
            t.is_internal = topic.is_internal
            t.partitions = [_partition(cls.MetadataResponseTopic.MetadataResponsePartition, i,
                                       *cluster.partition(topic, i))
                            for i in range(topic.partitions)]
        if with_operations and described:
            t.topic_authorized_operations = authorized_operations(ctx, ResourceType.TOPIC, name)
        out.append(t)
    response.topics = out
    return response


def _partition(pcls, index: int, error: int, leader: int, epoch: int, replicas: list[int]):
    return pcls(error_code=error, partition_index=index, leader_id=leader, leader_epoch=epoch,
                replica_nodes=replicas, isr_nodes=list(replicas), offline_replicas=[])


class _CreatePermission:
    """Whether the principal may auto-create a topic: Create on the cluster (asked once, a denial not reported,
    as Kafka), else Create on the topic."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.on_cluster: bool | None = None

    def __call__(self, name: str) -> bool:
        if self.on_cluster is None:
            self.on_cluster = self.ctx.authorize(Operation.CREATE, ResourceType.CLUSTER, CLUSTER_NAME,
                                                 log_if_denied=False)
        return self.on_cluster or self.ctx.authorize(Operation.CREATE, ResourceType.TOPIC, name)
