"""Runs the pure group coordinator: persists its records in __consumer_offsets, owns its timers, parks deferred answers.

The coordinator (state/groups.py) decides; this service carries out its Effects in the order
Kafka's CoordinatorShard does: records are appended to the internal offsets log, and only once
they are durable are they replayed into the coordinator and the answers that depended on them
released.  Replays happen strictly in log order, whoever's fsync finishes first.  Timers
(session expiry, rebalance and initial-delay deadlines) live here, in one trio task.

The offsets log is partition 0 of the internal topic ``__consumer_offsets``: it is not in the
topic registry, so Metadata does not list it and clients cannot produce to it.  On start-up it
is replayed in full and then compacted: the latest value of every key is appended as a fresh
snapshot and the log start offset moved past everything before it, so later start-ups replay
only the snapshot and what came after.
"""
from __future__ import annotations

import collections
import heapq
import itertools
import logging
import time
import uuid

import trio

from trireme.state.groups import Effects, GroupConfig, GroupCoordinator
from trireme.state.topics import Topic
from trireme.wire import error_codes as E
from trireme.wire import records as rec

from .broker import Broker, now_ms
from .dispatch import Deferred

log = logging.getLogger("trireme.groups")

OFFSETS_TOPIC = "__consumer_offsets"
READ_CHUNK = 1 << 20
# Compact on load once the log holds this many more records than live keys.
COMPACT_SLACK = 1000


class _Waiter:
    __slots__ = ("event", "result")

    def __init__(self):
        self.event = trio.Event()
        self.result = None


