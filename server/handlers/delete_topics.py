"""DeleteTopics: delete topics by name (v1-5) or by name or topic id (v6), removing their logs.

Behaviour / version notes:
- v1-6.  timeout_ms is irrelevant: deletion is immediate.
- delete.topic.enable false → every topic answers INVALID_REQUEST (v1-2) or
  TOPIC_DELETION_DISABLED (v3+), as Kafka.
- v6 entries name a topic either by name (topic id zero) or by id (name null): both → INVALID_REQUEST
  "You may not specify both topic name and topic id.", neither → INVALID_REQUEST.  An unknown name
  → UNKNOWN_TOPIC_OR_PARTITION, an unknown id → UNKNOWN_TOPIC_ID (name null).
- A name or id given more than once → one INVALID_REQUEST "Duplicate topic name."/"Duplicate topic
  id." result and no deletion; a name whose topic's id is also given → INVALID_REQUEST for the name
  and nothing deleted (Kafka's rules).
- Results carry the name and (v6) the topic id; they come in request order (Kafka shuffles them on
  purpose, so any order is what Kafka's clients expect).  error_message is v5+.
- ACLs (as Kafka's controller): Delete on the cluster allows every topic.  Otherwise, after the
  checks above: a topic named by id (known id; an unknown one is UNKNOWN_TOPIC_ID first) without
  Delete on it → TOPIC_AUTHORIZATION_FAILED, its name shown only if the principal may Describe it;
  a topic named by name that the principal may not Describe → TOPIC_AUTHORIZATION_FAILED whether
  it exists or not (its existence is not revealed), one it may Describe but that does not exist →
  UNKNOWN_TOPIC_OR_PARTITION, one it may Describe but not Delete → TOPIC_AUTHORIZATION_FAILED.
  Refused topics are not deleted; the message (v5+) is "Topic authorization failed.".  Describe
  checks do not count as denials.
"""
from __future__ import annotations

import uuid

from trireme.server.deferred import Deferred
from trireme.server.dispatch import handles
from trireme.state.acls import CLUSTER_NAME, Operation, ResourceType
from trireme.state.topics import TopicError
from trireme.wire import error_codes as E

ZERO_UUID = uuid.UUID(int=0)
UNKNOWN_TOPIC_MESSAGE = "This server does not host this topic-partition."
UNKNOWN_TOPIC_ID_MESSAGE = "This server does not host this topic ID."
TOPIC_AUTHORIZATION_MESSAGE = "Topic authorization failed."


@handles("DeleteTopics", 1, 6)
def delete_topics(ctx, request):
    broker = ctx.broker
    version = ctx.api_version
    response = ctx.response()
    rcls = type(response).DeletableTopicResult
    if version >= 6:
        entries = [(t.name, t.topic_id) for t in request.topics]
    else:
        entries = [(name, ZERO_UUID) for name in request.topic_names]

    if not broker.config["delete.topic.enable"]:
        code = E.TOPIC_DELETION_DISABLED.code if version >= 3 else E.INVALID_REQUEST.code
        response.responses = [rcls(name=name, topic_id=topic_id, error_code=code, error_message=None)
                              for name, topic_id in entries]
        return response

    results: list[tuple[int, object]] = []           # (request position, result)

    def answer(pos, name, topic_id, code=0, message=None):
        results.append((pos, rcls(name=name, topic_id=topic_id, error_code=code, error_message=message)))

    names: dict[str, int] = {}                       # name → first position
    ids: dict[uuid.UUID, int] = {}
    dup_names: set[str] = set()
    dup_ids: set[uuid.UUID] = set()
    for pos, (name, topic_id) in enumerate(entries):
        if name is None:
            if topic_id == ZERO_UUID:
                answer(pos, None, ZERO_UUID, E.INVALID_REQUEST.code, "Neither topic name nor id were specified.")
            elif topic_id in ids:
                dup_ids.add(topic_id)
            else:
                ids[topic_id] = pos
        elif topic_id == ZERO_UUID:
            if name in names:
                dup_names.add(name)
            else:
                names[name] = pos
        else:
            answer(pos, name, topic_id, E.INVALID_REQUEST.code, "You may not specify both topic name and topic id.")
    for name in dup_names:
        answer(names.pop(name), name, ZERO_UUID, E.INVALID_REQUEST.code, "Duplicate topic name.")
    for topic_id in dup_ids:
        answer(ids.pop(topic_id), None, topic_id, E.INVALID_REQUEST.code, "Duplicate topic id.")

    every_topic = ctx.authorize(Operation.DELETE, ResourceType.CLUSTER, CLUSTER_NAME, log_if_denied=False)
    describable: dict[str, bool] = {}
    deletable: dict[str, bool] = {}

    def may(name, operation, cache, log):
        if every_topic:
            return True
        if name not in cache:
            cache[name] = ctx.authorize(operation, ResourceType.TOPIC, name, log_if_denied=log)
        return cache[name]

    doomed: dict[uuid.UUID, tuple[int, str]] = {}     # topic id → (position, name)
    for topic_id, pos in ids.items():
        topic = broker.topics.by_id(topic_id)
        if topic is None:
            answer(pos, None, topic_id, E.UNKNOWN_TOPIC_ID.code, UNKNOWN_TOPIC_ID_MESSAGE)
        elif not may(topic.name, Operation.DELETE, deletable, True):
            shown = topic.name if may(topic.name, Operation.DESCRIBE, describable, False) else None
            answer(pos, shown, topic_id, E.TOPIC_AUTHORIZATION_FAILED.code, TOPIC_AUTHORIZATION_MESSAGE)
        else:
            doomed[topic_id] = (pos, topic.name)
    for name, pos in names.items():
        topic = broker.topics.get(name)
        if not may(name, Operation.DESCRIBE, describable, False):
            answer(pos, name, ZERO_UUID, E.TOPIC_AUTHORIZATION_FAILED.code, TOPIC_AUTHORIZATION_MESSAGE)
        elif topic is None:
            answer(pos, name, ZERO_UUID, E.UNKNOWN_TOPIC_OR_PARTITION.code, UNKNOWN_TOPIC_MESSAGE)
        elif not may(name, Operation.DELETE, deletable, True):
            answer(pos, name, ZERO_UUID, E.TOPIC_AUTHORIZATION_FAILED.code, TOPIC_AUTHORIZATION_MESSAGE)
        elif topic.topic_id in doomed or topic.topic_id in dup_ids:
            dup_ids.add(topic.topic_id)
            doomed.pop(topic.topic_id, None)
            answer(pos, name, topic.topic_id, E.INVALID_REQUEST.code,
                   "The provided topic name maps to an ID that was already supplied.")
        else:
            doomed[topic.topic_id] = (pos, name)

    async def delete():
        for topic_id, (pos, name) in doomed.items():
            try:
                await broker.delete_topic(name)
            except TopicError as refused:   # the metadata log could not be written (disk full): the topic stays
                answer(pos, name, topic_id, refused.code, refused.message)
                continue
            answer(pos, name, topic_id)
        response.responses = [result for _, result in sorted(results, key=lambda item: item[0])]
        return response
    return Deferred(delete)
