"""Client quotas against a real broker: AlterClientQuotas / DescribeClientQuotas over raw frames, a producer and a
consumer over tiny byte rates throttled with Kafka's throttle time (KIP-219: the answer says how long, and the
connection reads nothing more for that long), and the bytes a throttled producer gets in bounded by its quota."""
from __future__ import annotations

import math
import time

import pytest

from compat_tests.sasl_support import plain_login, sasl_server  # noqa: F401  (fixture)
from compat_tests.test_bad_input import (RawConn, create_topic, encode_request, produce_request, req, unique)
from trireme.wire import error_codes as E
from trireme.wire import records
from trireme.wire.codec import message

ACQ = message("AlterClientQuotasRequest").cls
WINDOWS, WINDOW_S = 11, 1            # quota.window.num, quota.window.size.seconds (Kafka's defaults)


def alter(conn, entries, validate_only=False, version=1):
    r = conn.request("AlterClientQuotas", version, ACQ(validate_only=validate_only, entries=[
        ACQ.EntryData(entity=[ACQ.EntryData.EntityData(entity_type=t, entity_name=n) for t, n in entity],
                      ops=[ACQ.EntryData.OpData(key=k, value=0.0 if v is None else v, remove=v is None)
                           for k, v in ops.items()])
        for entity, ops in entries]))
    return [(x.error_code, x.error_message) for x in r.entries]


def describe(conn, components=(), strict=False, version=1):
    cls = message("DescribeClientQuotasRequest").cls
    r = conn.request("DescribeClientQuotas", version, cls(strict=strict, components=[
        cls.ComponentData(entity_type=t, match_type=m, match=v) for t, m, v in components]))
    assert r.error_code == 0, r
    return {tuple((e.entity_type, e.entity_name) for e in x.entity): {v.key: v.value for v in x.values}
            for x in r.entries}


def kafka_round(x: float) -> int:
    return math.floor(x + 0.5)


def test_alter_and_describe_client_quotas(server):
    with RawConn(server.bootstrap) as conn:
        alice = [("user", "alice"), ("client-id", None)]
        entries = [(alice, {"producer_byte_rate": 1024.0, "request_percentage": 50.0}),
                   ([("client-id", "app")], {"consumer_byte_rate": 4096.0}),
                   ([("user", "bob")], {"producer_byte_rate": -1.0}),
                   ([("user", "carol")], {"no_such_quota": 1.0})]
        assert [e for e, _ in alter(conn, entries, validate_only=True)] == [0, 0, 42, 42]
        assert describe(conn) == {}
        results = alter(conn, entries)
        assert [e for e, _ in results] == [0, 0, E.INVALID_REQUEST.code, E.INVALID_REQUEST.code]
        assert "greater than 0" in results[2][1] and "no_such_quota" in results[3][1]
        assert describe(conn) == {tuple(alice): {"producer_byte_rate": 1024.0, "request_percentage": 50.0},
                                  (("client-id", "app"),): {"consumer_byte_rate": 4096.0}}
        assert describe(conn, [("user", 0, "alice")], strict=True) == {}
        assert list(describe(conn, [("user", 0, "alice")])) == [tuple(alice)]
        assert list(describe(conn, [("client-id", 1, None)], version=0)) == [tuple(alice)]
        assert alter(conn, [(alice, {"producer_byte_rate": None})], version=0) == [(0, None)]
        assert describe(conn, [("user", 2, None)]) == {tuple(alice): {"request_percentage": 50.0}}


def _produce_frame(topic: str, client_id: str, value_bytes: int, cid: int) -> bytes:
    batch = records.build_batch([(None, b"x" * value_bytes)])
    return encode_request("Produce", 9, produce_request(topic, {0: batch}), cid, client_id=client_id)


def test_producer_over_its_byte_rate_gets_kafkas_throttle_time_and_is_muted(server):
    _throttled_producer(server, WINDOWS, WINDOW_S, 40000.0)


@pytest.mark.server_config({"quota.window.num": 3, "quota.window.size.seconds": 2})
def test_quota_windows_are_configurable(server):
    _throttled_producer(server, 3, 2, 80000.0)


