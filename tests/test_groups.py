"""Tests for the classic group coordinator state machine, driven through a stand-in for the server."""
from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import trireme.wire.error_codes as E
from trireme.state import group_records as gr
from trireme.state.groups import (
    COMPLETING_REBALANCE, DEAD, EMPTY, PREPARING_REBALANCE, STABLE, DescribedGroup, FetchedOffset, GroupConfig,
    GroupCoordinator, JoinGroupMember, JoinGroupResult, ListedGroup, PartitionResult, SyncGroupResult,
    heartbeat_key, join_key, sync_key,
)
from trireme.wire.codec import message

NONE = E.NONE.code
SESSION = 10_000
REBALANCE = 30_000
DELAY = 3_000


def subscription(*topics: str) -> bytes:
    codec = message("ConsumerProtocolSubscription")
    return struct.pack(">h", 0) + codec.encode_bytes(codec.cls(topics=list(topics), user_data=None), 0)


SUB = subscription("t1")
RANGE = [("range", SUB)]


class Server:
    """Applies effects the way the real server must: append and replay records, then answer; keep timers."""

    def __init__(self, config: GroupConfig | None = None, *, load: bool = True):
        ids = itertools.count(1)
        self.gc = GroupCoordinator(config or GroupConfig(initial_rebalance_delay_ms=DELAY),
                                   new_uuid=lambda: f"u{next(ids)}")
        self.now = 0
        self.timers: dict = {}
        self.responses: dict = {}
        self.issued: list = []
        self.log: list = []
        self.latest: dict = {}          # key -> latest value appended
        self._rids = itertools.count(1)
        if load:
            self.apply(self.gc.loaded(0))

    # plumbing

    def apply(self, fx):
        for key, value in fx.records:
            self.append(key, value)
        for key in fx.cancel:
            self.timers.pop(key, None)
        for key, deadline in fx.timers:
            self.timers[key] = deadline
        for rid, result in fx.responses:
            assert rid not in self.responses, f"request {rid} answered twice"
            self.responses[rid] = result
        return fx

    def append(self, key, value, producer_id=-1, transactional=False):
        self.log.append(("record", key, value, producer_id, transactional))
        self.latest[key] = value
        self.gc.replay(key, value, producer_id=producer_id, transactional=transactional)

    def marker(self, producer_id, commit):
        self.log.append(("marker", producer_id, commit))
        self.gc.replay_end_txn(producer_id, commit)

    def advance(self, ms: int) -> None:
        target = self.now + ms
        while True:
            due = [(deadline, key) for key, deadline in self.timers.items() if deadline <= target]
            if not due:
                break
            deadline, key = min(due, key=lambda item: (item[0], repr(item[1])))
            del self.timers[key]
            self.now = max(self.now, deadline)
            self.apply(self.gc.on_timer(key, self.now))
        self.now = target

    def rid(self):
        rid = next(self._rids)
        self.issued.append(rid)
        return rid

    # requests

    def join(self, group="g", member_id="", instance=None, protocols=None, session=SESSION, rebalance=REBALANCE,
             ptype="consumer", client_id="c", **kw):
        rid = self.rid()
        self.apply(self.gc.join_group(rid, group, member_id, instance, ptype, protocols or RANGE, session,
                                      rebalance, self.now, client_id=client_id, **kw))
        return rid

    def sync(self, member_id, generation, group="g", assignments=(), instance=None, ptype="consumer",
             pname="range"):
        rid = self.rid()
        self.apply(self.gc.sync_group(rid, group, generation, member_id, instance, ptype, pname,
                                      list(assignments), self.now))
        return rid

    def heartbeat(self, member_id, generation, group="g", instance=None):
        error, fx = self.gc.heartbeat(group, generation, member_id, instance, self.now)
        self.apply(fx)
        return error

    def leave(self, *members, group="g"):
        results, error, fx = self.gc.leave_group(group, [(m, i, None) for m, i in members], self.now)
        self.apply(fx)
        return results, error

    def commit(self, offsets, group="g", generation=-1, member_id="", instance=None, **kw):
        results, fx = self.gc.commit_offsets(group, generation, member_id, instance, offsets, self.now, **kw)
        self.apply(fx)
        return results

    def fetch(self, partitions=None, group="g", require_stable=False):
        return self.gc.fetch_offsets(group, partitions, require_stable)

    def result(self, rid):
        return self.responses.get(rid)

    def group(self, group="g"):
        return self.gc.groups.get(group)

    def complete_joins(self, *rids):
        """Advance through the (possibly extended) initial delay until every given JoinGroup is answered."""
        for _ in range(50):
            if all(self.result(r) is not None for r in rids):
                return [self.result(r) for r in rids]
            self.advance(DELAY)
        raise AssertionError("joins never completed")

    def join_new(self, group="g", **kw):
        """A KIP-394 join: MEMBER_ID_REQUIRED, then the rejoin (parked); returns (member_id, rid)."""
        first = self.result(self.join(group, **kw))
        assert first.error == E.MEMBER_ID_REQUIRED.code
        return first.member_id, self.join(group, first.member_id, **kw)


def stable_group(s: Server, n: int, group="g", protocols=None) -> list[str]:
    """Members joined, rebalanced and synced; returns member ids in join order (the first leads)."""
    rids = []
    for _ in range(n):
        _, rid = s.join_new(group, protocols=protocols)
        rids.append(rid)
    results = s.complete_joins(*rids)
    assert all(r.error == NONE for r in results)
    leader = results[0].leader
    ids = [r.member_id for r in results]
    generation = results[0].generation_id
    for member_id in ids:
        if member_id != leader:
            s.sync(member_id, generation, group)
    s.sync(leader, generation, group, [(m, f"asg-{m}".encode()) for m in ids])
    assert s.group(group).state == STABLE
    return ids


# --- the first rebalance -----------------------------------------------------------------------

def test_first_join_to_stable():
    s = Server()
    first = s.result(s.join(client_id="app"))
    assert first == JoinGroupResult(E.MEMBER_ID_REQUIRED.code, member_id="app-u1")
    assert s.group().state == EMPTY and "app-u1" in s.group().pending_members
    assert s.timers[heartbeat_key("g", "app-u1")] == SESSION

    s.advance(100)
    rid = s.join(member_id="app-u1", client_id="app")
    assert s.result(rid) is None                          # parked through the initial delay
    assert s.group().state == PREPARING_REBALANCE
    assert s.timers[join_key("g")] == 100 + DELAY

    s.advance(DELAY - 1)
    assert s.result(rid) is None
    s.advance(1)
    joined = s.result(rid)
    assert joined == JoinGroupResult(NONE, 1, "consumer", "range", "app-u1", False, "app-u1",
                                     (JoinGroupMember("app-u1", None, SUB),))
    g = s.group()
    assert g.state == COMPLETING_REBALANCE and g.generation == 1
    assert s.timers[sync_key("g")] == s.now + REBALANCE
    assert s.timers[heartbeat_key("g", "app-u1")] == s.now + SESSION

    records_before = len(s.log)
    sync = s.result(s.sync("app-u1", 1, assignments=[("app-u1", b"A")]))
    assert sync == SyncGroupResult(NONE, "consumer", "range", b"A")
    assert g.state == STABLE
    assert sync_key("g") not in s.timers
    (_, key, value, _, _), = s.log[records_before:]
    meta = gr.parse_record(key, value)
    assert meta.generation == 1 and meta.leader == "app-u1" and meta.protocol == "range"
    assert [(m.member_id, m.assignment, m.subscription) for m in meta.members] == [("app-u1", b"A", SUB)]


