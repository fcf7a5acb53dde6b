"""Encodes and decodes the group coordinator's durable records in Kafka's ``__consumer_offsets`` format.

Every record is a key/value pair.  Both halves start with an int16 version; the key's version names the
record type, as in Kafka:

* key versions 0 and 1 -- an offset commit (``OffsetCommitKey``: group, topic, partition) whose value is
  an ``OffsetCommitValue`` (offset, leader epoch, metadata, commit timestamp, optional expiry);
* key version 2 -- a classic group's metadata (``GroupMetadataKey``: group) whose value is a
  ``GroupMetadataValue`` (protocol type, generation, protocol, leader, state timestamp, members).

A value of ``None`` is a tombstone: the latest record for a key wins, so a tombstone deletes it.
Values are written at the versions Kafka writes today (offset commits at 3, or 1 when they carry an
explicit expiry; group metadata at 3).  Values newer than the highest version known here are read as
that highest version, which is sound because Kafka only adds tagged fields to these records (KIP-915).
"""
from __future__ import annotations

from dataclasses import dataclass

from trireme.state.coordinator_records import RecordError, decode, encode, split_version
from trireme.wire.codec import message
from trireme.wire.primitives import CodecError

OFFSET_COMMIT_KEY_VERSION = 1
GROUP_METADATA_KEY_VERSION = 2
OFFSET_COMMIT_VALUE_VERSION = 3
OFFSET_COMMIT_VALUE_VERSION_WITH_EXPIRY = 1
GROUP_METADATA_VALUE_VERSION = 3

NO_EXPIRE_TIMESTAMP = -1
NO_LEADER_EPOCH = -1





# --- typed records ---------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class OffsetCommit:
    """A committed offset for one partition of one group."""

    group: str
    topic: str
    partition: int
    offset: int
    leader_epoch: int = NO_LEADER_EPOCH
    metadata: str = ""
    commit_timestamp: int = -1
    expire_timestamp: int = NO_EXPIRE_TIMESTAMP


@dataclass(frozen=True, slots=True)
class OffsetTombstone:
    """The deletion of one partition's committed offset."""

    group: str
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class MemberMetadata:
    """One member of a classic group as stored: its subscription for the chosen protocol and its assignment."""

    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout: int
    session_timeout: int
    subscription: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupMetadata:
    """A classic group's stored state after a generation's assignment (or on becoming Empty)."""

    group: str
    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    current_state_timestamp: int
    members: tuple[MemberMetadata, ...] = ()


@dataclass(frozen=True, slots=True)
class GroupTombstone:
    """The deletion of a classic group's metadata."""

    group: str


Record = OffsetCommit | OffsetTombstone | GroupMetadata | GroupTombstone


# --- encoding --------------------------------------------------------------------------------

def offset_commit_key(group: str, topic: str, partition: int) -> bytes:
    """The key under which one partition's committed offset for a group is stored."""
    codec = message("OffsetCommitKey")
    return encode("OffsetCommitKey", codec.cls(group=group, topic=topic, partition=partition),
                   OFFSET_COMMIT_KEY_VERSION)


def group_metadata_key(group: str) -> bytes:
    """The key under which a classic group's metadata is stored."""
    return encode("GroupMetadataKey", message("GroupMetadataKey").cls(group=group), GROUP_METADATA_KEY_VERSION)


def offset_commit_record(group: str, topic: str, partition: int, offset: int, leader_epoch: int,
                         metadata: str | None, commit_timestamp: int,
                         expire_timestamp: int = NO_EXPIRE_TIMESTAMP) -> tuple[bytes, bytes]:
    """An offset commit record; a null ``metadata`` is stored as ``""``, as Kafka does."""
    version = OFFSET_COMMIT_VALUE_VERSION if expire_timestamp == NO_EXPIRE_TIMESTAMP \
        else OFFSET_COMMIT_VALUE_VERSION_WITH_EXPIRY
    value = message("OffsetCommitValue").cls(
        offset=offset, leader_epoch=leader_epoch, metadata=metadata or "",
        commit_timestamp=commit_timestamp, expire_timestamp=expire_timestamp)
    return offset_commit_key(group, topic, partition), encode("OffsetCommitValue", value, version)


