"""Encodes and decodes the transaction coordinator's durable records in Kafka's ``__transaction_state`` format.

Every record is a key/value pair and both halves start with an int16 version, as for the group records
in :mod:`trireme.state.group_records`:

* the key (version 0, the transaction log's only record type) is a ``TransactionLogKey``: the
  transactional id;
* the value is a ``TransactionLogValue``: producer id and epoch, timeout, state, the transaction's
  partitions (one entry per topic) and its timestamps.  Version 0 is the classic layout; version 1
  is flexible and adds tagged fields -- previous producer id (tag 0), next producer id (tag 1), the
  client's transaction version (tag 2) and next producer epoch (tag 3) -- each written only when it
  differs from its default.  Kafka writes version 1 when the ``transaction.version`` feature level is
  at least 1 and version 0 otherwise (:func:`value_version_for`); version 0 cannot carry the tagged
  fields, so they are dropped and read back as their defaults.

A value of ``None`` is a tombstone: the latest record for a key wins, so a tombstone deletes the
transactional id.  Values newer than the highest version known here are read as that version, which is
sound because Kafka only adds tagged fields to this record (KIP-915).  Anything that does not decode
raises :class:`TxnRecordError` and nothing else.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from itertools import groupby

from trireme.state.coordinator_records import RecordError, decode, encode, split_version
from trireme.wire.codec import message

TXN_KEY_VERSION = 0
TXN_VALUE_MIN_VERSION = 0
TXN_VALUE_MAX_VERSION = 1

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1



class TxnRecordError(RecordError):
    """A ``__transaction_state`` record that cannot be read, or a value that cannot be written."""


class TxnState(enum.IntEnum):
    """A transaction's state as stored in ``TransactionStatus`` (Kafka's ``TransactionState`` ids)."""

    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7

    @property
    def kafka_name(self) -> str:
        """The name Kafka reports for the state (DescribeTransactions, ListTransactions): ``"PrepareCommit"``."""
        return "".join(part.capitalize() for part in self.name.split("_"))


@dataclass(frozen=True, slots=True, kw_only=True)
class TxnLogValue:
    """One transactional id's stored state.

    ``partitions`` is kept as a sorted tuple of distinct ``(topic, partition)`` pairs whatever iterable
    it is given as, and ``state`` as a :class:`TxnState`, so equal states compare equal.
    """

    producer_id: int
    previous_producer_id: int = NO_PRODUCER_ID
    next_producer_id: int = NO_PRODUCER_ID
    producer_epoch: int
    next_producer_epoch: int = NO_PRODUCER_EPOCH
    transaction_timeout_ms: int
    state: TxnState
    partitions: tuple[tuple[str, int], ...] = ()
    last_update_timestamp_ms: int
    start_timestamp_ms: int
    client_transaction_version: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "state", TxnState(self.state))
        object.__setattr__(self, "partitions", tuple(sorted({(t, p) for t, p in self.partitions})))


def value_version_for(transaction_version_level: int) -> int:
    """The value version Kafka writes at a ``transaction.version`` feature level: 1 from level 1, else 0."""
    return 1 if transaction_version_level >= 1 else 0


# --- encoding --------------------------------------------------------------------------------

def encode_txn_key(transactional_id: str) -> bytes:
    """The key under which ``transactional_id``'s state is stored."""
    return encode("TransactionLogKey", message("TransactionLogKey").cls(transactional_id=transactional_id),
                  TXN_KEY_VERSION, TxnRecordError)


def encode_txn_value(value: TxnLogValue, *, version: int) -> bytes:
    """``value`` as a version-prefixed ``TransactionLogValue`` at ``version`` (0 or 1).

    Partitions are written one entry per topic, topics in order and partition ids ascending; the Empty
    state has none and writes a null array, as Kafka does.  At version 0 the tagged fields are dropped.
    """
    if not TXN_VALUE_MIN_VERSION <= version <= TXN_VALUE_MAX_VERSION:
        raise TxnRecordError(f"TransactionLogValue has no version {version}")
    if value.state is TxnState.EMPTY and value.partitions:
        raise TxnRecordError("a transaction in the Empty state has no partitions")
    codec = message("TransactionLogValue")
    schema = codec.cls.PartitionsSchema
    if value.state is TxnState.EMPTY:
        partitions = None
    else:
        partitions = [schema(topic=topic, partition_ids=[p for _, p in pairs])
                      for topic, pairs in groupby(value.partitions, key=lambda tp: tp[0])]
    obj = codec.cls(
        producer_id=value.producer_id, producer_epoch=value.producer_epoch,
        transaction_timeout_ms=value.transaction_timeout_ms, transaction_status=int(value.state),
        transaction_partitions=partitions, transaction_last_update_timestamp_ms=value.last_update_timestamp_ms,
        transaction_start_timestamp_ms=value.start_timestamp_ms, previous_producer_id=value.previous_producer_id,
        next_producer_id=value.next_producer_id, client_transaction_version=value.client_transaction_version,
        next_producer_epoch=value.next_producer_epoch)
    return encode("TransactionLogValue", obj, version, TxnRecordError)


def txn_record(transactional_id: str, value: TxnLogValue, *, version: int) -> tuple[bytes, bytes]:
    """The key and value of one ``__transaction_state`` record."""
    return encode_txn_key(transactional_id), encode_txn_value(value, version=version)


def txn_tombstone(transactional_id: str) -> tuple[bytes, None]:
    """The record that deletes ``transactional_id``."""
    return encode_txn_key(transactional_id), None


# --- decoding --------------------------------------------------------------------------------

def decode_txn_key(data: bytes) -> str:
    """The transactional id a key names.  Raises :class:`TxnRecordError` for anything but a version 0 key."""
    version, body = split_version(data, TxnRecordError)
    if version != TXN_KEY_VERSION:
        raise TxnRecordError(f"transaction log key version {version} is not {TXN_KEY_VERSION}")
    return decode("TransactionLogKey", body, version, TxnRecordError).transactional_id


def decode_txn_value(data: bytes | None) -> TxnLogValue | None:
    """The state a value holds, or ``None`` for a tombstone.

    Versions above the highest known are read as it.  In the Empty state any stored partitions are
    ignored, as Kafka does.  Raises :class:`TxnRecordError` when the bytes do not decode.
    """
    if data is None:
        return None
    version, body = split_version(data, TxnRecordError)
    v = decode("TransactionLogValue", body, version, TxnRecordError)
    try:
        state = TxnState(v.transaction_status)
    except ValueError:
        raise TxnRecordError(f"unknown transaction status {v.transaction_status}") from None
    partitions = () if state is TxnState.EMPTY or v.transaction_partitions is None else tuple(
        (entry.topic, p) for entry in v.transaction_partitions for p in entry.partition_ids)
    return TxnLogValue(
        producer_id=v.producer_id, previous_producer_id=v.previous_producer_id,
        next_producer_id=v.next_producer_id, producer_epoch=v.producer_epoch,
        next_producer_epoch=v.next_producer_epoch, transaction_timeout_ms=v.transaction_timeout_ms,
        state=state, partitions=partitions, last_update_timestamp_ms=v.transaction_last_update_timestamp_ms,
        start_timestamp_ms=v.transaction_start_timestamp_ms,
        client_transaction_version=v.client_transaction_version)
