"""The group coordinator's service: the pure coordinator on the coordinator runtime, over ``__consumer_offsets``.

The coordinator (state/groups.py) decides; :class:`~trireme.server.coordinator_runtime.CoordinatorRuntime`
appends its records, waits for them to be durable, replays them in log order and releases the
answers.  What is particular to groups lives here: the offsets log is partition 0 of the internal
topic ``__consumer_offsets`` (not in the topic registry: clients can neither create nor produce
to it), committed offsets of deleted topics are tombstoned, and expired offsets are removed on
``offsets.retention.check.interval.ms``.  On start-up the log is replayed and, when it holds much
more than the live state, compacted (unless a transaction still has offsets pending in it).  The service
is active where the partition's leader is (coordinator_runtime.py: activate, deactivate).
"""
from __future__ import annotations

import logging
import time
import uuid

import trio

from trireme.state.groups import GroupConfig, GroupCoordinator
from trireme.state.topics import Topic

from .clock import now_ms
from .coordinator_runtime import CoordinatorRuntime, Durability

log = logging.getLogger("trireme.groups")

OFFSETS_TOPIC = "__consumer_offsets"
OFFSETS_TOPIC_ID = uuid.UUID(int=1)


class GroupService(CoordinatorRuntime):
    TOPIC = Topic(name=OFFSETS_TOPIC, topic_id=OFFSETS_TOPIC_ID, partitions=1, configs={}, created_order=-1,
                  leader_epoch=0)

    def __init__(self, config, durability: Durability):
        """Inactive until :meth:`activate` with the offsets partition (the broker opens it where it leads it)."""
        self.config = config
        super().__init__(OFFSETS_TOPIC, None, durability, self.new_coordinator(),
                         on_timer=lambda key, now: self.coordinator.on_timer(key, now))

    def new_coordinator(self) -> GroupCoordinator:
        config = self.config
        return GroupCoordinator(GroupConfig(
            initial_rebalance_delay_ms=config["group.initial.rebalance.delay.ms"],
            min_session_timeout_ms=config["group.min.session.timeout.ms"],
            max_session_timeout_ms=config["group.max.session.timeout.ms"],
            offsets_retention_ms=config["offsets.retention.minutes"] * 60_000,
        ))

    @property
    def segment_bytes(self) -> int:
        return self.config["offsets.topic.segment.bytes"]

    def loaded(self, replayed: int, started: float) -> None:
        if not self.coordinator.pending and not self.coordinator.open_transactions:
            self.compact(self.coordinator.compact_records(), replayed)
        self.stage(self.coordinator.loaded(now_ms()))     # timers only: members' sessions start now
        log.info("loaded group coordinator records=%d groups=%d in %.3fs", replayed,
                 len(self.coordinator.groups), time.perf_counter() - started)

    def forget_topic(self, topic: str) -> None:
        """A topic was deleted: its committed offsets go too (tombstones, written in the background)."""
        self.start_soon(self._forget_topic, topic)

    async def _forget_topic(self, topic: str) -> None:
        await self.wait_replayed()
        await self.write_records(self.coordinator.delete_topic_offsets({topic}))

    def serving(self, nursery) -> None:
        nursery.start_soon(self._run_offset_expiry)

    async def _run_offset_expiry(self) -> None:
        interval = self.config["offsets.retention.check.interval.ms"] / 1000
        while True:
            await trio.sleep(interval)
            await self.wait_replayed()
            await self.write_records(self.coordinator.expire_offsets(now_ms()))
