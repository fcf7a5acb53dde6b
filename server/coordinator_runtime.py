"""Runs a pure coordinator over its internal log partition: append, wait until durable, replay in log order, answer.

Both coordinators (groups in ``__consumer_offsets``, transactions in ``__transaction_state``) run
on this, as Kafka's CoordinatorRuntime serves its group and transaction shards.  The coordinator
decides and returns :class:`~trireme.state.effects.Effects`; the runtime appends their records as
one batch, and only once they are durable replays them into the coordinator (strictly in log
order, whoever's fsync finishes first) and releases the answers that depended on them.  Timers
(the coordinator's deadlines) live here, in one trio task.  On start-up the log is replayed in
full and, when it holds much more than the live state, compacted: the live records are appended
as a fresh snapshot and the log start offset moved past everything before it.  While the broker
runs, the log cleaner (server/log_cleaner.py) compacts the rolled segments of these logs as it does
any compacted topic's, so they stay bounded; a cleaned log replays to the same state.

A coordinator lives where its partition's leader is, as Kafka's coordinators do: :meth:`activate` when this
broker takes the partition (replay it, start the timers and the coordinator's background work),
:meth:`deactivate` when it loses it (everything in memory dropped, whatever waits answered NOT_COORDINATOR).
While inactive the pure coordinator answers every request NOT_COORDINATOR (COORDINATOR_LOAD_IN_PROGRESS while
the partition is being opened), each API in its own error fields, through its one check
(``coordinator.unavailable``).  With the local engine a broker leads everything: activated at start-up, for good.

The runtime depends only on what it uses: its partition and a :class:`Durability` (the broker's
group commit), never on the broker as a whole.
"""
from __future__ import annotations

import collections
import heapq
import itertools
import logging
import time
from typing import Callable, NamedTuple, Protocol

import trio

from trireme.state.effects import Effects
from trireme.wire import error_codes as E
from trireme.wire import records as rec

from .clock import now_ms
from .deferred import Deferred

log = logging.getLogger("trireme.coordinator")

READ_CHUNK = 1 << 20
# Compact on load once the log holds this many more records than live keys.
COMPACT_SLACK = 1000


class Durability(Protocol):
    """The part of the broker a runtime needs: group commit of appended data."""

    def appended(self, partition, *, awaited: bool = True) -> None: ...
    def write_appended(self, partition) -> bool: ...
    async def wait_durable(self, partition, offset: int) -> bool: ...
    def storage_failed(self, partition, error: BaseException) -> None: ...
    def sync_now(self, partition) -> None: ...


class Replay(Protocol):
    """What the coordinator offers the runtime to rebuild and advance its durable state."""

    def replay(self, key: bytes, value: bytes | None, *, producer_id: int = -1,
               transactional: bool = False) -> None: ...
    def replay_end_txn(self, producer_id: int, commit: bool) -> None: ...


class _Staged(NamedTuple):
    """Appended, not yet replayed: a batch of records, or (records None) a transaction marker."""

    last_offset: int
    records: list | None
    producer_id: int
    flag: bool              # records: transactional; marker: commit


class _Waiter:
    __slots__ = ("event", "result")

    def __init__(self):
        self.event = trio.Event()
        self.result = None


