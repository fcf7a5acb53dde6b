"""The transaction coordinator's service: the pure coordinator on the coordinator runtime over ``__transaction_state``, plus marker writing.

Every operation follows the runtime's order: the coordinator returns records, they are appended
and made durable, replayed, and only then is the client answered.  After a PREPARE record is
durable the markers go out as real WriteTxnMarkers requests through
:class:`~trireme.server.local_peer.LocalPeer` (encode → handler → decode), retried until every
partition has its marker; then a COMPLETE record ends the transaction.  On start-up, transactions
a crash left prepared get their markers written again.  Open transactions past their timeout are
aborted (with an epoch bump that fences the producer), and idle transactional ids expire.
"""
from __future__ import annotations

import logging
import time
import uuid

import trio

from trireme.state.topics import Topic
from trireme.state.transactions import MarkerJob, TransactionCoordinator, TxnConfig, TxnOutcome
from trireme.state.txn_records import decode_txn_key
from trireme.wire import error_codes as E
from trireme.wire.codec import message

from .clock import now_ms
from .coordinator_runtime import CoordinatorRuntime, Durability

log = logging.getLogger("trireme.transactions")

TRANSACTION_STATE_TOPIC = "__transaction_state"
TRANSACTION_STATE_TOPIC_ID = uuid.UUID(int=2)
MARKER_RETRY_BACKOFF_S = 0.1
CONCURRENT_WAIT_S = 5.0
# A marker for these is not written, and never will be: the partition is gone.
_GONE = {E.UNKNOWN_TOPIC_OR_PARTITION.code}

_MARKERS = message("WriteTxnMarkersRequest").cls