def _throttled_producer(server, windows, window_s, quota):
    with RawConn(server.bootstrap, timeout=60) as conn:
        topic = unique("quota-produce")
        create_topic(conn, topic)
        assert alter(conn, [([("client-id", "slow-producer")], {"producer_byte_rate": quota})]) == [(0, None)]
        data = _produce_frame(topic, "slow-producer", 500_000, 1)
        conn.send(data)
        r = conn.read_response("Produce", 9, 1)
        assert r.responses[0].partition_responses[0].error_code == 0
        # The first sample: the rate is counted over quota.window.num - 1 whole windows, so the throttle is exactly
        # Kafka's (rate - quota) / quota × that time for this request's size.
        size = len(data) - 4
        measured = (windows - 1) * window_s
        expected = kafka_round((size / measured - quota) / quota * measured * 1000)
        assert r.throttle_time_ms == expected > 2000
        # muted: the next request (not charged by any quota) is read only once the throttle time is over
        sent = time.monotonic()
        api = conn.request("ApiVersions", 3, req("ApiVersions", client_software_name="t", client_software_version="1"))
        assert api.error_code == 0 and api.throttle_time_ms == 0
        assert time.monotonic() - sent >= expected / 1000 / 2          # a lower bound only: slowness cannot fail it
        # another client id is not throttled
        conn.send(_produce_frame(topic, "other", 100, 2))
        assert conn.read_response("Produce", 9, 2).throttle_time_ms == 0


@pytest.mark.trireme_only("reads the broker's bytes through its own fetch; the bound is Trireme's accounting")
def test_throttled_producer_stays_near_its_quota(server):
    import confluent_kafka
    quota = 20000
    with RawConn(server.bootstrap) as conn:
        topic = unique("quota-rate")
        create_topic(conn, topic)
        assert alter(conn, [([("client-id", "bounded")], {"producer_byte_rate": float(quota)})]) == [(0, None)]
    throttles = []
    producer = confluent_kafka.Producer({
        "bootstrap.servers": server.bootstrap, "client.id": "bounded", "linger.ms": 5, "batch.size": 16384,
        "queue.buffering.max.kbytes": 256, "throttle_cb": lambda event: throttles.append(event.throttle_time)})
    value = b"v" * 100
    started = time.monotonic()
    while time.monotonic() - started < 4:
        try:
            producer.produce(topic, value)
        except BufferError:
            producer.poll(0.05)
        producer.poll(0)
    elapsed = time.monotonic() - started
    producer.purge()
    producer.flush(30)                                         # hang guard
    with RawConn(server.bootstrap) as conn:
        from compat_tests.test_bad_input import list_offset
        stored = list_offset(conn, topic, 0)
    assert throttles and max(throttles) > 0
    # what got in: at most the quota over the time it ran plus the windows a rate is measured over (the first
    # burst), and one request (16 KiB batches): a pipelined request waits out the throttle its predecessor earned
    assert stored * len(value) <= quota * (elapsed + WINDOWS * WINDOW_S) + 16384
    assert stored > 0


def test_consumer_over_its_byte_rate_gets_an_empty_throttled_answer(server):
    quota = 1000.0
    with RawConn(server.bootstrap) as conn:
        topic = unique("quota-fetch")
        create_topic(conn, topic)
        for i in range(40):                                    # 40 batches of about 1 KiB
            conn.send(_produce_frame(topic, "filler", 1000, 100 + i))
            assert conn.read_response("Produce", 9, 100 + i).throttle_time_ms == 0
        assert alter(conn, [([("client-id", "slow-consumer")], {"consumer_byte_rate": quota})]) == [(0, None)]
        cls = message("FetchRequest").cls
        tcls = cls.FetchTopic

        def fetch(offset, cid):
            request = cls(replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, isolation_level=0,
                          session_id=0, session_epoch=-1, topics=[tcls(topic=topic, partitions=[
                              tcls.FetchPartition(partition=0, fetch_offset=offset, log_start_offset=-1,
                                                  partition_max_bytes=1 << 20)])])
            conn.send(encode_request("Fetch", 11, request, cid, client_id="slow-consumer"))
            return conn.read_response("Fetch", 11, cid)

        first = fetch(0, 1)
        got = len(first.responses[0].partitions[0].records)
        # max_bytes cut to what the quota allows in quota.window.num - 1 windows (KIP-74: whole batches)
        assert 0 < got <= quota * (WINDOWS - 1) * WINDOW_S + 1100 and first.throttle_time_ms == 0
        second = fetch(1, 2)
        assert second.throttle_time_ms > 0 and second.responses == []        # KIP-219's empty throttled answer


@pytest.mark.trireme_only("restarts the broker")
def test_quotas_survive_a_restart(server):
    with RawConn(server.bootstrap) as conn:
        assert alter(conn, [([("user", None)], {"request_percentage": 25.0})]) == [(0, None)]
    server.restart()
    with RawConn(server.bootstrap) as conn:
        assert describe(conn) == {(("user", None),): {"request_percentage": 25.0}}


@pytest.mark.server_config({"connections.max.idle.ms": 2000})
def test_connection_muted_longer_than_the_idle_timeout_is_closed(server):
    """A byte-rate throttle has no bound of its own (1 KiB against 1 B/s: about 17 minutes); a connection muted
    for longer than connections.max.idle.ms is closed then, as Kafka's idle expiry closes a muted channel."""
    with RawConn(server.bootstrap, timeout=30) as conn:
        topic = unique("quota-stuck")
        create_topic(conn, topic)
        assert alter(conn, [([("client-id", "stuck")], {"producer_byte_rate": 1.0})]) == [(0, None)]
        conn.send(_produce_frame(topic, "stuck", 1000, 1))
        assert conn.read_response("Produce", 9, 1).throttle_time_ms > 600_000
        conn.send_request("ApiVersions", 3, req("ApiVersions", client_software_name="t", client_software_version="1"))
        conn.expect_closed(timeout=30)


