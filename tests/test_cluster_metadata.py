"""The cluster metadata coordinator and its sections: record framing, replay, compaction, SCRAM credentials and --add-scram, and the service on a real data directory (durable, replayed at start-up, compacted)."""
from __future__ import annotations

import base64
import hashlib
import hmac

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker_runner import run_with_broker
from trireme.server.broker import Broker
from trireme.server.cluster_metadata import CLUSTER_METADATA_TOPIC
from trireme.server.config import Config
from trireme.server.startup import StartupError
from trireme.state.acls import AclBinding, AclFilter, Authorizer, Operation, PatternType, Permission, ResourceType
from trireme.state.cluster_metadata import (ACCESS_CONTROL_ENTRY, AclRecords, ClusterMetadata, acl_record,
                                            acl_tombstone, encode_key, record_type)
from trireme.state.coordinator_records import RecordError
from trireme.state.scram_credentials import (SCRAM_SHA_256, SCRAM_SHA_512, AddScramError, ScramCredentials,
                                             credential, parse_add_scram, salted_password, scram_record,
                                             scram_tombstone)
from trireme.wire.codec import message

ALICE = "User:alice"


def binding(name="t", op=Operation.READ, perm=Permission.ALLOW, pattern=PatternType.LITERAL):
    return AclBinding(ResourceType.TOPIC, name, pattern, ALICE, "*", op, perm)


def coordinator(max_acls=100):
    authorizer = Authorizer()
    acls = AclRecords(authorizer, max_acls)
    scram = ScramCredentials()
    return ClusterMetadata([acls, scram]), acls, scram, authorizer


# --- framing and replay ----------------------------------------------------------------------

def test_key_starts_with_its_record_type():
    key, value = acl_record(binding())
    assert record_type(key) == ACCESS_CONTROL_ENTRY == 23
    assert value[:2] == b"\x00\x00"                       # value version 0
    assert record_type(scram_record("u", SCRAM_SHA_256, credential(SCRAM_SHA_256, b"s", b"x" * 32, 4096))[0]) == 11


def test_replay_adds_and_tombstone_removes():
    meta, _, _, authorizer = coordinator()
    b = binding()
    meta.replay(*acl_record(b))
    assert authorizer.authorize(ALICE, "h", Operation.READ, ResourceType.TOPIC, "t")
    meta.replay(*acl_tombstone(b))
    assert not authorizer.authorize(ALICE, "h", Operation.READ, ResourceType.TOPIC, "t")
    meta.replay(*acl_tombstone(b))                       # a tombstone for nothing: no error
    assert len(authorizer) == 0


def test_unreadable_records_are_skipped_and_counted():
    meta, _, _, authorizer = coordinator()
    meta.replay(b"\x00", b"")                             # shorter than a record type
    meta.replay(b"\x00\x17\xff", b"\x00\x00")             # type 23 with a truncated key
    meta.replay(*acl_record(binding(name="")))            # decodes, but not a valid binding
    assert meta.unreadable == 3 and len(authorizer) == 0


def test_unknown_record_types_survive_compaction():
    meta, _, _, _ = coordinator()
    meta.replay(b"\x00\x63abc", b"\x00\x00xyz")
    meta.replay(b"\x00\x63gone", b"\x00\x00")
    meta.replay(b"\x00\x63gone", None)
    assert (b"\x00\x63abc", b"\x00\x00xyz") in meta.compact_records()
    assert all(k != b"\x00\x63gone" for k, _ in meta.compact_records())


def test_two_sections_cannot_own_a_type():
    meta, _, _, _ = coordinator()
    with pytest.raises(ValueError):
        meta.register(ScramCredentials())


OPS = st.lists(st.tuples(st.booleans(), st.sampled_from(["a", "b", "c"]),
                         st.sampled_from([Operation.READ, Operation.WRITE]),
                         st.sampled_from([PatternType.LITERAL, PatternType.PREFIXED])), max_size=30)


