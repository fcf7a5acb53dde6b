"""Security review of issue 21, handler level: findings whose deciding code is reached by one request and best seen
in the broker's own state (tests/acl_matrix.py's call_as sends a request as a network client would, with the real
Security and authorizer).  Each is xfail(strict) while its finding is open; compat_tests/test_security_review.py has
the real-server ones."""
from __future__ import annotations

import pytest

from acl_matrix import call_as
from broker_runner import run_with_broker
from trireme.server.broker import Broker
from trireme.server.config import Config
from trireme.state.storage import MemoryStorage
from trireme.wire import error_codes as E
from trireme.wire.codec import message

PR = message("ProduceRequest").cls


def secured_broker(**props) -> Broker:
    """An in-memory broker with Kafka's authorizer on and no ACLs: User:alice may do nothing."""
    config = Config(data_dir="/security-review")
    config.set("authorizer.class.name", "org.apache.kafka.metadata.authorizer.StandardAuthorizer")
    for name, value in props.items():
        config.set(name, value)
    return Broker(config, MemoryStorage())


# --- finding 2: per-resource denial counters grow with names the client makes up -------------------------------------

@pytest.mark.xfail(strict=True, reason="review finding 2: metrics.request_denied keeps one counter per (principal, "
                                       "api, resource type, resource NAME) forever; names are the client's")
def test_denied_counters_are_bounded_whatever_names_clients_send():
    """One Produce of 20,000 made-up topic names from a principal allowed nothing: each name is refused
    (TOPIC_AUTHORIZATION_FAILED, as Kafka) but must not leave 20,000 label sets in the broker's memory for ever
    (Kafka keeps no per-resource denial metric; the quota sensors here stop at MAX_SENSORS = 10,000)."""
    broker = secured_broker()
    names = [f"made-up-{i:05d}-" + "x" * 200 for i in range(20_000)]
    request = PR(transactional_id=None, acks=1, timeout_ms=1000, topic_data=[
        PR.TopicProduceData(name=n, partition_data=[PR.TopicProduceData.PartitionProduceData(index=0, records=None)])
        for n in names])

    async def body(b):
        r = await call_as(b, "Produce", 9, request)
        assert {p.error_code for t in r.responses for p in t.partition_responses} == \
            {E.TOPIC_AUTHORIZATION_FAILED.code}
        assert len(b.metrics.denied) <= 10_000, len(b.metrics.denied)
    run_with_broker(broker, body)
