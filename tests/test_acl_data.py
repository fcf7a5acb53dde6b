"""What the data and transaction APIs check with an authorizer (issue 21): Kafka 4's KafkaApis checks, its error codes, per partition where Kafka answers per partition, and nothing changed when refused.

The matrix (tests/acl_matrix.py) runs each case once without each permission it needs and once with all of them,
on a fresh broker whose Security is a stand-in allowing exactly the grants given.
"""
from __future__ import annotations

import pytest

from acl_matrix import (PRINCIPAL, Case, Changes, broker_state, call_as, call_fast, cluster, context, error_codes, grant,
                        group, make_broker, only, run_case, settled, succeeded, topic, txn)
from broker_runner import run_with_broker
from trireme.server.dispatch import CloseConnection
from trireme.server.deferred import Deferred
from trireme.server.dispatch import API_KEYS, HANDLERS
from trireme.state.acls import Operation, ResourceType
from trireme.wire import error_codes as E
from trireme.wire import records
from trireme.wire.codec import message

READ, WRITE, CREATE, DELETE, DESCRIBE = Operation.READ, Operation.WRITE, Operation.CREATE, Operation.DELETE, \
    Operation.DESCRIBE
NONE = E.NONE.code
TOPIC_DENIED = E.TOPIC_AUTHORIZATION_FAILED.code
GROUP_DENIED = E.GROUP_AUTHORIZATION_FAILED.code
CLUSTER_DENIED = E.CLUSTER_AUTHORIZATION_FAILED.code
TXN_DENIED = E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED.code
TID = "tx-1"


def req(api):
    return message(api + "Request").cls


PR = req("Produce")
IP = req("InitProducerId")
AP = req("AddPartitionsToTxn")


all_none = succeeded


def by_missing(codes: dict):
    """A refusal check by the grant missing: its resource type's code everywhere (``codes[resource type]``)."""
    def check(response, missing):
        only(codes[missing.resource_type])(response, missing)
    return check


# --- set-up ----------------------------------------------------------------------------------

async def orders(broker):
    await broker.create_topic("orders", 2)
    return None


async def transactional_producer(broker, *, add=True):
    """An initialized transactional producer (TID) with, when ``add``, orders-0 and orders-1 in its transaction."""
    await broker.create_topic("orders", 2)
    init = await broker.local_peer.call("InitProducerId", 4, IP(transactional_id=TID, transaction_timeout_ms=60000,
                                                                  producer_id=-1, producer_epoch=-1))
    assert init.error_code == NONE
    if add:
        added = await broker.local_peer.call("AddPartitionsToTxn", 3, AP(
            v3_and_below_transactional_id=TID, v3_and_below_producer_id=init.producer_id,
            v3_and_below_producer_epoch=init.producer_epoch, v3_and_below_topics=[
                AP.AddPartitionsToTxnTopic(name="orders", partitions=[0, 1])]))
        assert set(error_codes(added)) == {NONE}
    return init.producer_id, init.producer_epoch


# --- Produce ---------------------------------------------------------------------------------

def batch(**kw) -> bytes:
    return bytes(records.build_batch([(b"k", b"v")], **kw))


def produce_request(topics, *, tid=None, version=9, broker=None, **batch_kw):
    """A Produce request writing one batch to each (topic, partition) in ``topics`` ({name: [index, ...]})."""
    def topic_data(name, indexes):
        topic_id = broker.described_topic(name).topic_id if version >= 13 else None
        return PR.TopicProduceData(name=name if version < 13 else None, topic_id=topic_id, partition_data=[
            PR.TopicProduceData.PartitionProduceData(index=i, records=batch(**batch_kw)) for i in indexes])
    return PR(transactional_id=tid, acks=-1, timeout_ms=1000,
              topic_data=[topic_data(name, indexes) for name, indexes in topics.items()])


PRODUCE_CASES = [
    Case("produce", "Produce", 9, lambda b, _: produce_request({"orders": [0, 1]}),
         (topic("orders", WRITE),), only(TOPIC_DENIED), all_none, setup=orders),
    Case("produce-fast-path", "Produce", 9, lambda b, _: produce_request({"orders": [1]}),
         (topic("orders", WRITE),), only(TOPIC_DENIED), all_none, setup=orders, fast=True),
    Case("produce-v13-topic-id", "Produce", 13, lambda b, _: produce_request({"orders": [0]}, version=13, broker=b),
         (topic("orders", WRITE),), only(TOPIC_DENIED), all_none, setup=orders),
    Case("produce-idempotent", "Produce", 11,
         lambda b, _: produce_request({"orders": [0]}, producer_id=7, producer_epoch=0, base_sequence=0),
         (topic("orders", WRITE),), only(TOPIC_DENIED), all_none, setup=orders),
    Case("produce-transactional", "Produce", 11,
         lambda b, ids: produce_request({"orders": [0, 1]}, tid=TID, producer_id=ids[0], producer_epoch=ids[1],
                                        base_sequence=0, transactional=True),
         (txn(TID, WRITE), topic("orders", WRITE)),
         by_missing({ResourceType.TRANSACTIONAL_ID: TXN_DENIED, ResourceType.TOPIC: TOPIC_DENIED}), all_none,
         setup=transactional_producer),
    # Transactions V2: the produce itself adds the partitions; refused, it must add nothing.
    Case("produce-transactional-v2", "Produce", 12,
         lambda b, ids: produce_request({"orders": [0, 1]}, tid=TID, version=12, producer_id=ids[0],
                                        producer_epoch=ids[1], base_sequence=0, transactional=True),
         (txn(TID, WRITE), topic("orders", WRITE)),
         by_missing({ResourceType.TRANSACTIONAL_ID: TXN_DENIED, ResourceType.TOPIC: TOPIC_DENIED}), all_none,
         setup=lambda b: transactional_producer(b, add=False)),
]


@pytest.mark.parametrize("case", PRODUCE_CASES, ids=str)
def test_produce_matrix(case):
    run_case(case)


def _run(body, **props):
    broker = make_broker(**props)
    try:
        run_with_broker(broker, body)
    finally:
        broker.close()


