"""The classic consumer-group coordinator as a pure state machine: membership, rebalances and committed offsets.

This follows Kafka's classic group handling (``GroupMetadataManager``/``ClassicGroup`` and
``OffsetMetadataManager`` in the KIP-848-era group coordinator) for every group on this single node.
Nothing here touches sockets, trio or the clock: every operation takes ``now_ms`` and returns plain
values, and anything the server must do -- answer requests parked earlier, (re)schedule or cancel
timers, durably append records -- comes back in an :class:`Effects`.

The server's side of the contract:

* Append ``Effects.records`` durably (in that order), then call :meth:`GroupCoordinator.replay` for each
  appended record, then send ``Effects.responses``.  Responses may answer requests other than the one
  being handled: JoinGroup and SyncGroup requests are parked until the rebalance moves on.
* Keep one timer per key: ``Effects.timers`` (re)schedules a key at an absolute deadline, ``Effects.cancel``
  drops keys.  When a timer fires call :meth:`GroupCoordinator.on_timer`; a timer that fires after the
  state machine stopped caring about it is ignored (each deadline is also kept in state and checked).
  Keys are tuples: ``("heartbeat", group, member_id)``, ``("join", group)`` (the delayed join, including
  the initial delay) and ``("sync", group)`` (the pending-sync expiry).
* At start-up, :meth:`replay` every record of the offsets log in order, then call :meth:`loaded` and
  apply its effects.  Until then every request is answered COORDINATOR_LOAD_IN_PROGRESS, as Kafka does.
  A coordinator whose partition this broker does not lead has :attr:`GroupCoordinator.unavailable` set:
  every request is answered with it (NOT_COORDINATOR, or COORDINATOR_LOAD_IN_PROGRESS while the partition
  is being opened), except ListGroups, which lists no group (Kafka lists the groups of the partitions a
  broker leads).
* Transactional offset commits (:meth:`txn_commit_offsets`) are written in a transactional batch of the
  producer; replay them with ``transactional=True`` and call :meth:`replay_end_txn` for the producer's
  commit or abort marker.

Durable state -- committed offsets and the stored group metadata -- changes only by replaying records,
as in Kafka's coordinator shards.  Membership is soft state kept in memory: group metadata records
produced while running describe what memory already holds, so their replay only updates what
:meth:`compact_records` returns; while loading, the same records rebuild the groups.
"""
from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass, field
from typing import Callable, Hashable, Iterable, NamedTuple

import trireme.wire.error_codes as E
from trireme.state import group_records as gr
from trireme.state.coordinator_status import CoordinatorStatus
from trireme.state.effects import Effects, TimerKey

CONSUMER_PROTOCOL_TYPE = "consumer"
GROUP_TYPE_CLASSIC = "classic"
NO_GENERATION = -1
NO_OFFSET = -1
NO_LEADER_EPOCH = -1
DEFAULT_RETENTION_TIME = -1
DEFAULT_MAX_METADATA_SIZE = 4096

HEARTBEAT = "heartbeat"
JOIN = "join"
SYNC = "sync"

NONE = E.NONE.code


class GroupState(enum.StrEnum):
    """Kafka's classic group states, valued with the names ListGroups and DescribeGroups use."""

    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


EMPTY = GroupState.EMPTY
PREPARING_REBALANCE = GroupState.PREPARING_REBALANCE
COMPLETING_REBALANCE = GroupState.COMPLETING_REBALANCE
STABLE = GroupState.STABLE
DEAD = GroupState.DEAD


@dataclass(frozen=True)
class GroupConfig:
    """The coordinator's settings, named after Kafka's ``group.*`` and ``offsets.*`` broker configs."""

    initial_rebalance_delay_ms: int = 3000            # group.initial.rebalance.delay.ms
    min_session_timeout_ms: int = 6000                # group.min.session.timeout.ms
    max_session_timeout_ms: int = 1_800_000           # group.max.session.timeout.ms
    offsets_retention_ms: int = 7 * 24 * 3600 * 1000  # offsets.retention.minutes
    max_group_size: int | None = None                 # group.max.size (None: unbounded)
    new_member_join_timeout_ms: int = 300_000         # Kafka's fixed 5-minute join timeout for new members


# --- results ---------------------------------------------------------------------------------

class JoinGroupMember(NamedTuple):
    """One member in the leader's JoinGroup response."""

    member_id: str
    group_instance_id: str | None
    metadata: bytes


class JoinGroupResult(NamedTuple):
    error: int
    generation_id: int = NO_GENERATION
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    skip_assignment: bool = False
    member_id: str = ""
    members: tuple[JoinGroupMember, ...] = ()


class SyncGroupResult(NamedTuple):
    error: int
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


class LeaveMemberResult(NamedTuple):
    member_id: str
    group_instance_id: str | None
    error: int


class DescribedMember(NamedTuple):
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


class DescribedGroup(NamedTuple):
    error: int
    group_id: str
    state: str
    protocol_type: str
    protocol_name: str
    members: tuple[DescribedMember, ...] = ()


class ListedGroup(NamedTuple):
    group_id: str
    protocol_type: str
    state: str
    group_type: str


class PartitionResult(NamedTuple):
    """The outcome for one partition of an OffsetCommit, TxnOffsetCommit or OffsetDelete."""

    topic: str
    partition: int
    error: int


class FetchedOffset(NamedTuple):
    topic: str
    partition: int
    offset: int
    leader_epoch: int
    metadata: str
    error: int


# (topic, partition, offset, leader_epoch, metadata) as an OffsetCommit/TxnOffsetCommit carries it.
OffsetToCommit = tuple[str, int, int, int, "str | None"]
def heartbeat_key(group_id: str, member_id: str) -> TimerKey:
    return (HEARTBEAT, group_id, member_id)


def join_key(group_id: str) -> TimerKey:
    return (JOIN, group_id)


def sync_key(group_id: str) -> TimerKey:
    return (SYNC, group_id)


# --- groups and members ----------------------------------------------------------------------

@dataclass(eq=False)
class Member:
    """A classic group member; ``join_waiters``/``sync_waiters`` are its parked JoinGroup/SyncGroup requests."""

    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    join_waiters: list[Hashable] = field(default_factory=list)
    sync_waiters: list[Hashable] = field(default_factory=list)
    is_new: bool = False
    heartbeat_deadline: int | None = None

    @property
    def awaiting_join(self) -> bool:
        return bool(self.join_waiters)

    @property
    def awaiting_sync(self) -> bool:
        return bool(self.sync_waiters)

    def has_satisfied_heartbeat(self) -> bool:
        """New members can expire while awaiting a join; others awaiting a rebalance step can't."""
        if self.is_new:
            return False
        return self.awaiting_join or self.awaiting_sync

    def matches(self, protocols: list[tuple[str, bytes]]) -> bool:
        return protocols == self.protocols

    def metadata(self, protocol_name: str | None) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol_name:
                return metadata
        return b""

    def vote(self, candidates: set[str]) -> str | None:
        """This member's most preferred protocol among ``candidates``."""
        for name, _ in self.protocols:
            if name in candidates:
                return name
        return None


