"""aiokafka 0.14 against a real Trireme process: admin create/delete,
produce/consume round trips per codec, ListOffsets, idempotence.

Client limits met here: aiokafka's send() refuses a record whose key and
value are both None (assert "Need at least one: key or value"), so its
records always have a key or a value.  Its RecordMetadata.timestamp is wrong
for all but the first record of a batch (client bug, see produce()).
AIOKafkaAdminClient has no
ListOffsets call (no MaxTimestamp lookup); offsets come from the consumer's
beginning_offsets / end_offsets / offsets_for_times.
"""
from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from compat_tests.broker_probe import bootstrap_addresses, broker_info
from compat_tests.python_clients import (CODECS, N_PARTITIONS, OFFSETS_PER_PARTITION,
                                         OP_TIMEOUT_S, Collected, Got, assign_and_seek,
                                         check_read_from, check_roundtrip, make_records,
                                         offsets_acked, offsets_base_ts, offsets_produce_calls,
                                         offsets_records, partition_counts, timestamp_cases,
                                         unique_topic)

pytestmark = pytest.mark.timeout(180)

TIMEOUT_MS = int(OP_TIMEOUT_S * 1000)
UNKNOWN_TOPIC_OR_PARTITION = 3
TOPIC_ALREADY_EXISTS = 36