@settings(max_examples=100, deadline=None)
@given(OPS, st.lists(st.tuples(st.booleans(), st.sampled_from(["u", "v"]), st.sampled_from([1, 2])), max_size=10))
def test_compacted_records_rebuild_the_same_state(acl_ops, scram_ops):
    meta, _, scram, authorizer = coordinator()
    for add, name, op, pattern in acl_ops:
        b = binding(name, op, pattern=pattern)
        meta.replay(*(acl_record(b) if add else acl_tombstone(b)))
    for add, user, mech in scram_ops:
        c = credential(mech, b"salt", salted_password(mech, "pw", b"salt", 4096), 4096)
        meta.replay(*(scram_record(user, mech, c) if add else scram_tombstone(user, mech)))
    again, _, scram2, authorizer2 = coordinator()
    for key, value in meta.compact_records():
        again.replay(key, value)
    assert set(authorizer2.bindings()) == set(authorizer.bindings())
    assert sorted(scram2.live_records()) == sorted(scram.live_records())


# --- ACL decisions ---------------------------------------------------------------------------

def test_create_validates_dedupes_and_bounds():
    meta, acls, _, authorizer = coordinator(max_acls=2)
    meta.replay(*acl_record(binding("x")))
    records, results = acls.create([binding("t"), binding("t"), binding(""), binding("x"), binding("u")])
    assert results[0] is None and results[1] is None and results[3] is None
    assert results[2][0] == "INVALID_REQUEST"
    assert results[4][0] == "POLICY_VIOLATION"
    assert records == [acl_record(binding("t"))]


def test_delete_lists_per_filter_and_removes_once():
    meta, acls, _, _ = coordinator()
    for name in ("t", "u"):
        meta.replay(*acl_record(binding(name)))
    any_topic = AclFilter(ResourceType.TOPIC, None, PatternType.ANY, None, None, Operation.ANY, Permission.ANY)
    just_t = AclFilter(ResourceType.TOPIC, "t", PatternType.ANY, None, None, Operation.ANY, Permission.ANY)
    bad = AclFilter(ResourceType.UNKNOWN, None, PatternType.ANY, None, None, Operation.ANY, Permission.ANY)
    records, results = acls.delete([any_topic, just_t, bad])
    assert set(results[0]) == {binding("t"), binding("u")} and results[1] == [binding("t")]
    assert results[2][0] == "INVALID_REQUEST"
    assert sorted(records) == sorted([acl_tombstone(binding("t")), acl_tombstone(binding("u"))])


# --- SCRAM -----------------------------------------------------------------------------------

