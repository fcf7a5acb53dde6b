"""Unit tests of the authorizer's decisions (Kafka's StandardAuthorizer semantics), its filters and authorizeByResourceType.

Examples are worked from Kafka 4's StandardAuthorizerData and Authorizer.authorizeByResourceType; the
property tests check the rules (DENY wins, implied operations, prefix matching, the decision cache)
against a plain restatement of them over random bindings.
"""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trireme.state.acls import (CLUSTER_NAME, AclBinding, AclFilter, Authorizer, Operation, PatternType, Permission,
                                ResourceType, creation_error, parse_super_users)

T, G, C, TX = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER, ResourceType.TRANSACTIONAL_ID
LIT, PRE = PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = Permission.ALLOW, Permission.DENY
O = Operation
ALICE, BOB = "User:alice", "User:bob"
HOST = "10.0.0.1"


def acl(name, op, perm=ALLOW, *, rtype=T, pattern=LIT, principal=ALICE, host="*"):
    return AclBinding(rtype, name, pattern, principal, host, op, perm)


def authorizer(*bindings, super_users="", allow_if_no_acl=False):
    a = Authorizer(parse_super_users(super_users), allow_if_no_acl)
    for b in bindings:
        a.add(b)
    return a


def ok(a, op, name, *, rtype=T, principal=ALICE, host=HOST):
    return a.authorize(principal, host, op, rtype, name)


# --- examples --------------------------------------------------------------------------------

def test_no_acls_denies_by_default_and_allows_with_allow_everyone():
    assert not ok(authorizer(), O.READ, "t")
    assert ok(authorizer(allow_if_no_acl=True), O.READ, "t")


def test_allow_everyone_applies_only_when_no_acl_is_on_the_resource():
    # an ACL for bob on the topic: alice gets no default allow any more (Kafka: hasResourceAcls)
    a = authorizer(acl("t", O.READ, principal=BOB), allow_if_no_acl=True)
    assert not ok(a, O.READ, "t")
    assert ok(a, O.READ, "other")                   # nothing on this one
    # an ACL on another resource type does not count
    assert ok(authorizer(acl("t", O.READ, rtype=G), allow_if_no_acl=True), O.READ, "t")


def test_literal_exact_and_wildcard():
    a = authorizer(acl("t", O.READ))
    assert ok(a, O.READ, "t") and not ok(a, O.READ, "t2") and not ok(a, O.READ, "x")
    a = authorizer(acl("*", O.WRITE))
    assert ok(a, O.WRITE, "anything") and ok(a, O.WRITE, "*")


def test_prefixed():
    a = authorizer(acl("orders-", O.READ, pattern=PRE))
    assert ok(a, O.READ, "orders-eu") and ok(a, O.READ, "orders-")
    assert not ok(a, O.READ, "orders") and not ok(a, O.READ, "order-eu")
    # a PREFIXED "*" is a prefix like any other, not a wildcard
    a = authorizer(acl("*", O.READ, pattern=PRE))
    assert not ok(a, O.READ, "t") and ok(a, O.READ, "*t")


def test_literal_name_that_is_a_prefix_does_not_match():
    assert not ok(authorizer(acl("foo", O.READ)), O.READ, "foobar")


def test_principal_exact_or_user_wildcard():
    a = authorizer(acl("t", O.READ, principal="User:*"))
    assert ok(a, O.READ, "t", principal=BOB)
    assert not ok(authorizer(acl("t", O.READ, principal=BOB)), O.READ, "t")
    # only User:* is a wildcard
    assert not ok(authorizer(acl("t", O.READ, principal="Group:*")), O.READ, "t")


def test_host_exact_or_wildcard():
    assert ok(authorizer(acl("t", O.READ, host=HOST)), O.READ, "t")
    assert not ok(authorizer(acl("t", O.READ, host="10.0.0.2")), O.READ, "t")


@pytest.mark.parametrize("granted", [O.READ, O.WRITE, O.DELETE, O.ALTER, O.DESCRIBE, O.ALL])
def test_describe_implied_by_allow(granted):
    assert ok(authorizer(acl("t", granted)), O.DESCRIBE, "t")


@pytest.mark.parametrize("granted", [O.CREATE, O.ALTER_CONFIGS, O.DESCRIBE_CONFIGS, O.IDEMPOTENT_WRITE])
def test_describe_not_implied(granted):
    assert not ok(authorizer(acl("t", granted)), O.DESCRIBE, "t")


