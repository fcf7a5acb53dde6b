"""Tests for the __consumer_offsets record codec: byte layouts, versions, tombstones and round trips."""
from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trireme.state import group_records as gr
from trireme.wire.codec import message


def kstr(s: str) -> bytes:
    data = s.encode()
    return struct.pack(">h", len(data)) + data


def kbytes(b: bytes) -> bytes:
    return struct.pack(">i", len(b)) + b


# --- byte layouts, written out by hand from Kafka's record definitions ------------------------

def test_offset_commit_key_layout():
    key = gr.offset_commit_key("grp", "topic", 7)
    assert key == struct.pack(">h", 1) + kstr("grp") + kstr("topic") + struct.pack(">i", 7)


def test_group_metadata_key_layout():
    assert gr.group_metadata_key("grp") == struct.pack(">h", 2) + kstr("grp")


def test_offset_commit_value_v3_layout():
    key, value = gr.offset_commit_record("g", "t", 0, 42, 5, "meta", 1000)
    assert key == gr.offset_commit_key("g", "t", 0)
    assert value == struct.pack(">hqi", 3, 42, 5) + kstr("meta") + struct.pack(">q", 1000)


def test_offset_commit_value_with_expiry_is_v1():
    _, value = gr.offset_commit_record("g", "t", 0, 42, 5, None, 1000, expire_timestamp=9000)
    # v1 has no leader epoch; null metadata is stored as "".
    assert value == struct.pack(">hq", 1, 42) + kstr("") + struct.pack(">qq", 1000, 9000)


def test_group_metadata_value_v3_layout():
    meta = gr.GroupMetadata("g", "consumer", 4, "range", "m1", 123, (
        gr.MemberMetadata("m1", "inst", "client", "/10.0.0.1", 30000, 10000, b"sub", b"asg"),))
    key, value = gr.group_metadata_record(meta)
    assert key == gr.group_metadata_key("g")
    expected = (struct.pack(">h", 3) + kstr("consumer") + struct.pack(">i", 4) + kstr("range") + kstr("m1")
                + struct.pack(">q", 123) + struct.pack(">i", 1)
                + kstr("m1") + kstr("inst") + kstr("client") + kstr("/10.0.0.1")
                + struct.pack(">ii", 30000, 10000) + kbytes(b"sub") + kbytes(b"asg"))
    assert value == expected


def test_group_metadata_value_nulls():
    meta = gr.GroupMetadata("g", "", 1, None, None, -1, ())
    _, value = gr.group_metadata_record(meta)
    assert value == struct.pack(">h", 3) + kstr("") + struct.pack(">i", 1) + struct.pack(">hh", -1, -1) \
        + struct.pack(">q", -1) + struct.pack(">i", 0)


# --- parsing -------------------------------------------------------------------------------

def test_parse_offset_commit_and_tombstone():
    key, value = gr.offset_commit_record("g", "t", 3, 10, 2, "x", 55)
    assert gr.parse_record(key, value) == gr.OffsetCommit("g", "t", 3, 10, 2, "x", 55, -1)
    assert gr.parse_record(*gr.offset_commit_tombstone("g", "t", 3)) == gr.OffsetTombstone("g", "t", 3)
    assert gr.record_type(key) == "offset"


def test_parse_group_metadata_and_tombstone():
    meta = gr.GroupMetadata("g", "consumer", 2, "range", "a", 5, (
        gr.MemberMetadata("a", None, "c", "h", 100, 50, b"s", b"a"),
        gr.MemberMetadata("b", "i", "c2", "h2", 200, 60, b"", b"")))
    key, value = gr.group_metadata_record(meta)
    assert gr.parse_record(key, value) == meta
    assert gr.parse_record(*gr.group_metadata_tombstone("g")) == gr.GroupTombstone("g")
    assert gr.record_type(key) == "group"