def test_initial_delay_is_extended_by_new_members_up_to_the_rebalance_timeout():
    s = Server(GroupConfig(initial_rebalance_delay_ms=3000))
    a, ra = s.join_new(rebalance=10_000)
    assert s.timers[join_key("g")] == 3000
    s.advance(2000)
    b, rb = s.join_new(rebalance=10_000)
    s.advance(1000)                                   # first delay ends: a member arrived, wait again
    assert s.result(ra) is None and s.timers[join_key("g")] == 6000
    s.advance(3000)                                   # nobody new: complete
    assert s.result(ra).error == NONE and s.result(rb).error == NONE
    assert {m.member_id for m in s.result(ra).members} == {a, b}


def test_initial_delay_never_exceeds_the_rebalance_timeout():
    s = Server(GroupConfig(initial_rebalance_delay_ms=3000))
    _, ra = s.join_new(rebalance=4000)                # remaining after the first delay: 1000
    for _ in range(5):
        s.advance(500)
        s.join_new(rebalance=4000)
    assert s.now == 2500
    s.advance(500)
    assert s.timers[join_key("g")] == 4000
    s.advance(1000)
    assert s.result(ra).error == NONE and s.group().generation == 1


def test_old_clients_join_without_member_id_required():
    s = Server()
    rid = s.join(require_known_member_id=False)
    assert s.result(rid) is None and len(s.group().members) == 1
    s.advance(DELAY)
    assert s.result(rid).error == NONE and s.result(rid).member_id == "c-u1"


def test_followers_park_until_the_leader_syncs():
    s = Server()
    _, r1 = s.join_new()
    _, r2 = s.join_new()
    _, r3 = s.join_new()
    s.complete_joins(r1, r2, r3)
    leader, f1, f2 = (s.result(r).member_id for r in (r1, r2, r3))
    assert s.result(r1).leader == leader and len(s.result(r1).members) == 3
    assert s.result(r2).members == () and s.result(r2).leader == leader
    p1, p2 = s.sync(f1, 1), s.sync(f2, 1)
    assert s.result(p1) is None and s.result(p2) is None
    assert s.heartbeat(f1, 1) == NONE                   # CompletingRebalance heartbeats are fine
    pl = s.sync(leader, 1, assignments=[(leader, b"L"), (f1, b"F1"), ("stranger", b"?")])
    assert s.result(pl) == SyncGroupResult(NONE, "consumer", "range", b"L")
    assert s.result(p1).assignment == b"F1"
    assert s.result(p2) == SyncGroupResult(NONE, "consumer", "range", b"")   # missing: empty assignment
    assert s.result(s.sync(f2, 1)).assignment == b""                        # Stable: answered at once


# --- later rebalances -------------------------------------------------------------------------

def test_a_new_member_triggers_a_rebalance_and_everyone_rejoins():
    s = Server()
    (a,) = stable_group(s, 1)
    b, rb = s.join_new()
    assert s.group().state == PREPARING_REBALANCE and s.result(rb) is None
    assert s.heartbeat(a, 1) == E.REBALANCE_IN_PROGRESS.code
    ra = s.join(member_id=a)
    ja, jb = s.result(ra), s.result(rb)
    assert ja.generation_id == jb.generation_id == 2
    assert ja.leader == a and {m.member_id for m in ja.members} == {a, b} and jb.members == ()
    assert s.group().state == COMPLETING_REBALANCE


def test_members_that_do_not_rejoin_in_time_are_removed():
    s = Server()
    a, b = stable_group(s, 2)
    c, rc = s.join_new()
    deadline = s.timers[join_key("g")]
    assert deadline == s.now + REBALANCE
    ra = s.join(member_id=a)
    while s.now + 5000 < deadline:                      # b keeps heartbeating but never rejoins
        s.advance(5000)
        assert s.heartbeat(b, 1) == E.REBALANCE_IN_PROGRESS.code
        assert s.heartbeat(a, 1) == E.REBALANCE_IN_PROGRESS.code
    assert s.result(ra) is None
    s.advance(deadline - s.now)
    assert s.result(ra).generation_id == 2 and {m.member_id for m in s.result(ra).members} == {a, c}
    assert s.result(rc).error == NONE
    assert b not in s.group().members and heartbeat_key("g", b) not in s.timers
    assert s.heartbeat(b, 2) == E.UNKNOWN_MEMBER_ID.code


def test_session_expiry_rebalances_and_the_last_one_leaves_an_empty_group():
    s = Server()
    a, b = stable_group(s, 2)
    s.advance(SESSION - 1)
    assert s.heartbeat(a, 1) == NONE
    s.advance(1)                                        # b's session ends
    assert b not in s.group().members and s.group().state == PREPARING_REBALANCE
    ra = s.join(member_id=a)                            # everyone left has rejoined: done at once
    assert s.result(ra).generation_id == 2 and s.result(ra).members == (JoinGroupMember(a, None, SUB),)

    before = len(s.log)
    s.advance(SESSION)                                  # a never syncs nor heartbeats
    g = s.group()
    assert g.state == EMPTY and not g.members and g.generation == 3 and g.protocol_name is None
    (_, key, value, _, _), = s.log[before:]
    assert gr.parse_record(key, value) == gr.GroupMetadata("g", "consumer", 3, None, None, s.now, ())


def test_rejoin_during_completing_rebalance():
    s = Server()
    _, r1 = s.join_new()
    _, r2 = s.join_new()
    s.complete_joins(r1, r2)
    leader, follower = s.result(r1).member_id, s.result(r2).member_id
    # Same metadata: the current generation again, with the member list for the leader.
    again = s.result(s.join(member_id=leader))
    assert again.generation_id == 1 and len(again.members) == 2
    assert s.group().state == COMPLETING_REBALANCE
    # A parked follower sync is told to rejoin when metadata changes.
    parked = s.sync(follower, 1)
    changed = s.join(member_id=leader, protocols=[("range", subscription("t1", "t2"))])
    assert s.result(parked) == SyncGroupResult(E.REBALANCE_IN_PROGRESS.code)
    assert s.group().state == PREPARING_REBALANCE and s.result(changed) is None
    rf = s.join(member_id=follower)
    assert s.result(changed).generation_id == 2 and s.result(rf).generation_id == 2


def test_rejoin_in_stable_follower_versus_leader():
    s = Server()
    leader, follower = stable_group(s, 2)
    same = s.result(s.join(member_id=follower))
    assert same == JoinGroupResult(NONE, 1, "consumer", "range", leader, False, follower, ())
    assert s.group().state == STABLE
    rl = s.join(member_id=leader)                       # a leader's join always rebalances
    assert s.group().state == PREPARING_REBALANCE and s.result(rl) is None
    rf = s.join(member_id=follower)
    assert s.result(rl).generation_id == s.result(rf).generation_id == 2


def test_rejoin_during_preparing_rebalance_completes_when_all_are_back():
    s = Server()
    a, b = stable_group(s, 2)
    ra = s.join(member_id=a)
    ra2 = s.join(member_id=a)                            # a retry while parked: both answered together
    assert s.result(ra) is None
    rb = s.join(member_id=b)
    assert s.result(ra).generation_id == s.result(ra2).generation_id == s.result(rb).generation_id == 2


def test_leader_that_does_not_rejoin_is_replaced():
    s = Server()
    a, b = stable_group(s, 2)
    rb = s.join(member_id=b, protocols=[("range", subscription("t9"))])
    s.advance(SESSION)                                   # a neither heartbeats nor rejoins
    assert s.result(rb).leader == b and s.group().leader_id == b


def test_pending_sync_expiry_removes_members_that_never_synced():
    s = Server()
    _, r1 = s.join_new()
    _, r2 = s.join_new()
    s.complete_joins(r1, r2)
    leader, follower = s.result(r1).member_id, s.result(r2).member_id
    s.sync(leader, 1, assignments=[(leader, b"L"), (follower, b"F")])
    deadline = s.timers[sync_key("g")]
    while s.now + 5000 < deadline:
        s.advance(5000)
        assert s.heartbeat(follower, 1) == NONE
        assert s.heartbeat(leader, 1) == NONE
    s.advance(deadline - s.now)
    assert follower not in s.group().members and s.group().state == PREPARING_REBALANCE