def test_describe_configs_implied_by_alter_configs_only():
    assert ok(authorizer(acl("t", O.ALTER_CONFIGS)), O.DESCRIBE_CONFIGS, "t")
    assert not ok(authorizer(acl("t", O.ALTER)), O.DESCRIBE_CONFIGS, "t")
    assert not ok(authorizer(acl("t", O.DESCRIBE_CONFIGS)), O.ALTER_CONFIGS, "t")


def test_implication_only_for_allow():
    # DENY READ does not deny DESCRIBE; DENY ALL denies everything
    a = authorizer(acl("t", O.DESCRIBE), acl("t", O.READ, DENY))
    assert ok(a, O.DESCRIBE, "t") and not ok(a, O.READ, "t")
    assert not ok(authorizer(acl("t", O.ALL), acl("t", O.ALL, DENY)), O.DESCRIBE, "t")


def test_read_does_not_imply_write():
    assert not ok(authorizer(acl("t", O.READ)), O.WRITE, "t")


def test_deny_wins_across_patterns():
    a = authorizer(acl("t", O.READ), acl("*", O.READ, DENY))
    assert not ok(a, O.READ, "t")
    a = authorizer(acl("*", O.ALL), acl("secret-", O.READ, DENY, pattern=PRE))
    assert not ok(a, O.READ, "secret-x") and ok(a, O.READ, "public") and ok(a, O.WRITE, "secret-x")
    a = authorizer(acl("t", O.READ, principal="User:*"), acl("t", O.READ, DENY, host=HOST))
    assert not ok(a, O.READ, "t") and ok(a, O.READ, "t", host="10.0.0.9")


def test_super_users_pass_deny():
    a = authorizer(acl("t", O.ALL, DENY, principal="User:*"), super_users=" User:admin ; User:broker ")
    assert ok(a, O.WRITE, "t", principal="User:admin") and ok(a, O.WRITE, "t", principal="User:broker")
    assert not ok(a, O.WRITE, "t")


def test_cluster_resource():
    a = authorizer(acl(CLUSTER_NAME, O.ALTER, rtype=C))
    assert ok(a, O.ALTER, CLUSTER_NAME, rtype=C) and ok(a, O.DESCRIBE, CLUSTER_NAME, rtype=C)
    assert not ok(a, O.ALTER, CLUSTER_NAME, rtype=T)


def test_cache_dropped_on_change():
    a = authorizer()
    assert not ok(a, O.READ, "t")
    b = acl("t", O.READ)
    a.add(b)
    assert ok(a, O.READ, "t")
    a.remove(b)
    assert not ok(a, O.READ, "t")
    a.add(acl("t", O.READ, pattern=PRE))
    assert ok(a, O.READ, "t") and ok(a, O.READ, "tt")


def test_add_and_remove_report_change():
    a = authorizer()
    b = acl("t", O.READ, pattern=PRE)
    assert a.add(b) and not a.add(b) and len(a) == 1
    assert a.remove(b) and not a.remove(b) and len(a) == 0
    assert not ok(a, O.READ, "t")


# --- authorizeByResourceType -----------------------------------------------------------------

def by_type(a, op=O.WRITE, rtype=T, principal=ALICE):
    return a.authorize_by_resource_type(principal, HOST, op, rtype)


def test_by_type_examples():
    assert not by_type(authorizer())
    assert by_type(authorizer(allow_if_no_acl=True))                  # the "hardcode" resource has no ACLs
    assert by_type(authorizer(super_users="User:alice"))
    assert by_type(authorizer(acl("t", O.WRITE)))
    assert not by_type(authorizer(acl("t", O.READ)))                  # no implication here
    assert by_type(authorizer(acl("t", O.ALL)))
    assert not by_type(authorizer(acl("t", O.WRITE), acl("t", O.WRITE, DENY)))
    assert not by_type(authorizer(acl("t", O.WRITE), acl("*", O.WRITE, DENY)))
    assert by_type(authorizer(acl("*", O.WRITE)))
    assert not by_type(authorizer(acl("abc", O.WRITE, pattern=PRE), acl("ab", O.WRITE, DENY, pattern=PRE)))
    assert by_type(authorizer(acl("abc", O.WRITE, pattern=PRE), acl("abd", O.WRITE, DENY, pattern=PRE)))
    # a LITERAL deny only cancels the same LITERAL allow
    assert by_type(authorizer(acl("abc", O.WRITE, pattern=PRE), acl("abc", O.WRITE, DENY)))
    assert not by_type(authorizer(acl("t", O.WRITE, host="10.9.9.9")))
    assert by_type(authorizer(acl("t", O.WRITE, principal="User:*")))
    assert not by_type(authorizer(acl("t", O.WRITE, rtype=G)))


