"""The cluster metadata coordinator: the broker's metadata (topics, producer id blocks, feature levels, ACLs, SCRAM credentials, client quotas) kept as records in the internal log ``__cluster_metadata`` and rebuilt by replaying them.

This is Kafka's own arrangement (its controllers keep topics, producer id blocks, features, ACLs, SCRAM
credentials and quotas as records in the metadata log ``__cluster_metadata``), run on the same
coordinator runtime as the group and transaction coordinators (server/cluster_metadata.py): a change
is appended as records, made durable, and only then replayed into the state the broker answers from.
On start-up the log is replayed in full and compacted when it holds much more than the live state.

Record framing
--------------
Every record is a key/value pair, as in ``__consumer_offsets``.  The key starts with an int16
*record type* (for the types below, the api key of the Kafka metadata record whose facts it carries)
followed by that type's key message at version 0; the value starts with an int16 version followed by
the value message at that version (:mod:`trireme.state.coordinator_records`).  The key names the
thing (one ACL, one user's credential for one mechanism, one quota of one entity), so the latest
record for a key is its state and a tombstone (value ``None``) deletes it; compaction keeps one
record per live key.  Definitions are ours, under wire/definitions:

====  =====================================================  ==============================  ============
type  key                                                    value                           section
====  =====================================================  ==============================  ============
2     TopicRecordKey (topic id)                              TopicRecordValue (whole topic)  topics
9     RemoveTopicKey (name of a deleted topic)               RemoveTopicValue                topics
11    UserScramCredentialKey (user, mechanism)               UserScramCredentialValue        SCRAM
12    FeatureLevelKey (feature name)                         FeatureLevelValue               features
14    ClientQuotaKey (entity, quota key)                     ClientQuotaValue                quotas
15    ProducerIdsKey (empty: one reservation)                ProducerIdsValue                producer ids
23    AccessControlEntryKey (the whole binding)              AccessControlEntryValue (empty)  ACLs
====  =====================================================  ==============================  ============

Sections
--------
The coordinator itself knows no record type: each kind of metadata is a *section*, an object with

* ``record_types``: the int16 key prefixes it owns (each owned by one section);
* ``replay(key, value)``: apply one durable record, ``value`` None for a tombstone.  Called at
  start-up for every record in log order, and after each write once it is durable, never for a
  record that is not.  It must accept any record its types may hold (a tombstone for a key it does
  not have, a value seen twice), raise :class:`~trireme.state.coordinator_records.RecordError` for
  bytes it cannot read (the record is then skipped and counted), and change nothing else;
* ``live_records()``: the records that rebuild its current state from nothing (compaction writes
  them as the log's new beginning).

A section decides changes itself (pure functions returning records and answers) and hands the
records to ``ClusterMetadataService.update`` (server/cluster_metadata.py; for the security sections
through ``Security.write`` / ``Security.update``), which appends them to the log and replays them here.  Records of a type no section owns (written by a newer version) are kept
as they are, and kept by compaction.  :class:`AclRecords` is the ACL section; SCRAM credentials are
in state/scram_credentials.py; client quotas in state/client_quotas.py; topics in state/topics.py
(TopicRegistry); producer id blocks in state/producer_ids.py; feature levels in state/features.py.

A topic is one record keyed by its id whose value carries all of it (name, partition count, configs,
leader epoch, creation order) rather than Kafka's TopicRecord, PartitionRecords and ConfigRecords: one
broker has no per-partition replicas or ISR to record, and one record per topic makes "the latest
record for a key is its state" hold for topics as for everything else here, so the log cleaner's
compaction keeps exactly one record per live topic and drops a deleted topic's tombstone after the
delete horizon.  A deleted name keeps one RemoveTopic record (the leader epoch a topic created again
under that name continues from) until the name is used again.
"""
from __future__ import annotations

import json
import struct
from typing import Callable, Iterable, Protocol

from trireme.wire.codec import message

from .acls import AclBinding, AclFilter, Authorizer, creation_error
from .coordinator_records import RecordError, decode, encode, split_version

TOPIC_RECORD = 2
REMOVE_TOPIC_RECORD = 9
USER_SCRAM_CREDENTIAL = 11
FEATURE_LEVEL = 12
CLIENT_QUOTA = 14
PRODUCER_IDS = 15
ACCESS_CONTROL_ENTRY = 23

_TYPE = struct.Struct(">h")


class MetadataRecordError(RecordError):
    """A ``__cluster_metadata`` record that cannot be read, or a value that cannot be written."""


def encode_key(record_type: int, name: str, obj) -> bytes:
    """A key: ``record_type`` then the message ``name`` (version 0)."""
    try:
        return _TYPE.pack(record_type) + message(name).encode_bytes(obj, 0)
    except (struct.error, ValueError, OverflowError) as e:
        raise MetadataRecordError(f"cannot write {name}: {e}") from None


def record_type(key) -> int:
    """The record type a key starts with."""
    return split_version(key, MetadataRecordError)[0]


def decode_key(key, name: str):
    """The key message ``name`` after the record type."""
    _, body = split_version(key, MetadataRecordError)
    return decode(name, body, 0, MetadataRecordError)


def encode_value(name: str, obj, version: int = 0) -> bytes:
    return encode(name, obj, version, MetadataRecordError)


def decode_value(value, name: str):
    version, body = split_version(value, MetadataRecordError)
    return decode(name, body, version, MetadataRecordError)


class Section(Protocol):
    """One kind of metadata kept in ``__cluster_metadata`` (see the module docstring)."""

    record_types: tuple[int, ...]

    def replay(self, key: bytes, value: bytes | None) -> None: ...

    def live_records(self) -> list[tuple[bytes, bytes]]: ...


