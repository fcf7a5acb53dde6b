"""The transaction coordinator's service: the pure coordinator on the coordinator runtime over ``__transaction_state``, plus marker writing.

Every operation follows the runtime's order: the coordinator returns records, they are appended
and made durable, replayed, and only then is the client answered.  After a PREPARE record is
durable the markers go out as real WriteTxnMarkers requests, one per partition leader, through the
peer of the leader's node (server/peers.py: :class:`~trireme.server.local_peer.LocalPeer`, encode →
handler → decode, for this node; a network peer for another) until every partition has its marker
(retriable errors with a bounded backoff, as are a leader that cannot be reached or does not answer
in time, which Kafka's marker channel also retries; a refusal for a newer producer epoch is moot); then a COMPLETE record ends the transaction.  Any other refusal leaves the transaction
*stuck* (prepared, listed in :attr:`TransactionService.stuck`) until an operator completes it
(:meth:`TransactionService.complete_stuck`).  On start-up, transactions a crash left prepared get
their markers written again.  Open transactions past their timeout are
aborted (with an epoch bump that fences the producer), and idle transactional ids expire.
"""
from __future__ import annotations

import dataclasses
import logging
import time
import uuid

import trio

from trireme.state.producer_ids import ProducerIdError
from trireme.state.topics import Topic
from trireme.state.transactions import MarkerJob, TransactionCoordinator, TxnConfig, TxnOutcome
from trireme.state.txn_records import TxnState, decode_txn_key
from trireme.wire import error_codes as E
from trireme.wire.codec import message

from .clock import now_ms
from .cluster_metadata import MetadataUnavailable
from .config import partition_list
from .coordinator_runtime import CoordinatorRuntime, Durability
from .peers import PeerUnavailable

log = logging.getLogger("trireme.transactions")

TRANSACTION_STATE_TOPIC = "__transaction_state"
TRANSACTION_STATE_TOPIC_ID = uuid.UUID(int=2)
MARKER_RETRY_BACKOFF_S = 0.1          # the first retry of a retriable marker error; doubles up to the maximum
MARKER_RETRY_MAX_BACKOFF_S = 5.0
MARKER_LOG_INTERVAL_S = 60.0          # a transaction's markers still being retried are logged at most this often
CONCURRENT_WAIT_S = 5.0
# Kafka's TransactionMarkerRequestCompletionHandler retries these (the partition may come back) ...
# NETWORK_EXCEPTION: the leader's broker could not be reached (Kafka re-queues the markers of a disconnected request).
RETRIABLE = frozenset(e.code for e in (E.NOT_LEADER_OR_FOLLOWER, E.NOT_ENOUGH_REPLICAS,
                                       E.NOT_ENOUGH_REPLICAS_AFTER_APPEND, E.REQUEST_TIMED_OUT, E.KAFKA_STORAGE_ERROR,
                                       E.NETWORK_EXCEPTION))
# ... and drops these partitions from the transaction: the partition is gone (Kafka drops a deleted partition when
# it queues the retry) or cannot hold a marker, so the producer cannot have written there.
_GONE = frozenset(e.code for e in (E.UNKNOWN_TOPIC_OR_PARTITION, E.UNSUPPORTED_FOR_MESSAGE_FORMAT,
                                   E.UNSUPPORTED_VERSION))
# INVALID_PRODUCER_EPOCH is moot (the partition has seen a newer producer epoch).  Every other error, among them
# TRANSACTION_COORDINATOR_FENCED (Kafka: "permanently failed", the transaction stays prepared), leaves it stuck.

_MARKERS = message("WriteTxnMarkersRequest").cls
_PRODUCERS = message("DescribeProducersRequest").cls


class NotStuck(Exception):
    """An operator's completion could not be done (the id is not stuck, or a marker was refused again)."""


@dataclasses.dataclass
class StuckTxn:
    """A prepared transaction whose markers a partition refused for good: it waits for an operator."""

    job: MarkerJob
    partitions: dict[tuple[str, int], int]          # refused partition → error code
    since_ms: int


