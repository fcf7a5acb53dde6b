"""Model-based test of transactions end to end: the coordinator, partition logs, producer state and markers.

A hypothesis state machine drives several transactional ids over several partitions with random interleavings of
InitProducerId (new producers, "zombie replacements" fencing an open transaction, KIP-360 bumps), AddPartitions +
transactional produce (well-behaved, and misbehaving clients producing to partitions they never added), commit,
abort, EndTxn retries, markers written partition by partition, transaction timeouts, coordinator records that
fail to become durable, idempotent non-transactional produce, and restarts (a crash of the in-memory storage with
everything fsynced, the coordinator rebuilt by replaying its durable records, the logs reopened and producer state
and the aborted-transaction index rebuilt from the batch headers).

The server glue is emulated the way the server does it:

* produce: ``server/handlers/produce.py`` -- producer-state check, then (transactional batches) the KIP-890
  verification: accepted only if the producer's transaction is already open in the partition at this epoch, or
  the coordinator's ``verify_partitions`` says the partition is in the producer's ongoing transaction; then
  ``log.append`` and commit of the producer-state overlay.
* markers: ``server/handlers/write_txn_markers.py`` -- ``check_marker``, a control batch appended,
  ``commit_end_txn`` and for an abort ``add_aborted_txn``; once every partition has its marker the coordinator's
  ``markers_written`` record is made durable.
* start-up: ``server/broker.py`` ``_open_partition`` -- replay of every batch header, markers read from their
  control record.

A small reference model (which records were appended, to which transaction, which transactions the clients
committed or aborted, which markers are in which partition) predicts every answer.  Invariants after each step:
a read_uncommitted read returns every appended record; a read_committed read (data batches below the LSO minus
the aborted transactions the log lists) returns exactly the committed records, in offset order; control records
are never data; the LSO never passes the first offset of an open transaction; the coordinator's state is the
model's.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import trireme.wire.error_codes as E
from trireme.state.log import AbortedTxn, PartitionLog
from trireme.state.producer_state import ProducerStateManager
from trireme.state.storage import MemoryStorage
from trireme.state.transactions import TransactionCoordinator, TxnConfig
from trireme.state.txn_records import TxnState, decode_txn_key, decode_txn_value
from trireme.wire import records

NONE = 0
TIDS = ("t0", "t1", "t2")
TIMEOUTS = {"t0": 400, "t1": 1500, "t2": 6000}
TPS = (("orders", 0), ("orders", 1), ("audit", 0))
SEGMENT_BYTES = 700            # small segments: rolls, and aborted-transaction entries in several txnindex files
ZOMBIES_KEPT = 3

EMPTY, ONGOING = TxnState.EMPTY, TxnState.ONGOING
PREPARE_COMMIT, PREPARE_ABORT = TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT
COMPLETE_COMMIT, COMPLETE_ABORT = TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT

# What produce answers when verification fails (server/handlers/produce.py).
VERIFY_ERRORS = {E.PRODUCER_FENCED.code: E.INVALID_PRODUCER_EPOCH.code,
                 E.CONCURRENT_TRANSACTIONS.code: E.NOT_ENOUGH_REPLICAS.code}
PRODUCE_REJECTIONS = {E.INVALID_PRODUCER_EPOCH.code, E.INVALID_TXN_STATE.code, E.NOT_ENOUGH_REPLICAS.code,
                      E.TRANSACTION_ABORTABLE.code}


# --- the reference model ---------------------------------------------------------------------------------------

@dataclass(eq=False)
class Txn:
    """One transaction as the model sees it."""

    tid: str
    pid: int
    data_epoch: int                 # the epoch its producer writes data with
    epoch: int                      # the epoch its markers carry (bumped when it is fenced)
    start: int
    partitions: set = field(default_factory=set)
    records: dict = field(default_factory=dict)         # tp → [(offset, value)]
    decision: bool | None = None    # True: committed, False: aborted, None: open
    markers_done: set = field(default_factory=set)      # partitions whose marker is in the log
    complete: bool = False          # the COMPLETE record is durable

    def open_in(self, tp) -> bool:
        """Whether it holds the LSO of ``tp`` back: data there and no marker yet."""
        return bool(self.records.get(tp)) and tp not in self.markers_done


@dataclass(eq=False)
class Client:
    """One producer instance (a replacement is a new instance with the same transactional id)."""

    tid: str
    pid: int = -1
    epoch: int = -1
    txn: Txn | None = None          # the transaction it believes open
    seqs: dict = field(default_factory=dict)            # tp → next sequence for (pid, epoch)
    last_end: bool | None = None    # its last successful EndTxn (commit?)


@dataclass
class Partition:
    tp: tuple
    log: PartitionLog
    producers: ProducerStateManager

    def last_stable_offset(self) -> int:
        hw = self.log.high_watermark
        unstable = self.producers.first_unstable_offset()
        return hw if unstable is None else min(hw, unstable)


def directory(tp) -> str:
    return f"logs/{tp[0]}-{tp[1]}"


def open_partition(storage, tp, now: int) -> Partition:
    """What server/broker.py _open_partition does: recover the log, replay every batch header into producer state,
    markers read from their control record, aborts re-added to the aborted-transaction index."""
    plog = PartitionLog.open(storage, directory(tp), segment_bytes=SEGMENT_BYTES, now_ms=now)
    producers = ProducerStateManager()
    for header in plog.iter_batch_headers():
        if not header.is_control:
            producers.load_batch(header)
            continue
        data = plog.read(header.base_offset, header.batch_length + records.LOG_OVERHEAD, header.base_offset + 1)
        kind, coordinator_epoch = records.parse_control_record(records.decode_records(data, 0)[0])
        first_offset = producers.load_batch(header, coordinator_epoch)
        if kind == records.CONTROL_ABORT and first_offset is not None:
            unstable = producers.first_unstable_offset()
            plog.add_aborted_txn(AbortedTxn(header.producer_id, first_offset, header.base_offset,
                                            header.base_offset + 1 if unstable is None else unstable))
    return Partition(tp, plog, producers)


_decoded: dict = {}
STATS = {"runs": 0, "steps": 0, "events": {}}       # what the machine did, for reporting


def note(event: str) -> None:
    STATS["events"][event] = STATS["events"].get(event, 0) + 1


def decode_batch(tp, data, pos, header) -> list:
    """(offset, value) of a data batch's records (cached by partition, base offset and CRC: logs only grow)."""
    key = (tp, header.base_offset, header.crc, header.batch_length)
    found = _decoded.get(key)
    if found is None:
        found = _decoded[key] = [(r.offset, r.value) for r in records.decode_records(data, pos)]
    return found