def test_a_new_member_that_disappears_while_parked_is_dropped():
    s = Server()
    (a,) = stable_group(s, 1)
    b, rb = s.join_new(rebalance=600_000)
    assert s.timers[heartbeat_key("g", b)] == s.now + 300_000
    for _ in range(60):                                  # a heartbeats but does not rejoin for 5 minutes
        s.advance(5000)
        s.heartbeat(a, 1)
    assert s.result(rb) == JoinGroupResult(E.UNKNOWN_MEMBER_ID.code)
    assert b not in s.group().members


def test_pending_member_that_never_rejoins_expires():
    s = Server()
    first = s.result(s.join())
    s.advance(SESSION)
    assert not s.group().pending_members
    late = s.result(s.join(member_id=first.member_id))
    assert late.error == E.UNKNOWN_MEMBER_ID.code


# --- protocols ----------------------------------------------------------------------------------

def test_protocol_selection_by_vote():
    s = Server()
    rids = [s.join_new(protocols=p)[1] for p in (
        [("range", b"1"), ("roundrobin", b"1"), ("sticky", b"1")],
        [("roundrobin", b"2"), ("range", b"2")],
        [("sticky", b"3"), ("roundrobin", b"3"), ("range", b"3")],
    )]
    s.complete_joins(*rids)
    # sticky is not supported by everyone; votes: range 1, roundrobin 2.
    assert {s.result(r).protocol_name for r in rids} == {"roundrobin"}
    assert [m.metadata for m in s.result(rids[0]).members] == [b"1", b"2", b"3"]


def test_tied_votes_go_to_the_protocol_voted_for_first():
    s = Server()
    r = [s.join_new(protocols=p)[1] for p in ([("b", b""), ("a", b"")], [("a", b""), ("b", b"")])]
    s.complete_joins(*r)
    assert s.result(r[0]).protocol_name == "b"


def test_inconsistent_protocols_are_refused():
    s = Server()
    stable_group(s, 1)
    assert s.result(s.join(protocols=[("roundrobin", b"")])).error == E.INCONSISTENT_GROUP_PROTOCOL.code
    assert s.result(s.join(ptype="connect")).error == E.INCONSISTENT_GROUP_PROTOCOL.code
    assert s.result(s.join(group="new", ptype="")).error == E.INCONSISTENT_GROUP_PROTOCOL.code
    assert "new" not in s.gc.groups


def test_empty_protocol_list_is_refused():
    s = Server()
    rid = s.rid()
    s.apply(s.gc.join_group(rid, "g", "", None, "consumer", [], SESSION, REBALANCE, 0))
    assert s.result(rid).error == E.INCONSISTENT_GROUP_PROTOCOL.code


# --- invalid JoinGroups -------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, error", [
    ({"group": ""}, E.INVALID_GROUP_ID),
    ({"session": 5999}, E.INVALID_SESSION_TIMEOUT),
    ({"session": 1_800_001}, E.INVALID_SESSION_TIMEOUT),
    ({"member_id": "ghost"}, E.UNKNOWN_MEMBER_ID),
])
def test_invalid_joins(kwargs, error):
    s = Server()
    assert s.result(s.join(**kwargs)).error == error.code
    assert not s.gc.groups


def test_unknown_member_of_an_existing_group():
    s = Server()
    stable_group(s, 1)
    result = s.result(s.join(member_id="ghost"))
    assert result == JoinGroupResult(E.UNKNOWN_MEMBER_ID.code, member_id="ghost")


def test_group_max_size():
    s = Server(GroupConfig(initial_rebalance_delay_ms=DELAY, max_group_size=2))
    stable_group(s, 2)
    assert s.result(s.join(require_known_member_id=False)).error == E.GROUP_MAX_SIZE_REACHED.code
    assert len(s.group().members) == 2


def test_join_a_dead_group():
    s = Server()
    s.commit([("t", 0, 5, -1, None)])
    s.gc.delete_groups(["g"], s.now)                     # Dead until the tombstone is replayed
    assert s.result(s.join()).error == E.COORDINATOR_NOT_AVAILABLE.code


# --- static membership ----------------------------------------------------------------------------

def static_stable(s: Server) -> tuple[str, str]:
    ra = s.join(instance="i1")
    rb = s.join(instance="i2")
    assert s.result(ra) is None                          # static members never get MEMBER_ID_REQUIRED
    s.complete_joins(ra, rb)
    a, b = s.result(ra).member_id, s.result(rb).member_id
    assert a == "i1-u1" and b == "i2-u2"
    s.sync(b, 1, instance="i2")
    s.sync(a, 1, instance="i1", assignments=[(a, b"A"), (b, b"B")])
    assert s.group().state == STABLE
    return a, b


def test_static_replacement_during_preparing_rebalance_fences_the_parked_join():
    s = Server()
    a, b = static_stable(s)
    parked_old = s.join(member_id=b, instance="i2", protocols=[("range", subscription("t1", "t2"))])
    assert s.group().state == PREPARING_REBALANCE and s.result(parked_old) is None
    new = s.join(instance="i2")
    assert s.result(parked_old) == JoinGroupResult(E.FENCED_INSTANCE_ID.code, member_id=b)
    assert s.result(new) is None
    ra = s.join(member_id=a, instance="i1")
    assert s.result(new).member_id == "i2-u3" and s.result(new).generation_id == 2
    assert {m.member_id for m in s.result(ra).members} == {a, "i2-u3"}


def test_static_replacement_in_stable_group():
    s = Server()
    a, b = static_stable(s)
    before = len(s.log)
    new = s.result(s.join(instance="i2"))
    assert new == JoinGroupResult(NONE, 1, "consumer", "range", a, False, "i2-u3", ())
    g = s.group()
    assert g.state == STABLE and g.generation == 1 and g.static_members["i2"] == "i2-u3"
    assert g.members["i2-u3"].assignment == b"B"
    (_, key, value, _, _), = s.log[before:]
    assert [m.member_id for m in gr.parse_record(key, value).members] == [a, "i2-u3"]
    # The old member id is fenced everywhere.
    assert s.heartbeat(b, 1, instance="i2") == E.FENCED_INSTANCE_ID.code
    assert s.result(s.sync(b, 1, instance="i2")).error == E.FENCED_INSTANCE_ID.code
    assert s.commit([("t", 0, 1, -1, "")], generation=1, member_id=b, instance="i2")[0].error \
        == E.FENCED_INSTANCE_ID.code
    assert s.result(s.join(member_id=b, instance="i2")).error == E.FENCED_INSTANCE_ID.code
    assert heartbeat_key("g", b) not in s.timers
    assert s.result(s.sync("i2-u3", 1, instance="i2")).assignment == b"B"


def test_static_leader_replacement_before_and_after_join_group_v9():
    s = Server()
    a, b = static_stable(s)
    legacy = s.result(s.join(instance="i1"))
    # Before v9 the new leader must not reassign: it is told the old leader id and no members.
    assert legacy == JoinGroupResult(NONE, 1, "consumer", "range", a, False, "i1-u3", ())
    assert s.group().leader_id == "i1-u3"
    v9 = s.result(s.join(instance="i1", supports_skip_assignment=True))
    assert v9.leader == v9.member_id == "i1-u4" and v9.skip_assignment
    assert {m.member_id for m in v9.members} == {"i1-u4", b}
    assert s.group().state == STABLE