@dataclass(eq=False)
class Group:
    """One classic group's in-memory state; ``members`` keeps join order (the first member leads)."""

    group_id: str
    state: GroupState = EMPTY
    previous_state: GroupState | None = None
    state_timestamp: int | None = None
    generation: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)     # group instance id -> member id
    pending_members: dict[str, int] = field(default_factory=dict)    # member id -> heartbeat deadline
    pending_sync: set[str] = field(default_factory=set)
    subscribed_topics: frozenset[str] | None = None
    new_member_added: bool = False
    join_deadline: int | None = None
    initial_delay: tuple[int, int] | None = None    # (delay, remaining) of a pending initial delayed join
    sync_deadline: int | None = None
    sync_generation: int = NO_GENERATION

    def transition(self, state: GroupState, now_ms: int) -> None:
        self.previous_state = self.state
        self.state = state
        self.state_timestamp = now_ms

    def is_leader(self, member_id: str) -> bool:
        return self.leader_id is not None and self.leader_id == member_id

    def add(self, member: Member) -> None:
        if member.group_instance_id is not None:
            self.static_members[member.group_instance_id] = member.member_id
        if not self.members:
            self.protocol_type = member.protocol_type
        if self.leader_id is None:
            self.leader_id = member.member_id
        self.members[member.member_id] = member
        self.pending_members.pop(member.member_id, None)

    def remove(self, member_id: str) -> Member | None:
        member = self.members.pop(member_id, None)
        if member is not None and member.group_instance_id is not None \
                and self.static_members.get(member.group_instance_id) == member_id:
            del self.static_members[member.group_instance_id]
        if self.is_leader(member_id):
            self.leader_id = next(iter(self.members), None)
        self.pending_members.pop(member_id, None)
        self.pending_sync.discard(member_id)
        return member

    def num_awaiting_join(self) -> int:
        return sum(1 for m in self.members.values() if m.awaiting_join)

    def has_all_members_joined(self) -> bool:
        return all(m.awaiting_join for m in self.members.values()) and not self.pending_members

    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def candidate_protocols(self) -> set[str]:
        """The protocols every member supports."""
        members = iter(self.members.values())
        first = next(members, None)
        if first is None:
            return set()
        candidates = {name for name, _ in first.protocols}
        for member in members:
            candidates &= {name for name, _ in member.protocols}
        return candidates

    def supports_protocols(self, protocol_type: str, names: Iterable[str]) -> bool:
        names = list(names)
        if self.state == EMPTY:
            return bool(protocol_type) and bool(names)
        candidates = self.candidate_protocols()
        return self.protocol_type == protocol_type and any(n in candidates for n in names)

    def select_protocol(self) -> str | None:
        """Kafka's vote: each member votes for its first candidate protocol, the most votes win.

        Kafka breaks ties by hash-map order; here the protocol voted for first (in join order) wins.
        """
        candidates = self.candidate_protocols()
        votes: dict[str, int] = {}
        for member in self.members.values():
            choice = member.vote(candidates)
            if choice is not None:
                votes[choice] = votes.get(choice, 0) + 1
        if not votes:
            return None
        return max(votes, key=votes.__getitem__)

    def uses_consumer_protocol(self) -> bool:
        return self.protocol_type == CONSUMER_PROTOCOL_TYPE

    def compute_subscribed_topics(self) -> frozenset[str] | None:
        """Topics the members subscribe to, known only for the consumer protocol with a chosen protocol."""
        if self.protocol_type != CONSUMER_PROTOCOL_TYPE:
            return None
        if not self.members:
            return frozenset()
        if self.protocol_name is None:
            return None
        topics: set[str] = set()
        for member in self.members.values():
            parsed = gr.subscribed_topics(member.metadata(self.protocol_name))
            if parsed is None:
                return None
            topics |= parsed
        return frozenset(topics)

    def is_subscribed_to(self, topic: str) -> bool:
        """Unknown subscriptions count as subscribed for consumer-protocol groups, as in Kafka."""
        if self.subscribed_topics is not None:
            return topic in self.subscribed_topics
        return self.uses_consumer_protocol()

    def validate_member(self, member_id: str, group_instance_id: str | None) -> int:
        """Kafka's ``validateMember``: a static member's id must be the instance's current one."""
        if group_instance_id is not None:
            existing = self.static_members.get(group_instance_id)
            if existing is None:
                return E.UNKNOWN_MEMBER_ID.code
            if existing != member_id:
                return E.FENCED_INSTANCE_ID.code
        if member_id not in self.members:
            return E.UNKNOWN_MEMBER_ID.code
        return NONE

    def current_members(self) -> tuple[JoinGroupMember, ...]:
        return tuple(JoinGroupMember(m.member_id, m.group_instance_id, m.metadata(self.protocol_name))
                     for m in self.members.values())

    def metadata_record(self, assignment: dict[str, bytes] | None = None) -> tuple[bytes, bytes]:
        """A GroupMetadata record of the group as it is, with ``assignment`` (default: current assignments)."""
        members = tuple(gr.MemberMetadata(
            m.member_id, m.group_instance_id, m.client_id, m.client_host, m.rebalance_timeout_ms,
            m.session_timeout_ms, m.metadata(self.protocol_name),
            m.assignment if assignment is None else assignment.get(m.member_id, b""))
            for m in self.members.values())
        return gr.group_metadata_record(gr.GroupMetadata(
            self.group_id, self.protocol_type or "", self.generation, self.protocol_name, self.leader_id,
            -1 if self.state_timestamp is None else self.state_timestamp, members))


@dataclass(frozen=True)
class CommittedOffset:
    """A materialized offset commit; ``sequence`` orders it against others as its log position would."""

    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp: int
    expire_timestamp: int
    sequence: int
    value: bytes

    @classmethod
    def from_record(cls, record: gr.OffsetCommit, sequence: int, value: bytes) -> "CommittedOffset":
        return cls(record.offset, record.leader_epoch, record.metadata, record.commit_timestamp,
                   record.expire_timestamp, sequence, bytes(value))


@dataclass(frozen=True)
class _JoinRequest:
    request_id: Hashable
    member_id: str
    group_instance_id: str | None
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    session_timeout_ms: int
    rebalance_timeout_ms: int
    client_id: str
    client_host: str
    require_known_member_id: bool
    supports_skip_assignment: bool


@dataclass
class _Op:
    """The clock reading and the effects being gathered by one operation."""

    now: int
    fx: Effects = field(default_factory=Effects)


# --- the coordinator -------------------------------------------------------------------------