class TxnMachine(RuleBasedStateMachine):

    @initialize()
    def start(self):
        _decoded.clear()
        self.now = 1_000_000
        self.storage = MemoryStorage()
        self.config = TxnConfig()
        self.txn_log: list = []                     # the durable __transaction_state records, in order
        self.coord = TransactionCoordinator(self.config)
        assert self.coord.loaded() == []
        self.jobs: list = []                        # [MarkerJob, partitions still without their marker]
        self.partitions = {tp: open_partition(self.storage, tp, self.now) for tp in TPS}
        self.pids = itertools.count(5000)
        self.values = itertools.count()
        # model
        self.clients = {tid: Client(tid) for tid in TIDS}
        self.zombies = {tid: [] for tid in TIDS}
        self.coord_pid: dict = {}
        self.coord_epoch: dict = {}
        self.coord_txn: dict = {}                   # tid → its latest transaction (None: Empty)
        self.txns: list = []
        self.appended = {tp: [] for tp in TPS}      # every data record: (offset, value)
        self.plain = {tp: [] for tp in TPS}         # non-transactional records (always committed)
        self.markers = {tp: [] for tp in TPS}       # (offset, commit?) of every control batch
        self.idem_pid = next(self.pids)
        self.idem_seq = {tp: 0 for tp in TPS}
        self.steps = 0

    # --- helpers -----------------------------------------------------------------------------------------------

    def tick(self, ms: int = 1) -> int:
        self.now += ms
        return self.now

    def alloc(self) -> int:
        return next(self.pids)

    def durable(self, outcome_or_records) -> None:
        recs = outcome_or_records if isinstance(outcome_or_records, list) else outcome_or_records.records
        for key, value in recs:
            self.txn_log.append((key, value))
            self.coord.replay(key, value)

    def value(self, tag: str) -> bytes:
        return f"{tag}/{next(self.values)}".encode()

    def expected_state(self, tid):
        if tid not in self.coord_pid:
            return None
        txn = self.coord_txn.get(tid)
        if txn is None:
            return EMPTY
        if txn.decision is None:
            return ONGOING
        if not txn.complete:
            return PREPARE_COMMIT if txn.decision else PREPARE_ABORT
        return COMPLETE_COMMIT if txn.decision else COMPLETE_ABORT

    def is_current(self, client: Client) -> bool:
        return client.pid >= 0 and client.pid == self.coord_pid.get(client.tid) \
            and client.epoch == self.coord_epoch.get(client.tid)

    def pick(self, tid: str, who: int) -> Client:
        zombies = self.zombies[tid]
        if who < 2 and zombies:
            return zombies[who % len(zombies)]
        return self.clients[tid]

    def replace_client(self, tid: str, client: Client) -> None:
        old = self.clients[tid]
        if old.pid >= 0:
            self.zombies[tid] = (self.zombies[tid] + [old])[-ZOMBIES_KEPT:]
        self.clients[tid] = client

    def add_job(self, job, txn: Txn) -> None:
        assert (job.transactional_id, job.producer_id, job.producer_epoch, job.commit) == \
            (txn.tid, txn.pid, txn.epoch, txn.decision)
        assert set(job.partitions) == txn.partitions
        self.jobs.append([job, set(job.partitions)])

    def fenced(self, tid: str, outcome) -> None:
        """A fence (replacement or timeout) is durable: the open transaction aborts with the bumped epoch."""
        txn = self.coord_txn[tid]
        assert outcome.transactional_id == tid
        _, value = self.only_record(outcome)
        assert (value.state, value.producer_id, value.producer_epoch) == \
            (PREPARE_ABORT, txn.pid, self.coord_epoch[tid] + 1)
        assert set(value.partitions) == txn.partitions
        self.durable(outcome)
        self.coord_epoch[tid] += 1
        txn.epoch = self.coord_epoch[tid]
        txn.decision = False
        self.add_job(outcome.markers, txn)

    @staticmethod
    def only_record(outcome):
        assert len(outcome.records) == 1, outcome
        key, value = outcome.records[0]
        return decode_txn_key(key), decode_txn_value(value)

    def txn_open_in(self, tp, pid: int, epoch: int) -> Txn | None:
        """The model's transaction of (pid, epoch) open in ``tp``, if any (at most one)."""
        found = [t for t in self.txns if t.pid == pid and t.data_epoch == epoch and t.open_in(tp)]
        assert len(found) <= 1
        return found[0] if found else None

    def produce_batch(self, part: Partition, buf: bytearray, transactional_id: str | None) -> tuple[int, int]:
        """server/handlers/produce.py _append for one batch → (error, base offset)."""
        batches = records.validate_batches(buf)
        assert len(batches) == 1
        pos, header = batches[0]
        append = part.producers.begin()
        check = append.check(header.producer_id, header.producer_epoch, header.base_sequence,
                             header.last_offset_delta, header.is_transactional)
        assert not check.is_duplicate               # the model never resends a batch
        if not check.accepted:
            return check.error_code, -1
        if header.is_transactional:
            entry = part.producers.entry(header.producer_id)
            if not (entry is not None and entry.current_txn_first_offset is not None
                    and entry.producer_epoch == header.producer_epoch):
                error = self.coord.verify_partitions(transactional_id, header.producer_id, header.producer_epoch,
                                                     [part.tp])[part.tp]
                if error:
                    return VERIFY_ERRORS.get(error, error), -1
        base_offset, _, _ = part.log.append(buf, batches, self.now)
        append.commit(header.producer_id, header.producer_epoch, header.base_sequence, header.last_offset_delta,
                      base_offset, header.max_timestamp, header.is_transactional)
        append.apply()
        part.log.sync()
        return NONE, base_offset

    # --- InitProducerId ----------------------------------------------------------------------------------------

    def init(self, tid: str) -> None:
        """A new producer instance for ``tid`` (replacing whichever one there was)."""
        self.steps += 1
        client = Client(tid)
        state = self.expected_state(tid)
        out = self.coord.init_producer_id(tid, TIMEOUTS[tid], self.tick(), self.alloc)
        if state in (None, EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT):
            assert out.error == NONE, out
            _, value = self.only_record(out)
            if state is None:
                assert out.producer_epoch == 0
                assert out.producer_id not in self.coord_pid.values()
            else:
                assert (out.producer_id, out.producer_epoch) == (self.coord_pid[tid], self.coord_epoch[tid] + 1)
            assert (value.state, value.producer_id, value.producer_epoch, value.partitions) == \
                (EMPTY, out.producer_id, out.producer_epoch, ())
            self.durable(out)
            self.coord_pid[tid], self.coord_epoch[tid] = out.producer_id, out.producer_epoch
            self.coord_txn[tid] = None
            client.pid, client.epoch = out.producer_id, out.producer_epoch
        elif state is ONGOING:
            # The replacement fences the open transaction; it is told to retry.
            assert out.error == E.CONCURRENT_TRANSACTIONS.code, out
            self.fenced(tid, out)
            note("fence by a replacement")
        else:
            assert out.error == E.CONCURRENT_TRANSACTIONS.code, out
            assert out.records == [] and out.markers is None
            return                                   # nothing changed: the replacement retries later
        self.replace_client(tid, client)

    @rule(tid=st.sampled_from(TIDS))
    def init_producer(self, tid):
        self.init(tid)

    @rule(tid=st.sampled_from(TIDS), lose_answer=st.booleans())
    def kip360_bump(self, tid, lose_answer):
        """The current producer bumps its own epoch (InitProducerId naming its id and epoch, KIP-360)."""
        client = self.clients[tid]
        if client.pid < 0:
            return self.init(tid)
        if not self.is_current(client):
            return      # fenced by a timeout and does not know yet (stale KIP-360 epochs: test_transactions.py)
        self.steps += 1
        state = self.expected_state(tid)
        out = self.coord.init_producer_id(tid, TIMEOUTS[tid], self.tick(), self.alloc,
                                          expected_producer_id=client.pid, expected_producer_epoch=client.epoch)
        if state is ONGOING:
            assert out.error == E.CONCURRENT_TRANSACTIONS.code, out
            self.fenced(tid, out)
            self.replace_client(tid, Client(tid))
            return
        if state in (PREPARE_COMMIT, PREPARE_ABORT):
            assert out.error == E.CONCURRENT_TRANSACTIONS.code and out.records == [], out
            return
        assert (out.error, out.producer_id, out.producer_epoch) == (NONE, client.pid, client.epoch + 1), out
        self.durable(out)
        note("kip360 bump")
        if lose_answer:
            note("kip360 retry")
            # The answer was lost; the retry names the old epoch and gets the same answer, writing nothing.
            retry = self.coord.init_producer_id(tid, TIMEOUTS[tid], self.tick(), self.alloc,
                                                expected_producer_id=client.pid,
                                                expected_producer_epoch=client.epoch)
            assert (retry.error, retry.producer_id, retry.producer_epoch, retry.records) == \
                (NONE, out.producer_id, out.producer_epoch, []), retry
        self.coord_epoch[tid] = out.producer_epoch
        self.coord_txn[tid] = None
        client.epoch = out.producer_epoch
        client.seqs = {}
        client.txn = None
        client.last_end = None

    # --- AddPartitions and produce -----------------------------------------------------------------------------

    def add_partition(self, client: Client, tp) -> bool:
        """AddPartitionsToTxn before the first batch to ``tp``; → whether the client may go on."""
        tid = client.tid
        state = self.expected_state(tid)
        out = self.coord.add_partitions(tid, client.pid, client.epoch, [tp], self.tick())
        if state in (PREPARE_COMMIT, PREPARE_ABORT):
            # markers still being written: Kafka answers this before the producer checks
            assert out.error == E.CONCURRENT_TRANSACTIONS.code and out.records == [], out
            return False
        if not self.is_current(client):
            assert out.error == E.PRODUCER_FENCED.code and out.records == [], out
            note("add partitions fenced")
            if client is self.clients[tid]:          # it learns it was fenced: a new instance takes over
                self.replace_client(tid, Client(tid))
            return False
        assert out.error == NONE and out.partition_errors == {tp: NONE}, out
        txn = self.coord_txn.get(tid) if state is ONGOING else None
        if txn is not None and tp in txn.partitions:
            assert out.records == []
        else:
            _, value = self.only_record(out)
            if txn is None:
                txn = Txn(tid, client.pid, client.epoch, client.epoch, start=self.now)
                self.txns.append(txn)
                self.coord_txn[tid] = txn
            txn.partitions.add(tp)
            assert (value.state, set(value.partitions), value.start_timestamp_ms) == \
                (ONGOING, txn.partitions, txn.start)
            self.durable(out)
        client.txn = txn
        return True

    PRODUCE = dict(tid=st.sampled_from(TIDS), tp=st.sampled_from(TPS), n=st.integers(1, 3), who=st.integers(0, 6),
                   add_first=st.integers(0, 5))

    # Produce is the most common thing clients do: three rules, so that transactions get data.
    @rule(**PRODUCE)
    def produce(self, tid, tp, n, who, add_first):
        self.produce_batch_as_client(tid, tp, n, who, add_first)

    @rule(**PRODUCE)
    def produce_again(self, tid, tp, n, who, add_first):
        self.produce_batch_as_client(tid, tp, n, who, add_first)

    @rule(**PRODUCE)
    def produce_more(self, tid, tp, n, who, add_first):
        self.produce_batch_as_client(tid, tp, n, who, add_first)

    def produce_batch_as_client(self, tid, tp, n, who, add_first):
        """A transactional batch; ``add_first`` 0 is a client that skips AddPartitionsToTxn."""
        client = self.pick(tid, who)
        if client.pid < 0:
            return self.init(tid)
        self.steps += 1
        if add_first and (client.txn is None or tp not in client.txn.partitions):
            if not self.add_partition(client, tp):
                return
        part = self.partitions[tp]
        # The model's prediction: the producer's transaction is open here at this epoch, or the coordinator
        # has the partition in the producer's ongoing transaction.
        target = self.txn_open_in(tp, client.pid, client.epoch)
        if target is None and self.is_current(client) and self.expected_state(tid) is ONGOING \
                and tp in self.coord_txn[tid].partitions:
            target = self.coord_txn[tid]
        values = [self.value(tid) for _ in range(n)]
        seq = client.seqs.get(tp, 0)
        buf = bytearray(records.build_batch([(None, v) for v in values], producer_id=client.pid,
                                            producer_epoch=client.epoch, base_sequence=seq, transactional=True,
                                            base_timestamp=self.now))
        end = part.log.log_end_offset
        error, base = self.produce_batch(part, buf, tid)
        kind = ("current" if self.is_current(client) else "zombie") + (" unadded" if not add_first else "")
        if target is None:
            assert error in PRODUCE_REJECTIONS, (error, base)
            assert part.log.log_end_offset == end
            note(f"produce rejected ({kind}, {E.for_code(error).name})")
            return
        note(f"produce accepted ({kind})")
        assert error == NONE, (error, client, target)
        assert base == end
        client.seqs[tp] = seq + n
        target.records.setdefault(tp, []).extend((base + i, v) for i, v in enumerate(values))
        self.appended[tp].extend((base + i, v) for i, v in enumerate(values))

    @rule(tp=st.sampled_from(TPS), n=st.integers(1, 2))
    def produce_idempotent(self, tp, n):
        """A non-transactional idempotent producer writing in between: its records are always committed."""
        self.steps += 1
        part = self.partitions[tp]
        values = [self.value("plain") for _ in range(n)]
        buf = bytearray(records.build_batch([(None, v) for v in values], producer_id=self.idem_pid,
                                            producer_epoch=0, base_sequence=self.idem_seq[tp],
                                            base_timestamp=self.now))
        error, base = self.produce_batch(part, buf, None)
        assert error == NONE
        self.idem_seq[tp] += n
        self.plain[tp].extend((base + i, v) for i, v in enumerate(values))
        self.appended[tp].extend((base + i, v) for i, v in enumerate(values))

    # --- EndTxn ------------------------------------------------------------------------------------------------

    END = dict(tid=st.sampled_from(TIDS), commit=st.booleans(), who=st.integers(0, 6))

    @rule(**END)
    def end_txn(self, tid, commit, who):
        self.end_txn_as_client(tid, commit, who)

    @rule(**END)
    def end_txn_again(self, tid, commit, who):
        self.end_txn_as_client(tid, commit, who)

    def end_txn_as_client(self, tid, commit, who):
        client = self.pick(tid, who)
        if client.pid < 0:
            return
        if client.txn is None and client.last_end is None and self.is_current(client) \
                and (self.expected_state(tid) is not EMPTY or who != 6):
            return                                   # nothing to end (now and then sent anyway: Empty)
        self.steps += 1
        state = self.expected_state(tid)
        out = self.coord.end_txn(tid, client.pid, client.epoch, commit, self.tick())
        if not self.is_current(client):
            assert out.error == E.PRODUCER_FENCED.code and out.records == [], out
            if client is self.clients[tid]:
                self.replace_client(tid, Client(tid))
            return
        if state is ONGOING:
            txn = self.coord_txn[tid]
            assert client.txn is txn
            assert (out.error, out.producer_id, out.producer_epoch) == (NONE, client.pid, client.epoch), out
            _, value = self.only_record(out)
            assert value.state is (PREPARE_COMMIT if commit else PREPARE_ABORT)
            assert set(value.partitions) == txn.partitions
            self.durable(out)
            txn.decision = commit
            note("end txn commit" if commit else "end txn abort")
            self.add_job(out.markers, txn)
            client.txn = None
            client.last_end = commit
            return
        # Retries of the last EndTxn, and EndTxn with nothing open.
        assert client.txn is None
        expected = {
            (EMPTY, True): E.INVALID_TXN_STATE.code, (EMPTY, False): E.INVALID_TXN_STATE.code,
            # markers still being written: Kafka's pending Complete* transition, checked before the state
            (PREPARE_COMMIT, True): E.CONCURRENT_TRANSACTIONS.code, (PREPARE_COMMIT, False): E.CONCURRENT_TRANSACTIONS.code,
            (PREPARE_ABORT, False): E.CONCURRENT_TRANSACTIONS.code, (PREPARE_ABORT, True): E.CONCURRENT_TRANSACTIONS.code,
            (COMPLETE_COMMIT, True): NONE, (COMPLETE_COMMIT, False): E.INVALID_TXN_STATE.code,
            (COMPLETE_ABORT, False): NONE, (COMPLETE_ABORT, True): E.INVALID_TXN_STATE.code,
        }[(state, commit)]
        assert out.error == expected, (state, commit, out)
        note(f"end txn retry {state.kafka_name} {'commit' if commit else 'abort'}")
        assert out.records == [] and out.markers is None

    # --- markers -----------------------------------------------------------------------------------------------

    def write_marker(self, entry, tp) -> None:
        """server/handlers/write_txn_markers.py for one partition of a job."""
        job, remaining = entry
        part = self.partitions[tp]
        txns = [t for t in self.txns if (t.tid, t.pid, t.epoch) == (job.transactional_id, job.producer_id,
                                                                    job.producer_epoch)
                and t.decision is not None and not t.complete]
        assert len(txns) == 1, (job, txns)
        txn = txns[0]
        assert txn.decision == job.commit
        error, message = part.producers.check_marker(job.producer_id, job.producer_epoch, job.coordinator_epoch,
                                                     strict_epoch=job.transaction_version >= 2)
        assert error == NONE, message
        now = self.tick()
        batch = bytearray(records.build_control_batch(job.commit, producer_id=job.producer_id,
                                                      producer_epoch=job.producer_epoch,
                                                      coordinator_epoch=job.coordinator_epoch, timestamp=now))
        offset, _, _ = part.log.append(batch, records.validate_batches(batch), now)
        first_offset = part.producers.commit_end_txn(job.producer_id, job.producer_epoch, offset, now,
                                                     job.coordinator_epoch)
        if tp in txn.markers_done:
            note("marker written again (resumed job)")
        expected_first = min(o for o, _ in txn.records[tp]) if txn.open_in(tp) else None
        assert first_offset == expected_first, (first_offset, expected_first)
        if not job.commit and first_offset is not None:
            part.log.add_aborted_txn(AbortedTxn(job.producer_id, first_offset, offset, part.last_stable_offset()))
        part.log.sync()
        # The partition now knows the producer at the marker's epoch: a fenced epoch's batches are refused here.
        assert part.producers.entry(job.producer_id).producer_epoch == job.producer_epoch
        assert part.producers.entry(job.producer_id).current_txn_first_offset is None
        note("marker written")
        txn.markers_done.add(tp)
        self.markers[tp].append((offset, job.commit))
        remaining.discard(tp)
        if not remaining:
            self.jobs.remove(entry)
            out = self.coord.markers_written(job.transactional_id, job.producer_id, job.producer_epoch, self.tick())
            assert out.error == NONE, out
            _, value = self.only_record(out)
            assert value.state is (COMPLETE_COMMIT if job.commit else COMPLETE_ABORT) and value.partitions == ()
            self.durable(out)
            txn.complete = True

    @precondition(lambda self: self.jobs)
    @rule(i=st.integers(0, 5), j=st.integers(0, 5))
    def write_one_marker(self, i, j):
        self.steps += 1
        entry = self.jobs[i % len(self.jobs)]
        remaining = sorted(entry[1])
        self.write_marker(entry, remaining[j % len(remaining)])

    @precondition(lambda self: self.jobs)
    @rule()
    def write_all_markers(self):
        self.steps += 1
        while self.jobs:
            entry = self.jobs[0]
            self.write_marker(entry, sorted(entry[1])[0])

    # --- timeouts ----------------------------------------------------------------------------------------------

    @rule(tid=st.sampled_from(TIDS))
    def time_out(self, tid):
        """Advance the clock past ``tid``'s open transaction's timeout and run the coordinator's sweep."""
        self.steps += 1
        if self.expected_state(tid) is ONGOING:
            txn = self.coord_txn[tid]
            self.now = max(self.now, txn.start + TIMEOUTS[tid] + 1)
        else:
            self.tick(100)
        expected = {t for t in TIDS if self.expected_state(t) is ONGOING
                    and self.coord_txn[t].start + TIMEOUTS[t] < self.now}
        outcomes = self.coord.abort_timed_out(self.now)
        assert {o.transactional_id for o in outcomes} == expected
        assert len(outcomes) == len(expected)
        for out in outcomes:
            assert out.error == NONE
            self.fenced(out.transactional_id, out)
            note("timed out")

    # --- failed coordinator writes -----------------------------------------------------------------------------

    @rule(tid=st.sampled_from(TIDS), kind=st.sampled_from(["init", "add", "commit", "abort"]),
          tp=st.sampled_from(TPS))
    def coordinator_write_fails(self, tid, kind, tp):
        """An operation whose __transaction_state record never becomes durable: abandoned, nothing changes."""
        client = self.clients[tid]
        if kind != "init" and client.pid < 0:
            return
        self.steps += 1
        before = self.coord.describe(tid)
        if kind == "init":
            out = self.coord.init_producer_id(tid, TIMEOUTS[tid], self.tick(), self.alloc)
        elif kind == "add":
            out = self.coord.add_partitions(tid, client.pid, client.epoch, [tp], self.tick())
        else:
            out = self.coord.end_txn(tid, client.pid, client.epoch, kind == "commit", self.tick())
        if out.records:
            assert tid in self.coord.pending
            self.coord.abandon(tid)
            note(f"write failed, abandoned ({kind})")
        assert self.coord.pending == {}
        assert self.coord.describe(tid) == before

    # --- restart -----------------------------------------------------------------------------------------------

    @rule(compact=st.booleans())
    def restart(self, compact):
        """Crash and restart: only durable state survives; markers of prepared transactions are resumed."""
        self.steps += 1
        assert self.coord.pending == {}
        before = dict(self.coord.transactions)
        if compact:
            self.txn_log = list(self.coord.compact_records())
        self.coord = TransactionCoordinator(self.config)
        for key, value in self.txn_log:
            self.coord.replay(key, value)
        # Before loaded() nothing is served.
        probe = self.coord.init_producer_id(TIDS[0], TIMEOUTS[TIDS[0]], self.now, self.alloc)
        assert probe.error == E.COORDINATOR_LOAD_IN_PROGRESS.code and probe.records == []
        jobs = self.coord.loaded()
        # Durable values only: last_producer_epoch/id live in memory (as Kafka's lastProducerEpoch).
        assert {k: m.value for k, m in self.coord.transactions.items()} == {k: m.value for k, m in before.items()}
        expected = {(t.tid, t.pid, t.epoch, t.decision, tuple(sorted(t.partitions)))
                    for t in self.txns if t.decision is not None and not t.complete}
        assert {(j.transactional_id, j.producer_id, j.producer_epoch, j.commit, j.partitions)
                for j in jobs} == expected
        assert len(jobs) == len(expected)
        self.jobs = [[job, set(job.partitions)] for job in jobs]
        note("restart with markers to resume" if jobs else "restart")
        if compact:
            note("restart from compacted records")
        # The partitions: every append was fsynced, so the crash loses nothing.
        for part in self.partitions.values():
            assert part.log.high_watermark == part.log.log_end_offset
        self.storage = self.storage.crash()
        old = self.partitions
        self.partitions = {tp: open_partition(self.storage, tp, self.now) for tp in TPS}
        for tp in TPS:
            assert self.partitions[tp].log.log_end_offset == old[tp].log.log_end_offset
            assert self.partitions[tp].producers.first_unstable_offset() == \
                old[tp].producers.first_unstable_offset()

    def teardown(self):
        if hasattr(self, "coord"):
            STATS["runs"] += 1
            STATS["steps"] += self.steps

    # --- invariants --------------------------------------------------------------------------------------------

    @invariant()
    def coordinator_matches_model(self):
        if not hasattr(self, "coord"):
            return
        assert self.coord.pending == {}
        for tid in TIDS:
            state = self.expected_state(tid)
            meta = self.coord.describe(tid)
            if state is None:
                assert meta is None
                continue
            assert (meta.state, meta.producer_id, meta.producer_epoch) == \
                (state, self.coord_pid[tid], self.coord_epoch[tid]), tid
            txn = self.coord_txn.get(tid)
            if state in (ONGOING, PREPARE_COMMIT, PREPARE_ABORT):
                assert set(meta.value.partitions) == txn.partitions
                assert meta.value.start_timestamp_ms == txn.start
            else:
                assert meta.value.partitions == ()
        pending_jobs = sum(1 for t in self.txns if t.decision is not None and not t.complete)
        assert len(self.jobs) == pending_jobs

    @invariant()
    def reads_match_model(self):
        if not hasattr(self, "coord"):
            return
        for tp in TPS:
            self.check_partition(tp)

    def check_partition(self, tp) -> None:
        part = self.partitions[tp]
        log = part.log
        hw = log.high_watermark
        assert hw == log.log_end_offset                         # everything was synced
        data = log.read(log.log_start_offset, 1 << 30, hw) if hw else b""
        batches = list(records.iter_batch_headers(data))
        # read_uncommitted: every data record, control records never among them.
        uncommitted, controls = [], []
        for pos, header in batches:
            if header.is_control:
                [record] = records.decode_records(data, pos)
                kind, coordinator_epoch = records.parse_control_record(record)
                assert kind in (records.CONTROL_ABORT, records.CONTROL_COMMIT) and coordinator_epoch == 0
                controls.append((header.base_offset, kind == records.CONTROL_COMMIT))
            else:
                uncommitted.extend(decode_batch(tp, data, pos, header))
        assert uncommitted == sorted(self.appended[tp])
        assert controls == self.markers[tp]
        # The last stable offset: held back exactly to the first offset of the oldest open transaction.
        open_first = [min(o for o, _ in t.records[tp]) for t in self.txns if t.open_in(tp)]
        first_open = min(open_first) if open_first else None
        assert part.producers.first_unstable_offset() == first_open
        lso = part.last_stable_offset()
        assert lso == (hw if first_open is None else min(hw, first_open))
        if first_open is not None:
            assert lso <= first_open
        # read_committed: data below the LSO minus the aborted transactions the log lists.
        aborted = log.aborted_txns(0, lso)
        committed = []
        for pos, header in batches:
            if header.is_control or header.base_offset >= lso:
                continue
            assert header.last_offset < lso
            if header.is_transactional and any(a.producer_id == header.producer_id
                                               and a.first_offset <= header.base_offset <= a.last_offset
                                               for a in aborted):
                continue
            committed.extend(decode_batch(tp, data, pos, header))
        expected = list(self.plain[tp])
        for t in self.txns:
            if t.decision and tp in t.markers_done:
                expected.extend(t.records.get(tp, ()))
        assert committed == sorted(r for r in expected if r[0] < lso)
        # Every aborted transaction whose marker is in the log is listed (and nothing else).
        listed = {(a.producer_id, a.first_offset) for a in log.aborted_txns(0, hw)}
        want = {(t.pid, min(o for o, _ in t.records[tp])) for t in self.txns
                if t.decision is False and tp in t.markers_done and t.records.get(tp)}
        assert listed == want


TxnMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=100, deadline=None)
test_transactions_model = TxnMachine.TestCase
