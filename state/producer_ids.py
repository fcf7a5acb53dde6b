"""Producer id allocation that never hands out the same id twice, even across crashes.

Ids are handed out from blocks reserved in ``__cluster_metadata``: a reservation is a record (Kafka's
ProducerIdsRecord) naming the end of the reserved ids, and an id is handed out only below the end of a
reservation that is durable (replayed).  After a restart allocation resumes at the last reservation's
end, so a crash can only skip ids, never repeat them.  The broker reserves the next block ahead, while
ids of the current one remain (server/broker.py, Broker.producer_ids_ready).
"""
from __future__ import annotations

import json
from typing import Protocol

from trireme.wire.codec import message

from .cluster_metadata import PRODUCER_IDS, decode_value, encode_key, encode_value

BLOCK_SIZE = 1000
MAX_PRODUCER_ID = 2**63 - 1
LEGACY_PRODUCER_IDS_FILE = "producer_ids"        # where earlier versions kept the reservation (read to upgrade)


class Storage(Protocol):
    def read_all(self, path: str) -> bytes: ...


class ProducerIdError(Exception):
    """No reserved producer id is left (the next block is not durable yet), or the id space is exhausted."""


_KEY = encode_key(PRODUCER_IDS, "ProducerIdsKey", message("ProducerIdsKey").cls())


def reservation_record(block_end: int, broker_id: int = -1) -> tuple[bytes, bytes]:
    """The record reserving every id below ``block_end``."""
    value = message("ProducerIdsValue").cls(broker_id=broker_id, next_producer_id=block_end)
    return _KEY, encode_value("ProducerIdsValue", value)


class ProducerIdManager:
    """Hands out producer ids for InitProducerId from the blocks reserved durably: the producer ids section of
    ``__cluster_metadata``."""

    record_types = (PRODUCER_IDS,)

    def __init__(self, block_size: int = BLOCK_SIZE, broker_id: int = -1) -> None:
        if block_size < 1:
            raise ValueError("block_size must be positive")
        self.block_size = block_size
        self.broker_id = broker_id
        self.block_end = 0          # every id below is reserved (durably)
        self._next = 0
        self._loaded = False

    # --- the durable section
    def replay(self, key: bytes, value: bytes | None) -> None:
        if value is None:
            return                  # a reservation is never taken back
        end = decode_value(value, "ProducerIdsValue").next_producer_id
        self.block_end = max(self.block_end, end)
        if not self._loaded:
            self._next = self.block_end     # loading: whatever an earlier run reserved may have been handed out

    def live_records(self) -> list[tuple[bytes, bytes]]:
        return [reservation_record(self.block_end, self.broker_id)] if self.block_end else []

    def loaded(self) -> None:
        """The log is replayed: reservations from now on extend the ids this run hands out."""
        self._loaded = True

    # --- allocation
    def available(self) -> int:
        """How many ids :meth:`next_id` can hand out without a new reservation."""
        return self.block_end - self._next

    def reserve(self) -> list[tuple[bytes, bytes]]:
        """The record reserving the next block (the state changes when it is replayed)."""
        new_end = self.block_end + self.block_size
        if new_end - 1 > MAX_PRODUCER_ID:
            raise ProducerIdError("producer id space exhausted")
        return [reservation_record(new_end, self.broker_id)]

    def next_id(self) -> int:
        """A producer id never returned before on this data (reserved durably); ProducerIdError if none is left."""
        if self._next >= self.block_end:
            raise ProducerIdError("no reserved producer id left")
        producer_id = self._next
        self._next += 1
        return producer_id

    def handed_out(self, producer_id: int) -> bool:
        """Whether :meth:`next_id` may ever have returned ``producer_id`` on this data (ids are handed out in
        increasing order; after a restart allocation resumes above every id reserved before)."""
        return 0 <= producer_id < self._next


def read_legacy_block_end(storage: Storage, path: str = LEGACY_PRODUCER_IDS_FILE) -> int | None:
    """The reservation end earlier versions kept in the JSON file ``path`` (None if there is none), for the
    upgrade that turns it into a record."""
    try:
        data = storage.read_all(path)
    except FileNotFoundError:
        return None
    try:
        doc = json.loads(data)
        if doc["version"] != 1:
            raise ValueError(f"unsupported version {doc['version']!r}")
        block_end = doc["block_end"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"malformed producer id file {path!r}: {exc!r}") from exc
    if type(block_end) is not int or block_end < 0:
        raise ValueError(f"malformed producer id file {path!r}: block_end {block_end!r}")
    return block_end