class TransactionService(CoordinatorRuntime):
    def __init__(self, config, durability: Durability, open_internal_partition, allocate_producer_id, peer,
                 transaction_version: int = 0):
        self.config = config
        self.allocate_producer_id = allocate_producer_id
        self.peer = peer
        coordinator = TransactionCoordinator(TxnConfig(
            max_timeout_ms=config["transaction.max.timeout.ms"],
            id_expiration_ms=config["transactional.id.expiration.ms"],
            two_phase_commit_enable=config["transaction.two.phase.commit.enable"],
            transaction_version=transaction_version,
        ))
        topic = Topic(name=TRANSACTION_STATE_TOPIC, topic_id=TRANSACTION_STATE_TOPIC_ID, partitions=1, configs={},
                      created_order=-1, leader_epoch=0)
        partition = open_internal_partition(topic, 0, segment_bytes=100 * 1024 * 1024)
        super().__init__(TRANSACTION_STATE_TOPIC, partition, durability, coordinator)
        self._changed = trio.Event()         # set whenever a transaction record was made durable
        started = time.perf_counter()
        loaded = self.load()
        self.compact(self.coordinator.compact_records(), loaded)
        self._resume = self.coordinator.loaded()
        self._orphans: list[MarkerJob] = []
        log.info("loaded transaction coordinator records=%d transactional_ids=%d prepared=%d in %.3fs", loaded,
                 len(self.coordinator.transactions), len(self._resume), time.perf_counter() - started)

    # --- operations the handlers call ------------------------------------------------------

    async def run_operation(self, outcome: TxnOutcome, *, answer_when_staged: bool = False) -> TxnOutcome:
        """Make an outcome's records durable and replayed, then start its markers; → the outcome to answer.
        ``answer_when_staged``: answer once the records are staged and written to the OS (a process crash keeps
        them; a power loss may not) and make them durable in the background."""
        if outcome.records:
            staged = self.stage(outcome.effects)
            self._signal_change()            # an operation waiting on this id may build on what was staged
            if answer_when_staged and self.written(staged) and self.start_soon(self._make_durable, outcome, staged):
                return outcome
            durable = await self._make_durable(outcome, staged)
            if not durable:
                outcome.error = E.COORDINATOR_NOT_AVAILABLE.code
                outcome.partition_errors = {tp: outcome.error for tp in outcome.partition_errors}
                return outcome
        if outcome.markers is not None:
            self.start_soon(self._write_markers, outcome.markers)
        return outcome

    async def _make_durable(self, outcome: TxnOutcome, staged) -> bool:
        durable = await self.complete(staged)
        if not durable:
            self.coordinator.abandon(outcome.transactional_id)
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
            outcome = await self.run_operation(attempt(), answer_when_staged=answer_when_staged)
            if outcome.error != E.CONCURRENT_TRANSACTIONS.code or trio.current_time() >= deadline:
                return outcome
            with trio.move_on_at(deadline):
                await changed.wait()

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
        self.coordinator.transaction_version = level

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
        """WriteTxnMarkers for every partition of a prepared transaction until each is written; then COMPLETE."""
        await self._send_markers(job)
        await self.wait_replayed()
        await self.run_operation(self.coordinator.markers_written(
            job.transactional_id, job.producer_id, job.producer_epoch, now_ms()))

    async def _send_markers(self, job: MarkerJob) -> None:
        """WriteTxnMarkers for every partition of ``job`` until each is written."""
        remaining = set(job.partitions)
        delay_ms = self.config["trireme.debug.transaction.marker.delay.ms"]
        while remaining:
            topics: dict[str, list[int]] = {}
            for topic, index in sorted(remaining)[:1] if delay_ms else sorted(remaining):
                topics.setdefault(topic, []).append(index)
            if delay_ms:
                await trio.sleep(delay_ms / 1000)
            request = _MARKERS(markers=[_MARKERS.WritableTxnMarker(
                producer_id=job.producer_id, producer_epoch=job.producer_epoch, transaction_result=job.commit,
                topics=[_MARKERS.WritableTxnMarker.WritableTxnMarkerTopic(name=t, partition_indexes=p)
                        for t, p in topics.items()],
                coordinator_epoch=job.coordinator_epoch, transaction_version=job.transaction_version)])
            response = await self.peer.call("WriteTxnMarkers", 2 if job.transaction_version >= 2 else 1, request)
            for marker in response.markers:
                for t in marker.topics:
                    for p in t.partitions:
                        if p.error_code == 0 or p.error_code in _GONE:
                            remaining.discard((t.name, p.partition_index))
                        else:
                            log.warning("marker for %s %s-%d failed with %s; retrying", job.transactional_id,
                                        t.name, p.partition_index, E.for_code(p.error_code).name)
            if remaining and not delay_ms:
                await trio.sleep(MARKER_RETRY_BACKOFF_S)

    # --- background work -------------------------------------------------------------------

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(super().run)
            for job in self._resume:
                log.info("resuming markers of prepared transaction %s (%s)", job.transactional_id,
                         "commit" if job.commit else "abort")
                self.start_soon(self._write_markers, job)
            self._resume = []
            for job in self._orphans:
                self.start_soon(self._send_markers, job)
            self._orphans = []
            nursery.start_soon(self._run_timeouts)
            nursery.start_soon(self._run_id_expiry)
            task_status.started()

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


def error_for_version(code: int, version: int, fenced_since: int) -> int:
    """Kafka's per-version mapping: PRODUCER_FENCED only where the request version knows it, else INVALID_PRODUCER_EPOCH."""
    if code == E.PRODUCER_FENCED.code and version < fenced_since:
        return E.INVALID_PRODUCER_EPOCH.code
    return code


_ADD = message("AddPartitionsToTxnRequest").cls
BROKER_ADD_VERSION = 5              # the broker-to-coordinator form (several transactions, VerifyOnly)


def _partitions_request(transactional_id: str, producer_id: int, producer_epoch: int,
                        partitions: list[tuple[str, int]], verify_only: bool):
    topics: dict[str, list[int]] = {}
    for topic, index in partitions:
        topics.setdefault(topic, []).append(index)
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


async def add_to_transaction(peer, transactional_id: str, producer_id: int, producer_epoch: int,
                             partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
    """KIP-890 part 2 (transactions V2), the partition side: the coordinator adds the partitions to the producer's
    transaction (an encoded AddPartitionsToTxn, VerifyOnly false), starting it if none is open → error code per
    partition (0: added, or already in it)."""
    return _partition_errors(await peer.call("AddPartitionsToTxn", BROKER_ADD_VERSION, _partitions_request(
        transactional_id, producer_id, producer_epoch, partitions, verify_only=False)))