def _partition_codes(response):
    return {(t.name, p.index): p.error_code for t in response.responses for p in t.partition_responses}


def test_produce_answers_per_topic():
    """A topic the principal may not write is refused partition by partition; the other topic's batches go in."""
    async def body(b):
        await b.create_topic("orders", 2)
        await b.create_topic("audit", 1)
        grant(b, [topic("audit", WRITE)])
        response = await call_as(b, "Produce", 9, produce_request({"orders": [0, 1], "audit": [0]}))
        assert _partition_codes(response) == {("orders", 0): TOPIC_DENIED, ("orders", 1): TOPIC_DENIED,
                                              ("audit", 0): NONE}
        assert [b.partition("orders", i).log.log_end_offset for i in (0, 1)] == [0, 0]
        assert b.partition("audit", 0).log.log_end_offset == 1
    _run(body)


def test_produce_topic_denial_comes_before_existence_and_internal_topics():
    """Kafka checks Write before anything else: an unknown or internal topic without it is TOPIC_AUTHORIZATION_FAILED
    (nothing about it is disclosed); with Write they get their own codes."""
    async def body(b):
        request = produce_request({"missing": [0], "__consumer_offsets": [0]})
        grant(b, [])
        assert set(_partition_codes(await call_as(b, "Produce", 9, request)).values()) == {TOPIC_DENIED}
        grant(b, [topic("missing", WRITE), topic("__consumer_offsets", WRITE)])
        assert _partition_codes(await call_as(b, "Produce", 9, request)) == {
            ("missing", 0): E.UNKNOWN_TOPIC_OR_PARTITION.code, ("__consumer_offsets", 0): E.INVALID_TOPIC_EXCEPTION.code}
    _run(body, **{"auto.create.topics.enable": False})


@pytest.mark.parametrize("fast", [False, True])
def test_produce_asks_once_per_topic_and_request(fast):
    """The check is on the hot path: one question per topic per request, however many partitions or batches."""
    async def body(b):
        await b.create_topic("orders", 3)
        security = grant(b, [topic("orders", WRITE)])
        send = call_fast if fast else call_as
        response = await send(b, "Produce", 9, produce_request({"orders": [0] if fast else [0, 1, 2]}))
        assert set(_partition_codes(response).values()) == {NONE}
        assert security.asked == [(PRINCIPAL, WRITE, ResourceType.TOPIC, "orders")]
    _run(body)


def test_produce_fast_path_leaves_a_denial_to_the_handler_and_counts_it_once():
    async def body(b):
        await b.create_topic("orders", 1)
        grant(b, [])
        response = await call_fast(b, "Produce", 9, produce_request({"orders": [0]}))
        assert _partition_codes(response) == {("orders", 0): TOPIC_DENIED}
        assert sum(n for (principal, api, *_), n in b.metrics.denied.items() if api == "Produce") == 1
    _run(body)


def test_transactional_id_without_transactional_batches_is_not_checked():
    """As Kafka: Write on the TransactionalId is asked only when a batch is transactional."""
    async def body(b):
        await b.create_topic("orders", 1)
        security = grant(b, [topic("orders", WRITE)])
        response = await call_as(b, "Produce", 9, produce_request({"orders": [0]}, tid=TID))
        assert set(_partition_codes(response).values()) == {NONE}
        assert {q[2] for q in security.asked} == {ResourceType.TOPIC}
    _run(body)


# --- Fetch -----------------------------------------------------------------------------------

FE = req("Fetch")


async def orders_with_data(broker):
    """orders (2 partitions) with one durable batch in each."""
    await broker.create_topic("orders", 2)
    for index in (0, 1):
        answer = await broker.local_peer.call("Produce", 9, produce_request({"orders": [index]}))
        assert set(error_codes(answer)) == {NONE}
    return None


def fetch_request(topics, *, version=12, broker=None, replica_id=-1, isolation_level=0):
    def fetch_topic(name, indexes):
        return FE.FetchTopic(topic=name if version < 13 else None,
                             topic_id=broker.described_topic(name).topic_id if version >= 13 else None,
                             partitions=[FE.FetchTopic.FetchPartition(partition=i, fetch_offset=0,
                                                                      partition_max_bytes=1 << 20)
                                         for i in indexes])
    return FE(replica_id=replica_id, replica_state=FE.ReplicaState(replica_id=replica_id, replica_epoch=-1),
              max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, isolation_level=isolation_level, session_id=0,
              session_epoch=-1, topics=[fetch_topic(n, i) for n, i in topics.items()], forgotten_topics_data=[],
              rack_id="")


def fetched(response, broker):
    """Success: no error and the records of every partition are there."""
    all_none(response, broker)
    assert all(p.records for t in response.responses for p in t.partitions)


def fetch_refused(response, missing):
    only(TOPIC_DENIED)(response, missing)
    assert all(p.records == b"" and p.high_watermark == -1 for t in response.responses for p in t.partitions)


FETCH_CASES = [
    Case("consumer", "Fetch", 12, lambda b, _: fetch_request({"orders": [0, 1]}), (topic("orders", READ),),
         fetch_refused, fetched, setup=orders_with_data, changes=Changes.NOTHING),
    Case("consumer-read-committed", "Fetch", 12, lambda b, _: fetch_request({"orders": [0, 1]}, isolation_level=1),
         (topic("orders", READ),), fetch_refused, fetched, setup=orders_with_data, changes=Changes.NOTHING),
    Case("consumer-v13-topic-id", "Fetch", 13, lambda b, _: fetch_request({"orders": [0]}, version=13, broker=b),
         (topic("orders", READ),), fetch_refused, fetched, setup=orders_with_data, changes=Changes.NOTHING),
    Case("consumer-v17", "Fetch", 17, lambda b, _: fetch_request({"orders": [0]}, version=17, broker=b),
         (topic("orders", READ),), fetch_refused, fetched, setup=orders_with_data, changes=Changes.NOTHING),
    Case("follower", "Fetch", 12, lambda b, _: fetch_request({"orders": [0, 1]}, replica_id=1),
         (cluster(Operation.CLUSTER_ACTION),), fetch_refused, fetched, setup=orders_with_data,
         changes=Changes.NOTHING),
    Case("follower-v15-replica-state", "Fetch", 15,
         lambda b, _: fetch_request({"orders": [0]}, version=15, broker=b, replica_id=1),
         (cluster(Operation.CLUSTER_ACTION),), fetch_refused, fetched, setup=orders_with_data,
         changes=Changes.NOTHING),
]


