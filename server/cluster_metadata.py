"""The cluster metadata service: the pure coordinator of state/cluster_metadata.py on the coordinator runtime, over ``__cluster_metadata``.

Topics, producer id blocks, feature levels, ACLs, SCRAM credentials and client quotas are records in
partition 0 of the internal topic ``__cluster_metadata`` (as Kafka keeps them in its metadata log); it
is opened and replayed before the data partitions, whose list it holds.
:meth:`ClusterMetadataService.update` is the one way to change them while the broker serves (before,
at start-up, :meth:`ClusterMetadataService.bootstrap`): it waits until every earlier change is replayed, lets the caller
decide on that state (no await in between, so decisions are serialized), appends the records,
waits until they are durable and replays them; only then does the caller answer.  The topic is
hidden from clients: not described, not in the registry, its partition not reachable by name
(Broker.partition), never subject to retention.  On start-up the log is replayed and, when it holds
much more than the live state, compacted.
"""
from __future__ import annotations

import logging
import time
import uuid

from trireme.state.cluster_metadata import ClusterMetadata
from trireme.state.topics import Topic

from .coordinator_runtime import CoordinatorRuntime, Durability

log = logging.getLogger("trireme.cluster_metadata")

CLUSTER_METADATA_TOPIC = "__cluster_metadata"
CLUSTER_METADATA_TOPIC_ID = uuid.UUID(int=3)


class MetadataUnavailable(Exception):
    """The metadata log cannot take a write now (its partition is offline: disk full or failed; or, in a cluster,
    this broker is not the controller, which writes it)."""


class ClusterMetadataService(CoordinatorRuntime):
    def __init__(self, durability: Durability, open_internal_partition, coordinator: ClusterMetadata):
        topic = Topic(name=CLUSTER_METADATA_TOPIC, topic_id=CLUSTER_METADATA_TOPIC_ID, partitions=1, configs={},
                      created_order=-1, leader_epoch=0)
        partition = open_internal_partition(topic, 0, segment_bytes=100 * 1024 * 1024)
        super().__init__(CLUSTER_METADATA_TOPIC, partition, durability, coordinator)
        started = time.perf_counter()
        loaded = self.load()
        if not partition.following:
            self.compact(self.coordinator.compact_records(), loaded)
        if self.coordinator.unreadable:
            log.warning("skipped %d unreadable records in %s", self.coordinator.unreadable, CLUSTER_METADATA_TOPIC)
        log.info("loaded cluster metadata records=%d in %.3fs", loaded, time.perf_counter() - started)

    def follow(self, partition, from_offset: int) -> int:
        """In a cluster: replay what ``partition`` holds from ``from_offset`` to its high watermark — this broker's
        copy of the log the controller writes, grown (or rebuilt from the database) — and write it from now on if
        this broker leads it → how many records."""
        self.partition = partition
        partition.runtime = self
        return self.replay_from(from_offset)

    def bootstrap(self, records: list) -> None:
        """Write records at start-up, before the broker serves (the first records of a new data directory, the
        upgrade of an earlier version's files, the topics ``trireme serve --topic`` names): appended, fsynced and
        replayed at once."""
        if not records:
            return
        if self._append_batch(records, sync=True) is None:
            raise OSError(f"could not write the initial records of {CLUSTER_METADATA_TOPIC}")
        for key, value in records:
            self.coordinator.replay(key, value)

    async def update(self, decide):
        """``decide()`` → (records, answer) on the state every earlier change left, then the records made durable
        and replayed; → the answer.  Raises :class:`MetadataUnavailable` when the log cannot be written, before
        deciding or after (then nothing is replayed, and the records are replayed if the disk comes back)."""
        while not self.settled():
            if self.partition.storage_error:
                raise MetadataUnavailable(self.partition.storage_error)
            await self.wait_replayed()
        if self.partition.storage_error:
            raise MetadataUnavailable(self.partition.storage_error)
        if self.partition.following:
            raise MetadataUnavailable("this broker is not the controller, which writes the cluster's metadata")
        records, answer = decide()
        if records and not await self.write_records(records):
            raise MetadataUnavailable(self.partition.storage_error or "not durable")
        return answer