class TransactionService(CoordinatorRuntime):
    TOPIC = Topic(name=TRANSACTION_STATE_TOPIC, topic_id=TRANSACTION_STATE_TOPIC_ID, partitions=1, configs={},
                  created_order=-1, leader_epoch=0)

    def __init__(self, config, durability: Durability, allocate_producer_id, producer_ids_ready, peer, leader_node,
                 transaction_version: int = 0):
        """``allocate_producer_id()``: a producer id reserved durably, ProducerIdError when none is left;
        ``await producer_ids_ready()``: until one is (raises MetadataUnavailable if the reservation cannot be
        written); ``peer(node id)``: its Peer (Broker.peer); ``leader_node(topic, index)``: the node id of the
        partition's leader.  Inactive until :meth:`activate` with the ``__transaction_state`` partition (the broker
        opens it where it leads it)."""
        self.config = config
        self.allocate_producer_id = allocate_producer_id
        self.producer_ids_ready = producer_ids_ready
        self.peer = peer
        self.leader_node = leader_node
        self._transaction_version = transaction_version
        super().__init__(TRANSACTION_STATE_TOPIC, None, durability, self.new_coordinator())
        self._changed = trio.Event()         # set whenever a transaction record was made durable
        self._not_durable: set[str] = set()  # ids whose records could not be made durable (disk full)
        self._id_block_failed = False        # the last producer id block reservation failed (logged)
        self._resume: list[MarkerJob] = []   # prepared transactions found by the last activation
        self._orphans: list[MarkerJob] = []
        self.stuck: dict[str, StuckTxn] = {}          # transactional id → its stuck transaction
        self.moot_markers = 0                         # markers counted as written: the partition saw a newer epoch
        # Fault injection (tests of stuck transactions): partitions whose coordinator markers are refused.
        self._refuse_markers = partition_list(config["trireme.debug.transaction.marker.refuse"])

    @property
    def segment_bytes(self) -> int:
        return self.config["transaction.state.log.segment.bytes"]

    def new_coordinator(self) -> TransactionCoordinator:
        config = self.config
        return TransactionCoordinator(TxnConfig(
            max_timeout_ms=config["transaction.max.timeout.ms"],
            id_expiration_ms=config["transactional.id.expiration.ms"],
            two_phase_commit_enable=config["transaction.two.phase.commit.enable"],
            transaction_version=self._transaction_version,
        ))

    def activate(self, partition, open_transactions=()) -> None:
        """Lead ``__transaction_state`` (see CoordinatorRuntime.activate): then the transactions it left prepared
        get their markers again, and those open in ``open_transactions`` (the data partitions this broker leads:
        ((topic, index), producer id, epoch)) that it never recorded are aborted (:meth:`abort_orphans`)."""
        self.stuck.clear()
        self._not_durable.clear()
        super().activate(partition)
        self.abort_orphans(open_transactions)          # their markers go out when the activation's tasks start

    def loaded(self, replayed: int, started: float) -> None:
        self.compact(self.coordinator.compact_records(), replayed)
        self._resume = self.coordinator.loaded()
        self._orphans = []
        log.info("loaded transaction coordinator records=%d transactional_ids=%d prepared=%d in %.3fs", replayed,
                 len(self.coordinator.transactions), len(self._resume), time.perf_counter() - started)

    def deactivate(self, why: str) -> None:
        super().deactivate(why)
        self._resume, self._orphans = [], []
        self.stuck.clear()
        self._signal_change()                # operations waiting on an id answer (NOT_COORDINATOR)

    # --- operations the handlers call ------------------------------------------------------

    async def run_operation(self, outcome: TxnOutcome, *, answer_when_staged: bool = False) -> TxnOutcome:
        """Make an outcome's records durable and replayed, then start its markers; → the outcome to answer.
        ``answer_when_staged``: answer once the records are staged and written to the OS (a process crash keeps
        them; a power loss may not) and make them durable in the background."""
        if outcome.records:
            staged = self.stage(outcome.effects, awaited=not answer_when_staged)
            self._signal_change()            # an operation waiting on this id may build on what was staged
            if answer_when_staged:
                if self.written(staged) and self.start_soon(self._make_durable, outcome, staged):
                    return outcome
                self.flush_soon()
            durable = await self._make_durable(outcome, staged)
            if not durable:
                # the partition moved meanwhile: NOT_COORDINATOR, as Kafka maps NOT_LEADER_OR_FOLLOWER
                outcome.error = E.COORDINATOR_NOT_AVAILABLE.code if self.active else E.NOT_COORDINATOR.code
                outcome.partition_errors = {tp: outcome.error for tp in outcome.partition_errors}
                return outcome
        if outcome.markers is not None:
            self.start_soon(self._write_markers, outcome.markers)
        return outcome

    async def _make_durable(self, outcome: TxnOutcome, staged) -> bool:
        durable = await self.complete(staged)
        if not durable:
            self.coordinator.abandon(outcome.transactional_id)
            self._not_durable.add(outcome.transactional_id)
        self._signal_change()
        return durable

    def _signal_change(self) -> None:
        """Wake the operations waiting for a transaction record to be staged or made durable."""
        self._changed.set()
        self._changed = trio.Event()

    async def _when_settled(self, attempt, *, answer_when_staged: bool = False) -> TxnOutcome:
        """Run ``attempt()``; while it is CONCURRENT_TRANSACTIONS (the id's previous transaction is still
        writing its markers, or a record of it is in flight), wait for that to finish and try again instead
        of making the client back off and retry (librdkafka waits retry.backoff.ms, 100 ms by default).
        After CONCURRENT_WAIT_S the client gets CONCURRENT_TRANSACTIONS, as from Kafka."""
        deadline = trio.current_time() + CONCURRENT_WAIT_S
        while True:
            changed = self._changed
            outcome = await self.run_operation(await self._attempt(attempt), answer_when_staged=answer_when_staged)
            if outcome.error != E.CONCURRENT_TRANSACTIONS.code or trio.current_time() >= deadline:
                return outcome
            self.flush_soon()                # the record in flight may be one no answer waited for (run_operation)
            with trio.move_on_at(deadline):
                await changed.wait()

    async def _attempt(self, attempt) -> TxnOutcome:
        """``attempt()``; when it needed a producer id and none is reserved (the next block is not durable yet), wait
        for a reservation (the coordinator's state is unchanged then) and attempt again.  If the block cannot be
        reserved (``__cluster_metadata`` cannot be written: disk full or failing) → COORDINATOR_NOT_AVAILABLE,
        retriable, as for a record that cannot be written.  Logged once until an attempt succeeds again."""
        while True:
            try:
                outcome = attempt()
                break
            except ProducerIdError:
                pass
            try:
                await self.producer_ids_ready()
            except (MetadataUnavailable, ProducerIdError) as e:
                if not self._id_block_failed:
                    log.error("cannot reserve producer ids (answering COORDINATOR_NOT_AVAILABLE until it can): %s", e)
                self._id_block_failed = True
                return TxnOutcome(error=E.COORDINATOR_NOT_AVAILABLE.code)
        self._id_block_failed = False
        return outcome

    async def idempotent_producer_id(self) -> int | None:
        """A new producer id for a non-transactional InitProducerId; None when it needs a block of ids that cannot be
        reserved (logged as for :meth:`_attempt`: the caller answers COORDINATOR_NOT_AVAILABLE)."""
        outcome = await self._attempt(lambda: TxnOutcome(producer_id=self.allocate_producer_id()))
        return None if outcome.error else outcome.producer_id

    def resume_after_storage_error(self) -> None:
        """``__transaction_state`` is writable again after a full disk: a transaction left prepared by an operation
        whose records could not be made durable gets its markers written, as at start-up.  Its PREPARE became
        durable with the retry (the operation answered COORDINATOR_NOT_AVAILABLE and started no markers), or its
        COMPLETE was refused (which ended the marker task).  Either way no marker task runs for it; any other
        prepared transaction still has its own."""
        not_durable, self._not_durable = self._not_durable, set()
        for job in self.coordinator.prepared():
            if job.transactional_id in not_durable:
                self._resume_markers(job)
        self._signal_change()

    def _resume_markers(self, job: MarkerJob) -> None:
        """Write the markers of a transaction found prepared, then its COMPLETE record.  One an operator completed
        (every refused marker written, only the COMPLETE record left: it was refused) gets just the record; its
        markers again would carry the coordinator epoch the operator's resend went past, and be refused."""
        stuck = self.stuck.get(job.transactional_id)
        if stuck is not None and stuck.job == job and not stuck.partitions:
            log.info("writing the COMPLETE record of operator-completed transaction %s", job.transactional_id)
            self.start_soon(self._complete, job)
            return
        log.info("resuming markers of prepared transaction %s (%s)", job.transactional_id,
                 "commit" if job.commit else "abort")
        self.start_soon(self._write_markers, job)

    async def init_producer_id(self, transactional_id: str, timeout_ms: int, **kwargs) -> TxnOutcome:
        await self.wait_replayed()

        def attempt():
            outcome = self.coordinator.init_producer_id(transactional_id, timeout_ms, now_ms(),
                                                        self.allocate_producer_id, **kwargs)
            if outcome.markers is not None:
                log.warning("transaction %s fenced by a new producer with its id: aborting, producer id %d "
                            "epoch now %d", transactional_id, outcome.producer_id, outcome.producer_epoch)
            return outcome
        return await self._when_settled(attempt)

    def set_transaction_version(self, level: int) -> None:
        """The finalized transaction.version changed (UpdateFeatures): records and classic transactions follow it."""
        self._transaction_version = self.coordinator.transaction_version = level

    async def add_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                             partitions, *, implicit: bool = False, answer_when_staged: bool = False) -> TxnOutcome:
        """AddPartitionsToTxn.  ``answer_when_staged`` (data partitions only): the answer does not wait for the
        record's fsync — the producer's next request (Produce) waits for its own, and a crash that loses the record
        but keeps data leaves a transaction :meth:`abort_orphans` aborts at start-up.  This takes one fsync off
        the critical path of every transaction."""
        return await self._when_settled(lambda: self.coordinator.add_partitions(
            transactional_id, producer_id, producer_epoch, partitions, now_ms(), implicit=implicit),
            answer_when_staged=answer_when_staged)

    async def end_txn(self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool, *,
                      epoch_bump: bool = False) -> TxnOutcome:
        outcome = await self._when_settled(lambda: self.coordinator.end_txn(
            transactional_id, producer_id, producer_epoch, commit, now_ms(), epoch_bump=epoch_bump,
            allocate_producer_id=self.allocate_producer_id))
        if outcome.error == 0 and outcome.markers is not None:
            log.debug("transaction %s prepared %s", transactional_id, "commit" if commit else "abort")
        return outcome

    # --- markers ---------------------------------------------------------------------------

    def abort_orphans(self, open_transactions) -> None:
        """At start-up: abort the transactions open in data partitions whose AddPartitionsToTxn record a crash lost
        (see :meth:`TransactionCoordinator.orphaned`); their markers go out once the service runs."""
        for job in self.coordinator.orphaned(open_transactions):
            log.warning("transaction %s: producer id %d epoch %d has a transaction open on %s-%d that the "
                        "coordinator never recorded (its AddPartitionsToTxn record was lost in a crash): aborting it",
                        job.transactional_id, job.producer_id, job.producer_epoch, *job.partitions[0])
            self._orphans.append(job)

    async def _write_markers(self, job: MarkerJob) -> None:
        """WriteTxnMarkers for every partition of a prepared transaction until each is written; then COMPLETE.
        A refusal that no retry can change leaves the transaction prepared and listed in :attr:`stuck`."""
        refused = await self._send_markers(job)
        if refused:
            log.error("transaction %s: %s marker refused for good on %s; not retrying: it stays %s until an operator "
                      "completes it (trireme transactions complete --transactional-id %s)", job.transactional_id,
                      "commit" if job.commit else "abort", _partition_errors_text(refused),
                      "PrepareCommit" if job.commit else "PrepareAbort", job.transactional_id)
            self.stuck[job.transactional_id] = StuckTxn(job, refused, now_ms())
            return
        await self._complete(job)

    async def _abort_orphan(self, job: MarkerJob) -> None:
        """The ABORT marker of a transaction the coordinator never recorded (:meth:`abort_orphans`)."""
        refused = await self._send_markers(job)
        if refused:
            log.error("transaction %s: the abort marker of producer id %d's unrecorded transaction was refused for "
                      "good on %s; not retrying: abort it as a hanging transaction (trireme transactions "
                      "find-hanging, abort)", job.transactional_id, job.producer_id, _partition_errors_text(refused))

    async def _complete(self, job: MarkerJob, *, by_operator: bool = False) -> TxnOutcome:
        """The COMPLETE record of a transaction whose markers are durable.  No client waits for it, and a crash that
        loses it leaves the transaction prepared, its markers written again at start-up: so it is made durable by
        the next flush round anyone needs (the next transaction's first Produce), not by one of its own; an
        operator's completion waits for its fsync."""
        await self.wait_replayed()
        outcome = await self.run_operation(self.coordinator.markers_written(
            job.transactional_id, job.producer_id, job.producer_epoch, now_ms()), answer_when_staged=not by_operator)
        stuck = self.stuck.get(job.transactional_id)
        if not outcome.error and stuck is not None and stuck.job == job:
            del self.stuck[job.transactional_id]
        return outcome

    async def _marker_round(self, job: MarkerJob, partitions, coordinator_epoch: int, *,
                            by_operator: bool = False) -> dict[tuple[str, int], int]:
        """One WriteTxnMarkers request for ``partitions`` of ``job`` → error code per partition.
        ``trireme.debug.transaction.marker.refuse`` answers TRANSACTION_COORDINATOR_FENCED for its partitions
        without sending; not ``by_operator`` (:meth:`complete_stuck`): the injected fault stands for a partition
        that refuses the coordinator's epoch, and the operator's resend carries the epoch the partition reports."""
        injected = {} if by_operator else {tp: E.TRANSACTION_COORDINATOR_FENCED.code
                                           for tp in partitions if tp in self._refuse_markers}
        errors = dict(injected)
        for node, led in self._by_leader(set(partitions) - set(injected)).items():
            request = _MARKERS(markers=[_MARKERS.WritableTxnMarker(
                producer_id=job.producer_id, producer_epoch=job.producer_epoch, transaction_result=job.commit,
                topics=[_MARKERS.WritableTxnMarker.WritableTxnMarkerTopic(name=t, partition_indexes=p)
                        for t, p in _by_topic(led).items()],
                coordinator_epoch=coordinator_epoch, transaction_version=job.transaction_version)])
            try:
                response = await self.peer(node).call("WriteTxnMarkers", 2 if job.transaction_version >= 2 else 1,
                                                      request)
            except PeerUnavailable as e:
                log.info("transaction %s: markers to node %d not sent: %s", job.transactional_id, node, e)
                errors.update({tp: e.error_code for tp in led})
                continue
            errors.update({(t.name, p.partition_index): p.error_code
                           for marker in response.markers for t in marker.topics for p in t.partitions})
        return errors

    def _by_leader(self, partitions) -> dict[int, list[tuple[str, int]]]:
        """Partitions (sorted) by the node id of their leader: one request per leader, as Kafka's marker channel."""
        nodes: dict[int, list[tuple[str, int]]] = {}
        for tp in sorted(partitions):
            nodes.setdefault(self.leader_node(*tp), []).append(tp)
        return nodes

    def _settle(self, job: MarkerJob, errors: dict[tuple[str, int], int]) -> tuple[set, dict]:
        """Sort one round's answers as Kafka's TransactionMarkerRequestCompletionHandler does → (partitions to retry,
        {partition: error} refused for good).  Written, gone and moot partitions are done; each gone or moot one
        is logged once."""
        retry, refused = set(), {}
        what = "commit" if job.commit else "abort"
        for (topic, index), code in sorted(errors.items()):
            if code == 0:
                continue
            if code in RETRIABLE:
                retry.add((topic, index))
            elif code in _GONE:
                log.info("transaction %s: %s marker for %s-%d not written (%s): the partition will not get one",
                         job.transactional_id, what, topic, index, E.for_code(code).name)
            elif code == E.INVALID_PRODUCER_EPOCH.code:
                self.moot_markers += 1
                log.warning("transaction %s: %s marker for %s-%d refused with INVALID_PRODUCER_EPOCH: the partition "
                            "has seen a newer epoch of producer id %d than %d, which can no longer write there, so "
                            "the marker is moot: counted as written", job.transactional_id, what, topic, index,
                            job.producer_id, job.producer_epoch)
            else:
                refused[(topic, index)] = code
        return retry, refused

    async def _send_markers(self, job: MarkerJob) -> dict[tuple[str, int], int]:
        """WriteTxnMarkers for every partition of ``job`` until each is written, gone or moot, retrying retriable
        errors with a bounded backoff → the partitions refused for good (no retry can change them), with errors."""
        remaining = set(job.partitions)
        refused: dict[tuple[str, int], int] = {}
        delay_ms = self.config["trireme.debug.transaction.marker.delay.ms"]
        backoff = MARKER_RETRY_BACKOFF_S
        logged_at = None
        while remaining:
            if delay_ms:
                await trio.sleep(delay_ms / 1000)
            batch = sorted(remaining)[:1] if delay_ms else sorted(remaining)
            errors = await self._marker_round(job, batch, job.coordinator_epoch)
            retry, failed = self._settle(job, errors)
            remaining -= set(batch) - retry
            refused.update(failed)
            if not retry:
                continue
            # Retriable errors (a partition offline): back off, and say so at most once per MARKER_LOG_INTERVAL_S.
            now = trio.current_time()
            if logged_at is None or now - logged_at >= MARKER_LOG_INTERVAL_S:
                logged_at = now
                log.warning("transaction %s: markers for %s not written yet (%s); retrying every %.1fs at most",
                            job.transactional_id, ", ".join(f"{t}-{i}" for t, i in sorted(retry)),
                            ", ".join(sorted({E.for_code(errors[tp]).name for tp in retry})), MARKER_RETRY_MAX_BACKOFF_S)
            await trio.sleep(backoff)
            backoff = min(backoff * 2, MARKER_RETRY_MAX_BACKOFF_S)
        return refused

    async def complete_stuck(self, transactional_id: str) -> str:
        """An operator's completion of a stuck transaction (one a partition refused a marker for) with its prepared
        result → what was done, for people.  The refused markers are sent again with the coordinator epoch the
        partition has seen for the producer (DescribeProducers), so a TRANSACTION_COORDINATOR_FENCED refusal cannot
        recur; then the COMPLETE record.  Raises :class:`NotStuck` when the id is not stuck (any more)."""
        await self.wait_replayed()
        stuck = self.stuck.pop(transactional_id, None)       # one completion at a time: taken while it runs
        if stuck is None or not self._still_prepared(stuck.job):
            raise NotStuck(f"transactional id {transactional_id!r} has no stuck transaction")
        job = stuck.job
        try:
            try:
                seen = await self._coordinator_epochs(job.producer_id, list(stuck.partitions))
            except PeerUnavailable as e:
                raise NotStuck(f"cannot read the partitions' coordinator epochs: {e}; the transaction is still "
                               f"stuck") from None
            for tp in sorted(stuck.partitions):
                epoch = max(job.coordinator_epoch, seen.get(tp, -1))
                errors = await self._marker_round(job, [tp], epoch, by_operator=True)
                retry, refused = self._settle(job, errors)
                if retry or refused:
                    raise NotStuck(f"the marker for {tp[0]}-{tp[1]} was refused again "
                                   f"({E.for_code(errors[tp]).name}); the transaction is still stuck")
                log.warning("transaction %s: %s marker written on %s-%d by an operator, with coordinator epoch %d",
                            transactional_id, "commit" if job.commit else "abort", tp[0], tp[1], epoch)
                del stuck.partitions[tp]
        except BaseException:
            self.stuck.setdefault(transactional_id, stuck)
            raise
        outcome = await self._complete(job, by_operator=True)
        if outcome.error:
            self.stuck.setdefault(transactional_id, stuck)        # its markers are written: only COMPLETE is left
            raise NotStuck(f"writing the COMPLETE record failed: {E.for_code(outcome.error).name}")
        return (f"Completed the transaction of {transactional_id!r} "
                f"({'commit' if job.commit else 'abort'}, producer id {job.producer_id} epoch {job.producer_epoch}).")

    def _still_prepared(self, job: MarkerJob) -> bool:
        meta = self.coordinator.transactions.get(job.transactional_id)
        return meta is not None and meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT) \
            and (meta.producer_id, meta.producer_epoch) == (job.producer_id, job.producer_epoch)

    def stuck_transactions(self) -> list[StuckTxn]:
        """The stuck transactions still prepared, by transactional id."""
        for transactional_id, stuck in list(self.stuck.items()):
            if not self._still_prepared(stuck.job):
                del self.stuck[transactional_id]
        return [self.stuck[t] for t in sorted(self.stuck)]

    async def _coordinator_epochs(self, producer_id: int, partitions) -> dict[tuple[str, int], int]:
        """The latest coordinator epoch each partition has seen for ``producer_id`` (DescribeProducers, as an admin
        client reads it; -1 where the partition does not know the producer)."""
        epochs = {}
        for node, led in self._by_leader(partitions).items():
            response = await self.peer(node).call("DescribeProducers", 0, _PRODUCERS(topics=[
                _PRODUCERS.TopicRequest(name=t, partition_indexes=p) for t, p in _by_topic(led).items()]))
            epochs.update({(t.name, p.partition_index): s.coordinator_epoch
                           for t in response.topics for p in t.partitions for s in p.active_producers
                           if s.producer_id == producer_id})
        return epochs

    # --- background work -------------------------------------------------------------------

    def serving(self, nursery) -> None:
        self._start_resumed()
        nursery.start_soon(self._run_timeouts)
        nursery.start_soon(self._run_id_expiry)

    def _start_resumed(self) -> None:
        """Markers of the transactions the activation found prepared, and aborts of the orphans it found."""
        for job in self._resume:
            self._resume_markers(job)
        self._resume = []
        for job in self._orphans:
            self.start_soon(self._abort_orphan, job)
        self._orphans = []

    async def _run_timeouts(self) -> None:
        interval = self.config["transaction.abort.timed.out.transaction.cleanup.interval.ms"] / 1000
        while True:
            await trio.sleep(interval)
            await self.wait_replayed()
            for outcome in self.coordinator.abort_timed_out(now_ms()):
                log.warning("transaction %s timed out: aborting, producer id %d fenced at epoch %d",
                            outcome.transactional_id, outcome.producer_id, outcome.producer_epoch)
                await self.run_operation(outcome)

    async def _run_id_expiry(self) -> None:
        interval = self.config["transaction.remove.expired.transaction.cleanup.interval.ms"] / 1000
        while True:
            await trio.sleep(interval)
            await self.wait_replayed()
            records = self.coordinator.expire_transactional_ids(now_ms())
            if not await self.write_records(records):
                for key, _ in records:
                    self.coordinator.abandon(decode_txn_key(key))
            self._signal_change()            # an operation waiting on an expiring id tries again