def offset_commit_tombstone(group: str, topic: str, partition: int) -> tuple[bytes, None]:
    return offset_commit_key(group, topic, partition), None


def group_metadata_record(group: GroupMetadata) -> tuple[bytes, bytes]:
    """A group metadata record for ``group`` (a :class:`GroupMetadata`)."""
    codec = message("GroupMetadataValue")
    members = [codec.cls.MemberMetadata(
        member_id=m.member_id, group_instance_id=m.group_instance_id, client_id=m.client_id,
        client_host=m.client_host, rebalance_timeout=m.rebalance_timeout, session_timeout=m.session_timeout,
        subscription=bytes(m.subscription), assignment=bytes(m.assignment)) for m in group.members]
    value = codec.cls(protocol_type=group.protocol_type, generation=group.generation, protocol=group.protocol,
                      leader=group.leader, current_state_timestamp=group.current_state_timestamp, members=members)
    return group_metadata_key(group.group), encode("GroupMetadataValue", value, GROUP_METADATA_VALUE_VERSION)


def group_metadata_tombstone(group: str) -> tuple[bytes, None]:
    return group_metadata_key(group), None


# --- decoding --------------------------------------------------------------------------------

def record_type(key: bytes) -> str | None:
    """``"offset"``, ``"group"`` or ``None`` (a record type this coordinator does not keep) for a key."""
    version, _ = split_version(key)
    if version in (0, 1):
        return "offset"
    if version == GROUP_METADATA_KEY_VERSION:
        return "group"
    return None


def parse_record(key: bytes, value: bytes | None) -> Record | None:
    """The typed form of one record; ``None`` for key versions other than offset commits and group metadata.

    Raises :class:`RecordError` when the bytes do not decode.
    """
    key_version, key_body = split_version(key)
    if key_version in (0, 1):
        k = decode("OffsetCommitKey", key_body, key_version)
        if value is None:
            return OffsetTombstone(k.group, k.topic, k.partition)
        value_version, value_body = split_version(value)
        v = decode("OffsetCommitValue", value_body, value_version)
        return OffsetCommit(k.group, k.topic, k.partition, v.offset, v.leader_epoch, v.metadata,
                            v.commit_timestamp, v.expire_timestamp)
    if key_version == GROUP_METADATA_KEY_VERSION:
        k = decode("GroupMetadataKey", key_body, key_version)
        if value is None:
            return GroupTombstone(k.group)
        value_version, value_body = split_version(value)
        v = decode("GroupMetadataValue", value_body, value_version)
        members = tuple(MemberMetadata(
            m.member_id, m.group_instance_id, m.client_id, m.client_host,
            # Records older than version 1 have no rebalance timeout; Kafka uses the session timeout.
            m.rebalance_timeout if m.rebalance_timeout != -1 else m.session_timeout,
            m.session_timeout, bytes(m.subscription), bytes(m.assignment)) for m in v.members)
        return GroupMetadata(k.group, v.protocol_type, v.generation, v.protocol, v.leader,
                             v.current_state_timestamp, members)
    return None


def subscribed_topics(subscription: bytes) -> frozenset[str] | None:
    """The topics named by a consumer protocol subscription, or ``None`` if it does not parse.

    The subscription is an int16 version followed by a ``ConsumerProtocolSubscription``; every version
    starts with the version 0 layout (a topics array), so that prefix is all that is read, as Kafka does.
    """
    try:
        version, body = split_version(subscription)
        if version < 0:
            return None
        obj, _ = message("ConsumerProtocolSubscription").decode(body, 0)
    except (RecordError, CodecError):
        return None
    return frozenset(obj.topics)