def test_java_admin_describes_the_quotas_set(server, java_harness):
    """Kafka's own Admin.describeClientQuotas (what kafka-client-quotas.sh / kafka-configs.sh call) reads them."""
    with RawConn(server.bootstrap) as conn:
        assert alter(conn, [([("user", "alice"), ("client-id", None)], {"producer_byte_rate": 1024.0}),
                            ([("user", None)], {"request_percentage": 12.5})]) == [(0, None), (0, None)]
    java = java_harness("4.3.0")
    entries = java.ok("describe_client_quotas")["entries"]
    assert sorted((sorted(e["entity"].items(), key=str), e["values"]) for e in entries) == sorted([
        (sorted({"user": "alice", "client-id": None}.items(), key=str), {"producer_byte_rate": 1024.0}),
        ([("user", None)], {"request_percentage": 12.5})])
    assert [e["values"] for e in java.ok("describe_client_quotas", user="alice")["entries"]] == [
        {"producer_byte_rate": 1024.0}]


def test_throttled_consumer_still_reads_everything(server):
    """librdkafka takes the empty throttled answers in its stride (KIP-219) and reads every record in the end."""
    import confluent_kafka
    count, size = 400, 500                                     # 200 KB against 20 KB/s: throttled after the burst
    with RawConn(server.bootstrap) as conn:
        topic = unique("quota-consume")
        create_topic(conn, topic)
        for i in range(0, count, 50):
            batch = records.build_batch([(None, b"r" * size)] * 50)
            conn.send(encode_request("Produce", 9, produce_request(topic, {0: batch}), 100 + i, client_id="filler"))
            assert conn.read_response("Produce", 9, 100 + i).throttle_time_ms == 0
        assert alter(conn, [([("client-id", "slow-consumer")], {"consumer_byte_rate": 20000.0})]) == [(0, None)]
    throttles = []
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": server.bootstrap, "client.id": "slow-consumer", "group.id": unique("g"),
        "auto.offset.reset": "earliest", "enable.auto.commit": False, "fetch.max.bytes": 1 << 20,
        "throttle_cb": lambda event: throttles.append(event.throttle_time)})
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
        got = 0
        deadline = time.monotonic() + 60                       # hang guard
        while got < count and time.monotonic() < deadline:
            message_ = consumer.poll(0.5)
            if message_ is not None and message_.error() is None:
                got += 1
    finally:
        consumer.close()
    assert got == count
    assert throttles and max(throttles) > 0


@pytest.mark.trireme_only("a SASL_PLAINTEXT listener stand-in")
def test_user_quota_applies_to_the_authenticated_user_and_all_their_client_ids(sasl_server):
    """Precedence with real principals: /users/alice applies to alice whatever her client id (one sensor for all of
    them), not to bob; the SASL exchange itself is not charged."""
    server = sasl_server()
    quota = 40000.0
    with RawConn(server.sasl_bootstrap, timeout=60) as alice, RawConn(server.sasl_bootstrap) as bob:
        assert plain_login(alice).error_code == 0
        assert plain_login(bob, "bob", "bob-secret").error_code == 0
        topic = unique("quota-user")
        create_topic(alice, topic)
        assert alter(alice, [([("user", "alice")], {"producer_byte_rate": quota}),
                             ([("user", None)], {"producer_byte_rate": 10 ** 9})]) == [(0, None), (0, None)]
        data = _produce_frame(topic, "first-client-id", 300_000, 1)
        alice.send(data)
        first = alice.read_response("Produce", 9, 1).throttle_time_ms
        assert first == 0                                           # 30 KB/s over 10 s: within 40 KB/s
        alice.send(_produce_frame(topic, "second-client-id", 300_000, 2))
        second = alice.read_response("Produce", 9, 2)
        # throttled although this client id alone is within: both requests are in alice's one sensor, whose rate
        # is (600 KB) / (10 s + the time between them), so the throttle is at most 600 KB / 40 KB/s - 10 s
        total = len(data) - 4 + len(_produce_frame(topic, "second-client-id", 300_000, 2)) - 4
        assert 0 < second.throttle_time_ms <= kafka_round(total / quota * 1000 - 10_000)
        bob.send(_produce_frame(topic, "first-client-id", 300_000, 3))
        assert bob.read_response("Produce", 9, 3).throttle_time_ms == 0     # bob: the default user's high quota