@pytest.mark.parametrize("case", FETCH_CASES, ids=str)
def test_fetch_matrix(case):
    run_case(case)


def test_fetch_answers_per_topic_and_asks_once():
    async def body(b):
        await orders_with_data(b)
        await b.create_topic("audit", 1)
        security = grant(b, [topic("audit", READ)])
        response = await call_as(b, "Fetch", 12, fetch_request({"orders": [0, 1], "audit": [0], "missing": [0]}))
        codes = {(t.topic, p.partition_index): p.error_code for t in response.responses for p in t.partitions}
        assert codes == {("orders", 0): TOPIC_DENIED, ("orders", 1): TOPIC_DENIED, ("audit", 0): NONE,
                         ("missing", 0): TOPIC_DENIED}
        assert sorted(q[3] for q in security.asked) == ["audit", "missing", "orders"]
    _run(body)


def test_a_long_poll_asks_once():
    """A long poll woken by flushes reads again without asking the authorizer again."""
    async def body(b):
        await b.create_topic("orders", 1)
        security = grant(b, [topic("orders", READ)])
        request = fetch_request({"orders": [0]})
        request.max_wait_ms, request.min_bytes = 5000, 1
        handler = HANDLERS[API_KEYS["Fetch"]]
        frame = bytearray(handler.request.encode_bytes(request, 12))
        decoded, _ = handler.request.decode(frame, 12)
        poll = handler.fn(context(b, "Fetch", 12, frame), decoded)
        for _ in range(3):         # flushes of the partition that bring nothing new to read at offset 0 wake it
            answer = await b.local_peer.call("Produce", 9, produce_request({"orders": [0]}))
            assert set(error_codes(answer)) == {NONE}
        response = await poll.wait()
        assert response.responses[0].partitions[0].records
        assert len(security.asked) == 1
    _run(body)


# --- ListOffsets, OffsetForLeaderEpoch, DeleteRecords, DescribeProducers ------------------------

LO = req("ListOffsets")
OE = req("OffsetForLeaderEpoch")
DR = req("DeleteRecords")
DP = req("DescribeProducers")


def list_offsets_request(isolation_level=0):
    return LO(replica_id=-1, isolation_level=isolation_level, topics=[LO.ListOffsetsTopic(name="orders", partitions=[
        LO.ListOffsetsTopic.ListOffsetsPartition(partition_index=i, timestamp=-1) for i in (0, 1)])])


def list_offsets_refused(response, missing):
    only(TOPIC_DENIED)(response, missing)
    assert {(p.offset, p.timestamp) for t in response.topics for p in t.partitions} == {(-1, -1)}


def leader_epoch_request(broker, _):
    epoch = broker.described_topic("orders").leader_epoch
    return OE(replica_id=-1, topics=[OE.OffsetForLeaderTopic(topic="orders", partitions=[
        OE.OffsetForLeaderTopic.OffsetForLeaderPartition(partition=i, leader_epoch=epoch) for i in (0, 1)])])


def delete_records_request(broker, _):
    return DR(timeout_ms=1000, topics=[DR.DeleteRecordsTopic(name="orders", partitions=[
        DR.DeleteRecordsTopic.DeleteRecordsPartition(partition_index=i, offset=-1) for i in (0, 1)])])


def describe_producers_request(broker, _):
    return DP(topics=[DP.TopicRequest(name="orders", partition_indexes=[0, 1])])


async def idempotent_data(broker):
    await broker.create_topic("orders", 2)
    for index in (0, 1):
        answer = await broker.local_peer.call("Produce", 9, produce_request(
            {"orders": [index]}, producer_id=11, producer_epoch=0, base_sequence=0))
        assert set(error_codes(answer)) == {NONE}


def producers_described(response, broker):
    succeeded(response, broker)
    assert [[s.producer_id for s in p.active_producers] for p in response.topics[0].partitions] == [[11], [11]]


TOPIC_READ_CASES = [
    Case("list-offsets", "ListOffsets", 9, lambda b, _: list_offsets_request(), (topic("orders", DESCRIBE),),
         list_offsets_refused, succeeded, setup=orders_with_data, changes=Changes.NOTHING),
    Case("list-offsets-read-committed", "ListOffsets", 2, lambda b, _: list_offsets_request(1),
         (topic("orders", DESCRIBE),), list_offsets_refused, succeeded, setup=orders_with_data,
         changes=Changes.NOTHING),
    Case("offset-for-leader-epoch", "OffsetForLeaderEpoch", 4, leader_epoch_request, (topic("orders", DESCRIBE),),
         only(TOPIC_DENIED), succeeded, setup=orders_with_data, changes=Changes.NOTHING),
    Case("delete-records", "DeleteRecords", 2, delete_records_request, (topic("orders", DELETE),),
         only(TOPIC_DENIED), succeeded, setup=orders_with_data),
    Case("describe-producers", "DescribeProducers", 0, describe_producers_request, (topic("orders", READ),),
         only(TOPIC_DENIED), producers_described, setup=idempotent_data, changes=Changes.NOTHING),
]


@pytest.mark.parametrize("case", TOPIC_READ_CASES, ids=str)
def test_topic_matrix(case):
    run_case(case)


def test_offset_for_leader_epoch_with_cluster_action_needs_no_topic_permission():
    """A follower's question (ClusterAction) is answered for every topic, as Kafka's replica fetchers ask."""
    async def body(b):
        await orders_with_data(b)
        security = grant(b, [cluster(Operation.CLUSTER_ACTION)])
        response = await call_as(b, "OffsetForLeaderEpoch", 4, leader_epoch_request(b, None))
        assert set(error_codes(response)) == {NONE}
        assert [q[1:] for q in security.asked] == [(Operation.CLUSTER_ACTION, ResourceType.CLUSTER, "kafka-cluster")]
        assert not b.metrics.denied
    _run(body)