def test_static_replacement_that_changes_the_protocol_rebalances():
    s = Server()
    both = [("range", SUB), ("roundrobin", SUB)]
    rid = s.join(instance="i1", protocols=both)
    s.complete_joins(rid)
    m = s.result(rid).member_id
    s.sync(m, 1, instance="i1", assignments=[(m, b"A")])
    same = s.result(s.join(instance="i1", protocols=both))
    assert same.error == NONE and s.group().generation == 1           # no change of protocol: no rebalance
    changed = s.result(s.join(instance="i1", protocols=both[::-1]))
    # The vote now picks roundrobin: the group rebalances, and as everyone is back it completes at once.
    assert changed.generation_id == 2 and changed.protocol_name == "roundrobin"
    assert s.group().state == COMPLETING_REBALANCE
    assert s.result(s.join(instance="i1", protocols=[("other", b"")])).error == E.INCONSISTENT_GROUP_PROTOCOL.code


def test_static_replacement_during_completing_rebalance_fences_and_rebalances():
    s = Server()
    ra = s.join(instance="i1")
    rb = s.join(instance="i2")
    s.complete_joins(ra, rb)
    b = s.result(rb).member_id
    parked = s.sync(b, 1, instance="i2")
    new = s.join(instance="i2")
    assert s.result(parked) == SyncGroupResult(E.FENCED_INSTANCE_ID.code)
    assert s.group().state == PREPARING_REBALANCE and s.result(new) is None
    s.join(member_id=s.result(ra).member_id, instance="i1")
    assert s.result(new).generation_id == 2


def test_static_members_that_do_not_rejoin_stay_until_their_session_ends():
    s = Server()
    a, b = static_stable(s)
    ra = s.join(member_id=a, instance="i1")              # leader rejoin: rebalance
    deadline = s.timers[join_key("g")]
    while s.now + 5000 < deadline:
        s.advance(5000)
        s.heartbeat(b, 1, instance="i2")
        s.heartbeat(a, 1, instance="i1")
    s.advance(deadline - s.now)
    assert s.result(ra).generation_id == 2
    assert {m.member_id for m in s.result(ra).members} == {a, b}
    s.advance(SESSION)                                   # now b's session runs out
    assert b not in s.group().members and "i2" not in s.group().static_members


def test_unknown_static_member_with_a_member_id():
    s = Server()
    static_stable(s)
    assert s.result(s.join(member_id="x", instance="i9")).error == E.UNKNOWN_MEMBER_ID.code


# --- LeaveGroup ---------------------------------------------------------------------------------

def test_dynamic_leave_rebalances():
    s = Server()
    a, b = stable_group(s, 2)
    results, error = s.leave((b, None))
    assert error == NONE and [r.error for r in results] == [NONE]
    assert s.group().state == PREPARING_REBALANCE and heartbeat_key("g", b) not in s.timers
    assert s.result(s.join(member_id=a)).generation_id == 2
    results, _ = s.leave((a, None))
    assert s.group().state == EMPTY and s.group().generation == 3


def test_static_leave_by_instance_id_and_fencing():
    s = Server()
    a, b = static_stable(s)
    results, _ = s.leave((a, "i2"), ("", "i9"), ("nobody", None))
    assert [r.error for r in results] == [E.FENCED_INSTANCE_ID.code, E.UNKNOWN_MEMBER_ID.code,
                                         E.UNKNOWN_MEMBER_ID.code]
    assert s.group().state == STABLE
    results, _ = s.leave(("", "i2"))                     # admin removal by instance id
    assert results[0].error == NONE and b not in s.group().members
    assert s.group().state == PREPARING_REBALANCE


def test_leave_answers_parked_requests_and_pending_members():
    s = Server()
    a, b = stable_group(s, 2)
    ra = s.join(member_id=a)
    pending = s.result(s.join()).member_id
    results, _ = s.leave((a, None), (pending, None))
    assert [r.error for r in results] == [NONE, NONE]
    assert s.result(ra) == JoinGroupResult(E.UNKNOWN_MEMBER_ID.code)
    assert not s.group().pending_members


def test_leave_errors():
    s = Server()
    assert s.leave(("a", None), group="nope")[1] == E.UNKNOWN_MEMBER_ID.code
    assert s.leave(("a", None), group="")[1] == E.INVALID_GROUP_ID.code
    s.commit([("t", 0, 1, -1, None)])
    s.gc.delete_groups(["g"], s.now)
    assert s.leave(("a", None))[1] == E.COORDINATOR_NOT_AVAILABLE.code


# --- Heartbeat and SyncGroup errors ---------------------------------------------------------------

def test_heartbeat_in_every_state():
    s = Server()
    assert s.heartbeat("x", 0, group="") == E.INVALID_GROUP_ID.code
    assert s.heartbeat("x", 0) == E.UNKNOWN_MEMBER_ID.code            # no such group
    s.commit([("t", 0, 1, -1, None)])                                   # an Empty group
    assert s.heartbeat("x", 0) == E.UNKNOWN_MEMBER_ID.code
    s.gc.delete_groups(["g"], s.now)
    assert s.heartbeat("x", 0) == E.COORDINATOR_NOT_AVAILABLE.code    # Dead
    s2 = Server()
    m, _ = s2.join_new()
    assert s2.heartbeat(m, 0) == E.REBALANCE_IN_PROGRESS.code          # PreparingRebalance (initial)
    s2.advance(DELAY)
    assert s2.group().state == COMPLETING_REBALANCE
    assert s2.heartbeat(m, 1) == NONE
    assert s2.heartbeat(m, 2) == E.ILLEGAL_GENERATION.code
    assert s2.heartbeat("other", 1) == E.UNKNOWN_MEMBER_ID.code
    assert s2.heartbeat(m, 1, instance="i") == E.UNKNOWN_MEMBER_ID.code
    s2.sync(m, 1, assignments=[(m, b"")])
    assert s2.heartbeat(m, 1) == NONE                                  # Stable
    s2.advance(100)
    assert s2.heartbeat(m, 1) == NONE and s2.timers[heartbeat_key("g", m)] == s2.now + SESSION
    s2.join_new()
    assert s2.heartbeat(m, 1) == E.REBALANCE_IN_PROGRESS.code         # PreparingRebalance
    assert s2.timers[heartbeat_key("g", m)] == s2.now + SESSION


def test_heartbeat_of_a_static_member():
    s = Server()
    a, b = static_stable(s)
    assert s.heartbeat(a, 1, instance="i1") == NONE
    assert s.heartbeat(b, 1, instance="i1") == E.FENCED_INSTANCE_ID.code


def test_sync_errors():
    s = Server()
    assert s.result(s.sync("m", 1, group="")).error == E.INVALID_GROUP_ID.code
    assert s.result(s.sync("m", 1)).error == E.UNKNOWN_MEMBER_ID.code   # no group
    s.commit([("t", 0, 1, -1, None)])
    assert s.result(s.sync("m", 1)).error == E.UNKNOWN_MEMBER_ID.code   # Empty group
    s = Server()
    a, b = stable_group(s, 2)
    assert s.result(s.sync("x", 1)).error == E.UNKNOWN_MEMBER_ID.code
    assert s.result(s.sync(a, 7)).error == E.ILLEGAL_GENERATION.code
    assert s.result(s.sync(a, 1, ptype="connect")).error == E.INCONSISTENT_GROUP_PROTOCOL.code
    assert s.result(s.sync(a, 1, pname="roundrobin")).error == E.INCONSISTENT_GROUP_PROTOCOL.code
    assert s.result(s.sync(a, 1, ptype=None, pname=None)).error == NONE  # before v5: not checked
    assert s.result(s.sync(a, 1, instance="i")).error == E.UNKNOWN_MEMBER_ID.code
    s.join_new()
    assert s.result(s.sync(a, 1)).error == E.REBALANCE_IN_PROGRESS.code


# --- offsets -------------------------------------------------------------------------------------