class GroupCoordinator(CoordinatorStatus):
    """All classic groups and their committed offsets on this node."""

    def __init__(self, config: GroupConfig | None = None, *, new_uuid: Callable[[], str] | None = None):
        self.config = config or GroupConfig()
        self._new_uuid = new_uuid or (lambda: str(uuid.uuid4()))
        self.groups: dict[str, Group] = {}
        self.offsets: dict[str, dict[tuple[str, int], CommittedOffset]] = {}
        # producer id -> group -> (topic, partition) -> pending transactional offset
        self.pending: dict[int, dict[str, dict[tuple[str, int], CommittedOffset]]] = {}
        self.open_transactions: dict[str, set[int]] = {}
        self._group_values: dict[str, bytes] = {}    # latest stored GroupMetadata value per group
        self._sequence = 0
        CoordinatorStatus.__init__(self)    # loading; unavailable: not serving (see above)

    # --- JoinGroup ---------------------------------------------------------------------------

    def join_group(self, request_id: Hashable, group_id: str, member_id: str, group_instance_id: str | None,
                   protocol_type: str, protocols: list[tuple[str, bytes]], session_timeout_ms: int,
                   rebalance_timeout_ms: int, now_ms: int, *, require_known_member_id: bool = True,
                   supports_skip_assignment: bool = False, client_id: str = "", client_host: str = "",
                   reason: str | None = None) -> Effects:
        """Handle a JoinGroup; the answer may be parked until the rebalance's join phase completes.

        ``require_known_member_id`` is JoinGroup v4+, ``supports_skip_assignment`` v9+; v0 callers pass
        the session timeout as ``rebalance_timeout_ms``.  ``reason`` (v8+) is informational only.
        """
        op = _Op(now_ms)
        req = _JoinRequest(request_id, member_id, group_instance_id, protocol_type,
                           [(name, bytes(metadata)) for name, metadata in protocols], session_timeout_ms,
                           rebalance_timeout_ms, client_id, client_host, require_known_member_id,
                           supports_skip_assignment)
        error = self._join_precheck(group_id, session_timeout_ms)
        if error:
            op.fx.respond(request_id, JoinGroupResult(error, member_id=member_id))
            return op.fx

        group = self.groups.get(group_id)
        created = False
        if group is None:
            if member_id:
                op.fx.respond(request_id, JoinGroupResult(E.UNKNOWN_MEMBER_ID.code, member_id=member_id))
                return op.fx
            group = self.groups[group_id] = Group(group_id, state_timestamp=now_ms)
            created = True

        if not self._accept_joining_member(group, member_id):
            self._drop_member(op, group, member_id)
            op.fx.respond(request_id, JoinGroupResult(E.GROUP_MAX_SIZE_REACHED.code))
        elif not member_id:
            self._join_new_member(op, group, req)
        else:
            self._join_existing_member(op, group, req)

        if created and not group.members and not group.pending_members:
            del self.groups[group_id]
        return op.fx

    def _join_precheck(self, group_id: str, session_timeout_ms: int) -> int:
        if self.serving_error:
            return self.serving_error
        if not group_id:
            return E.INVALID_GROUP_ID.code
        if not self.config.min_session_timeout_ms <= session_timeout_ms <= self.config.max_session_timeout_ms:
            return E.INVALID_SESSION_TIMEOUT.code
        return NONE

    def _accept_joining_member(self, group: Group, member_id: str) -> bool:
        """Kafka's group.max.size rule: awaiting members count while preparing, all members otherwise."""
        limit = self.config.max_group_size
        if limit is None or group.state in (EMPTY, DEAD):
            return True
        member = group.members.get(member_id)
        if group.state == PREPARING_REBALANCE:
            return (member is not None and member.awaiting_join) or group.num_awaiting_join() < limit
        return member is not None or len(group.members) < limit

    def _join_new_member(self, op: _Op, group: Group, req: _JoinRequest) -> None:
        if group.state == DEAD:
            op.fx.respond(req.request_id, JoinGroupResult(E.COORDINATOR_NOT_AVAILABLE.code))
            return
        if not group.supports_protocols(req.protocol_type, (name for name, _ in req.protocols)):
            op.fx.respond(req.request_id, JoinGroupResult(E.INCONSISTENT_GROUP_PROTOCOL.code))
            return
        new_member_id = f"{req.group_instance_id if req.group_instance_id is not None else req.client_id}" \
                        f"-{self._new_uuid()}"
        if req.group_instance_id is not None:
            existing = group.static_members.get(req.group_instance_id)
            if existing is not None:
                self._replace_static_member(op, group, req, existing, new_member_id)
            else:
                self._add_member_and_rebalance(op, group, req, new_member_id)
        elif req.require_known_member_id:
            # KIP-394: hand out the member id and expect the member back with it.
            deadline = op.now + req.session_timeout_ms
            group.pending_members[new_member_id] = deadline
            op.fx.schedule(heartbeat_key(group.group_id, new_member_id), deadline)
            op.fx.respond(req.request_id, JoinGroupResult(E.MEMBER_ID_REQUIRED.code, member_id=new_member_id))
        else:
            self._add_member_and_rebalance(op, group, req, new_member_id)

    def _join_existing_member(self, op: _Op, group: Group, req: _JoinRequest) -> None:
        member_id = req.member_id
        if group.state == DEAD:
            op.fx.respond(req.request_id, JoinGroupResult(E.COORDINATOR_NOT_AVAILABLE.code, member_id=member_id))
            return
        if not group.supports_protocols(req.protocol_type, (name for name, _ in req.protocols)):
            op.fx.respond(req.request_id, JoinGroupResult(E.INCONSISTENT_GROUP_PROTOCOL.code, member_id=member_id))
            return
        if member_id in group.pending_members:
            if req.group_instance_id is not None:
                # Kafka fails this with an IllegalStateException, which clients see as UNKNOWN_SERVER_ERROR.
                op.fx.respond(req.request_id, JoinGroupResult(E.UNKNOWN_SERVER_ERROR.code, member_id=member_id))
            else:
                self._add_member_and_rebalance(op, group, req, member_id)
            return
        error = group.validate_member(member_id, req.group_instance_id)
        if error:
            op.fx.respond(req.request_id, JoinGroupResult(error, member_id=member_id))
            return

        member = group.members[member_id]
        if group.state == PREPARING_REBALANCE:
            self._update_member_and_rebalance(op, group, member, req)
        elif group.state == COMPLETING_REBALANCE:
            if member.matches(req.protocols):
                # Same metadata (the member probably lost the JoinGroup response): answer with this generation.
                op.fx.respond(req.request_id, self._join_result(group, member_id))
            else:
                self._update_member_and_rebalance(op, group, member, req)
        elif group.state == STABLE:
            if group.is_leader(member_id) or not member.matches(req.protocols):
                # A leader's JoinGroup always rebalances: it may have seen a metadata change the others can't.
                self._update_member_and_rebalance(op, group, member, req)
            else:
                op.fx.respond(req.request_id, self._join_result(group, member_id, include_members=False))
        else:
            op.fx.respond(req.request_id, JoinGroupResult(E.UNKNOWN_MEMBER_ID.code, member_id=member_id))

    def _join_result(self, group: Group, member_id: str, *, include_members: bool = True) -> JoinGroupResult:
        members = group.current_members() if include_members and group.is_leader(member_id) else ()
        return JoinGroupResult(NONE, group.generation, group.protocol_type, group.protocol_name,
                               group.leader_id or "", False, member_id, members)

    def _update_member_and_rebalance(self, op: _Op, group: Group, member: Member, req: _JoinRequest) -> None:
        member.protocols = req.protocols
        member.rebalance_timeout_ms = req.rebalance_timeout_ms
        member.session_timeout_ms = req.session_timeout_ms
        member.join_waiters.append(req.request_id)
        self._maybe_prepare_rebalance_or_complete_join(op, group)

    def _add_member_and_rebalance(self, op: _Op, group: Group, req: _JoinRequest, member_id: str) -> None:
        member = Member(member_id, req.group_instance_id, req.client_id, req.client_host,
                        req.rebalance_timeout_ms, req.session_timeout_ms, req.protocol_type, req.protocols,
                        join_waiters=[req.request_id], is_new=True)
        if group.state == PREPARING_REBALANCE and group.previous_state == EMPTY:
            group.new_member_added = True     # lets the initial delayed join wait a little longer
        group.add(member)
        # A parked new member can't heartbeat; if it vanishes, this timeout drops it from the rebalance.
        self._schedule_heartbeat(op, group, member, self.config.new_member_join_timeout_ms)
        self._maybe_prepare_rebalance_or_complete_join(op, group)

    def _replace_static_member(self, op: _Op, group: Group, req: _JoinRequest, old_member_id: str,
                               new_member_id: str) -> None:
        """A known group instance id rejoined without a member id: the new id takes the old one's place.

        The old id is fenced (its parked requests answered FENCED_INSTANCE_ID).  A Stable group whose
        chosen protocol would not change keeps its assignment and needs no rebalance: the new member's
        id is made durable and it gets the current generation back.
        """
        previous_leader = group.leader_id
        old = group.members.pop(old_member_id)
        for request_id in old.join_waiters:
            op.fx.respond(request_id, JoinGroupResult(E.FENCED_INSTANCE_ID.code, member_id=old_member_id))
        for request_id in old.sync_waiters:
            op.fx.respond(request_id, SyncGroupResult(E.FENCED_INSTANCE_ID.code))
        self._cancel_heartbeat(op, group, old)
        new = Member(new_member_id, old.group_instance_id, old.client_id, old.client_host,
                     old.rebalance_timeout_ms, old.session_timeout_ms, old.protocol_type, old.protocols,
                     old.assignment)
        group.members[new_member_id] = new
        if group.is_leader(old_member_id):
            group.leader_id = new_member_id
        group.static_members[req.group_instance_id] = new_member_id
        if old_member_id in group.pending_sync:
            group.pending_sync.discard(old_member_id)
        self._schedule_heartbeat(op, group, new)

        new.protocols = req.protocols
        new.rebalance_timeout_ms = req.rebalance_timeout_ms
        new.session_timeout_ms = req.session_timeout_ms
        new.join_waiters.append(req.request_id)

        if group.state == STABLE:
            if group.protocol_name == group.select_protocol():
                op.fx.append(group.metadata_record())
                new.join_waiters.clear()
                if req.supports_skip_assignment:
                    # JoinGroup v9+: a new leader is told the members but to skip the assignment.
                    is_leader = group.is_leader(new_member_id)
                    op.fx.respond(req.request_id, JoinGroupResult(
                        NONE, group.generation, group.protocol_type, group.protocol_name, group.leader_id or "",
                        is_leader, new_member_id, group.current_members() if is_leader else ()))
                else:
                    # Older clients would reassign if told they lead, so they see the previous leader id.
                    op.fx.respond(req.request_id, JoinGroupResult(
                        NONE, group.generation, group.protocol_type, group.protocol_name, previous_leader or "",
                        False, new_member_id, ()))
            else:
                self._maybe_prepare_rebalance_or_complete_join(op, group)
        elif group.state == COMPLETING_REBALANCE:
            # The leader may be assigning to the old id already; only a new rebalance can fix that.
            self._prepare_rebalance(op, group)
        else:
            self._maybe_complete_join_phase(op, group)

    # --- SyncGroup ---------------------------------------------------------------------------

    def sync_group(self, request_id: Hashable, group_id: str, generation_id: int, member_id: str,
                   group_instance_id: str | None, protocol_type: str | None, protocol_name: str | None,
                   assignments: list[tuple[str, bytes]], now_ms: int) -> Effects:
        """Handle a SyncGroup; followers are parked until the leader's assignment is stored."""
        op = _Op(now_ms)
        error = self._sync_error(group_id, generation_id, member_id, group_instance_id, protocol_type,
                                 protocol_name)
        if error:
            op.fx.respond(request_id, SyncGroupResult(error))
            return op.fx
        group = self.groups[group_id]
        if group.state == PREPARING_REBALANCE:
            op.fx.respond(request_id, SyncGroupResult(E.REBALANCE_IN_PROGRESS.code))
        elif group.state == COMPLETING_REBALANCE:
            group.members[member_id].sync_waiters.append(request_id)
            self._remove_pending_sync(op, group, member_id)
            if group.is_leader(member_id):
                given = {mid: bytes(assignment) for mid, assignment in assignments}
                assignment = {mid: given.get(mid, b"") for mid in group.members}
                op.fx.append(group.metadata_record(assignment))
                for member in group.members.values():
                    member.assignment = assignment[member.member_id]
                self._propagate_assignment(op, group, NONE)
                group.transition(STABLE, op.now)
        else:
            self._remove_pending_sync(op, group, member_id)
            op.fx.respond(request_id, SyncGroupResult(NONE, group.protocol_type, group.protocol_name,
                                                      group.members[member_id].assignment))
        return op.fx

    def _sync_error(self, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None,
                    protocol_type: str | None, protocol_name: str | None) -> int:
        if self.serving_error:
            return self.serving_error
        if not group_id:
            return E.INVALID_GROUP_ID.code
        group = self.groups.get(group_id)
        if group is None or group.state == EMPTY:
            return E.UNKNOWN_MEMBER_ID.code
        if group.state == DEAD:
            return E.COORDINATOR_NOT_AVAILABLE.code
        error = group.validate_member(member_id, group_instance_id)
        if error:
            return error
        if generation_id != group.generation:
            return E.ILLEGAL_GENERATION.code
        if _inconsistent(protocol_type, group.protocol_type) or _inconsistent(protocol_name, group.protocol_name):
            return E.INCONSISTENT_GROUP_PROTOCOL.code
        return NONE

    def _remove_pending_sync(self, op: _Op, group: Group, member_id: str) -> None:
        group.pending_sync.discard(member_id)
        if group.state not in (COMPLETING_REBALANCE, STABLE) or not group.pending_sync:
            self._cancel_sync_expiry(op, group)

    # --- Heartbeat ---------------------------------------------------------------------------

    def heartbeat(self, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None,
                  now_ms: int) -> tuple[int, Effects]:
        """Handle a Heartbeat → (error code, effects); a valid heartbeat restarts the member's session.  While the
        coordinator loads, the member is told nothing (NONE, as Kafka answers it blindly then)."""
        op = _Op(now_ms)
        if self.serving_error:
            return (0 if self.serving_error == E.COORDINATOR_LOAD_IN_PROGRESS.code else self.serving_error), op.fx
        if not group_id:
            return E.INVALID_GROUP_ID.code, op.fx
        group = self.groups.get(group_id)
        if group is None:
            return E.UNKNOWN_MEMBER_ID.code, op.fx
        if group.state == DEAD:
            return E.COORDINATOR_NOT_AVAILABLE.code, op.fx
        error = group.validate_member(member_id, group_instance_id)
        if error:
            return error, op.fx
        if generation_id != group.generation:
            return E.ILLEGAL_GENERATION.code, op.fx
        if group.state == EMPTY:
            return E.UNKNOWN_MEMBER_ID.code, op.fx
        self._schedule_heartbeat(op, group, group.members[member_id])
        if group.state == PREPARING_REBALANCE:
            return E.REBALANCE_IN_PROGRESS.code, op.fx
        # CompletingRebalance too: consumers may heartbeat between their JoinGroup and SyncGroup.
        return NONE, op.fx

    # --- LeaveGroup --------------------------------------------------------------------------

    def leave_group(self, group_id: str, members: list[tuple[str, str | None, str | None]],
                    now_ms: int) -> tuple[list[LeaveMemberResult], int, Effects]:
        """Handle a LeaveGroup of ``(member_id, group_instance_id, reason)`` entries.

        Returns the per-member results, the top-level error and the effects.  An empty member id with
        an instance id removes that static member, whatever its current member id (admin removal).
        """
        op = _Op(now_ms)
        if self.serving_error:
            return [], self.serving_error, op.fx
        if not group_id:
            return [], E.INVALID_GROUP_ID.code, op.fx
        group = self.groups.get(group_id)
        if group is None:
            return [], E.UNKNOWN_MEMBER_ID.code, op.fx
        if group.state == DEAD:
            return [], E.COORDINATOR_NOT_AVAILABLE.code, op.fx

        results = []
        for member_id, instance_id, _reason in members:
            if not member_id:
                current = group.static_members.get(instance_id) if instance_id is not None else None
                if current is not None:
                    self._remove_leaving_member(op, group, group.members[current])
                    results.append(LeaveMemberResult(member_id, instance_id, NONE))
                else:
                    results.append(LeaveMemberResult(member_id, instance_id, E.UNKNOWN_MEMBER_ID.code))
            elif member_id in group.pending_members:
                del group.pending_members[member_id]
                op.fx.cancel_timer(heartbeat_key(group.group_id, member_id))
                results.append(LeaveMemberResult(member_id, instance_id, NONE))
            else:
                error = group.validate_member(member_id, instance_id)
                if not error:
                    self._remove_leaving_member(op, group, group.members[member_id])
                results.append(LeaveMemberResult(member_id, instance_id, error))

        if any(r.error == NONE for r in results):
            if group.state in (STABLE, COMPLETING_REBALANCE):
                self._maybe_prepare_rebalance_or_complete_join(op, group)
            elif group.state == PREPARING_REBALANCE:
                self._maybe_complete_join_phase(op, group)
        return results, NONE, op.fx

    def _remove_leaving_member(self, op: _Op, group: Group, member: Member) -> None:
        self._cancel_heartbeat(op, group, member)
        self._answer_removed_member(op, member)
        group.remove(member.member_id)

    # --- timers ------------------------------------------------------------------------------

    def on_timer(self, key: TimerKey, now_ms: int) -> Effects:
        """A timer fired: a member's session expired, a delayed join is due, or a pending sync expired."""
        op = _Op(now_ms)
        if self.loading or not key:
            return op.fx
        kind = key[0]
        group = self.groups.get(key[1]) if len(key) > 1 else None
        if group is None or group.state == DEAD:
            return op.fx
        if kind == HEARTBEAT and len(key) == 3:
            self._expire_heartbeat(op, group, key[2])
        elif kind == JOIN:
            if group.join_deadline is None or now_ms < group.join_deadline:
                return op.fx
            group.join_deadline = None
            initial, group.initial_delay = group.initial_delay, None
            if initial is not None:
                self._try_complete_initial_rebalance(op, group, *initial)
            else:
                self._complete_join(op, group)
        elif kind == SYNC:
            if group.sync_deadline is None or now_ms < group.sync_deadline:
                return op.fx
            group.sync_deadline = None
            self._expire_pending_sync(op, group)
        return op.fx

    def _expire_heartbeat(self, op: _Op, group: Group, member_id: str) -> None:
        deadline = group.pending_members.get(member_id)
        if deadline is not None:
            if op.now >= deadline:
                del group.pending_members[member_id]
                if group.state == PREPARING_REBALANCE and group.has_all_members_joined():
                    self._complete_join(op, group)
            return
        member = group.members.get(member_id)
        if member is None or member.heartbeat_deadline is None or op.now < member.heartbeat_deadline:
            return
        member.heartbeat_deadline = None
        if member.has_satisfied_heartbeat():
            return      # a fresh session starts once its rebalance step completes
        self._answer_removed_member(op, member)
        group.remove(member_id)
        if group.state in (STABLE, COMPLETING_REBALANCE):
            self._maybe_prepare_rebalance_or_complete_join(op, group)
        elif group.state == PREPARING_REBALANCE and group.has_all_members_joined():
            self._complete_join(op, group)

    def _expire_pending_sync(self, op: _Op, group: Group) -> None:
        """Members that never sent their SyncGroup after the join phase are removed, and the group rebalances."""
        if group.sync_generation != group.generation or group.state not in (COMPLETING_REBALANCE, STABLE):
            return
        if not group.pending_sync:
            return
        for member_id in sorted(group.pending_sync):
            member = group.members.get(member_id)
            if member is not None:
                self._cancel_heartbeat(op, group, member)
                self._answer_removed_member(op, member)
            group.remove(member_id)
        self._prepare_rebalance(op, group)

    # --- the rebalance machinery -------------------------------------------------------------

    def _maybe_prepare_rebalance_or_complete_join(self, op: _Op, group: Group) -> None:
        if group.state in (STABLE, COMPLETING_REBALANCE, EMPTY):
            self._prepare_rebalance(op, group)
        else:
            self._maybe_complete_join_phase(op, group)

    def _maybe_complete_join_phase(self, op: _Op, group: Group) -> None:
        """Complete the join phase early once everyone rejoined -- except during the initial delay."""
        if group.state != PREPARING_REBALANCE or group.previous_state == EMPTY:
            return
        if group.has_all_members_joined():
            self._complete_join(op, group)

    def _prepare_rebalance(self, op: _Op, group: Group) -> None:
        if group.state == COMPLETING_REBALANCE:
            # Members parked in SyncGroup must rejoin.
            for member in group.members.values():
                member.assignment = b""
            self._propagate_assignment(op, group, E.REBALANCE_IN_PROGRESS.code)
        group.pending_sync.clear()
        self._cancel_sync_expiry(op, group)

        initial = group.state == EMPTY
        if initial:
            # group.initial.rebalance.delay.ms: give a new group's members time to arrive.
            delay = self.config.initial_rebalance_delay_ms
            remaining = max(group.rebalance_timeout_ms() - delay, 0)
            self._schedule_join(op, group, op.now + delay, (delay, remaining))
        group.transition(PREPARING_REBALANCE, op.now)
        if not initial:
            if group.has_all_members_joined():
                self._complete_join(op, group)
            else:
                self._schedule_join(op, group, op.now + group.rebalance_timeout_ms())

    def _try_complete_initial_rebalance(self, op: _Op, group: Group, delay: int, remaining: int) -> None:
        """Kafka's InitialDelayedJoin: each new arrival extends the wait, up to the rebalance timeout."""
        if group.new_member_added and remaining != 0:
            group.new_member_added = False
            new_delay = min(self.config.initial_rebalance_delay_ms, remaining)
            new_remaining = max(remaining - delay, 0)
            self._schedule_join(op, group, op.now + new_delay, (new_delay, new_remaining))
        else:
            self._complete_join(op, group)

    def _complete_join(self, op: _Op, group: Group) -> None:
        """End the join phase: drop dynamic members that did not rejoin, start the next generation."""
        self._cancel_join(op, group)
        for member in [m for m in group.members.values() if not m.awaiting_join and m.group_instance_id is None]:
            self._cancel_heartbeat(op, group, member)
            self._answer_removed_member(op, member)
            group.remove(member.member_id)
        if group.state == DEAD:
            return
        if group.members and not self._elect_joined_leader(group):
            # Nobody rejoined (only static members remain): wait for them or for their sessions to expire.
            self._schedule_join(op, group, op.now + group.rebalance_timeout_ms())
            return

        group.generation += 1
        group.pending_sync.clear()
        if not group.members:
            group.protocol_name = None
            group.subscribed_topics = group.compute_subscribed_topics()
            group.transition(EMPTY, op.now)
            op.fx.append(group.metadata_record())
            return
        group.protocol_name = group.select_protocol()
        group.subscribed_topics = group.compute_subscribed_topics()
        group.transition(COMPLETING_REBALANCE, op.now)
        for member in group.members.values():
            result = self._join_result(group, member.member_id)
            for request_id in member.join_waiters:
                op.fx.respond(request_id, result)
            member.join_waiters.clear()
            self._schedule_heartbeat(op, group, member)
            member.is_new = False
            group.pending_sync.add(member.member_id)
        group.sync_deadline = op.now + group.rebalance_timeout_ms()
        group.sync_generation = group.generation
        op.fx.schedule(sync_key(group.group_id), group.sync_deadline)

    def _elect_joined_leader(self, group: Group) -> bool:
        """Keep the leader if it rejoined, else hand leadership to a member that did."""
        leader = group.members.get(group.leader_id) if group.leader_id is not None else None
        if leader is None:
            return False
        if leader.awaiting_join:
            return True
        for member in group.members.values():
            if member.awaiting_join:
                group.leader_id = member.member_id
                return True
        return False

    def _propagate_assignment(self, op: _Op, group: Group, error: int) -> None:
        protocol_type = group.protocol_type if error == NONE else None
        protocol_name = group.protocol_name if error == NONE else None
        for member in group.members.values():
            if not member.sync_waiters:
                continue
            result = SyncGroupResult(error, protocol_type, protocol_name, member.assignment)
            for request_id in member.sync_waiters:
                op.fx.respond(request_id, result)
            member.sync_waiters.clear()
            self._schedule_heartbeat(op, group, member)

    def _answer_removed_member(self, op: _Op, member: Member) -> None:
        """A removed member's parked requests are answered UNKNOWN_MEMBER_ID so that it rejoins."""
        for request_id in member.join_waiters:
            op.fx.respond(request_id, JoinGroupResult(E.UNKNOWN_MEMBER_ID.code))
        for request_id in member.sync_waiters:
            op.fx.respond(request_id, SyncGroupResult(E.UNKNOWN_MEMBER_ID.code))
        member.join_waiters.clear()
        member.sync_waiters.clear()

    def _drop_member(self, op: _Op, group: Group, member_id: str) -> None:
        member = group.members.get(member_id)
        if member is not None:
            self._cancel_heartbeat(op, group, member)
            self._answer_removed_member(op, member)
        group.remove(member_id)

    def _schedule_heartbeat(self, op: _Op, group: Group, member: Member, timeout_ms: int | None = None) -> None:
        member.heartbeat_deadline = op.now + (member.session_timeout_ms if timeout_ms is None else timeout_ms)
        op.fx.schedule(heartbeat_key(group.group_id, member.member_id), member.heartbeat_deadline)

    def _cancel_heartbeat(self, op: _Op, group: Group, member: Member) -> None:
        member.heartbeat_deadline = None
        op.fx.cancel_timer(heartbeat_key(group.group_id, member.member_id))

    def _schedule_join(self, op: _Op, group: Group, deadline: int, initial: tuple[int, int] | None = None) -> None:
        group.join_deadline = deadline
        group.initial_delay = initial
        op.fx.schedule(join_key(group.group_id), deadline)

    def _cancel_join(self, op: _Op, group: Group) -> None:
        group.join_deadline = None
        group.initial_delay = None
        op.fx.cancel_timer(join_key(group.group_id))

    def _cancel_sync_expiry(self, op: _Op, group: Group) -> None:
        if group.sync_deadline is not None:
            group.sync_deadline = None
            op.fx.cancel_timer(sync_key(group.group_id))

    # --- DescribeGroups, ListGroups, DeleteGroups ---------------------------------------------

    def describe_groups(self, group_ids: list[str], version: int = 0) -> list[DescribedGroup]:
        """DescribeGroups; an unknown group is described as Dead, with GROUP_ID_NOT_FOUND from v6 (KIP-1043)."""
        described = []
        for group_id in group_ids:
            if self.serving_error:
                described.append(DescribedGroup(self.serving_error, group_id, "", "", ""))
                continue
            group = self.groups.get(group_id)
            if group is None or group.state == DEAD:
                error = E.GROUP_ID_NOT_FOUND.code if version >= 6 else NONE
                described.append(DescribedGroup(error, group_id, str(DEAD), "", ""))
                continue
            stable = group.state == STABLE
            members = tuple(DescribedMember(
                m.member_id, m.group_instance_id, m.client_id, m.client_host,
                m.metadata(group.protocol_name) if stable else b"", m.assignment)
                for m in group.members.values())
            described.append(DescribedGroup(NONE, group_id, str(group.state), group.protocol_type or "",
                                            (group.protocol_name or "") if stable else "", members))
        return described

    def list_groups(self, states_filter: list[str] | None = None,
                    types_filter: list[str] | None = None) -> tuple[int, list[ListedGroup]]:
        """ListGroups → (error, groups); filters match case-insensitively, an empty filter matches all."""
        if self.unavailable == E.NOT_COORDINATOR.code:
            return 0, []                     # none of the groups this broker coordinates
        if self.serving_error:
            return self.serving_error, []
        states = {s.strip().lower() for s in states_filter or ()}
        types = {t.strip().lower() for t in types_filter or ()}
        if types and GROUP_TYPE_CLASSIC not in types:
            return NONE, []
        listed = [ListedGroup(g.group_id, g.protocol_type or "", str(g.state), GROUP_TYPE_CLASSIC)
                  for g in self.groups.values()
                  if g.state != DEAD and (not states or str(g.state).lower() in states)]
        return NONE, listed

    def delete_groups(self, group_ids: list[str], now_ms: int) -> tuple[list[tuple[str, int]], list]:
        """DeleteGroups → ([(group_id, error)], records): only Empty groups go, with all their offsets.

        A deleted group turns Dead at once (joins get COORDINATOR_NOT_AVAILABLE and retry) and
        disappears when its tombstone is replayed.
        """
        results, records = [], []
        for group_id in group_ids:
            if self.serving_error:
                results.append((group_id, self.serving_error))
                continue
            group = self.groups.get(group_id)
            if group is None or group.state == DEAD:
                results.append((group_id, E.GROUP_ID_NOT_FOUND.code))
                continue
            if group.state != EMPTY:
                results.append((group_id, E.NON_EMPTY_GROUP.code))
                continue
            records.extend(self._all_offset_tombstones(group_id))
            records.append(gr.group_metadata_tombstone(group_id))
            group.transition(DEAD, now_ms)
            results.append((group_id, NONE))
        return results, records

    def _all_offset_tombstones(self, group_id: str) -> list:
        tombstones = [gr.offset_commit_tombstone(group_id, t, p) for t, p in self.offsets.get(group_id, {})]
        seen = set(self.offsets.get(group_id, {}))
        for producer_id in sorted(self.open_transactions.get(group_id, ())):
            for tp in self.pending.get(producer_id, {}).get(group_id, {}):
                if tp not in seen:
                    seen.add(tp)
                    tombstones.append(gr.offset_commit_tombstone(group_id, *tp))
        return tombstones

    # --- OffsetCommit and TxnOffsetCommit ----------------------------------------------------

    def commit_offsets(self, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None,
                       offsets: list[OffsetToCommit], now_ms: int, *,
                       max_metadata_size: int = DEFAULT_MAX_METADATA_SIZE,
                       retention_time_ms: int = DEFAULT_RETENTION_TIME,
                       api_version: int = 8) -> tuple[list[PartitionResult], Effects]:
        """OffsetCommit → (per-partition results, effects with the records to append).

        Generation -1 with no member id is a "simple" commit, accepted when the group is Empty or
        unknown (which creates an Empty group without a protocol type).  The commit is not visible until
        its records are replayed.  ``retention_time_ms`` is OffsetCommit v2-4's field; ``api_version``
        picks the unknown-group error (GROUP_ID_NOT_FOUND from v9, ILLEGAL_GENERATION before).
        """
        op = _Op(now_ms)
        if self.serving_error:
            return _all_failed(offsets, self.serving_error), op.fx
        group = self.groups.get(group_id)
        if group is None:
            if generation_id >= 0:
                error = E.GROUP_ID_NOT_FOUND.code if api_version >= 9 else E.ILLEGAL_GENERATION.code
                return _all_failed(offsets, error), op.fx
            group = self.groups[group_id] = Group(group_id, state_timestamp=now_ms)
        error = self._validate_offset_commit(group, member_id, group_instance_id, generation_id, False)
        if error:
            return _all_failed(offsets, error), op.fx
        if group.state in (STABLE, PREPARING_REBALANCE) and member_id in group.members:
            # A classic member's commit counts as a sign of life.
            self._schedule_heartbeat(op, group, group.members[member_id])
        expire = now_ms + retention_time_ms if retention_time_ms != DEFAULT_RETENTION_TIME else -1
        results = self._offset_records(group_id, offsets, now_ms, max_metadata_size, expire, op.fx.records)
        return results, op.fx

    def txn_commit_offsets(self, transactional_id: str, group_id: str, producer_id: int, producer_epoch: int,
                           generation_id: int, member_id: str, group_instance_id: str | None,
                           offsets: list[OffsetToCommit], now_ms: int, *,
                           max_metadata_size: int = DEFAULT_MAX_METADATA_SIZE) -> tuple[list[PartitionResult], list]:
        """TxnOffsetCommit → (per-partition results, records to write in the producer's transactional batch)."""
        if self.serving_error:
            return _all_failed(offsets, self.serving_error), []
        if not group_id:
            return _all_failed(offsets, E.INVALID_GROUP_ID.code), []
        group = self.groups.get(group_id)
        if group is None:
            if generation_id >= 0:
                return _all_failed(offsets, E.ILLEGAL_GENERATION.code), []
            group = self.groups[group_id] = Group(group_id, state_timestamp=now_ms)
        error = self._validate_offset_commit(group, member_id, group_instance_id, generation_id, True)
        if error:
            return _all_failed(offsets, error), []
        records: list = []
        return self._offset_records(group_id, offsets, now_ms, max_metadata_size, -1, records), records

    def _validate_offset_commit(self, group: Group, member_id: str, group_instance_id: str | None,
                                generation_id: int, transactional: bool) -> int:
        if group.state == DEAD:
            return E.COORDINATOR_NOT_AVAILABLE.code
        if generation_id < 0 and group.state == EMPTY:
            return NONE
        if generation_id >= 0 or member_id or group_instance_id is not None:
            error = group.validate_member(member_id, group_instance_id)
            if error:
                return error
            if generation_id != group.generation:
                return E.ILLEGAL_GENERATION.code
        elif not transactional and group.state != EMPTY:
            # A commit without member and generation is only allowed while nobody is a member.
            return E.UNKNOWN_MEMBER_ID.code
        if not transactional and group.state == COMPLETING_REBALANCE:
            return E.REBALANCE_IN_PROGRESS.code
        return NONE

    @staticmethod
    def _offset_records(group_id: str, offsets: list[OffsetToCommit], now_ms: int, max_metadata_size: int,
                        expire_timestamp: int, records: list) -> list[PartitionResult]:
        results = []
        for topic, partition, offset, leader_epoch, metadata in offsets:
            if metadata is not None and len(metadata) > max_metadata_size:
                results.append(PartitionResult(topic, partition, E.OFFSET_METADATA_TOO_LARGE.code))
                continue
            records.append(gr.offset_commit_record(group_id, topic, partition, offset, leader_epoch, metadata,
                                                   now_ms, expire_timestamp))
            results.append(PartitionResult(topic, partition, NONE))
        return results

    # --- OffsetFetch, OffsetDelete, expiry ---------------------------------------------------

    def fetch_offsets(self, group_id: str, partitions: list[tuple[str, int]] | None = None,
                      require_stable: bool = False) -> tuple[int, list[FetchedOffset]]:
        """OffsetFetch → (group error, offsets); ``partitions=None`` fetches every committed offset.

        With ``require_stable`` a partition with a pending transactional commit is UNSTABLE_OFFSET_COMMIT.
        """
        if self.serving_error:
            return self.serving_error, []
        group = self.groups.get(group_id)
        committed = {} if group is None or group.state == DEAD else self.offsets.get(group_id, {})
        if partitions is None:
            partitions = sorted(committed)
        fetched = []
        for topic, partition in partitions:
            entry = committed.get((topic, partition))
            if require_stable and self._has_pending(group_id, topic, partition):
                fetched.append(FetchedOffset(topic, partition, NO_OFFSET, NO_LEADER_EPOCH, "",
                                             E.UNSTABLE_OFFSET_COMMIT.code))
            elif entry is None:
                fetched.append(FetchedOffset(topic, partition, NO_OFFSET, NO_LEADER_EPOCH, "", NONE))
            else:
                fetched.append(FetchedOffset(topic, partition, entry.offset, entry.leader_epoch, entry.metadata,
                                             NONE))
        return NONE, fetched

    def delete_offsets(self, group_id: str,
                       partitions: list[tuple[str, int]]) -> tuple[int, list[PartitionResult], list]:
        """OffsetDelete → (group error, per-partition results, tombstones).

        A group with members refuses with NON_EMPTY_GROUP unless it uses the consumer protocol, whose
        subscriptions are known: then only topics no member subscribes to can lose their offsets.
        """
        if self.serving_error:
            return self.serving_error, [], []
        if not group_id:
            return E.INVALID_GROUP_ID.code, [], []
        group = self.groups.get(group_id)
        if group is None or group.state == DEAD:
            return E.GROUP_ID_NOT_FOUND.code, [], []
        if group.state != EMPTY and not group.uses_consumer_protocol():
            return E.NON_EMPTY_GROUP.code, [], []
        results, records = [], []
        committed = self.offsets.get(group_id, {})
        for topic, partition in partitions:
            if group.is_subscribed_to(topic):
                results.append(PartitionResult(topic, partition, E.GROUP_SUBSCRIBED_TO_TOPIC.code))
                continue
            results.append(PartitionResult(topic, partition, NONE))
            if (topic, partition) in committed or self._has_pending(group_id, topic, partition):
                records.append(gr.offset_commit_tombstone(group_id, topic, partition))
        return NONE, results, records

    def expire_offsets(self, now_ms: int) -> list:
        """Tombstones for expired offsets, and for Empty groups left with no offsets (Kafka's cleanup cycle).

        KIP-211: a group's offsets expire ``offsets_retention_ms`` after the group became Empty; a
        group without a protocol type (simple commits only) expires each offset that long after its
        commit; a Stable consumer-protocol group expires offsets of topics nobody subscribes to that
        long after their commit.  Offsets with an explicit expiry (v1 records) expire then.  Offsets
        with a pending transactional commit stay.  Groups given a tombstone turn Dead at once.
        """
        if self.loading:
            return []
        records = []
        for group_id, group in list(self.groups.items()):
            if group.state == DEAD:
                continue
            base = self._expiration_base(group)
            all_expired = True
            for (topic, partition), entry in self.offsets.get(group_id, {}).items():
                if base is None or group.is_subscribed_to(topic):
                    all_expired = False
                    continue
                if entry.expire_timestamp != -1:
                    expired = now_ms >= entry.expire_timestamp
                else:
                    expired = now_ms - base(entry) >= self.config.offsets_retention_ms
                if expired and not self._has_pending(group_id, topic, partition):
                    records.append(gr.offset_commit_tombstone(group_id, topic, partition))
                else:
                    all_expired = False
            if all_expired and group_id not in self.open_transactions and group.state == EMPTY:
                records.append(gr.group_metadata_tombstone(group_id))
                group.transition(DEAD, now_ms)
        return records

    @staticmethod
    def _expiration_base(group: Group) -> Callable[[CommittedOffset], int] | None:
        if group.protocol_type is None:
            return lambda entry: entry.commit_timestamp
        if group.state == EMPTY:
            since = group.state_timestamp
            return lambda entry: since if since is not None else entry.commit_timestamp
        if group.uses_consumer_protocol() and group.subscribed_topics is not None and group.state == STABLE:
            return lambda entry: entry.commit_timestamp
        return None

    def _has_pending(self, group_id: str, topic: str, partition: int) -> bool:
        for producer_id in self.open_transactions.get(group_id, ()):
            if (topic, partition) in self.pending.get(producer_id, {}).get(group_id, {}):
                return True
        return False

    # --- replay and loading ------------------------------------------------------------------

    def replay(self, key: bytes, value: bytes | None, *, producer_id: int = -1,
               transactional: bool = False) -> None:
        """Apply one appended (or, at start-up, loaded) record; records of other types are ignored."""
        self._sequence += 1
        record = gr.parse_record(key, value)
        if isinstance(record, gr.OffsetCommit):
            if record.group not in self.groups:
                # Offsets committed outside group management create a "simple" Empty group.
                self.groups[record.group] = Group(record.group)
            entry = CommittedOffset.from_record(record, self._sequence, value)
            tp = (record.topic, record.partition)
            if transactional:
                self.pending.setdefault(producer_id, {}).setdefault(record.group, {})[tp] = entry
                self.open_transactions.setdefault(record.group, set()).add(producer_id)
            else:
                self.offsets.setdefault(record.group, {})[tp] = entry
        elif isinstance(record, gr.OffsetTombstone):
            tp = (record.topic, record.partition)
            group_offsets = self.offsets.get(record.group)
            if group_offsets is not None:
                group_offsets.pop(tp, None)
                if not group_offsets:
                    del self.offsets[record.group]
            for open_producer in self.open_transactions.get(record.group, ()):
                self.pending.get(open_producer, {}).get(record.group, {}).pop(tp, None)
        elif isinstance(record, gr.GroupMetadata):
            self._group_values[record.group] = bytes(value)
            if self.loading:
                self.groups[record.group] = _group_from_record(record)
        elif isinstance(record, gr.GroupTombstone):
            self._group_values.pop(record.group, None)
            group = self.groups.get(record.group)
            if group is not None and (self.loading or (group.state in (EMPTY, DEAD) and not group.members)):
                del self.groups[record.group]
                # A deleted group takes its offsets along, also any replayed after the decision.
                self.offsets.pop(record.group, None)

    def delete_topic_offsets(self, topics: set[str]) -> list:
        """Tombstones for every committed offset of deleted topics (Kafka's onPartitionsDeleted)."""
        return [gr.offset_commit_tombstone(group_id, topic, partition)
                for group_id, offsets in self.offsets.items()
                for (topic, partition) in offsets if topic in topics]

    def replay_end_txn(self, producer_id: int, commit: bool) -> None:
        """Apply a transaction marker: COMMIT makes the producer's pending offsets visible, ABORT drops them.

        A pending commit only replaces a committed offset written before it, as Kafka compares log offsets.
        """
        self._sequence += 1
        pending = self.pending.pop(producer_id, None)
        if pending is None:
            return
        for group_id, offsets in pending.items():
            producers = self.open_transactions.get(group_id)
            if producers is not None:
                producers.discard(producer_id)
                if not producers:
                    del self.open_transactions[group_id]
            if not commit:
                continue
            committed = self.offsets.setdefault(group_id, {})
            for tp, entry in offsets.items():
                existing = committed.get(tp)
                if existing is None or entry.sequence > existing.sequence:
                    committed[tp] = entry
            if not committed:
                del self.offsets[group_id]

    def loaded(self, now_ms: int) -> Effects:
        """End loading: loaded members' sessions start now, and requests are served from here on."""
        op = _Op(now_ms)
        self.loading = False
        limit = self.config.max_group_size
        for group in self.groups.values():
            for member in group.members.values():
                self._schedule_heartbeat(op, group, member)
            if limit is not None and len(group.members) > limit:
                # group.max.size shrank since the group was stored: rebalance so it can shed members.
                self._prepare_rebalance(op, group)
        return op.fx

    def compact_records(self) -> list[tuple[bytes, bytes]]:
        """The latest value of every live key: group metadata first, then committed offsets.

        Pending transactional offsets are not included; see :meth:`pending_transactional_records`.
        """
        records = [(gr.group_metadata_key(g), v) for g, v in self._group_values.items()]
        for group_id, offsets in self.offsets.items():
            for (topic, partition), entry in sorted(offsets.items(), key=lambda item: item[1].sequence):
                records.append((gr.offset_commit_key(group_id, topic, partition), entry.value))
        return records

    def pending_transactional_records(self) -> list[tuple[int, bytes, bytes]]:
        """``(producer_id, key, value)`` of every offset commit still waiting for its transaction marker."""
        records = []
        for producer_id, groups in self.pending.items():
            for group_id, offsets in groups.items():
                for (topic, partition), entry in offsets.items():
                    records.append((producer_id, gr.offset_commit_key(group_id, topic, partition), entry.value))
        return records