def test_topic_denials_come_before_existence():
    """Nothing about a topic the principal may not see is disclosed: unknown topics are TOPIC_AUTHORIZATION_FAILED
    too, and an internal one for DeleteRecords."""
    async def body(b):
        grant(b, [])
        lo = await call_as(b, "ListOffsets", 9, LO(replica_id=-1, topics=[LO.ListOffsetsTopic(
            name="missing", partitions=[LO.ListOffsetsTopic.ListOffsetsPartition(partition_index=0, timestamp=-1)])]))
        oe = await call_as(b, "OffsetForLeaderEpoch", 4, OE(replica_id=-1, topics=[OE.OffsetForLeaderTopic(
            topic="missing", partitions=[OE.OffsetForLeaderTopic.OffsetForLeaderPartition(partition=0)])]))
        dr = await call_as(b, "DeleteRecords", 2, DR(timeout_ms=1, topics=[DR.DeleteRecordsTopic(
            name="__consumer_offsets", partitions=[DR.DeleteRecordsTopic.DeleteRecordsPartition(offset=-1)])]))
        dp = await call_as(b, "DescribeProducers", 0, DP(topics=[DP.TopicRequest(name="missing",
                                                                                  partition_indexes=[0])]))
        for response in (lo, oe, dr, dp):
            assert error_codes(response, top=False) == [TOPIC_DENIED]
        # An illegal name is refused as such first (Kafka validates DescribeProducers' names before asking).
        bad = await call_as(b, "DescribeProducers", 0, DP(topics=[DP.TopicRequest(name="a/b", partition_indexes=[0])]))
        assert error_codes(bad, top=False) == [E.INVALID_TOPIC_EXCEPTION.code]
    _run(body)


# --- Metadata ------------------------------------------------------------------------------------

MD = req("Metadata")


def metadata_request(*names, auto_create=False, version=12, ops=False):
    return MD(topics=None if names == (None,) else [MD.MetadataRequestTopic(name=n) for n in names],
              allow_auto_topic_creation=auto_create, include_cluster_authorized_operations=ops and version <= 10,
              include_topic_authorized_operations=ops)


def metadata_refused(response, missing):
    only(TOPIC_DENIED)(response, missing)
    assert [(t.partitions, t.topic_id.int) for t in response.topics] == [([], 0)]


def created(response, broker):
    succeeded(response, broker)
    assert broker.topics.get("fresh") is not None and len(response.topics[0].partitions) == 1


METADATA_CASES = [
    Case("metadata-named", "Metadata", 12, lambda b, _: metadata_request("orders"), (topic("orders", DESCRIBE),),
         metadata_refused, succeeded, setup=orders, changes=Changes.NOTHING),
    Case("metadata-v0", "Metadata", 0, lambda b, _: metadata_request("orders", version=0),
         (topic("orders", DESCRIBE),), metadata_refused, succeeded, setup=orders, changes=Changes.NOTHING),
    Case("metadata-auto-create", "Metadata", 12, lambda b, _: metadata_request("fresh", auto_create=True),
         (topic("fresh", DESCRIBE), topic("fresh", CREATE)), metadata_refused, created,
         props={"num.partitions": 1}),
    Case("metadata-auto-create-cluster", "Metadata", 9, lambda b, _: metadata_request("fresh", auto_create=True),
         (topic("fresh", DESCRIBE), cluster(CREATE)), metadata_refused, created, props={"num.partitions": 1}),
]


@pytest.mark.parametrize("case", METADATA_CASES, ids=str)
def test_metadata_matrix(case):
    run_case(case)


def test_metadata_all_topics_leaves_out_what_may_not_be_described():
    async def body(b):
        await b.create_topic("orders", 1)
        await b.create_topic("audit", 1)
        grant(b, [topic("audit", DESCRIBE), topic("__consumer_offsets", DESCRIBE)])
        for version in (0, 1, 12):
            response = await call_as(b, "Metadata", version, metadata_request(*(() if version == 0 else (None,))))
            assert sorted(t.name for t in response.topics) == ["__consumer_offsets", "audit"]
        assert not b.metrics.denied               # leaving a topic out is no denial worth reporting
        named = await call_as(b, "Metadata", 12, metadata_request("orders", "audit", "missing"))
        assert {t.name: t.error_code for t in named.topics} == {"orders": TOPIC_DENIED, "audit": NONE,
                                                                 "missing": TOPIC_DENIED}
        assert sorted(key[3] for key in b.metrics.denied) == ["missing", "orders"]
    _run(body)


def test_metadata_by_topic_id_answers_the_id_without_the_name():
    async def body(b):
        await b.create_topic("orders", 1)
        orders_id = b.topics.get("orders").topic_id
        grant(b, [])
        response = await call_as(b, "Metadata", 12, MD(topics=[MD.MetadataRequestTopic(name=None, topic_id=orders_id)]))
        [t] = response.topics
        assert (t.error_code, t.name, t.topic_id, t.partitions) == (TOPIC_DENIED, None, orders_id, [])
    _run(body)


def test_metadata_auto_create_is_refused_without_create():
    """Describe alone does not create: TOPIC_AUTHORIZATION_FAILED and no topic; without auto-creation it is just
    unknown; an illegal name with Create gets its own code."""
    async def body(b):
        grant(b, [topic("*", DESCRIBE)])
        response = await call_as(b, "Metadata", 12, metadata_request("fresh", auto_create=True))
        assert [t.error_code for t in response.topics] == [TOPIC_DENIED] and b.topics.get("fresh") is None
        response = await call_as(b, "Metadata", 12, metadata_request("fresh", auto_create=False))
        assert [t.error_code for t in response.topics] == [E.UNKNOWN_TOPIC_OR_PARTITION.code]
        security = grant(b, [topic("*", DESCRIBE), topic("*", CREATE)])
        response = await call_as(b, "Metadata", 12, metadata_request("a/b", "fresh", auto_create=True))
        assert [t.error_code for t in response.topics] == [E.INVALID_TOPIC_EXCEPTION.code, NONE]
        creates = [q for q in security.asked if q[1] == CREATE]
        assert creates == [(PRINCIPAL, CREATE, ResourceType.CLUSTER, "kafka-cluster"),
                           (PRINCIPAL, CREATE, ResourceType.TOPIC, "a/b"), (PRINCIPAL, CREATE, ResourceType.TOPIC, "fresh")]
    _run(body, **{"num.partitions": 1})