def test_key_version_0_is_an_offset_commit():
    key = struct.pack(">h", 0) + kstr("g") + kstr("t") + struct.pack(">i", 1)
    _, value = gr.offset_commit_record("g", "t", 1, 9, -1, "", 0)
    assert gr.parse_record(key, value) == gr.OffsetCommit("g", "t", 1, 9, -1, "", 0, -1)


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4])
def test_every_offset_commit_value_version_parses(version):
    codec = message("OffsetCommitValue")
    obj = codec.cls(offset=77, leader_epoch=3, metadata="m", commit_timestamp=11, expire_timestamp=99)
    value = struct.pack(">h", version) + codec.encode_bytes(obj, version)
    parsed = gr.parse_record(gr.offset_commit_key("g", "t", 0), value)
    assert parsed.offset == 77 and parsed.metadata == "m" and parsed.commit_timestamp == 11
    assert parsed.leader_epoch == (3 if version >= 3 else -1)
    assert parsed.expire_timestamp == (99 if version == 1 else -1)


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4])
def test_every_group_metadata_value_version_parses(version):
    codec = message("GroupMetadataValue")
    member = codec.cls.MemberMetadata(member_id="m", group_instance_id="i", client_id="c", client_host="h",
                                      rebalance_timeout=300, session_timeout=100, subscription=b"s",
                                      assignment=b"a")
    obj = codec.cls(protocol_type="consumer", generation=3, protocol="range", leader="m",
                    current_state_timestamp=77, members=[member])
    value = struct.pack(">h", version) + codec.encode_bytes(obj, version)
    parsed = gr.parse_record(gr.group_metadata_key("g"), value)
    assert parsed.generation == 3 and parsed.protocol == "range" and parsed.leader == "m"
    assert parsed.current_state_timestamp == (77 if version >= 2 else -1)
    (m,) = parsed.members
    assert m.group_instance_id == ("i" if version >= 3 else None)
    # Before v1 there is no rebalance timeout; Kafka falls back to the session timeout.
    assert m.rebalance_timeout == (300 if version >= 1 else 100)
    assert (m.subscription, m.assignment) == (b"s", b"a")


def test_newer_value_versions_read_as_the_latest_known():
    codec = message("OffsetCommitValue")
    body = codec.encode_bytes(codec.cls(offset=5, leader_epoch=1, metadata="", commit_timestamp=2), 4)
    parsed = gr.parse_record(gr.offset_commit_key("g", "t", 0), struct.pack(">h", 9) + body)
    assert parsed.offset == 5


def test_unknown_key_versions_are_not_ours():
    key = struct.pack(">h", 3) + kstr("g")
    assert gr.parse_record(key, b"\x00\x00") is None
    assert gr.record_type(key) is None


def test_malformed_records_raise():
    with pytest.raises(gr.RecordError):
        gr.parse_record(b"\x00", None)
    with pytest.raises(gr.RecordError):
        gr.parse_record(gr.offset_commit_key("g", "t", 0), b"\x00\x03\x00")
    with pytest.raises(gr.RecordError):
        gr.parse_record(struct.pack(">h", 1) + b"\x00\x09ab", None)


# --- consumer protocol subscriptions ---------------------------------------------------------

def subscription(version: int, topics: list[str]) -> bytes:
    codec = message("ConsumerProtocolSubscription")
    return struct.pack(">h", version) + codec.encode_bytes(
        codec.cls(topics=topics, user_data=b"u", generation_id=3, rack_id="r"), min(version, 3))


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_subscribed_topics_for_every_version(version):
    assert gr.subscribed_topics(subscription(version, ["a", "b"])) == frozenset({"a", "b"})


def test_subscribed_topics_of_a_future_version_reads_the_v0_prefix():
    data = subscription(3, ["x"])
    assert gr.subscribed_topics(struct.pack(">h", 7) + data[2:]) == frozenset({"x"})


@pytest.mark.parametrize("data", [b"", b"\x00", b"\x00\x00\x00\x00\x00\x05", b"\xff\xff\x00\x00\x00\x00"])
def test_unparseable_subscriptions(data):
    assert gr.subscribed_topics(data) is None


# --- round trips -----------------------------------------------------------------------------

names = st.text(max_size=20)
int32 = st.integers(-(2**31), 2**31 - 1)
int64 = st.integers(-(2**63), 2**63 - 1)


@given(names, names, int32, int64, int32, st.one_of(st.none(), names), int64,
       st.one_of(st.just(-1), st.integers(0, 2**62)))
def test_offset_commit_round_trip(group, topic, partition, offset, epoch, metadata, ts, expire):
    key, value = gr.offset_commit_record(group, topic, partition, offset, epoch, metadata, ts, expire)
    parsed = gr.parse_record(key, value)
    assert parsed == gr.OffsetCommit(group, topic, partition, offset, epoch if expire == -1 else -1,
                                     metadata or "", ts, expire)


members = st.builds(gr.MemberMetadata, names, st.one_of(st.none(), names), names, names,
                    st.integers(0, 2**31 - 1), int32, st.binary(max_size=30), st.binary(max_size=30))


@given(st.builds(gr.GroupMetadata, names, names, int32, st.one_of(st.none(), names),
                 st.one_of(st.none(), names), int64, st.lists(members, max_size=4).map(tuple)))
def test_group_metadata_round_trip(meta):
    assert gr.parse_record(*gr.group_metadata_record(meta)) == meta
