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

def test_denied_counters_are_bounded_whatever_names_clients_send():
    """One Produce of 20,000 made-up topic names from a principal allowed nothing: each name is refused
    (TOPIC_AUTHORIZATION_FAILED, as Kafka) but must not leave 20,000 label sets in the broker's memory for ever
    (Kafka keeps no per-resource denial metric; the quota sensors here stop at MAX_SENSORS = 10,000).  The bound:
    MAX_SECURITY_KEYS keys of their own, then one "(other)" key per API and resource type (names of the broker's,
    not the client's), every denial still counted; and each name in a key is cut to MAX_LABEL_CHARS."""
    from trireme.server.metrics import MAX_LABEL_CHARS, MAX_SECURITY_KEYS, OTHER
    broker = secured_broker()
    names = [f"made-up-{i:05d}-" + "x" * 400 for i in range(20_000)]
    request = PR(transactional_id=None, acks=1, timeout_ms=1000, topic_data=[
        PR.TopicProduceData(name=n, partition_data=[PR.TopicProduceData.PartitionProduceData(index=0, records=None)])
        for n in names])

    async def body(b):
        r = await call_as(b, "Produce", 9, request)
        assert {p.error_code for t in r.responses for p in t.partition_responses} == \
            {E.TOPIC_AUTHORIZATION_FAILED.code}
        denied = b.metrics.denied
        own = [k for k in denied if k[0] != OTHER]
        assert len(own) <= MAX_SECURITY_KEYS, len(own)
        assert set(denied) - set(own) == {(OTHER, "Produce", "TOPIC", OTHER)}
        assert sum(denied.values()) == len(names)
        assert max(len(k[3]) for k in own) <= MAX_LABEL_CHARS + 3
    run_with_broker(broker, body)


def test_throttle_counters_are_bounded_whatever_client_ids_clients_send():
    """A default client-id quota (kafka-configs --entity-default --entity-type clients) throttles each new client
    id; 20,000 made-up client ids must not leave 20,000 label sets for ever (the quota sensors themselves stop at
    server/quotas.py's MAX_SENSORS, and Kafka expires its per-client-id sensors after an hour idle)."""
    import types

    import trio

    from trireme.server.metrics import Metrics
    from trireme.server.quotas import ClientQuotaManager
    from trireme.state.client_quotas import CLIENT_ID, ClientQuotas
    quotas = ClientQuotas()
    results, records = quotas.alter([([(CLIENT_ID, None)], [("producer_byte_rate", 1, False)])])
    assert results == [(None, None)]
    for k, v in records:
        quotas.replay(k, v)
    metrics = Metrics()
    manager = ClientQuotaManager({"quota.window.num": 11, "quota.window.size.seconds": 1}, quotas, metrics,
                                 clock=lambda: 0)
    answer = message("ProduceResponse").cls

    async def run():
        for i in range(20_000):
            conn = types.SimpleNamespace(principal="User:ANONYMOUS", throttled_until=0.0)
            r = manager.charge(conn, "Produce", 9, f"made-up-{i}", 10_000, 0.0, answer(responses=[],
                                                                                       throttle_time_ms=0))
            assert r.throttle_time_ms > 0
    trio.run(run)
    assert len(metrics.throttled) <= 10_000, len(metrics.throttled)


# --- finding 4: the PLAIN credentials file tells which users exist -------------------------------------------------

def test_unknown_plain_user_costs_the_same_password_check_as_a_known_one(tmp_path, monkeypatch):
    """A wrong password for a user in trireme.sasl.plain.credentials.file costs one PBKDF2 of the file's iterations;
    a user name not in the file must cost the same (a dummy hash), or the answer's delay tells an unauthenticated
    client which names exist (the same failure message for both is not enough).  Counted, not timed."""
    import hashlib

    import trio

    from trireme.server import plain_credentials
    from trireme.server.sasl_mechanisms import PlainServer, SaslFailure
    path = tmp_path / "plain.credentials"
    path.write_text("alice:" + plain_credentials.hash_password("alice-secret", 20_000) + "\n")
    calls = []
    real = hashlib.pbkdf2_hmac
    monkeypatch.setattr(hashlib, "pbkdf2_hmac", lambda *a: calls.append(a[3]) or real(*a))
    credentials = plain_credentials.CredentialsFile(str(path))

    def attempt(user):
        calls.clear()
        with pytest.raises(SaslFailure):
            trio.run(PlainServer({}, credentials).evaluate, f"\0{user}\0guess".encode())
        return list(calls)
    assert attempt("alice") == [20_000]
    assert attempt("mallory") == [20_000]


