"""Producer id allocation that never hands out the same id twice, even across crashes.

Ids are handed out from blocks.  Before the first id of a block is handed out, the end of the block
is written durably (``write_atomic``); after a restart allocation resumes at the last written block
end.  A crash therefore can only skip ids, never repeat them.
"""
from __future__ import annotations

import json
import posixpath
from typing import Protocol

BLOCK_SIZE = 1000
MAX_PRODUCER_ID = 2**63 - 1
FORMAT_VERSION = 1


class Storage(Protocol):
    def read_all(self, path: str) -> bytes: ...
    def write_atomic(self, path: str, data: bytes) -> None: ...
    def exists(self, path: str) -> bool: ...
    def makedirs(self, path: str) -> None: ...


class ProducerIdError(Exception):
    """The allocation file is unreadable, or the id space is exhausted."""


class ProducerIdManager:
    """Hands out producer ids for InitProducerId, reserving them durably a block at a time."""

    def __init__(self, storage: Storage, path: str, block_size: int = BLOCK_SIZE) -> None:
        if block_size < 1:
            raise ValueError("block_size must be positive")
        self._storage = storage
        self._path = path
        self._block_size = block_size
        self._block_end = self._load()
        self._next = self._block_end

    def reserve_needed(self) -> bool:
        """Whether the next :meth:`next_id` will first write a new block reservation."""
        return self._next >= self._block_end

    def reserve(self) -> None:
        """Durably reserve the next block now; ids already reserved in memory are given up."""
        new_end = self._next + self._block_size
        if new_end - 1 > MAX_PRODUCER_ID:
            raise ProducerIdError("producer id space exhausted")
        parent = posixpath.dirname(self._path)
        if parent and not self._storage.exists(parent):
            self._storage.makedirs(parent)
        doc = {"version": FORMAT_VERSION, "block_end": new_end}
        self._storage.write_atomic(self._path, json.dumps(doc).encode())
        self._block_end = new_end

    def next_id(self) -> int:
        """A producer id never returned before by any manager on this storage and path."""
        if self.reserve_needed():
            self.reserve()
        producer_id = self._next
        self._next += 1
        return producer_id

    def handed_out(self, producer_id: int) -> bool:
        """Whether :meth:`next_id` may ever have returned ``producer_id`` on this storage (ids are handed out in
        increasing order; after a restart allocation resumes above every id handed out before)."""
        return 0 <= producer_id < self._next

    def _load(self) -> int:
        try:
            data = self._storage.read_all(self._path)
        except FileNotFoundError:
            return 0
        try:
            doc = json.loads(data)
            if doc["version"] != FORMAT_VERSION:
                raise ProducerIdError(f"unsupported producer id file version {doc['version']!r}")
            block_end = doc["block_end"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ProducerIdError(f"malformed producer id file {self._path!r}: {exc!r}") from exc
        if type(block_end) is not int or block_end < 0:
            raise ProducerIdError(f"malformed producer id file {self._path!r}: block_end {block_end!r}")
        return block_end