def rfc_keys(digest, password, salt, iterations):
    """RFC 5802 written out independently of the module."""
    salted = hashlib.pbkdf2_hmac(digest, password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", digest).digest()
    return salted, hashlib.new(digest, client_key).digest(), hmac.new(salted, b"Server Key", digest).digest()


def test_credential_matches_rfc_5802_and_scramp():
    salt = b"0123456789abcdef"
    salted, stored, server = rfc_keys("sha512", "secret", salt, 4096)
    c = credential(SCRAM_SHA_512, salt, salted_password(SCRAM_SHA_512, "secret", salt, 4096), 4096)
    assert (c.salt, c.stored_key, c.server_key, c.iterations) == (salt, stored, server, 4096)
    import scramp
    assert scramp.ScramMechanism("SCRAM-SHA-512").make_auth_info("secret", iteration_count=4096, salt=salt) == \
        tuple(c)


def upsert(user, mech=SCRAM_SHA_256, iterations=4096, salt=b"salt", password="pw"):
    return user, mech, iterations, salt, salted_password(mech if mech in (1, 2) else 1, password, salt, iterations)


def test_alter_validation_in_kafka_order():
    meta, _, scram, _ = coordinator()
    records, results = scram.alter(
        deletions=[("gone", SCRAM_SHA_256), ("gone2", SCRAM_SHA_256)],
        upsertions=[upsert("alice"), upsert("dup"), upsert("dup", SCRAM_SHA_512), upsert("gone2"), upsert(""),
                    upsert("weird", mech=3), upsert("few", iterations=4095), upsert("many", iterations=16385),
                    upsert("max", iterations=16384)])
    got = {r.user: r.error for r in results}
    assert [r.user for r in results] == ["gone", "gone2", "alice", "dup", "", "weird", "few", "many", "max"]
    # a user's first error stands (Kafka skips a user with one): gone2 is not found, not a duplicate
    assert got == {"gone": "RESOURCE_NOT_FOUND", "gone2": "RESOURCE_NOT_FOUND", "dup": "DUPLICATE_RESOURCE",
                   "alice": None,
                   "": "UNACCEPTABLE_CREDENTIAL", "weird": "UNSUPPORTED_SASL_MECHANISM",
                   "few": "UNACCEPTABLE_CREDENTIAL", "many": "UNACCEPTABLE_CREDENTIAL", "max": None}
    for r in records:
        meta.replay(*r)
    assert scram.get("alice", "SCRAM-SHA-256").iterations == 4096 and scram.get("max", 1).iterations == 16384
    assert scram.get("alice", "SCRAM-SHA-512") is None and scram.get("dup", 2) is None
    records, results = scram.alter([("alice", SCRAM_SHA_256)], [])
    assert results[0].error is None
    for r in records:
        meta.replay(*r)
    assert scram.get("alice", 1) is None


def test_describe():
    meta, _, scram, _ = coordinator()
    for r in scram.alter([], [upsert("a"), upsert("b", SCRAM_SHA_512, 8192)])[0]:
        meta.replay(*r)
    for r in scram.alter([], [upsert("a", SCRAM_SHA_512, 5000)])[0]:
        meta.replay(*r)
    everyone = {r.user: r.credentials for r in scram.describe(None)}
    assert everyone == {"a": ((1, 4096), (2, 5000)), "b": ((2, 8192),)}
    assert scram.describe([]) == scram.describe(None)
    named = scram.describe(["b", "x", "a", "a"])
    assert [(r.user, r.error) for r in named] == [("b", None), ("x", "RESOURCE_NOT_FOUND"), ("a", "DUPLICATE_RESOURCE")]


def test_credential_count_is_bounded():
    scram = ScramCredentials(max_credentials=1)
    meta2 = ClusterMetadata([scram])
    for r in scram.alter([], [upsert("a")])[0]:
        meta2.replay(*r)
    records, results = scram.alter([], [upsert("b"), upsert("a", password="new")])
    assert [(r.user, r.error) for r in results] == [("b", "UNACCEPTABLE_CREDENTIAL"), ("a", None)]


def test_parse_add_scram_forms():
    salt = base64.b64encode(b"NaCl").decode()
    salted = base64.b64encode(b"x" * 64).decode()
    entries = parse_add_scram(f'SCRAM-SHA-512=[name=admin,password=secret] ; '
                              f'SCRAM-SHA-256=[name="bob",iterations=8192,salt="{salt}",saltedpassword="{salted}"];'
                              f'SCRAM-SHA-256=[name=carol,password="p=w",salt={salt}]')
    assert [(e.mechanism, e.user, e.iterations) for e in entries] == [(2, "admin", 4096), (1, "bob", 8192),
                                                                       (1, "carol", 4096)]
    assert entries[0].password == "secret" and entries[0].salt is None
    assert entries[1].salted_password == b"x" * 64 and entries[1].salt == b"NaCl"
    assert entries[2].password == "p=w"
    assert "secret" not in repr(entries)
    assert parse_add_scram("") == []


@pytest.mark.parametrize("text", [
    "SCRAM-SHA-1=[name=a,password=b]", "SCRAM-SHA-256", "SCRAM-SHA-256=name=a", "SCRAM-SHA-256=[password=b]",
    "SCRAM-SHA-256=[name=a]", "SCRAM-SHA-256=[name=a,saltedpassword=eHg=]", "SCRAM-SHA-256=[name=a,password=b,x=1]",
    "SCRAM-SHA-256=[name=a,password=b,iterations=100]", "SCRAM-SHA-256=[name=a,password=b,iterations=99999]",
    "SCRAM-SHA-256=[name=a,password=b,iterations=many]", "SCRAM-SHA-256=[name=a,password=b,salt=%%%]",
    "SCRAM-SHA-256=[name=a,hunter2]"])
def test_parse_add_scram_refusals_never_show_the_password(text):
    with pytest.raises(AddScramError) as refused:
        parse_add_scram(text)
    assert "hunter2" not in str(refused.value) and "password=b" not in str(refused.value)


# --- the service on a data directory ---------------------------------------------------------

def make_broker(path, **props):
    config = Config(data_dir=str(path))
    config.update({"authorizer.class.name": "trireme", **props})
    return Broker(config)


def test_acls_and_credentials_survive_restart_and_compaction(tmp_path):
    broker = make_broker(tmp_path)
    security = broker.security

    async def body(b):
        for i in range(700):
            await security.update(lambda: security.acls.create([binding(f"t{i % 3}", Operation.WRITE)]))
            b_ = binding(f"churn{i}")
            await security.write([acl_record(b_)])
            await security.write([acl_tombstone(b_)])
        await security.update(lambda: security.scram.alter([], [upsert("alice", SCRAM_SHA_512)]))
    run_with_broker(broker, body)
    end = broker.cluster_metadata.partition.log.log_end_offset
    assert end == 1 + 3 + 1400 + 1                 # the first: the new data directory's feature level
    broker.close()

    again = make_broker(tmp_path)
    log = again.cluster_metadata.partition.log
    assert log.log_start_offset == end and log.log_end_offset == end + 5      # compacted to the live records
    assert sorted(b.name for b in again.security.authorizer.bindings()) == ["t0", "t1", "t2"]
    assert again.security.authorize(ALICE, "h", Operation.WRITE, ResourceType.TOPIC, "t1")
    assert not again.security.authorize(ALICE, "h", Operation.WRITE, ResourceType.TOPIC, "t3")
    assert again.security.scram_credential("alice", "SCRAM-SHA-512").iterations == 4096
    again.close()


def test_cluster_metadata_is_hidden_and_internal(tmp_path):
    broker = make_broker(tmp_path)
    assert broker.partition(CLUSTER_METADATA_TOPIC, 0) is None
    assert CLUSTER_METADATA_TOPIC not in broker.internal_topics
    assert CLUSTER_METADATA_TOPIC not in [t.name for t in broker.described_topics()]
    assert (CLUSTER_METADATA_TOPIC, 0) in broker.partitions                        # flushed like the others
    assert broker.cluster_metadata.partition.topic.is_internal                     # no retention
    broker.close()


def test_add_scram_applies_to_a_new_data_directory_only(tmp_path, caplog):
    caplog.set_level("INFO")
    text = "SCRAM-SHA-512=[name=admin,password=hunter2];SCRAM-SHA-256=[name=admin,password=hunter2,iterations=8192]"
    broker = make_broker(tmp_path, **{"trireme.storage.add.scram": text})
    admin = broker.security.scram_credential("admin", "SCRAM-SHA-512")
    salted, stored, server = rfc_keys("sha512", "hunter2", admin.salt, 4096)
    assert (admin.stored_key, admin.server_key) == (stored, server) and len(admin.salt) == 32
    assert broker.security.scram_credential("admin", "SCRAM-SHA-256").iterations == 8192
    broker.close()
    assert "hunter2" not in caplog.text and "admin" in caplog.text

    again = make_broker(tmp_path, **{"trireme.storage.add.scram": "SCRAM-SHA-512=[name=other,password=x]"})
    assert again.security.scram_credential("other", "SCRAM-SHA-512") is None         # not new: ignored
    assert again.security.scram_credential("admin", "SCRAM-SHA-512") == admin         # durable
    again.close()


def test_bad_settings_refuse_to_start(tmp_path):
    with pytest.raises(StartupError, match="authorizer.class.name"):
        make_broker(tmp_path / "a", **{"authorizer.class.name": "kafka.security.auth.SimpleAclAuthorizer"})
    with pytest.raises(StartupError) as refused:
        make_broker(tmp_path / "b", **{"trireme.storage.add.scram": "SCRAM-SHA-512=[name=a,hunter2]"})
    assert "hunter2" not in str(refused.value)


def test_record_type_errors_are_record_errors():
    with pytest.raises(RecordError):
        record_type(b"")
    key = encode_key(7, "UserScramCredentialKey", message("UserScramCredentialKey").cls(name="u", mechanism=1))
    assert record_type(key) == 7


def test_add_scram_applies_only_while_the_metadata_log_is_empty(tmp_path):
    """"New" is the metadata log never written: a first start writes its feature levels (and the users) in one
    durable batch, so a later start's users are not applied (as Kafka's format-time --add-scram)."""
    setting = {"trireme.storage.add.scram": "SCRAM-SHA-256=[name=late,password=x]"}
    make_broker(tmp_path / "a").close()
    broker = make_broker(tmp_path / "a", **setting)
    assert broker.security.scram_credential("late", "SCRAM-SHA-256") is None
    broker.close()
    broker = make_broker(tmp_path / "b", **setting)
    assert broker.security.scram_credential("late", "SCRAM-SHA-256") is not None
    broker.close()