def test_simple_commit_creates_an_empty_group_and_becomes_visible_on_replay():
    s = Server()
    results, fx = s.gc.commit_offsets("g", -1, "", None, [("t", 0, 10, 3, "m"), ("t", 1, 20, -1, None)], 5)
    assert results == [PartitionResult("t", 0, NONE), PartitionResult("t", 1, NONE)]
    assert s.group().state == EMPTY and s.group().protocol_type is None
    assert s.gc.list_groups() == (NONE, [ListedGroup("g", "", "Empty", "classic")])
    assert s.fetch([("t", 0)]) == (NONE, [FetchedOffset("t", 0, -1, -1, "", NONE)])   # not replayed yet
    s.apply(fx)
    assert s.fetch() == (NONE, [FetchedOffset("t", 0, 10, 3, "m", NONE), FetchedOffset("t", 1, 20, -1, "", NONE)])
    assert s.fetch([("t", 1), ("u", 0)])[1] == [FetchedOffset("t", 1, 20, -1, "", NONE),
                                                 FetchedOffset("u", 0, -1, -1, "", NONE)]
    assert s.fetch(group="other") == (NONE, [])


def test_member_commits():
    s = Server()
    a, b = stable_group(s, 2)
    s.advance(100)
    assert s.commit([("t1", 0, 7, 1, "x")], generation=1, member_id=a) == [PartitionResult("t1", 0, NONE)]
    assert s.timers[heartbeat_key("g", a)] == s.now + SESSION       # a commit keeps the session alive
    assert s.fetch([("t1", 0)])[1][0].offset == 7
    assert s.commit([("t1", 0, 8, 1, "")], generation=2, member_id=a)[0].error == E.ILLEGAL_GENERATION.code
    assert s.commit([("t1", 0, 8, 1, "")], generation=1, member_id="x")[0].error == E.UNKNOWN_MEMBER_ID.code
    assert s.commit([("t1", 0, 8, 1, "")])[0].error == E.UNKNOWN_MEMBER_ID.code       # simple, but not Empty
    s.join_new()
    assert s.commit([("t1", 0, 9, 1, "")], generation=1, member_id=a)[0].error == NONE  # PreparingRebalance
    for m in (a, b):
        s.join(member_id=m)
    assert s.group().state == COMPLETING_REBALANCE
    assert s.commit([("t1", 0, 9, 1, "")], generation=2, member_id=a)[0].error \
        == E.REBALANCE_IN_PROGRESS.code


def test_commit_to_unknown_group_with_a_generation():
    s = Server()
    assert s.commit([("t", 0, 1, -1, "")], generation=3, member_id="m")[0].error == E.ILLEGAL_GENERATION.code
    assert s.commit([("t", 0, 1, -1, "")], generation=3, member_id="m", api_version=9)[0].error \
        == E.GROUP_ID_NOT_FOUND.code
    assert not s.gc.groups


def test_offset_metadata_too_large():
    s = Server()
    results = s.commit([("t", 0, 1, -1, "x" * 4097), ("t", 1, 1, -1, "x" * 4096)])
    assert [r.error for r in results] == [E.OFFSET_METADATA_TOO_LARGE.code, NONE]
    assert [r.partition for r in s.fetch()[1]] == [1]
    assert s.commit([("t", 2, 1, -1, "abc")], max_metadata_size=2)[0].error == E.OFFSET_METADATA_TOO_LARGE.code


def test_commit_with_retention_time_expires_on_its_own_schedule():
    s = Server()
    s.commit([("t", 0, 1, -1, "")], retention_time_ms=1000)
    assert gr.parse_record(*s.log[-1][1:3]).expire_timestamp == 1000
    s.advance(999)
    assert not s.gc.expire_offsets(s.now)
    s.advance(1)
    assert s.gc.expire_offsets(s.now) == [gr.offset_commit_tombstone("g", "t", 0),
                                          gr.group_metadata_tombstone("g")]


# --- DeleteGroups and OffsetDelete ----------------------------------------------------------------

def test_delete_groups():
    s = Server()
    stable_group(s, 1, group="busy")
    s.commit([("t", 0, 1, -1, ""), ("t", 1, 1, -1, "")])
    results, records = s.gc.delete_groups(["busy", "g", "nope", "g"], s.now)
    assert results == [("busy", E.NON_EMPTY_GROUP.code), ("g", NONE), ("nope", E.GROUP_ID_NOT_FOUND.code),
                       ("g", E.GROUP_ID_NOT_FOUND.code)]
    assert records == [gr.offset_commit_tombstone("g", "t", 0), gr.offset_commit_tombstone("g", "t", 1),
                       gr.group_metadata_tombstone("g")]
    assert s.group().state == DEAD
    assert s.gc.describe_groups(["g"], version=6)[0].error == E.GROUP_ID_NOT_FOUND.code
    for key, value in records:
        s.append(key, value)
    assert "g" not in s.gc.groups and s.fetch([("t", 0)])[1][0].offset == -1
    assert s.result(s.join()).error == E.MEMBER_ID_REQUIRED.code      # a fresh group may start


def test_delete_offsets_refuses_subscribed_topics():
    s = Server()
    a, b = stable_group(s, 2)
    s.commit([("t1", 0, 5, -1, ""), ("t2", 0, 5, -1, "")], generation=1, member_id=a)
    error, results, records = s.gc.delete_offsets("g", [("t1", 0), ("t2", 0), ("t3", 0)])
    assert error == NONE
    assert results == [PartitionResult("t1", 0, E.GROUP_SUBSCRIBED_TO_TOPIC.code),
                       PartitionResult("t2", 0, NONE), PartitionResult("t3", 0, NONE)]
    assert records == [gr.offset_commit_tombstone("g", "t2", 0)]
    assert s.gc.delete_offsets("nope", [("t", 0)])[0] == E.GROUP_ID_NOT_FOUND.code
    assert s.gc.delete_offsets("", [("t", 0)])[0] == E.INVALID_GROUP_ID.code


def test_delete_offsets_of_non_consumer_groups():
    s = Server()
    rid = s.join(ptype="connect", protocols=[("default", b"?")], require_known_member_id=False)
    s.advance(DELAY)
    assert s.result(rid).error == NONE
    assert s.gc.delete_offsets("g", [("t", 0)])[0] == E.NON_EMPTY_GROUP.code
    s.leave((s.result(rid).member_id, None))
    assert s.group().state == EMPTY
    assert s.gc.delete_offsets("g", [("t", 0)])[:2] == (NONE, [PartitionResult("t", 0, NONE)])


def test_unparseable_consumer_subscription_counts_as_subscribed():
    s = Server()
    stable_group(s, 1, protocols=[("range", b"garbage")])
    assert s.group().subscribed_topics is None
    assert s.gc.delete_offsets("g", [("any", 0)])[1][0].error == E.GROUP_SUBSCRIBED_TO_TOPIC.code


# --- transactional offsets -------------------------------------------------------------------------

def txn_commit(s, offsets, producer_id=7, group="g", generation=-1, member_id="", instance=None):
    results, records = s.gc.txn_commit_offsets("tx", group, producer_id, 0, generation, member_id, instance,
                                               offsets, s.now)
    for key, value in records:
        s.append(key, value, producer_id=producer_id, transactional=True)
    return results


def test_transactional_offsets_commit():
    s = Server()
    s.commit([("t", 0, 1, -1, "")])
    assert txn_commit(s, [("t", 0, 50, -1, "tx"), ("t", 1, 60, -1, None)]) == \
        [PartitionResult("t", 0, NONE), PartitionResult("t", 1, NONE)]
    assert s.fetch([("t", 0), ("t", 1)], require_stable=True)[1] == [
        FetchedOffset("t", 0, -1, -1, "", E.UNSTABLE_OFFSET_COMMIT.code),
        FetchedOffset("t", 1, -1, -1, "", E.UNSTABLE_OFFSET_COMMIT.code)]
    assert s.fetch([("t", 0), ("t", 1)])[1] == [FetchedOffset("t", 0, 1, -1, "", NONE),
                                                 FetchedOffset("t", 1, -1, -1, "", NONE)]
    assert [f.error for f in s.fetch(require_stable=True)[1]] == [E.UNSTABLE_OFFSET_COMMIT.code]
    s.marker(7, commit=True)
    assert s.fetch([("t", 0), ("t", 1)], require_stable=True)[1] == [
        FetchedOffset("t", 0, 50, -1, "tx", NONE), FetchedOffset("t", 1, 60, -1, "", NONE)]