def _bits(*operations) -> int:
    return sum(1 << op for op in operations)


def test_metadata_reports_the_real_authorized_operations():
    async def body(b):
        await b.create_topic("orders", 1)
        grant(b, [topic("orders", READ), topic("orders", DESCRIBE), topic("orders", Operation.ALTER_CONFIGS)])
        response = await call_as(b, "Metadata", 10, metadata_request("orders", ops=True, version=10))
        assert response.cluster_authorized_operations == 0                  # no Describe on the cluster
        assert response.topics[0].topic_authorized_operations == _bits(READ, DESCRIBE, Operation.ALTER_CONFIGS)
        grant(b, [topic("orders", DESCRIBE), cluster(DESCRIBE), cluster(Operation.IDEMPOTENT_WRITE),
                  cluster(Operation.ANY)])
        response = await call_as(b, "Metadata", 10, metadata_request("orders", ops=True, version=10))
        assert response.cluster_authorized_operations == _bits(DESCRIBE, Operation.IDEMPOTENT_WRITE)
        assert response.topics[0].topic_authorized_operations == _bits(DESCRIBE)
        grant(b, allow_all=True)
        response = await call_as(b, "Metadata", 12, metadata_request("orders", ops=True))
        assert response.topics[0].topic_authorized_operations == _bits(
            READ, WRITE, CREATE, DELETE, Operation.ALTER, DESCRIBE, Operation.DESCRIBE_CONFIGS,
            Operation.ALTER_CONFIGS)
    _run(body)


# --- DescribeTopicPartitions -----------------------------------------------------------------------

DT = req("DescribeTopicPartitions")


def describe_topics_request(*names, limit=2000):
    return DT(topics=[DT.TopicRequest(name=n) for n in names], response_partition_limit=limit, cursor=None)


def describe_topics_refused(response, missing):
    only(TOPIC_DENIED)(response, missing)
    [t] = response.topics
    assert (t.topic_id.int, t.is_internal, t.partitions, t.topic_authorized_operations) == (0, False, [], -2**31)


DESCRIBE_TOPIC_PARTITIONS_CASES = [
    Case("describe-topic-partitions", "DescribeTopicPartitions", 0, lambda b, _: describe_topics_request("orders"),
         (topic("orders", DESCRIBE),), describe_topics_refused, succeeded, setup=orders, changes=Changes.NOTHING),
    Case("describe-topic-partitions-missing", "DescribeTopicPartitions", 0,
         lambda b, _: describe_topics_request("missing"), (topic("missing", DESCRIBE),), describe_topics_refused,
         lambda r, b: only(E.UNKNOWN_TOPIC_OR_PARTITION.code)(r, None), changes=Changes.NOTHING),
]


@pytest.mark.parametrize("case", DESCRIBE_TOPIC_PARTITIONS_CASES, ids=str)
def test_describe_topic_partitions_matrix(case):
    run_case(case)


def test_describe_topic_partitions_pages_skip_what_may_not_be_described():
    """Kafka's lazy filter: a refused topic takes no room in the page and is never the next cursor."""
    async def body(b):
        for name in "abcd":
            await b.create_topic(name, 1)
        grant(b, [topic(n, DESCRIBE) for n in "acd"] + [topic("a", READ)])
        named = await call_as(b, "DescribeTopicPartitions", 0, describe_topics_request("a", "b", "c", "d", limit=2))
        assert [(t.name, t.error_code, len(t.partitions)) for t in named.topics] == [
            ("a", NONE, 1), ("c", NONE, 1), ("b", TOPIC_DENIED, 0)]
        assert (named.next_cursor.topic_name, named.next_cursor.partition_index) == ("d", 0)
        assert [t.topic_authorized_operations for t in named.topics[:2]] == [_bits(READ, DESCRIBE), _bits(DESCRIBE)]
        every = await call_as(b, "DescribeTopicPartitions", 0, describe_topics_request(limit=2))
        assert [t.name for t in every.topics] == ["a", "c"] and every.next_cursor.topic_name == "d"
        grant(b, [topic(n, DESCRIBE) for n in "ac"])
        last = await call_as(b, "DescribeTopicPartitions", 0, describe_topics_request(limit=2))
        assert [t.name for t in last.topics] == ["a", "c"] and last.next_cursor is None
    _run(body)


# --- FindCoordinator -----------------------------------------------------------------------------

FC = req("FindCoordinator")


def coordinator_refused(code):
    def check(response, missing):
        only(code)(response, missing)
        keys = response.coordinators or [response]
        assert {(k.node_id, k.host, k.port) for k in keys} == {(-1, "", -1)}
    return check


def found(response, broker):
    succeeded(response, broker)
    keys = response.coordinators or [response]
    assert {k.node_id for k in keys} == {broker.node_id}


FIND_CASES = [
    Case(f"find-{kind}-v{version}", "FindCoordinator", version,
         lambda b, _, version=version, key_type=key_type: FC(key="g1", key_type=key_type, coordinator_keys=["g1"])
         if version < 4 else FC(key_type=key_type, coordinator_keys=["g1"]),
         (grant_of("g1", DESCRIBE),), coordinator_refused(code), found, changes=Changes.NOTHING)
    for kind, key_type, grant_of, code in (("group", 0, group, GROUP_DENIED), ("txn", 1, txn, TXN_DENIED))
    for version in (1, 3, 4, 6)
]


@pytest.mark.parametrize("case", FIND_CASES, ids=str)
def test_find_coordinator_matrix(case):
    run_case(case)


