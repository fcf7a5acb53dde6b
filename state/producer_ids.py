"""Producer id allocation that never hands out the same id twice, even across crashes.

Ids are handed out from blocks reserved in ``__cluster_metadata``: a reservation is a record (Kafka's
ProducerIdsRecord) naming the end of the reserved ids, and an id is handed out only below the end of a
reservation that is durable (replayed).  After a restart allocation resumes at the last reservation's
end, so a crash can only skip ids, never repeat them.  The broker reserves the next block ahead, while
ids of the current one remain (server/broker.py, Broker.producer_ids_ready).
"""
from __future__ import annotations

from typing import Protocol

from trireme.wire.codec import message

from .cluster_metadata import PRODUCER_IDS, decode_value, encode_key, encode_value, read_legacy_file

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
        self.block_end = 0          # every id below is reserved (durably), for this broker or another
        self._blocks: list[list[int]] = []  # [next, end) of this broker's blocks reserved while it runs
        self._granted: list[tuple[int, int]] = []  # every block granted to it while it runs
        self._loaded = False

    # --- the durable section
    def replay(self, key: bytes, value: bytes | None) -> None:
        if value is None:
            return                  # a reservation is never taken back
        reservation = decode_value(value, "ProducerIdsValue")
        start, end = self.block_end, reservation.next_producer_id
        self.block_end = max(self.block_end, end)
        # loading: whatever an earlier run reserved may have been handed out; afterwards a block reserved for this
        # broker is its own to hand out (in a cluster each broker has blocks of its own: Kafka's AllocateProducerIds)
        if self._loaded and reservation.broker_id == self.broker_id:
            self.granted(start, end)

    def live_records(self) -> list[tuple[bytes, bytes]]:
        return [reservation_record(self.block_end, self.broker_id)] if self.block_end else []

    def loaded(self) -> None:
        """The log is replayed: reservations from now on extend the ids this run hands out."""
        self._loaded = True

    # --- allocation
    def granted(self, start: int, end: int) -> None:
        """The block [start, end) is this broker's (its reservation replayed, or the controller's answer to its
        AllocateProducerIds, whichever comes first: the other changes nothing)."""
        if end <= start or any(start < b_end and b_start < end for b_start, b_end in self._granted):
            return
        self._granted = [*self._granted[-15:], (start, end)]   # the recent ones: a block is granted twice at most
        self._blocks.append([start, end])

    def available(self) -> int:
        """How many ids :meth:`next_id` can hand out without a new reservation."""
        return sum(end - nxt for nxt, end in self._blocks)

    def reserve(self) -> list[tuple[bytes, bytes]]:
        """The record reserving the next block for this broker (the state changes when it is replayed)."""
        return self.reserve_for(self.broker_id)[0]

    def reserve_for(self, broker_id: int) -> tuple[list[tuple[bytes, bytes]], int]:
        """The record reserving the next block for ``broker_id`` (the controller's side of AllocateProducerIds)
        → (records, the block's first id); its ids are the block_size from there."""
        new_end = self.block_end + self.block_size
        if new_end - 1 > MAX_PRODUCER_ID:
            raise ProducerIdError("producer id space exhausted")
        return [reservation_record(new_end, broker_id)], self.block_end

    def next_id(self) -> int:
        """A producer id never returned before on this data (reserved durably); ProducerIdError if none is left."""
        while self._blocks and self._blocks[0][0] >= self._blocks[0][1]:
            self._blocks.pop(0)
        if not self._blocks:
            raise ProducerIdError("no reserved producer id left")
        producer_id = self._blocks[0][0]
        self._blocks[0][0] += 1
        return producer_id

    def handed_out(self, producer_id: int) -> bool:
        """Whether some broker may ever have returned ``producer_id`` on this data: it was reserved, and is not among
        this broker's ids still to hand out."""
        return 0 <= producer_id < self.block_end and not any(nxt <= producer_id < end for nxt, end in self._blocks)


def read_legacy_block_end(storage: Storage, path: str = LEGACY_PRODUCER_IDS_FILE) -> int | None:
    """The reservation end earlier versions kept in the JSON file ``path`` (None if there is none), for the
    upgrade that turns it into a record."""
    def read(doc):
        block_end = doc["block_end"]
        if type(block_end) is not int or block_end < 0:
            raise ValueError(f"block_end {block_end!r}")
        return block_end
    return read_legacy_file(storage, path, "producer id file", read)