def test_transactional_offsets_abort():
    s = Server()
    s.commit([("t", 0, 1, -1, "")])
    txn_commit(s, [("t", 0, 50, -1, "")])
    s.marker(7, commit=False)
    assert s.fetch([("t", 0)], require_stable=True)[1] == [FetchedOffset("t", 0, 1, -1, "", NONE)]
    s.marker(7, commit=True)                             # a marker without pending offsets is harmless
    assert s.fetch([("t", 0)])[1][0].offset == 1


def test_a_later_regular_commit_wins_over_an_earlier_transactional_one():
    s = Server()
    txn_commit(s, [("t", 0, 50, -1, "")])
    s.commit([("t", 0, 99, -1, "")])
    s.marker(7, commit=True)
    assert s.fetch([("t", 0)])[1][0].offset == 99


def test_transactional_commit_validation():
    s = Server()
    assert txn_commit(s, [("t", 0, 1, -1, "")], generation=2, member_id="m")[0].error \
        == E.ILLEGAL_GENERATION.code
    assert txn_commit(s, [("t", 0, 1, -1, "")], group="")[0].error == E.INVALID_GROUP_ID.code
    _, r1 = s.join_new()
    s.advance(DELAY)
    m = s.result(r1).member_id
    assert s.group().state == COMPLETING_REBALANCE
    # Unlike OffsetCommit, neither CompletingRebalance nor a missing member id is refused.
    assert txn_commit(s, [("t", 0, 2, -1, "")], generation=1, member_id=m)[0].error == NONE
    assert txn_commit(s, [("t", 0, 3, -1, "")], producer_id=8)[0].error == NONE
    assert txn_commit(s, [("t", 0, 3, -1, "")], generation=0, member_id=m)[0].error == E.ILLEGAL_GENERATION.code
    assert txn_commit(s, [("t", 0, 1, -1, "x" * 5000)])[0].error == E.OFFSET_METADATA_TOO_LARGE.code


def test_transactional_commit_during_a_rebalance_is_never_rebalance_in_progress():
    """A worker's TxnOffsetCommit while its group rebalances (another member joining): accepted with the current
    generation, ILLEGAL_GENERATION with an older one, as Kafka's; never REBALANCE_IN_PROGRESS, which librdkafka's
    send_offsets_to_transaction does not retry (docs/transactions.md, "A worker stuck in
    send_offsets_to_transaction")."""
    s = Server()
    first, = stable_group(s, 1)
    generation = s.group().generation
    s.join_new()                                                       # a second worker: the group rebalances
    assert s.group().state == PREPARING_REBALANCE
    assert txn_commit(s, [("t", 0, 5, -1, "")], generation=generation, member_id=first)[0].error == NONE
    assert txn_commit(s, [("t", 0, 5, -1, "")], generation=generation - 1, member_id=first)[0].error == \
        E.ILLEGAL_GENERATION.code


def test_deleting_a_group_drops_pending_transactional_offsets():
    s = Server()
    s.commit([("t", 0, 1, -1, "")])
    txn_commit(s, [("t", 0, 5, -1, ""), ("u", 0, 5, -1, "")])
    _, records = s.gc.delete_groups(["g"], s.now)
    assert records == [gr.offset_commit_tombstone("g", "t", 0), gr.offset_commit_tombstone("g", "u", 0),
                       gr.group_metadata_tombstone("g")]
    for key, value in records:
        s.append(key, value)
    s.marker(7, commit=True)
    assert not s.gc.offsets


# --- expiry ------------------------------------------------------------------------------------------

DAY = 24 * 3600 * 1000