def test_find_coordinator_answers_each_key_on_its_own():
    async def body(b):
        grant(b, [group("mine", DESCRIBE)])
        response = await call_as(b, "FindCoordinator", 4, FC(key_type=0, coordinator_keys=["mine", "theirs"]))
        assert [(k.key, k.error_code, k.node_id, k.error_message) for k in response.coordinators] == [
            ("mine", NONE, b.node_id, None), ("theirs", GROUP_DENIED, -1, None)]
        old = await call_as(b, "FindCoordinator", 3, FC(key="theirs", key_type=0))
        assert (old.error_code, old.error_message) == (GROUP_DENIED, "Group authorization failed.")
    _run(body)


# --- InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, TxnOffsetCommit -------------------

AO = req("AddOffsetsToTxn")
ET = req("EndTxn")
TC = req("TxnOffsetCommit")
GROUP_ID = "g1"


def id_refused(code):
    def check(response, missing):
        only(code)(response, missing)
        assert (response.producer_id, response.producer_epoch) == (-1, -1)
    return check


def init_request(tid):
    return IP(transactional_id=tid, transaction_timeout_ms=60000, producer_id=-1, producer_epoch=-1)


def add_request(ids, topics=None):
    return AP(v3_and_below_transactional_id=TID, v3_and_below_producer_id=ids[0], v3_and_below_producer_epoch=ids[1],
              v3_and_below_topics=[AP.AddPartitionsToTxnTopic(name=n, partitions=p)
                                   for n, p in (topics or {"orders": [0, 1]}).items()])


def broker_add_request(ids, verify_only=False):
    return AP(transactions=[AP.AddPartitionsToTxnTransaction(
        transactional_id=TID, producer_id=ids[0], producer_epoch=ids[1], verify_only=verify_only,
        topics=[AP.AddPartitionsToTxnTransaction.AddPartitionsToTxnTopic(name="orders", partitions=[0])])])


async def offsets_in_transaction(broker, *, add_offsets=True):
    """A transactional producer (orders in its transaction) that added GROUP_ID's offsets (when ``add_offsets``)."""
    ids = await transactional_producer(broker)
    if add_offsets:
        added = await broker.local_peer.call("AddOffsetsToTxn", 3, AO(transactional_id=TID, producer_id=ids[0],
                                                                        producer_epoch=ids[1], group_id=GROUP_ID))
        assert added.error_code == NONE
    return ids


def txn_commit_request(ids, topics=("orders",)):
    return TC(transactional_id=TID, group_id=GROUP_ID, producer_id=ids[0], producer_epoch=ids[1], generation_id=-1,
              member_id="", topics=[TC.TxnOffsetCommitRequestTopic(name=n, partitions=[
                  TC.TxnOffsetCommitRequestTopic.TxnOffsetCommitRequestPartition(partition_index=0, committed_offset=5)])
                  for n in topics])


TXN_CASES = [
    Case("init-producer-id-transactional", "InitProducerId", 4, lambda b, _: init_request(TID), (txn(TID, WRITE),),
         id_refused(TXN_DENIED), succeeded),
    Case("init-producer-id-idempotent", "InitProducerId", 4, lambda b, _: init_request(None),
         (cluster(Operation.IDEMPOTENT_WRITE),), id_refused(CLUSTER_DENIED), succeeded),
    Case("add-partitions-v3", "AddPartitionsToTxn", 3, lambda b, ids: add_request(ids),
         (txn(TID, WRITE), topic("orders", WRITE)),
         by_missing({ResourceType.TRANSACTIONAL_ID: TXN_DENIED, ResourceType.TOPIC: TOPIC_DENIED}), succeeded,
         setup=lambda b: transactional_producer(b, add=False)),
    Case("add-partitions-v0", "AddPartitionsToTxn", 0, lambda b, ids: add_request(ids),
         (txn(TID, WRITE), topic("orders", WRITE)),
         by_missing({ResourceType.TRANSACTIONAL_ID: TXN_DENIED, ResourceType.TOPIC: TOPIC_DENIED}), succeeded,
         setup=lambda b: transactional_producer(b, add=False)),
    # The broker form (v4+) comes from brokers only.
    Case("add-partitions-broker-form", "AddPartitionsToTxn", 5, lambda b, ids: broker_add_request(ids),
         (cluster(Operation.CLUSTER_ACTION),), only(CLUSTER_DENIED), succeeded,
         setup=lambda b: transactional_producer(b, add=False)),
    Case("add-partitions-broker-form-verify", "AddPartitionsToTxn", 4,
         lambda b, ids: broker_add_request(ids, verify_only=True), (cluster(Operation.CLUSTER_ACTION),),
         only(CLUSTER_DENIED), succeeded, setup=transactional_producer, changes=Changes.NOTHING),
    Case("add-offsets", "AddOffsetsToTxn", 3,
         lambda b, ids: AO(transactional_id=TID, producer_id=ids[0], producer_epoch=ids[1], group_id=GROUP_ID),
         (txn(TID, WRITE), group(GROUP_ID, READ)),
         by_missing({ResourceType.TRANSACTIONAL_ID: TXN_DENIED, ResourceType.GROUP: GROUP_DENIED}), succeeded,
         setup=transactional_producer),
    Case("end-txn", "EndTxn", 3, lambda b, ids: ET(transactional_id=TID, producer_id=ids[0], producer_epoch=ids[1],
                                                   committed=True),
         (txn(TID, WRITE),), id_refused(TXN_DENIED), succeeded, setup=transactional_producer),
    Case("end-txn-v5", "EndTxn", 5, lambda b, ids: ET(transactional_id=TID, producer_id=ids[0], producer_epoch=ids[1],
                                                      committed=False),
         (txn(TID, WRITE),), id_refused(TXN_DENIED), succeeded, setup=transactional_producer),
    Case("txn-offset-commit", "TxnOffsetCommit", 3, lambda b, ids: txn_commit_request(ids),
         (txn(TID, WRITE), group(GROUP_ID, READ), topic("orders", READ)),
         by_missing({ResourceType.TRANSACTIONAL_ID: TXN_DENIED, ResourceType.GROUP: GROUP_DENIED,
                     ResourceType.TOPIC: TOPIC_DENIED}), succeeded, setup=offsets_in_transaction),
    # v5 (transactions V2) adds the offsets partition itself: refused, it must add nothing.
    Case("txn-offset-commit-v5", "TxnOffsetCommit", 5, lambda b, ids: txn_commit_request(ids),
         (txn(TID, WRITE), group(GROUP_ID, READ), topic("orders", READ)),
         by_missing({ResourceType.TRANSACTIONAL_ID: TXN_DENIED, ResourceType.GROUP: GROUP_DENIED,
                     ResourceType.TOPIC: TOPIC_DENIED}), succeeded,
         setup=lambda b: offsets_in_transaction(b, add_offsets=False)),
]