def test_by_type_refuses_any():
    with pytest.raises(ValueError):
        by_type(authorizer(), op=O.ANY)
    with pytest.raises(ValueError):
        by_type(authorizer(), rtype=ResourceType.ANY)


def test_by_type_super_user_passes_wildcard_deny():
    a = authorizer(acl("*", O.WRITE, DENY, principal="User:*"), super_users="User:alice")
    assert by_type(a) and not by_type(a, principal=BOB)


# --- filters ---------------------------------------------------------------------------------

def flt(rtype=ResourceType.ANY, name=None, pattern=PatternType.ANY, principal=None, host=None, op=O.ANY,
        perm=Permission.ANY):
    return AclFilter(rtype, name, pattern, principal, host, op, perm)


def test_filter_any_and_exact():
    bs = [acl("t", O.READ), acl("t", O.READ, pattern=PRE), acl("*", O.WRITE), acl("g", O.READ, rtype=G)]
    a = authorizer(*bs)
    assert set(a.acls(flt())) == set(bs)
    assert set(a.acls(flt(T))) == set(bs[:3])
    assert set(a.acls(flt(T, "t"))) == set(bs[:2])                 # ANY pattern: exact name, either type
    assert a.acls(flt(T, "t", LIT)) == [bs[0]]
    assert a.acls(flt(T, "t", PRE)) == [bs[1]]
    assert a.acls(flt(op=O.WRITE)) == [bs[2]]
    assert a.acls(flt(principal=BOB)) == []
    assert set(a.acls(flt(principal=ALICE, host="*", perm=ALLOW))) == set(bs)


def test_filter_match():
    bs = [acl("topic-a", O.READ), acl("*", O.READ), acl("topic-", O.READ, pattern=PRE),
          acl("to", O.READ, pattern=PRE), acl("topic-b", O.READ), acl("topic-ab", O.READ, pattern=PRE)]
    a = authorizer(*bs)
    assert set(a.acls(flt(T, "topic-a", PatternType.MATCH))) == set(bs[:4])
    assert set(a.acls(flt(T, None, PatternType.MATCH))) == set(bs)


def test_filter_error_for_unknown():
    assert flt(ResourceType.UNKNOWN).error() and flt(pattern=PatternType.UNKNOWN).error()
    assert flt(op=O.UNKNOWN).error() and flt(perm=Permission.UNKNOWN).error()
    assert flt().error() is None
    # unknown wire codes read as UNKNOWN
    assert AclFilter.of(99, None, 1, None, None, 1, 1).error()


def test_creation_errors():
    good = acl("t", O.READ)
    assert creation_error(good) is None
    assert "kafka-cluster" in creation_error(acl("other", O.ALTER, rtype=C))
    assert creation_error(acl(CLUSTER_NAME, O.ALTER, rtype=C)) is None
    assert "empty" in creation_error(acl("", O.READ))
    assert "resourceType" in creation_error(acl("t", O.READ, rtype=ResourceType.ANY))
    assert "patternType" in creation_error(acl("t", O.READ, pattern=PatternType.MATCH))
    assert "operation" in creation_error(acl("t", O.ANY))
    assert "permissionType" in creation_error(acl("t", O.READ, Permission.ANY))
    assert "colon" in creation_error(acl("t", O.READ, principal="alice"))
    assert creation_error(acl("t", O.READ, rtype=ResourceType.DELEGATION_TOKEN))
    assert creation_error(AclBinding.of(2, "t", 3, ALICE, "*", 99, 3))        # unknown operation code


# --- properties ------------------------------------------------------------------------------