def test_simple_group_offsets_expire_after_their_commit():
    s = Server(GroupConfig(initial_rebalance_delay_ms=DELAY, offsets_retention_ms=DAY))
    s.commit([("t", 0, 1, -1, "")])
    s.advance(DAY // 2)
    s.commit([("t", 1, 1, -1, "")])
    s.advance(DAY // 2)
    assert s.gc.expire_offsets(s.now) == [gr.offset_commit_tombstone("g", "t", 0)]
    s.advance(DAY // 2)
    records = s.gc.expire_offsets(s.now)
    assert records == [gr.offset_commit_tombstone("g", "t", 0), gr.offset_commit_tombstone("g", "t", 1),
                       gr.group_metadata_tombstone("g")]
    assert s.group().state == DEAD
    for key, value in records:
        s.append(key, value)
    assert not s.gc.groups and not s.gc.offsets


def test_consumer_group_offsets_expire_after_the_group_becomes_empty():
    s = Server(GroupConfig(initial_rebalance_delay_ms=DELAY, offsets_retention_ms=DAY))
    (a,) = stable_group(s, 1)
    s.commit([("t1", 0, 1, -1, ""), ("other", 0, 1, -1, "")], generation=1, member_id=a)
    for _ in range(int(DAY * 1.5) // 9000):
        s.advance(9000)
        s.heartbeat(a, 1)
    # Stable: offsets of topics nobody subscribes to expire after their commit; t1's stay.
    assert s.gc.expire_offsets(s.now) == [gr.offset_commit_tombstone("g", "other", 0)]
    s.append(*gr.offset_commit_tombstone("g", "other", 0))
    s.leave((a, None))
    emptied = s.now
    assert s.group().state == EMPTY
    s.advance(DAY - 1)
    assert s.gc.expire_offsets(s.now) == []              # the clock starts when the group empties
    s.advance(1)
    assert s.now - emptied == DAY
    assert s.gc.expire_offsets(s.now) == [gr.offset_commit_tombstone("g", "t1", 0),
                                          gr.group_metadata_tombstone("g")]


def test_pending_transactions_hold_back_expiry():
    s = Server(GroupConfig(initial_rebalance_delay_ms=DELAY, offsets_retention_ms=DAY))
    s.commit([("t", 0, 1, -1, "")])
    txn_commit(s, [("t", 0, 2, -1, "")])
    s.advance(DAY)
    assert s.gc.expire_offsets(s.now) == []
    s.marker(7, commit=False)
    assert s.gc.expire_offsets(s.now) == [gr.offset_commit_tombstone("g", "t", 0),
                                          gr.group_metadata_tombstone("g")]


def test_groups_in_a_rebalance_keep_their_offsets():
    s = Server(GroupConfig(initial_rebalance_delay_ms=DELAY, offsets_retention_ms=1000))
    s.commit([("t", 0, 1, -1, "")])
    s.join_new()
    s.advance(DELAY)
    assert s.group().state == COMPLETING_REBALANCE
    assert s.gc.expire_offsets(s.now) == []


def test_empty_groups_without_offsets_are_removed():
    s = Server()
    (a,) = stable_group(s, 1)
    s.leave((a, None))
    assert s.gc.expire_offsets(s.now) == [gr.group_metadata_tombstone("g")]


# --- replay, loading and compaction ------------------------------------------------------------------

def busy_server() -> Server:
    s = Server()
    a, b = stable_group(s, 2)
    static = s.join(group="s", instance="i1")
    s.advance(DELAY)
    sm = s.result(static).member_id
    s.sync(sm, 1, group="s", instance="i1", assignments=[(sm, b"S")])
    s.result(s.join(group="s", instance="i1"))           # static replacement: a new record
    s.commit([("t1", 0, 5, 2, "a"), ("t1", 1, 6, 2, "b")], generation=1, member_id=a)
    s.commit([("t1", 0, 7, 2, "c")], generation=1, member_id=a)
    s.commit([("x", 0, 1, -1, "")], group="simple")
    s.commit([("y", 0, 1, -1, "")], group="gone")
    _, records = s.gc.delete_groups(["gone"], s.now)
    for key, value in records:
        s.append(key, value)
    txn_commit(s, [("t9", 0, 9, -1, "")], group="simple", producer_id=3)
    s.marker(3, commit=True)
    txn_commit(s, [("t9", 1, 9, -1, "")], group="simple", producer_id=4)   # left open
    return s


def replayed(entries, now) -> tuple[GroupCoordinator, object]:
    gc = GroupCoordinator(GroupConfig(initial_rebalance_delay_ms=DELAY))
    for entry in entries:
        if entry[0] == "record":
            _, key, value, producer_id, transactional = entry
            gc.replay(key, value, producer_id=producer_id, transactional=transactional)
        else:
            gc.replay_end_txn(entry[1], entry[2])
    return gc, gc.loaded(now)


def snapshot(gc: GroupCoordinator):
    groups = {gid: (str(g.state), g.generation, g.protocol_type, g.protocol_name, g.leader_id,
                    sorted((m.member_id, m.group_instance_id, m.assignment, m.session_timeout_ms)
                           for m in g.members.values()))
              for gid, g in gc.groups.items()}
    offsets = {gid: {tp: (o.offset, o.leader_epoch, o.metadata, o.commit_timestamp) for tp, o in tps.items()}
               for gid, tps in gc.offsets.items()}
    pending = {pid: {gid: sorted(tps) for gid, tps in groups_.items()} for pid, groups_ in gc.pending.items()}
    return groups, offsets, pending


def test_replaying_the_log_reproduces_the_state():
    s = busy_server()
    gc, fx = replayed(s.log, s.now)
    assert snapshot(gc) == snapshot(s.gc)
    assert gc.fetch_offsets("simple", [("t9", 1)], True)[1][0].error == E.UNSTABLE_OFFSET_COMMIT.code
    # Loaded members' sessions restart now.
    keys = {key for key, _ in fx.timers}
    assert keys == {heartbeat_key("g", m) for m in s.gc.groups["g"].members} | \
        {heartbeat_key("s", m) for m in s.gc.groups["s"].members}
    assert all(deadline == s.now + SESSION for _, deadline in fx.timers)
    (member,) = s.gc.groups["s"].members
    assert gc.heartbeat("s", 1, member, "i1", s.now)[0] == NONE
    assert gc.sync_group(1, "s", 1, member, "i1", None, None, [], s.now).responses == \
        [(1, SyncGroupResult(NONE, "consumer", "range", b"S"))]


def test_loaded_members_that_stay_silent_are_removed():
    s = busy_server()
    t = Server(load=False)
    t.gc, fx = replayed(s.log, s.now)
    t.now = s.now
    t.apply(fx)
    assert t.gc.groups["g"].state == STABLE and t.gc.groups["g"].generation == 1
    t.advance(SESSION)
    assert t.gc.groups["g"].state == EMPTY and t.gc.groups["g"].generation == 2
    assert t.gc.groups["s"].state == EMPTY


def test_loading_a_group_over_the_size_limit_rebalances():
    s = busy_server()
    gc = GroupCoordinator(GroupConfig(max_group_size=1))
    for _, key, value, producer_id, transactional in (e for e in s.log if e[0] == "record"):
        gc.replay(key, value, producer_id=producer_id, transactional=transactional)
    fx = gc.loaded(s.now)
    assert gc.groups["g"].state == PREPARING_REBALANCE and gc.groups["s"].state == STABLE
    assert join_key("g") in dict(fx.timers)


def test_compaction_keeps_only_the_latest_value_per_key():
    s = busy_server()
    compacted = s.gc.compact_records()
    keys = [key for key, _ in compacted]
    assert len(keys) == len(set(keys))
    assert all(value is not None for _, value in compacted)
    parsed = [gr.parse_record(key, value) for key, value in compacted]
    offsets = {(p.group, p.topic, p.partition): p.offset for p in parsed if isinstance(p, gr.OffsetCommit)}
    assert offsets == {("g", "t1", 0): 7, ("g", "t1", 1): 6, ("simple", "x", 0): 1, ("simple", "t9", 0): 9}
    assert {p.group for p in parsed if isinstance(p, gr.GroupMetadata)} == {"g", "s"}
    pending = s.gc.pending_transactional_records()
    assert [(pid, gr.parse_record(k, v).partition) for pid, k, v in pending] == [(4, 1)]

    entries = [("record", k, v, -1, False) for k, v in compacted] + \
              [("record", k, v, pid, True) for pid, k, v in pending]
    gc, _ = replayed(entries, s.now)
    assert snapshot(gc) == snapshot(s.gc)


def test_loading_refuses_requests():
    gc = GroupCoordinator()
    fx = gc.join_group(1, "g", "", None, "consumer", RANGE, SESSION, REBALANCE, 0)
    assert fx.responses == [(1, JoinGroupResult(E.COORDINATOR_LOAD_IN_PROGRESS.code))]
    loading = E.COORDINATOR_LOAD_IN_PROGRESS.code
    assert gc.sync_group(2, "g", 1, "m", None, None, None, [], 0).responses == [(2, SyncGroupResult(loading))]
    assert gc.heartbeat("g", 1, "m", None, 0)[0] == 0           # answered blindly, as Kafka
    assert gc.leave_group("g", [("m", None, None)], 0)[1] == loading
    assert gc.commit_offsets("g", -1, "", None, [("t", 0, 1, -1, "")], 0)[0][0].error == loading
    assert gc.txn_commit_offsets("x", "g", 1, 0, -1, "", None, [("t", 0, 1, -1, "")], 0)[0][0].error == loading
    assert gc.fetch_offsets("g")[0] == loading
    assert gc.delete_offsets("g", [])[0] == loading
    assert gc.delete_groups(["g"], 0)[0] == [("g", loading)]
    assert gc.describe_groups(["g"])[0].error == loading
    assert gc.list_groups()[0] == loading
    assert gc.expire_offsets(0) == []


def test_group_metadata_replayed_after_loading_does_not_disturb_live_groups():
    s = Server()
    a, b = stable_group(s, 2)
    stale = gr.group_metadata_record(gr.GroupMetadata("g", "consumer", 0, None, None, -1, ()))
    s.append(*stale)
    assert s.group().state == STABLE and len(s.group().members) == 2
    s.append(*gr.group_metadata_tombstone("g"))          # a group with members is not removed
    assert s.group() is not None


def test_stale_timers_are_ignored():
    s = Server()
    a, b = stable_group(s, 2)
    old_deadline = s.timers[heartbeat_key("g", a)]
    s.advance(1000)
    s.heartbeat(a, 1)
    assert s.gc.on_timer(heartbeat_key("g", a), old_deadline).responses == []
    assert a in s.group().members
    for key in (join_key("g"), sync_key("g"), heartbeat_key("g", "nobody"), heartbeat_key("none", "x"),
                ("bogus",), ()):
        fx = s.gc.on_timer(key, s.now)
        assert not fx.responses and not fx.records and not fx.timers
    assert s.group().state == STABLE


# --- DescribeGroups and ListGroups -----------------------------------------------------------------

def test_describe_groups():
    s = Server()
    rid = s.join(client_id="app", client_host="/10.1.1.1", require_known_member_id=False)
    s.advance(DELAY)
    m = s.result(rid).member_id
    (described,) = s.gc.describe_groups(["g"])
    assert described == DescribedGroup(NONE, "g", "CompletingRebalance", "consumer", "", (
        (m, None, "app", "/10.1.1.1", b"", b""),))
    s.sync(m, 1, assignments=[(m, b"A")])
    (described,) = s.gc.describe_groups(["g"])
    assert described == DescribedGroup(NONE, "g", "Stable", "consumer", "range", (
        (m, None, "app", "/10.1.1.1", SUB, b"A"),))
    assert s.gc.describe_groups(["nope"], version=5) == [DescribedGroup(NONE, "nope", "Dead", "", "")]
    assert s.gc.describe_groups(["nope"], version=6) == [
        DescribedGroup(E.GROUP_ID_NOT_FOUND.code, "nope", "Dead", "", "")]


def test_list_groups_filters():
    s = Server()
    stable_group(s, 1, group="a")
    s.commit([("t", 0, 1, -1, "")], group="b")
    s.join_new(group="c")
    everything = s.gc.list_groups()[1]
    assert sorted(everything) == [ListedGroup("a", "consumer", "Stable", "classic"),
                                  ListedGroup("b", "", "Empty", "classic"),
                                  ListedGroup("c", "consumer", "PreparingRebalance", "classic")]
    assert [g.group_id for g in s.gc.list_groups(["stable", " EMPTY "])[1]] == ["a", "b"]
    assert [g.group_id for g in s.gc.list_groups(None, ["Classic"])[1]] == ["a", "b", "c"]
    assert s.gc.list_groups(None, ["consumer"])[1] == []
    assert s.gc.list_groups([], [])[1] == everything


# --- random sequences keep the invariants ------------------------------------------------------------

class Client:
    def __init__(self, instance):
        self.instance = instance
        self.member_id = ""
        self.generation = -1
        self.leader = False
        self.members: tuple = ()
        self.join_rid = None
        self.sync_rid = None
        self.synced_generation = -1


def check_invariants(s: Server, generations: dict) -> None:
    for gid, g in s.gc.groups.items():
        assert g.generation >= generations.get(gid, 0)
        generations[gid] = g.generation
        if g.state == EMPTY:
            assert not g.members
        if g.state in (STABLE, COMPLETING_REBALANCE):
            assert g.members and g.leader_id in g.members
            assert g.protocol_name is not None
        if g.members:
            assert g.leader_id in g.members
        assert g.pending_sync <= set(g.members)
        for instance, member_id in g.static_members.items():
            assert g.members[member_id].group_instance_id == instance
        assert len(g.static_members) == sum(1 for m in g.members.values() if m.group_instance_id is not None)
        if g.state == PREPARING_REBALANCE:
            assert g.join_deadline is not None and s.timers.get(join_key(gid)) == g.join_deadline
        if g.state == COMPLETING_REBALANCE:
            assert g.pending_sync and s.timers.get(sync_key(gid)) == g.sync_deadline
        if g.state == STABLE:
            key = gr.group_metadata_key(gid)
            meta = gr.parse_record(key, s.latest[key])
            assert {m.member_id for m in meta.members} == set(g.members)
            assert meta.generation == g.generation
            assert {m.member_id: m.assignment for m in meta.members} == \
                {m.member_id: m.assignment for m in g.members.values()}
        for member in g.members.values():
            key = heartbeat_key(gid, member.member_id)
            if key in s.timers:
                assert s.timers[key] == member.heartbeat_deadline
            else:
                assert member.has_satisfied_heartbeat()
            for rid in member.join_waiters + member.sync_waiters:
                assert rid not in s.responses


ADVANCES = [1, 500, 2_000, 3_000, 3_000, 6_000, 12_000, 40_000]
# Mostly well-behaved consumers ("step"), with every kind of misbehaviour mixed in.
OP_NAMES = ["step"] * 12 + ["advance"] * 3 + ["join", "sync", "heartbeat", "leave", "commit", "protocols", "restart"]
ops = st.lists(st.tuples(st.sampled_from(OP_NAMES), st.integers(0, 3), st.sampled_from(ADVANCES)).map(
    lambda t: (t[0], t[2] if t[0] == "advance" else t[1])), min_size=30, max_size=150)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops, st.lists(st.booleans(), min_size=1, max_size=4))
def test_random_sequences_keep_the_invariants(sequence, static_flags):
    s = Server()
    clients = [Client(f"i{i}" if flag else None) for i, flag in enumerate(static_flags)]
    sequence = [(op, arg if op == "advance" else arg % len(clients)) for op, arg in sequence]
    protocol_choice = [0] * 4
    protocol_sets = [[("range", SUB), ("roundrobin", SUB)], [("roundrobin", SUB), ("range", SUB)]]
    generations: dict = {}

    def settle():
        for c in clients:
            if c.join_rid is not None and c.join_rid in s.responses:
                r = s.responses[c.join_rid]
                c.join_rid = None
                if r.error == NONE:
                    c.member_id, c.generation = r.member_id, r.generation_id
                    c.leader, c.members = r.leader == r.member_id, r.members
                elif r.error == E.MEMBER_ID_REQUIRED.code:
                    c.member_id = r.member_id
                elif r.error in (E.UNKNOWN_MEMBER_ID.code, E.FENCED_INSTANCE_ID.code):
                    c.member_id, c.generation = "", -1
            if c.sync_rid is not None and c.sync_rid in s.responses:
                r = s.responses[c.sync_rid]
                c.sync_rid = None
                if r.error in (E.UNKNOWN_MEMBER_ID.code, E.FENCED_INSTANCE_ID.code):
                    c.member_id, c.generation = "", -1

    for op, arg in sequence:
        if op == "advance":
            s.advance(arg)
        else:
            c = clients[arg]
            if op == "step":
                # What a well-behaved consumer does next: join, sync once per generation, then heartbeat.
                if c.join_rid is None and (not c.member_id or c.generation < 0):
                    op = "join"
                elif c.join_rid is None and c.sync_rid is None and c.synced_generation != c.generation:
                    op = "sync"
                    c.synced_generation = c.generation
                else:
                    op = "heartbeat"
            if op == "join" and c.join_rid is None:
                c.join_rid = s.join(member_id=c.member_id, instance=c.instance,
                                    protocols=protocol_sets[protocol_choice[arg]],
                                    supports_skip_assignment=arg % 2 == 0)
            elif op == "sync" and c.sync_rid is None and c.member_id and c.join_rid is None:
                assignments = [(m.member_id, m.member_id.encode()) for m in c.members] if c.leader else []
                c.sync_rid = s.sync(c.member_id, c.generation, instance=c.instance, assignments=assignments)
            elif op == "heartbeat" and c.member_id:
                error = s.heartbeat(c.member_id, c.generation, instance=c.instance)
                if error in (E.UNKNOWN_MEMBER_ID.code, E.FENCED_INSTANCE_ID.code):
                    c.member_id, c.generation = "", -1
                elif error in (E.REBALANCE_IN_PROGRESS.code, E.ILLEGAL_GENERATION.code):
                    c.generation = -1       # rejoin with the member id
            elif op == "leave" and (c.member_id or c.instance):
                s.leave((c.member_id, c.instance))
                c.member_id, c.generation = "", -1
            elif op == "commit":
                results = s.commit([("t1", arg, 1, -1, "")], generation=c.generation, member_id=c.member_id,
                                   instance=c.instance)
                assert len(results) == 1
            elif op == "protocols":
                protocol_choice[arg] ^= 1
            elif op == "restart":
                # The process restarts: it forgets its member id and any requests still parked.
                clients[arg] = Client(c.instance)
        settle()
        check_invariants(s, generations)

    # With everyone silent, sessions run out: every parked request gets its answer.
    s.advance(3_600_000)
    assert all(rid in s.responses for rid in s.issued)
    g = s.group()
    assert g is None or (g.state == EMPTY and not g.members)
    assert not s.timers