@pytest.mark.parametrize("case", TXN_CASES, ids=str)
def test_transaction_matrix(case):
    run_case(case)


def test_idempotent_init_producer_id_with_write_on_any_topic():
    """Kafka 3+: IdempotentWrite on the cluster, or Write on at least one topic (authorizeByResourceType)."""
    async def body(b):
        grant(b, [topic("some-topic", WRITE)])
        response = await call_as(b, "InitProducerId", 4, init_request(None))
        assert response.error_code == NONE and response.producer_id >= 0
        grant(b, [topic("some-topic", READ), txn(TID, WRITE)])
        response = await call_as(b, "InitProducerId", 4, init_request(None))
        assert (response.error_code, response.producer_id) == (CLUSTER_DENIED, -1)
        assert [key[2:] for key in b.metrics.denied] == [("CLUSTER", "kafka-cluster")]
    _run(body)


def test_add_partitions_refuses_the_whole_add_when_a_topic_is_denied():
    async def body(b):
        ids = await transactional_producer(b, add=False)
        await b.create_topic("audit", 1)
        grant(b, [txn(TID, WRITE), topic("audit", WRITE), topic("__consumer_offsets", WRITE)])
        await settled(b)
        before = broker_state(b)
        response = await call_as(b, "AddPartitionsToTxn", 3, add_request(
            ids, {"orders": [0], "audit": [0], "__consumer_offsets": [0]}))
        codes = {(t.name, p.partition_index): p.partition_error_code for t in response.results_by_topic_v3_and_below
                 for p in t.results_by_partition}
        assert codes == {("orders", 0): TOPIC_DENIED, ("audit", 0): E.OPERATION_NOT_ATTEMPTED.code,
                         ("__consumer_offsets", 0): TOPIC_DENIED}
        assert broker_state(b) == before
    _run(body)


def test_txn_offset_commit_commits_the_topics_it_may_read():
    async def body(b):
        ids = await offsets_in_transaction(b)
        await b.create_topic("audit", 1)
        grant(b, [txn(TID, WRITE), group(GROUP_ID, READ), topic("audit", READ)])
        response = await call_as(b, "TxnOffsetCommit", 3, txn_commit_request(ids, ("orders", "audit")))
        assert {t.name: t.partitions[0].error_code for t in response.topics} == {"orders": TOPIC_DENIED,
                                                                               "audit": NONE}
        pending = b.groups.coordinator.pending[ids[0]][GROUP_ID]
        assert set(pending) == {("audit", 0)}
    _run(body)


# --- WriteTxnMarkers -----------------------------------------------------------------------------

WM = req("WriteTxnMarkers")


def marker_request(producer_id, epoch, *, commit=False, partitions=(0,), coordinator_epoch=0):
    return WM(markers=[WM.WritableTxnMarker(
        producer_id=producer_id, producer_epoch=epoch, transaction_result=commit, coordinator_epoch=coordinator_epoch,
        topics=[WM.WritableTxnMarker.WritableTxnMarkerTopic(name="orders", partition_indexes=list(partitions))])])


async def open_transaction_with_data(broker):
    """TID's transaction open on orders-0 and orders-1, a batch in each → (producer id, epoch)."""
    ids = await transactional_producer(broker)
    answer = await broker.local_peer.call("Produce", 11, produce_request(
        {"orders": [0, 1]}, tid=TID, producer_id=ids[0], producer_epoch=ids[1], base_sequence=0, transactional=True))
    assert set(error_codes(answer)) == {NONE}
    return ids


async def idempotent_producer(broker):
    """A producer id handed out to an idempotent producer (no transaction the coordinator knows of)."""
    await broker.create_topic("orders", 2)
    init = await broker.local_peer.call("InitProducerId", 4, init_request(None))
    return init.producer_id, init.producer_epoch


# An admin's abort of a hanging transaction (KIP-664): ClusterAction, or Alter on the cluster as Kafka 4 allows.
WRITE_TXN_MARKERS_CASES = [
    Case(f"write-txn-markers-{operation.name.lower()}", "WriteTxnMarkers", 1,
         lambda b, ids: marker_request(*ids), (cluster(operation),), only(CLUSTER_DENIED), succeeded,
         setup=idempotent_producer)
    for operation in (Operation.CLUSTER_ACTION, Operation.ALTER)
]


@pytest.mark.parametrize("case", WRITE_TXN_MARKERS_CASES, ids=str)
def test_write_txn_markers_matrix(case):
    run_case(case)


@pytest.mark.parametrize("version", [1, 2])
def test_rogue_markers_are_refused_and_the_transaction_stays_intact(version):
    """A client without ClusterAction (or Alter on the cluster) writes no marker: the open transaction keeps its
    partitions, data and last stable offset; one with ClusterAction still meets the checks against the
    coordinator (issue 20): no marker may end a partition of an open transaction behind the coordinator's back."""
    async def body(b):
        pid, epoch = await open_transaction_with_data(b)
        await settled(b)
        lso = [b.partition("orders", i).last_stable_offset() for i in (0, 1)]
        before = broker_state(b)
        grant(b, [topic("orders", WRITE), topic("orders", READ), txn(TID, WRITE), cluster(DESCRIBE)])
        for commit in (False, True):
            response = await call_as(b, "WriteTxnMarkers", version, marker_request(pid, epoch, commit=commit,
                                                                                      partitions=(0, 1)))
            assert error_codes(response, top=False) == [CLUSTER_DENIED, CLUSTER_DENIED]
        assert broker_state(b) == before
        grant(b, [cluster(Operation.CLUSTER_ACTION)])
        response = await call_as(b, "WriteTxnMarkers", version, marker_request(pid, epoch, partitions=(0, 1)))
        assert error_codes(response, top=False) == [E.INVALID_TXN_STATE.code] * 2
        assert broker_state(b) == before
        assert [b.partition("orders", i).last_stable_offset() for i in (0, 1)] == lso
        # The transaction is still the producer's to end.
        ended = await b.local_peer.call("EndTxn", 3, ET(transactional_id=TID, producer_id=pid, producer_epoch=epoch,
                                                          committed=True))
        assert ended.error_code == NONE
    _run(body)