def _group_from_record(record: gr.GroupMetadata) -> Group:
    """A group as loaded: its members keep their assignments, and it is Stable if it has any."""
    group = Group(record.group,
                  state=STABLE if record.members else EMPTY,
                  state_timestamp=None if record.current_state_timestamp == -1 else record.current_state_timestamp,
                  generation=record.generation,
                  protocol_type=record.protocol_type or None,
                  protocol_name=record.protocol,
                  leader_id=record.leader)
    for m in record.members:
        member = Member(m.member_id, m.group_instance_id, m.client_id, m.client_host, m.rebalance_timeout,
                        m.session_timeout, record.protocol_type, [(record.protocol or "", m.subscription)],
                        m.assignment)
        group.members[m.member_id] = member
        if m.group_instance_id is not None:
            group.static_members[m.group_instance_id] = m.member_id
    if group.leader_id not in group.members:
        group.leader_id = next(iter(group.members), None)
    group.subscribed_topics = group.compute_subscribed_topics()
    return group


def _inconsistent(requested: str | None, current: str | None) -> bool:
    return requested is not None and current is not None and requested != current


def _all_failed(offsets: list[OffsetToCommit], error: int) -> list[PartitionResult]:
    return [PartitionResult(topic, partition, error) for topic, partition, *_ in offsets]