def _partition_errors_text(errors: dict[tuple[str, int], int]) -> str:
    return ", ".join(f"{t}-{i} ({E.for_code(c).name})" for (t, i), c in sorted(errors.items()))


def error_for_version(code: int, version: int, fenced_since: int) -> int:
    """Kafka's per-version mapping: PRODUCER_FENCED only where the request version knows it, else INVALID_PRODUCER_EPOCH."""
    if code == E.PRODUCER_FENCED.code and version < fenced_since:
        return E.INVALID_PRODUCER_EPOCH.code
    return code


_ADD = message("AddPartitionsToTxnRequest").cls
BROKER_ADD_VERSION = 5              # the broker-to-coordinator form (several transactions, VerifyOnly)


def _by_topic(partitions) -> dict[str, list[int]]:
    """(topic, index) pairs → each topic's indexes, in the order given: how requests name partitions."""
    topics: dict[str, list[int]] = {}
    for topic, index in partitions:
        topics.setdefault(topic, []).append(index)
    return topics


def _partitions_request(transactional_id: str, producer_id: int, producer_epoch: int,
                        partitions: list[tuple[str, int]], verify_only: bool):
    topics = _by_topic(partitions)
    return _ADD(transactions=[_ADD.AddPartitionsToTxnTransaction(
        transactional_id=transactional_id, producer_id=producer_id, producer_epoch=producer_epoch,
        verify_only=verify_only,
        topics=[_ADD.AddPartitionsToTxnTopic(name=t, partitions=p) for t, p in topics.items()])])