# --- finding 6 (fixed): ACL hosts compared with the client's address as Java writes it --------------------------------

@pytest.mark.parametrize("python, java", [
    ("127.0.0.1", "127.0.0.1"),
    ("::1", "0:0:0:0:0:0:0:1"),
    ("2001:db8::1", "2001:db8:0:0:0:0:0:1"),
    ("2001:DB8:0:0:1::a", "2001:db8:0:0:1:0:0:a"),
    ("::ffff:10.1.2.3", "10.1.2.3"),             # Java makes an IPv4-mapped address an Inet4Address
    ("fe80::1%eth0", "fe80:0:0:0:0:0:0:1%eth0"),
])
def test_java_host_address(python, java):
    from trireme.server.security import java_host_address
    assert java_host_address(python) == java


def test_a_deny_for_the_java_form_of_an_ipv6_host_applies():
    """Kafka's StandardAuthorizerData.findResult compares acl.host() with clientAddress().getHostAddress()."""
    from trireme.state.acls import AclBinding, Operation, PatternType, Permission, ResourceType
    broker = secured_broker()
    security = broker.security
    for host, permission in (("*", Permission.ALLOW), ("0:0:0:0:0:0:0:1", Permission.DENY)):
        security.authorizer.add(AclBinding(ResourceType.TOPIC, "t", PatternType.LITERAL, "User:alice", host,
                                           Operation.READ, permission))
    assert security.authorize("User:alice", "127.0.0.1", Operation.READ, ResourceType.TOPIC, "t")
    assert not security.authorize("User:alice", "::1", Operation.READ, ResourceType.TOPIC, "t")


# --- finding 7 (fixed): ACL and SCRAM change log lines could be forged with a newline --------------------------------

def test_acl_and_scram_change_log_lines_cannot_be_forged(caplog):
    """CreateAcls / DeleteAcls / AlterUserScramCredentials log the binding, the user names and who asked; a resource
    name, principal or user name holding a newline (Kafka accepts any string there) must not start a log line of its
    own that reads like the broker's."""
    import hashlib
    import logging
    forged = "x\n2026-01-01 00:00:00,000 WARNING trireme.security forged"
    broker = secured_broker(**{"super.users": "User:alice"})
    ca, da = message("CreateAclsRequest").cls, message("DeleteAclsRequest").cls
    us = message("AlterUserScramCredentialsRequest").cls

    async def body(b):
        r = await call_as(b, "CreateAcls", 3, ca(creations=[ca.AclCreation(
            resource_type=2, resource_name=forged, resource_pattern_type=3, principal="User:" + forged, host="*",
            operation=3, permission_type=3)]))
        assert [x.error_code for x in r.results] == [0]
        r = await call_as(b, "DeleteAcls", 3, da(filters=[da.DeleteAclsFilter(
            resource_type_filter=1, resource_name_filter=None, pattern_type_filter=1, principal_filter=None,
            host_filter=None, operation=1, permission_type=1)]))
        assert [len(f.matching_acls) for f in r.filter_results] == [1]
        r = await call_as(b, "AlterUserScramCredentials", 0, us(deletions=[], upsertions=[us.ScramCredentialUpsertion(
            name=forged, mechanism=1, iterations=4096, salt=b"salt", salted_password=hashlib.sha256(b"x").digest())]))
        assert [x.error_code for x in r.results] == [0]
    with caplog.at_level(logging.INFO, logger="trireme.security"):
        run_with_broker(broker, body)
    lines = [r.getMessage() for r in caplog.records if r.name == "trireme.security"]
    assert len(lines) >= 3 and all("forged" in line for line in lines[-3:]), lines
    assert not any("\n" in line for line in lines), lines