class GroupService:
    def __init__(self, broker: Broker):
        self.broker = broker
        config = broker.config
        self.coordinator = GroupCoordinator(GroupConfig(
            initial_rebalance_delay_ms=config["group.initial.rebalance.delay.ms"],
            min_session_timeout_ms=config["group.min.session.timeout.ms"],
            max_session_timeout_ms=config["group.max.session.timeout.ms"],
            offsets_retention_ms=config["offsets.retention.minutes"] * 60_000,
        ))
        topic = Topic(name=OFFSETS_TOPIC, topic_id=uuid.UUID(int=1), partitions=1, configs={},
                      created_order=-1, leader_epoch=0)
        self.partition = broker.open_internal_partition(topic, 0, segment_bytes=100 * 1024 * 1024)
        self._waiters: dict[int, _Waiter] = {}
        self._ids = itertools.count(1)
        self._timers: dict[object, int] = {}
        self._heap: list[tuple[int, int, object]] = []
        self._heap_seq = itertools.count()
        self._timers_changed = trio.Event()
        self._unreplayed: collections.deque = collections.deque()
        self._nursery = None
        started = time.perf_counter()
        loaded = self._load()
        self._stage(self.coordinator.loaded(now_ms()))
        log.info("loaded group coordinator records=%d groups=%d in %.3fs", loaded,
                 len(self.coordinator.groups), time.perf_counter() - started)

    # --- loading ---------------------------------------------------------------------------

    def _load(self) -> int:
        plog = self.partition.log
        offset, end = plog.log_start_offset, plog.high_watermark
        count = 0
        while offset < end:
            data = plog.read(offset, READ_CHUNK, end)
            if not data:
                break
            for pos, header in rec.iter_batch_headers(data):
                records = rec.decode_records(data, pos)
                if header.is_control:
                    kind, _ = rec.parse_control_record(records[0])
                    self.coordinator.replay_end_txn(header.producer_id, kind == rec.CONTROL_COMMIT)
                else:
                    for r in records:
                        self.coordinator.replay(r.key, r.value, producer_id=header.producer_id,
                                                transactional=header.is_transactional)
                        count += 1
                offset = header.next_offset
        if count > COMPACT_SLACK and not self.coordinator.pending and not self.coordinator.open_transactions:
            self._compact(count)
        return count

    def _compact(self, replayed: int) -> None:
        """Append the live state as one snapshot, fsync it, then drop everything before it."""
        live = self.coordinator.compact_records()
        if len(live) * 2 > replayed:
            return
        plog = self.partition.log
        start = plog.log_end_offset
        if live:
            if self._append_batch(live, sync=True) is None:
                return
        else:
            plog.sync(now_ms())
        plog.delete_records(start)
        log.info("compacted %s: %d records replayed, %d live keys kept", OFFSETS_TOPIC, replayed, len(live))

    # --- running effects -------------------------------------------------------------------

    def _append_batch(self, records: list, *, producer_id: int = -1, producer_epoch: int = -1,
                      transactional: bool = False, sync: bool = False) -> int | None:
        """Append one batch of coordinator records → its last offset, or None if the write failed."""
        if self.partition.storage_error:
            return None
        now = now_ms()
        batch = bytearray(rec.build_batch([(k, v, [], now) for k, v in records], producer_id=producer_id,
                                          producer_epoch=producer_epoch, transactional=transactional,
                                          base_timestamp=now))
        batches = rec.validate_batches(batch)
        try:
            _, last, _ = self.partition.log.append(batch, batches, now)
        except OSError as e:
            self.broker.storage_failed(self.partition, e)
            return None
        if sync:
            self.partition.log.sync(now)
        else:
            self.broker.appended(self.partition)
        return last

    def _stage(self, effects: Effects, *, producer_id: int = -1, producer_epoch: int = -1,
               transactional: bool = False):
        """Carry out the synchronous part of ``effects``: append records, set timers.

        The answers then wait for everything staged so far, not just these records: an answer may
        rest on state that an earlier, not yet durable record established (a follower's SyncGroup
        on the leader's assignment), as Kafka's coordinator runtime waits for its last write.
        """
        failed = False
        if effects.records:
            last = self._append_batch(effects.records, producer_id=producer_id,
                                      producer_epoch=producer_epoch, transactional=transactional)
            if last is None:
                failed = True
            else:
                self._unreplayed.append((last, effects.records, producer_id, transactional))
        target = self._unreplayed[-1][0] if self._unreplayed else None
        for key in effects.cancel:
            self._timers.pop(key, None)
        for key, deadline in effects.timers:
            self._timers[key] = deadline
            heapq.heappush(self._heap, (deadline, next(self._heap_seq), key))
        if effects.timers:
            self._timers_changed.set()
        return target, effects.responses, failed

    async def _complete(self, staged) -> bool:
        """Wait until the staged records are durable, replay them in log order, release the answers;
        → whether the records are durable."""
        target, responses, failed = staged
        durable = not failed
        if target is not None:
            durable = await self.broker.wait_durable(self.partition, target) and durable
            self._replay_durable()
        for request_id, result in responses:
            waiter = self._waiters.pop(request_id, None)
            if waiter is None:
                continue
            if not durable and hasattr(result, "_replace") and hasattr(result, "error"):
                result = result._replace(error=E.COORDINATOR_NOT_AVAILABLE.code)
            waiter.result = result
            waiter.event.set()
        return durable

    def _replay_durable(self) -> None:
        hw = self.partition.log.high_watermark
        while self._unreplayed and self._unreplayed[0][0] < hw:
            _, records, producer_id, transactional = self._unreplayed.popleft()
            for key, value in records:
                self.coordinator.replay(key, value, producer_id=producer_id, transactional=transactional)

    def stage(self, effects: Effects | list):
        """Append the records of ``effects`` (or a plain record list) now, in request order; pass the
        result to :meth:`complete` from the handler's Deferred."""
        return self._stage(effects if isinstance(effects, Effects) else _records_only(effects))

    async def complete(self, staged) -> bool:
        """Wait for staged records to be durable and replayed; → False if they could not be made durable."""
        return await self._complete(staged)

    async def write_records(self, records: list, **batch) -> bool:
        """Append coordinator records that come without Effects; True once durable and replayed."""
        if not records:
            return True
        return await self._complete(self._stage(_records_only(records), **batch))

    def settled(self) -> bool:
        """Whether every staged record has been replayed (reads may answer right away)."""
        return not self._unreplayed

    async def wait_replayed(self) -> None:
        """Wait until everything staged so far is durable and replayed, so a read sees it."""
        if self._unreplayed:
            await self._complete((self._unreplayed[-1][0], [], False))

    def after_staged_writes(self, answer):
        """``answer()`` now if every staged record is replayed, else a Deferred that waits for them first."""
        if self.settled():
            return answer()

        async def wait():
            await self.wait_replayed()
            return answer()
        return Deferred(wait)

    def forget_topic(self, topic: str) -> None:
        """A topic was deleted: its committed offsets go too (tombstones, written in the background)."""
        if self._nursery is not None:
            self._nursery.start_soon(self._forget_topic, topic)

    async def _forget_topic(self, topic: str) -> None:
        await self.wait_replayed()
        await self.write_records(self.coordinator.delete_topic_offsets({topic}))

    async def call(self, operation, *args, **kwargs):
        """Run an operation that answers through Effects (JoinGroup, SyncGroup) and wait for its answer,
        which may come from a later operation or a timer."""
        request_id = next(self._ids)
        waiter = self._waiters[request_id] = _Waiter()
        try:
            effects = operation(request_id, *args, **kwargs)
            await self._complete(self._stage(effects))
            await waiter.event.wait()
        finally:
            self._waiters.pop(request_id, None)
        return waiter.result

    # --- timers and housekeeping -----------------------------------------------------------

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._run_timers, nursery)
            nursery.start_soon(self._run_offset_expiry)
            task_status.started()

    async def _run_timers(self, nursery) -> None:
        while True:
            self._timers_changed = trio.Event()
            if self._heap:
                delay = max(0.0, (self._heap[0][0] - now_ms()) / 1000)
                with trio.move_on_after(delay):
                    await self._timers_changed.wait()
            else:
                await self._timers_changed.wait()
            now = now_ms()
            while self._heap and self._heap[0][0] <= now:
                deadline, _, key = heapq.heappop(self._heap)
                if self._timers.get(key) != deadline:
                    continue     # rescheduled or cancelled since
                del self._timers[key]
                nursery.start_soon(self._complete, self._stage(self.coordinator.on_timer(key, now)))

    async def _run_offset_expiry(self) -> None:
        interval = self.broker.config["offsets.retention.check.interval.ms"] / 1000
        while True:
            await trio.sleep(interval)
            await self.wait_replayed()
            await self.write_records(self.coordinator.expire_offsets(now_ms()))


def _records_only(records: list) -> Effects:
    effects = Effects()
    for record in records:
        effects.append(record)
    return effects