# --- DescribeTransactions, ListTransactions ----------------------------------------------------------

DX = req("DescribeTransactions")
LX = req("ListTransactions")


def listed_nothing(response, missing):
    assert (response.error_code, response.transaction_states) == (NONE, []), f"without {missing}: {response}"


def listed_tid(response, broker):
    assert [(s.transactional_id, s.transaction_state) for s in response.transaction_states] == [(TID, "Ongoing")]


TRANSACTION_TOOLING_CASES = [
    Case("describe-transactions", "DescribeTransactions", 0, lambda b, _: DX(transactional_ids=[TID]),
         (txn(TID, DESCRIBE),), only(TXN_DENIED), succeeded, setup=transactional_producer, changes=Changes.NOTHING),
    Case("list-transactions", "ListTransactions", 1,
         lambda b, _: LX(state_filters=[], producer_id_filters=[], duration_filter=-1),
         (txn(TID, DESCRIBE),), listed_nothing, listed_tid, setup=transactional_producer, changes=Changes.NOTHING),
]


@pytest.mark.parametrize("case", TRANSACTION_TOOLING_CASES, ids=str)
def test_transaction_tooling_matrix(case):
    run_case(case)


def test_describe_transactions_per_id_and_only_describable_topics():
    async def body(b):
        await transactional_producer(b)
        await b.create_topic("audit", 1)
        grant(b, [txn(TID, DESCRIBE), topic("audit", DESCRIBE)])
        response = await call_as(b, "DescribeTransactions", 0, DX(transactional_ids=[TID, "other"]))
        mine, other = response.transaction_states
        assert (mine.error_code, mine.transaction_state, mine.topics) == (NONE, "Ongoing", [])   # orders hidden
        assert (other.error_code, other.transactional_id, other.producer_id) == (TXN_DENIED, "other", 0)
        grant(b, [txn(TID, DESCRIBE), topic("orders", DESCRIBE)])
        [mine] = (await call_as(b, "DescribeTransactions", 0, DX(transactional_ids=[TID]))).transaction_states
        assert [(t.topic, sorted(t.partitions)) for t in mine.topics] == [("orders", [0, 1])]
        grant(b, [])
        [mine] = (await call_as(b, "DescribeTransactions", 0, DX(transactional_ids=[TID]))).transaction_states
        assert (mine.error_code, mine.transaction_state, mine.topics) == (TXN_DENIED, "", [])
    _run(body)


@pytest.mark.parametrize("version", [0, 2])
def test_list_transactions_lists_only_describable_ids(version):
    async def body(b):
        await b.create_topic("orders", 1)
        for tid in ("tx-a", "tx-b", "other"):
            init = await b.local_peer.call("InitProducerId", 4, init_request(tid))
            assert init.error_code == NONE
        grant(b, [txn("tx-a", DESCRIBE), txn("other", DESCRIBE)])
        pattern = "tx-.*" if version >= 2 else None
        response = await call_as(b, "ListTransactions", version, LX(state_filters=[], producer_id_filters=[],
                                                                    duration_filter=-1,
                                                                    transactional_id_pattern=pattern))
        assert response.error_code == NONE
        assert sorted(s.transactional_id for s in response.transaction_states) == (
            ["tx-a"] if version >= 2 else ["other", "tx-a"])
        # The pattern is applied first: only "tx-b" was a denial, not the ids the pattern left out.
        assert sorted(key[3] for key in b.metrics.denied) == ["tx-b"]
    _run(body)


def test_a_fetch_with_nothing_it_may_read_is_answered_at_once():
    """As Kafka: no partition that exists and may be read, nothing to wait for (no long poll of max_wait)."""
    async def body(b):
        await b.create_topic("orders", 1)
        grant(b, [topic("missing", READ)])
        handler = HANDLERS[API_KEYS["Fetch"]]
        for names in ({"orders": [0]}, {"missing": [0]}, {"orders": [0], "missing": [0]}):
            request = fetch_request(names)
            request.max_wait_ms, request.min_bytes = 60000, 1
            frame = bytearray(handler.request.encode_bytes(request, 12))
            decoded, _ = handler.request.decode(frame, 12)
            response = handler.fn(context(b, "Fetch", 12, frame), decoded)
            assert not isinstance(response, Deferred), names
            assert set(error_codes(response, top=False)) <= {TOPIC_DENIED, E.UNKNOWN_TOPIC_OR_PARTITION.code}
        grant(b, [topic("orders", READ)])
        request = fetch_request({"orders": [0]})
        request.max_wait_ms, request.min_bytes = 60000, 1
        frame = bytearray(handler.request.encode_bytes(request, 12))
        decoded, _ = handler.request.decode(frame, 12)
        assert isinstance(handler.fn(context(b, "Fetch", 12, frame), decoded), Deferred)   # may read: it waits
    _run(body)


@pytest.mark.parametrize("tid", [None, TID])
def test_acks0_transactional_refusal_closes_the_connection(tid):
    """Kafka answers an error it cannot send (acks=0) by closing the connection; nothing is appended."""
    async def body(b):
        await b.create_topic("orders", 1)
        grant(b, [topic("orders", WRITE)])
        request = produce_request({"orders": [0]}, tid=tid, producer_id=5, producer_epoch=0, base_sequence=0,
                                  transactional=True)
        request.acks = 0
        with pytest.raises(CloseConnection):
            await call_as(b, "Produce", 9, request)
        assert b.partition("orders", 0).log.log_end_offset == 0
    _run(body)