class ClusterMetadata:
    """The pure coordinator: routes each replayed record to the section owning its type."""

    def __init__(self, sections: Iterable[Section] = ()):
        self._sections: dict[int, Section] = {}
        self.unknown: dict[bytes, bytes] = {}       # records of types no section owns, kept for compaction
        self.unreadable = 0                         # records skipped because they did not decode
        for section in sections:
            self.register(section)

    def register(self, section: Section) -> None:
        """Add a section (before the log is loaded)."""
        for t in section.record_types:
            if t in self._sections:
                raise ValueError(f"record type {t} has two sections")
            self._sections[t] = section

    @property
    def sections(self) -> list[Section]:
        return list(dict.fromkeys(self._sections.values()))

    def replay(self, key: bytes, value: bytes | None, *, producer_id: int = -1, transactional: bool = False) -> None:
        try:
            section = self._sections.get(record_type(key))
            if section is None:
                if value is None:
                    self.unknown.pop(bytes(key), None)
                else:
                    self.unknown[bytes(key)] = bytes(value)
                return
            section.replay(key, value)
        except RecordError:
            self.unreadable += 1

    def replay_end_txn(self, producer_id: int, commit: bool) -> None:
        """No transactions write this log."""

    def compact_records(self) -> list[tuple[bytes, bytes]]:
        """Every live record: what rebuilds the whole state."""
        records = [r for section in self.sections for r in section.live_records()]
        records.extend(self.unknown.items())
        return records


# --- the ACL section -------------------------------------------------------------------------

def acl_key(b: AclBinding) -> bytes:
    k = message("AccessControlEntryKey").cls(
        resource_type=int(b.resource_type), resource_name=b.name, pattern_type=int(b.pattern_type),
        principal_name=b.principal, host=b.host, operation=int(b.operation), permission_type=int(b.permission))
    return encode_key(ACCESS_CONTROL_ENTRY, "AccessControlEntryKey", k)


_ACL_VALUE = encode_value("AccessControlEntryValue", message("AccessControlEntryValue").cls())


def acl_record(b: AclBinding) -> tuple[bytes, bytes]:
    return acl_key(b), _ACL_VALUE


def acl_tombstone(b: AclBinding) -> tuple[bytes, None]:
    return acl_key(b), None


def decode_acl_key(key) -> AclBinding:
    k = decode_key(key, "AccessControlEntryKey")
    b = AclBinding.of(k.resource_type, k.resource_name, k.pattern_type, k.principal_name, k.host, k.operation,
                      k.permission_type)
    if creation_error(b) is not None:
        raise MetadataRecordError(f"ACL record holds an invalid binding: {creation_error(b)}")
    return b


class AclRecords:
    """The ACL section: replays ACL records into an :class:`Authorizer` and decides CreateAcls/DeleteAcls."""

    record_types = (ACCESS_CONTROL_ENTRY,)

    def __init__(self, authorizer: Authorizer, max_acls: int):
        self.authorizer = authorizer
        self.max_acls = max_acls

    def replay(self, key: bytes, value: bytes | None) -> None:
        b = decode_acl_key(key)
        if value is None:
            self.authorizer.remove(b)
        else:
            self.authorizer.add(b)

    def live_records(self) -> list[tuple[bytes, bytes]]:
        return [acl_record(b) for b in self.authorizer.bindings()]

    def create(self, bindings: list[AclBinding]) -> tuple[list, list[tuple[str, str] | None]]:
        """CreateAcls: → (records, per binding None or (error name, message)).  A binding present already (or
        twice in the request) succeeds without a record; past ``max_acls`` the rest are POLICY_VIOLATION."""
        records, results, adding = [], [], set()
        for b in bindings:
            problem = creation_error(b)
            if problem is not None:
                results.append(("INVALID_REQUEST", problem))
            elif b in self.authorizer or b in adding:
                results.append(None)
            elif len(self.authorizer) + len(adding) >= self.max_acls:
                results.append(("POLICY_VIOLATION", f"this broker keeps at most {self.max_acls} ACLs "
                                                    f"(trireme.max.acls)"))
            else:
                adding.add(b)
                records.append(acl_record(b))
                results.append(None)
        return records, results

    def delete(self, filters: list[AclFilter]) -> tuple[list, list[tuple[str, str] | list[AclBinding]]]:
        """DeleteAcls: → (tombstones, per filter the bindings it matched or (error name, message)).  A binding
        several filters match is listed under each and removed once."""
        records, results, removing = [], [], set()
        for f in filters:
            problem = f.error()
            if problem is not None:
                results.append(("INVALID_REQUEST", problem))
                continue
            matched = self.authorizer.acls(f)
            for b in matched:
                if b not in removing:
                    removing.add(b)
                    records.append(acl_tombstone(b))
            results.append(matched)
        return records, results


def read_legacy_file(storage, path: str, what: str, read: Callable[[dict], object]) -> object | None:
    """``read(document)`` of the JSON file ``path`` (version 1) where an earlier version kept what is now records
    of this log, for the upgrade that turns it into them; None if there is none.  Anything malformed (``read``'s
    ValueError, KeyError, TypeError or AttributeError included) is a ValueError naming ``what``."""
    try:
        data = storage.read_all(path)
    except FileNotFoundError:
        return None
    try:
        doc = json.loads(data)
        if doc["version"] != 1:
            raise ValueError(f"unsupported version {doc['version']!r}")
        return read(doc)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"malformed {what} {path!r}: {exc!r}") from exc