def run(coro, timeout: float = 150):
    """Run one test body on a fresh event loop, bounded in time."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


@asynccontextmanager
async def admin_client(server):
    admin = AIOKafkaAdminClient(bootstrap_servers=server.bootstrap, request_timeout_ms=TIMEOUT_MS)
    await admin.start()
    try:
        yield admin
    finally:
        await admin.close()


async def create_topic(admin, name: str, partitions: int = N_PARTITIONS, expect_error: int = 0):
    resp = await admin.create_topics([NewTopic(name, partitions, 1)], timeout_ms=TIMEOUT_MS)
    assert [(t[0], t[1]) for t in resp.topic_errors] == [(name, expect_error)], resp


async def check_topic_metadata(admin, server, name: str, partitions: int) -> None:
    """The client sees the brokers (one, or a cluster's: those of the bootstrap list), the controller and each
    partition's leader as the broker's own Metadata gives them; replication factor 1: the leader is the only
    replica."""
    probe = broker_info(server.bootstrap)
    cluster = await admin.describe_cluster()
    assert {b["node_id"]: (b["host"], b["port"]) for b in cluster["brokers"]} == probe.brokers
    assert sorted(probe.addresses()) == sorted(bootstrap_addresses(server.bootstrap))
    assert cluster["controller_id"] == probe.controller_id and cluster["cluster_id"]
    leaders = probe.leaders(name)
    (t,) = await admin.describe_topics([name])
    assert (t["topic"], t["error_code"], t["is_internal"]) == (name, 0, False)
    assert sorted(p["partition"] for p in t["partitions"]) == list(range(partitions))
    for p in t["partitions"]:
        assert p["error_code"] == 0 and p["leader"] == leaders[p["partition"]]
        assert p["replicas"] == [p["leader"]] and p["isr"] == [p["leader"]]


async def produce(server, topic: str, records, **config) -> dict[int, tuple[int, int]]:
    """acks=all; returns {index: (partition, offset)} and checks every
    RecordMetadata field."""
    producer = AIOKafkaProducer(bootstrap_servers=server.bootstrap, acks="all", linger_ms=5,
                                request_timeout_ms=TIMEOUT_MS, **config)
    await producer.start()
    try:
        futures = [(rec, await producer.send(topic, value=rec.value, key=rec.key,
                                             partition=rec.partition, timestamp_ms=rec.timestamp,
                                             headers=list(rec.headers)))
                   for rec in records]
        await producer.flush()
        acked = {}
        metas = []
        for rec, fut in futures:
            md = await fut
            assert (md.topic, md.partition, md.timestamp_type) == (topic, rec.partition, 0)
            assert md.topic_partition == TopicPartition(topic, rec.partition)
            assert md.log_start_offset == 0
            acked[rec.index] = (md.partition, md.offset)
            metas.append((rec, md))
        # aiokafka bug (producer/message_accumulator.py MessageBatch.done():
        # ``if timestamp == -1: timestamp = metadata.timestamp`` reassigns the
        # loop-shared variable) - every record of a batch gets the FIRST
        # record's timestamp in its RecordMetadata.  So: each reported
        # timestamp is that of a record at or before it in its partition, and
        # the first record of each partition is reported exactly.
        seen_ts: dict[int, set[int]] = {}
        for rec, md in sorted(metas, key=lambda m: (m[1].partition, m[1].offset)):
            if md.partition not in seen_ts:        # first record of this call in the partition
                assert md.timestamp == rec.timestamp, (rec.index, md)
                seen_ts[md.partition] = set()
            seen_ts[md.partition].add(rec.timestamp)
            assert md.timestamp in seen_ts[md.partition], (rec.index, md)
        return acked
    finally:
        await producer.stop()


def to_got(r, topic: str) -> Got:
    assert r.topic == topic
    assert r.checksum is None                              # v2 batches carry no per-record CRC
    assert r.serialized_key_size == (-1 if r.key is None else len(r.key))
    assert r.serialized_value_size == (-1 if r.value is None else len(r.value))
    return Got(r.partition, r.offset, r.key, r.value, tuple(r.headers or ()), r.timestamp,
               r.timestamp_type == 0)


@asynccontextmanager
async def consumer_for(server, **config):
    consumer = AIOKafkaConsumer(bootstrap_servers=server.bootstrap, group_id=None,
                                enable_auto_commit=False, request_timeout_ms=TIMEOUT_MS,
                                fetch_max_wait_ms=100, **config)
    await consumer.start()
    try:
        yield consumer
    finally:
        await consumer.stop()


async def consume(server, topic: str, counts: dict[int, int],
                  start: dict[int, int] | None = None) -> list[Got]:
    """assign() + seek() each partition (default offset 0) and getmany()
    until ``counts[p]`` records came from every partition."""
    async with consumer_for(server) as consumer:
        assign_and_seek(consumer, [TopicPartition(topic, p) for p in counts], start)
        c = Collected(counts)
        while c.want_more():
            batch = await consumer.getmany(timeout_ms=500, max_records=5000)
            for recs in batch.values():
                for r in recs:
                    c.add(to_got(r, topic))
        for recs in (await consumer.getmany(timeout_ms=300)).values():
            c.got.extend(to_got(r, topic) for r in recs)
        return c.got


# -------------------------------------------------------------------- tests

def test_admin_create_delete_topic(module_server):
    async def body():
        topic = unique_topic("aio-admin")
        async with admin_client(module_server) as admin:
            await create_topic(admin, topic)
            await check_topic_metadata(admin, module_server, topic, 3)
            assert topic in await admin.list_topics()
            async with consumer_for(module_server) as consumer:
                assert topic in await consumer.topics()
            producer = AIOKafkaProducer(bootstrap_servers=module_server.bootstrap)
            await producer.start()
            try:
                assert await producer.partitions_for(topic) == {0, 1, 2}
            finally:
                await producer.stop()

            await create_topic(admin, topic, expect_error=TOPIC_ALREADY_EXISTS)
            records = make_records(30, null_key_and_value=False)
            assert len(await produce(module_server, topic, records)) == 30

            resp = await admin.delete_topics([topic], timeout_ms=TIMEOUT_MS)
            assert [tuple(t) for t in resp.topic_error_codes] == [(topic, 0)]
            deadline = time.monotonic() + 15
            while topic in await admin.list_topics():
                assert time.monotonic() < deadline, f"{topic} still listed after delete"
                await asyncio.sleep(0.1)
            resp = await admin.delete_topics([topic], timeout_ms=TIMEOUT_MS)
            assert [tuple(t) for t in resp.topic_error_codes] == [(topic, UNKNOWN_TOPIC_OR_PARTITION)]

            # The name is free again: a new topic with it starts empty.
            await create_topic(admin, topic, partitions=2)
            await check_topic_metadata(admin, module_server, topic, 2)
            async with consumer_for(module_server) as consumer:
                tps = [TopicPartition(topic, p) for p in range(2)]
                assert await consumer.end_offsets(tps) == {tp: 0 for tp in tps}
    run(body())


@pytest.mark.parametrize("codec", CODECS)
def test_produce_consume_roundtrip(module_server, codec):
    async def body():
        topic = unique_topic(f"aio-rt-{codec}")
        async with admin_client(module_server) as admin:
            await create_topic(admin, topic)
            await check_topic_metadata(admin, module_server, topic, 3)
        records = make_records(null_key_and_value=False)
        acked = await produce(module_server, topic, records,
                              compression_type=None if codec == "none" else codec)
        got = await consume(module_server, topic, partition_counts(records))
        check_roundtrip(records, acked, got)

        mid = await consume(module_server, topic, {0: 5}, start={0: 3210})
        check_read_from(records, acked, mid, 0, 3210)
    run(body())


def test_list_offsets(module_server):
    async def body():
        topic = unique_topic("aio-offsets")
        async with admin_client(module_server) as admin:
            await create_topic(admin, topic)
        base = offsets_base_ts()
        records = offsets_records(base)
        acked: dict[int, tuple[int, int]] = {}
        for batch in offsets_produce_calls(records):
            acked.update(await produce(module_server, topic, batch))
        assert acked == offsets_acked(records)
        tps = [TopicPartition(topic, p) for p in range(N_PARTITIONS)]
        async with consumer_for(module_server) as consumer:
            assert await consumer.beginning_offsets(tps) == {tp: 0 for tp in tps}
            assert await consumer.end_offsets(tps) == {tp: OFFSETS_PER_PARTITION for tp in tps}
            for case in timestamp_cases(base):
                res = await consumer.offsets_for_times({tp: case[tp.partition][0] for tp in tps})
                assert {tp.partition: None if v is None else (v.offset, v.timestamp)
                        for tp, v in res.items()} == {p: case[p][1] for p in case}, case
    run(body())


def test_idempotent_produce(module_server):
    async def body():
        topic = unique_topic("aio-idem")
        async with admin_client(module_server) as admin:
            await create_topic(admin, topic)
        records = make_records(3000, null_key_and_value=False, seed=11)
        config = {"enable_idempotence": True, "compression_type": "lz4", "max_batch_size": 4096}
        acked = await produce(module_server, topic, records[:1500], **config)
        acked.update(await produce(module_server, topic, records[1500:], **config))
        got = await consume(module_server, topic, partition_counts(records))
        check_roundtrip(records, acked, got)
    run(body())