class CoordinatorRuntime:
    def __init__(self, name: str, partition, durability: Durability, coordinator: Replay,
                 on_timer: Callable[[object, int], Effects] | None = None):
        """``partition``: the coordinator's log, or None: inactive until :meth:`activate`."""
        self.name = name
        self.partition = None
        self.durability = durability
        self.coordinator = coordinator
        self.on_timer = on_timer
        self._waiters: dict[int, _Waiter] = {}
        self._ids = itertools.count(1)
        self._timers: dict[object, int] = {}
        self._heap: list[tuple[int, int, object]] = []
        self._heap_seq = itertools.count()
        self._timers_changed = trio.Event()
        self._unreplayed: collections.deque[_Staged] = collections.deque()
        self._nursery = None                 # the active coordinator's task group (cancelled on deactivation)
        self._runner = None                  # run()'s task group: where an activation's tasks start
        self._starting: list = []            # start_soon before the activation's task group runs
        if partition is not None:
            self._take(partition)
        else:
            coordinator.unavailable = E.NOT_COORDINATOR.code

    # --- active or not ---------------------------------------------------------------------

    @property
    def active(self) -> bool:
        return self.partition is not None

    def _take(self, partition) -> None:
        self.partition = partition
        partition.runtime = self           # appends to this log (markers included) go through the runtime

    def new_coordinator(self):
        """A pure coordinator with nothing loaded (what an activation replays the log into)."""
        raise NotImplementedError

    def loading(self) -> None:
        """This broker is opening the coordinator's partition: requests are answered COORDINATOR_LOAD_IN_PROGRESS
        until :meth:`activate` (or NOT_COORDINATOR again after :meth:`deactivate`)."""
        if not self.active:
            self.coordinator.unavailable = E.COORDINATOR_LOAD_IN_PROGRESS.code

    def activate(self, partition) -> None:
        """This broker leads the coordinator's partition now: replay it into a fresh coordinator (:meth:`loaded`
        finishes what loading leaves to do), then serve, timers and background work started."""
        if self.active:
            self.deactivate("taken again")
        self.coordinator = self.new_coordinator()
        self._take(partition)
        started = time.perf_counter()
        self.loaded(self.load(), started)
        self.coordinator.unavailable = 0
        if self._runner is not None:
            self._runner.start_soon(self._serve)

    def loaded(self, replayed: int, started: float) -> None:
        """The log is replayed (``replayed`` records, loading began at perf_counter ``started``): compact it, and
        stage what the coordinator does first (timers)."""

    def deactivate(self, why: str) -> None:
        """This broker no longer leads the coordinator's partition (moved, or fenced): timers and background work
        cancelled, the state in memory dropped, and whatever waits answered NOT_COORDINATOR."""
        if not self.active:
            return
        log.info("%s coordinator no longer here: %s", self.name, why)
        self.partition.runtime = None
        self.partition = None
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()
            self._nursery = None
        self._timers.clear()
        self._heap.clear()
        self._unreplayed.clear()
        self._starting.clear()
        waiters, self._waiters = self._waiters, {}
        for waiter in waiters.values():
            waiter.event.set()               # result None: call's answer is its if_moved
        self.coordinator = self.new_coordinator()
        self.coordinator.unavailable = E.NOT_COORDINATOR.code

    # --- loading ---------------------------------------------------------------------------

    def load(self) -> int:
        """Replay the whole log into the coordinator; → how many records it held."""
        return self.replay_from(self.partition.log.log_start_offset)

    def replay_from(self, offset: int) -> int:
        """Replay the log from ``offset`` to its high watermark into the coordinator (start-up, and a follower's copy
        of a log another broker writes as it grows); → how many records that was."""
        plog = self.partition.log
        offset, end = max(offset, plog.log_start_offset), plog.high_watermark
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
        return count

    def compact(self, live: list, replayed: int) -> None:
        """Append the live state as one snapshot, fsync it, then drop everything before it."""
        if replayed <= COMPACT_SLACK or len(live) * 2 > replayed:
            return
        plog = self.partition.log
        start = plog.log_end_offset
        try:
            if live:
                if self._append_batch(live, sync=True) is None:
                    return
            else:
                self.durability.sync_now(self.partition)
        except OSError as e:
            # The snapshot stays appended (the same state again) and the log uncompacted; a full disk's retry
            # makes it durable, any other error takes the partition offline as a failed write does.
            log.warning("could not compact %s: %r", self.name, e)
            self.durability.storage_failed(self.partition, e)
            return
        try:
            plog.delete_records(start)
        except OSError as e:
            log.warning("could not compact %s (log start offset not moved): %r", self.name, e)
            return
        log.info("compacted %s: %d records replayed, %d live keys kept", self.name, replayed, len(live))

    # --- appending -------------------------------------------------------------------------

    def _append(self, batch: bytearray, sync: bool, awaited: bool = True) -> int | None:
        if self.partition.storage_error:
            return None
        now = now_ms()
        batches = rec.validate_batches(batch)
        for pos, _header in batches:            # stamped with the leader epoch, as every leader append
            rec.set_partition_leader_epoch(batch, pos, self.partition.leader_epoch)
        try:
            _, last, _ = self.partition.log.append(batch, batches, now)
        except OSError as e:
            self.durability.storage_failed(self.partition, e)
            return None
        if sync:
            self.durability.sync_now(self.partition)
        else:
            self.durability.appended(self.partition, awaited=awaited)
        return last

    def _append_batch(self, records: list, *, producer_id: int = -1, producer_epoch: int = -1,
                      transactional: bool = False, sync: bool = False, awaited: bool = True) -> int | None:
        """Append one batch of coordinator records → its last offset, or None if the write failed."""
        now = now_ms()
        return self._append(bytearray(rec.build_batch([(k, v, [], now) for k, v in records],
                                                      producer_id=producer_id, producer_epoch=producer_epoch,
                                                      transactional=transactional, base_timestamp=now)), sync,
                            awaited)

    def stage(self, effects: Effects | list, *, producer_id: int = -1, producer_epoch: int = -1,
              transactional: bool = False, awaited: bool = True):
        """Carry out the synchronous part of ``effects`` (or a plain record list): append, set timers, and see to
        its answers.  → what :meth:`complete` takes, to wait until the records are durable.

        The answers wait for everything staged so far, not just these records: an answer may rest on state
        that an earlier, not yet durable record established (a follower's SyncGroup on the leader's
        assignment), as Kafka's runtime waits for its last write.  The runtime releases them itself, not the
        caller's wait: an answer may go to another request queued ahead of the caller's on its connection (a
        LeaveGroup ends the parked JoinGroup before it), whose answer must not wait for the caller's.
        ``awaited=False``: the caller answers once the records are :meth:`written`, so their flush may wait for a
        round that something else needs (Broker.appended); if it cannot answer so, :meth:`flush_soon`.
        """
        if not isinstance(effects, Effects):
            effects = records_only(effects)
        failed = False
        if effects.records:
            last = self._append_batch(effects.records, producer_id=producer_id,
                                      producer_epoch=producer_epoch, transactional=transactional, awaited=awaited)
            if last is None:
                failed = True
            else:
                self._unreplayed.append(_Staged(last, effects.records, producer_id, transactional))
        self._schedule(effects)
        target = self._target()
        if effects.responses:
            if target is None or failed:
                self._release(effects.responses, not failed)
            elif not self.start_soon(self._release_when_durable, target, effects.responses):
                raise RuntimeError(f"{self.name}: answers staged before the runtime runs")
        return target, failed

    def stage_marker(self, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int):
        """Append a transaction marker to this log (WriteTxnMarkers for this partition); → for :meth:`complete`.

        The marker is replayed (pending transactional records made visible or dropped) once durable.
        """
        now = now_ms()
        batch = bytearray(rec.build_control_batch(commit, producer_id=producer_id, producer_epoch=producer_epoch,
                                                  coordinator_epoch=coordinator_epoch, timestamp=now))
        last = self._append(batch, sync=False)
        if last is not None:
            self._unreplayed.append(_Staged(last, None, producer_id, commit))
        return self._target(), last is None

    def _target(self) -> int | None:
        return self._unreplayed[-1].last_offset if self._unreplayed else None

    def _schedule(self, effects: Effects) -> None:
        for key in effects.cancel:
            self._timers.pop(key, None)
        for key, deadline in effects.timers:
            self._timers[key] = deadline
            heapq.heappush(self._heap, (deadline, next(self._heap_seq), key))
        if effects.timers:
            self._timers_changed.set()

    def flush_soon(self) -> None:
        """What was staged with ``awaited=False`` is waited for after all: its flush round is due now (no round when
        every staged record is replayed already)."""
        if self._unreplayed:
            self.durability.appended(self.partition)

    def written(self, staged) -> bool:
        """Write the staged records to the OS now (no fsync) → whether they were written: what an answer sent
        before :meth:`complete` needs, so that a crash of the process cannot take back what it acknowledged."""
        target, failed = staged
        return not failed and (target is None or self.durability.write_appended(self.partition))

    async def complete(self, staged) -> bool:
        """Wait until the staged records are durable and replay them in log order; → whether they are durable."""
        target, failed = staged
        durable = not failed
        if target is not None:
            durable = await self.durability.wait_durable(self.partition, target) and durable
            self._replay_durable()
        return durable

    async def _release_when_durable(self, target: int, responses: list) -> None:
        self._release(responses, await self.complete((target, False)))

    def _release(self, responses: list, durable: bool) -> None:
        """Hand answers to the requests waiting in :meth:`call` (an answer resting on records that could not be
        made durable becomes COORDINATOR_NOT_AVAILABLE)."""
        for request_id, result in responses:
            waiter = self._waiters.pop(request_id, None)
            if waiter is None:
                continue
            if not durable and hasattr(result, "_replace") and hasattr(result, "error"):
                result = result._replace(error=E.COORDINATOR_NOT_AVAILABLE.code)
            waiter.result = result
            waiter.event.set()

    def drop_unreplayed(self) -> None:
        """Forget what was appended but never became durable (in a cluster: this broker lost the partition, and
        another broker's records take those offsets); whoever waits for it is answered as after a failed write."""
        self._unreplayed.clear()

    def _replay_durable(self) -> None:
        if not self.active:
            return                           # deactivated: nothing of it is kept
        hw = self.partition.log.high_watermark
        while self._unreplayed and self._unreplayed[0].last_offset < hw:
            staged = self._unreplayed.popleft()
            if staged.records is None:
                self.coordinator.replay_end_txn(staged.producer_id, staged.flag)
                continue
            for key, value in staged.records:
                self.coordinator.replay(key, value, producer_id=staged.producer_id, transactional=staged.flag)

    async def write_records(self, records: list, **batch) -> bool:
        """Append coordinator records that come without Effects; True once durable and replayed."""
        if not records:
            return True
        return await self.complete(self.stage(records, **batch))

    # --- a full disk -----------------------------------------------------------------------

    def storage_recovered(self) -> None:
        """The log's failed write succeeded after the disk was full (the broker's retry): records staged before
        it failed are durable now and are replayed (their answers went out as retriable errors, so a client may
        find them done when it retries, as after a timeout), then the coordinator resumes what they left to do."""
        self._replay_durable()
        self.resume_after_storage_error()

    def resume_after_storage_error(self) -> None:
        """Work a write failure left undone, for the coordinator to pick up again (none here)."""

    # --- reading after writes --------------------------------------------------------------

    def settled(self) -> bool:
        """Whether every staged record has been replayed (reads may answer right away)."""
        return not self._unreplayed

    async def wait_replayed(self) -> None:
        """Wait until everything staged so far is durable and replayed, so a read sees it."""
        if self._unreplayed:
            await self.complete((self._unreplayed[-1].last_offset, False))

    def after_staged_writes(self, answer):
        """``answer()`` now if every staged record is replayed, else a Deferred that waits for them first."""
        if self.settled():
            return answer()

        async def wait():
            await self.wait_replayed()
            return answer()
        return Deferred(wait)

    def call(self, operation, *args, if_moved, **kwargs):
        """Run an operation that answers through Effects (JoinGroup, SyncGroup) now, so that the requests of a
        connection change the state in their order; → an async function that returns its answer, which this
        operation, a later one or a timer gives, or ``if_moved`` (a NOT_COORDINATOR answer) when the coordinator
        is deactivated first."""
        request_id = next(self._ids)
        waiter = self._waiters[request_id] = _Waiter()
        self.stage(operation(request_id, *args, **kwargs))

        async def answer():
            await waiter.event.wait()
            return if_moved if waiter.result is None else waiter.result
        return answer

    # --- background work -------------------------------------------------------------------

    def start_soon(self, fn, *args) -> bool:
        """Run ``fn(*args)`` in the active coordinator's task group (an activation whose tasks have not started yet
        starts it with them); False before :meth:`run` started, or while inactive."""
        if self._nursery is None:
            if not self.active or self._runner is None:
                return False
            self._starting.append((fn, args))
            return True
        self._nursery.start_soon(fn, *args)
        return True

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """The runtime's tasks: those of each activation, for as long as it lasts (one at a time)."""
        async with trio.open_nursery() as runner:
            self._runner = runner
            if self.active:
                await runner.start(self._serve)
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                self._runner = None

    async def _serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """One activation's tasks, until :meth:`deactivate` cancels them."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._run_timers, nursery)
            starting, self._starting = self._starting, []
            for fn, args in starting:
                nursery.start_soon(fn, *args)
            self.serving(nursery)
            task_status.started()

    def serving(self, nursery) -> None:
        """An activation's tasks start: the coordinator's own background work goes in ``nursery``."""

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
                if self.on_timer is not None:
                    nursery.start_soon(self.complete, self.stage(self.on_timer(key, now)))


def records_only(records: list) -> Effects:
    effects = Effects()
    for record in records:
        effects.append(record)
    return effects