NAMES = st.text(alphabet="ab*", min_size=1, max_size=4)
OPS = st.sampled_from([O.ALL, O.READ, O.WRITE, O.DESCRIBE, O.ALTER, O.ALTER_CONFIGS, O.DESCRIBE_CONFIGS, O.CREATE])
BINDINGS = st.builds(AclBinding, st.sampled_from([T, G]), NAMES, st.sampled_from([LIT, PRE]),
                     st.sampled_from([ALICE, BOB, "User:*"]), st.sampled_from(["*", HOST, "10.0.0.2"]), OPS,
                     st.sampled_from([ALLOW, DENY]))
REQUEST_OPS = st.sampled_from([O.READ, O.WRITE, O.DESCRIBE, O.ALTER, O.ALTER_CONFIGS, O.DESCRIBE_CONFIGS, O.CREATE])


def on_resource(b, rtype, name):
    if b.resource_type != rtype:
        return False
    if b.pattern_type == LIT:
        return b.name == name or b.name == "*"
    return name.startswith(b.name)


def applies(b, principal, host, op):
    if b.principal not in (principal, "User:*") or b.host not in (host, "*"):
        return False
    if b.operation in (O.ALL, op):
        return True
    if b.permission != ALLOW:
        return False
    return (op == O.DESCRIBE and b.operation in (O.READ, O.WRITE, O.DELETE, O.ALTER)) or \
        (op == O.DESCRIBE_CONFIGS and b.operation == O.ALTER_CONFIGS)


def reference(bindings, principal, host, op, rtype, name, allow_if_no_acl):
    mine = [b for b in bindings if on_resource(b, rtype, name)]
    hits = [b for b in mine if applies(b, principal, host, op)]
    if any(b.permission == DENY for b in hits):
        return False
    if hits:
        return True
    return allow_if_no_acl and not mine


@settings(max_examples=300, deadline=None)
@given(st.lists(BINDINGS, max_size=12), st.sampled_from([ALICE, BOB]), st.sampled_from([HOST, "10.0.0.2"]),
       REQUEST_OPS, st.sampled_from([T, G]), NAMES, st.booleans())
def test_decisions_match_the_rules(bindings, principal, host, op, rtype, name, allow_if_no_acl):
    a = authorizer(*bindings, allow_if_no_acl=allow_if_no_acl)
    expected = reference(set(bindings), principal, host, op, rtype, name, allow_if_no_acl)
    assert a.authorize(principal, host, op, rtype, name) == expected
    assert a.authorize(principal, host, op, rtype, name) == expected          # cached answer


@settings(max_examples=200, deadline=None)
@given(st.lists(BINDINGS, max_size=10), st.booleans(), REQUEST_OPS, NAMES)
def test_a_matching_deny_always_wins(bindings, prefixed, op, name):
    deny = AclBinding(T, name[:1], PRE, ALICE, "*", O.ALL, DENY) if prefixed else \
        AclBinding(T, name, LIT, ALICE, "*", O.ALL, DENY)
    a = authorizer(*bindings, deny, acl("*", O.ALL), acl(name, O.ALL))
    assert not a.authorize(ALICE, HOST, op, T, name)


@settings(max_examples=200, deadline=None)
@given(st.lists(BINDINGS, max_size=12), st.lists(st.integers(0, 11), max_size=6), st.sampled_from([ALICE, BOB]),
       REQUEST_OPS, NAMES)
def test_removal_and_cache_agree_with_a_fresh_authorizer(bindings, removals, principal, op, name):
    a = authorizer(*bindings)
    for i in removals:                       # decide (and cache) between every change
        a.authorize(principal, HOST, op, T, name)
        if i < len(bindings):
            a.remove(bindings[i])
    left = set(bindings) - {bindings[i] for i in removals if i < len(bindings)}
    assert a.authorize(principal, HOST, op, T, name) == authorizer(*left).authorize(principal, HOST, op, T, name)
    assert set(a.bindings()) == left


@settings(max_examples=200, deadline=None)
@given(st.lists(BINDINGS, max_size=12), st.sampled_from([T, G]), st.one_of(st.none(), NAMES),
       st.sampled_from([PatternType.ANY, PatternType.MATCH, LIT, PRE]), st.sampled_from([None, ALICE, "User:*"]),
       st.sampled_from([O.ANY, O.READ, O.ALL]))
def test_filter_index_agrees_with_a_scan(bindings, rtype, name, pattern, principal, op):
    a = authorizer(*bindings)
    f = flt(rtype, name, pattern, principal, None, op)
    assert set(a.acls(f)) == {b for b in set(bindings) if f.matches(b)}