def _partition_errors(response) -> dict[tuple[str, int], int]:
    return {(t.name, p.partition_index): p.partition_error_code
            for result in response.results_by_transaction for t in result.topic_results
            for p in t.results_by_partition}


def verify_in_transaction(peer, transactional_id: str, producer_id: int, producer_epoch: int,
                          partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
    """KIP-890 part 1, the partition side: ask the coordinator (an encoded AddPartitionsToTxn VerifyOnly) whether
    each partition is in the producer's ongoing transaction → error code per partition (0: it is)."""
    return _partition_errors(peer.call_now("AddPartitionsToTxn", BROKER_ADD_VERSION, _partitions_request(
        transactional_id, producer_id, producer_epoch, partitions, verify_only=True)))


def coordinator_here(broker) -> bool:
    """Whether this broker leads ``__transaction_state``'s partition (a request to the coordinator can be answered
    at once by its own handlers)."""
    return broker.partition_leader(TRANSACTION_STATE_TOPIC, 0) == broker.node_id


async def ask_coordinator(broker, transactional_id: str, producer_id: int, producer_epoch: int,
                          partitions: list[tuple[str, int]], *, verify_only: bool) -> dict[tuple[str, int], int]:
    """The partition side of KIP-890, wherever the transaction coordinator is: an AddPartitionsToTxn (v5) to the
    broker that leads ``__transaction_state``'s partition → error code per partition.  ``verify_only`` (part 1):
    whether each partition is in the producer's ongoing transaction (0: it is); else (part 2, transactions V2)
    the coordinator adds them, starting a transaction if none is open (0: added, or already in it).  As Kafka's
    AddPartitionsToTxnManager: no live leader → COORDINATOR_NOT_AVAILABLE; no answer (disconnected, timed out)
    → NETWORK_EXCEPTION; an error for the whole request → that error (CLUSTER_AUTHORIZATION_FAILED: the
    INVALID_TXN_STATE a client understands) for each partition."""
    node = broker.partition_leader(TRANSACTION_STATE_TOPIC, 0)
    if node < 0:
        return {tp: E.COORDINATOR_NOT_AVAILABLE.code for tp in partitions}
    try:
        response = await broker.peer(node).call("AddPartitionsToTxn", BROKER_ADD_VERSION, _partitions_request(
            transactional_id, producer_id, producer_epoch, partitions, verify_only=verify_only))
    except PeerUnavailable as e:
        log.warning("AddPartitionsToTxn to the transaction coordinator (node %d) not answered: %s", node, e)
        return {tp: E.NETWORK_EXCEPTION.code for tp in partitions}
    if response.error_code:
        error = E.INVALID_TXN_STATE.code if response.error_code == E.CLUSTER_AUTHORIZATION_FAILED.code \
            else response.error_code
        return {tp: error for tp in partitions}
    return _partition_errors(response)
