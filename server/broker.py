"""The running broker: ties the pure state (topics, partition logs, producer state) to trio tasks for fsync and retention.

Durability works by group commit: appends only write; a single flusher task fsyncs every log
that has unflushed data in one worker-thread call, then advances those logs' high watermarks
and wakes everyone waiting (acks=1/all produce responses, long-polling fetches).  Whatever was
appended while an fsync ran is covered by the next one, so concurrent produce requests share
fsyncs.  Data becomes visible to consumers only once durable (high watermark = flushed offset).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import threading
import time
import uuid

import trio
import trio.testing

from trireme.state.features import (LEGACY_FEATURES_FILE, TRANSACTION_VERSION, FeatureLevels, feature_record,
                                    read_legacy_levels)
from trireme.state.leader_epochs import LeaderEpochCache
from trireme.state.log import AbortedTxn, PartitionLog, release_files
from trireme.state.producer_ids import (LEGACY_PRODUCER_IDS_FILE, ProducerIdError, ProducerIdManager,
                                        read_legacy_block_end, reservation_record)
from trireme.state.producer_state import ProducerStateError, ProducerStateManager
from trireme.state.storage import FileStorage, Storage, out_of_space
from trireme.state.topics import (INTERNAL_TOPICS, LEGACY_REGISTRY_FILE, OP_DELETE, BrokerMeta, Topic, TopicError,
                                  TopicRegistry, read_legacy_registry, removed_topic_record, topic_record)
from trireme.wire import error_codes as E
from trireme.wire import records
from trireme.wire.codec import message

from .clock import now_ms
from .cluster import LocalCluster, ViewCluster, choose_leader
from .cluster_metadata import (CLUSTER_METADATA_TOPIC, CLUSTER_METADATA_TOPIC_ID, ClusterMetadataService,
                               MetadataUnavailable)
from .config import TOPIC_DEFAULT_PROPERTIES, Config, ConfigError
from .data_dir import DataDirLock
from .groups import GroupService
from .limits import Limits, out_of_descriptors
from .log_cleaner import LogCleaner, set_when_cancelled
from .forwarding import AutoCreation
from .local_peer import LocalPeer
from .network_peer import NetworkPeer, inter_broker_security
from .peers import Peers, PeerUnavailable
from .metrics import Metrics
from .postgresql.engine import (DatabaseUnavailable, PartitionAppend, PartitionRow, PostgresEngine, append_committed,
                                load_partition, rows_of)
from .postgresql.membership import Membership, NodeIdInUse
from .quotas import ClientQuotaManager
from .security import Security
from .startup import StartupError, StartupInterrupted, os_reason
from .transactions import TransactionService
from .worker_thread import ThreadFanOut, WorkerThread

log = logging.getLogger("trireme.broker")

# Producer state is snapshotted at shutdown and after every this many bytes appended to a partition,
# so start-up replays only the batch headers after the snapshot (Kafka snapshots at segment rolls).
PRODUCER_SNAPSHOT = "producer-state.snapshot"
SNAPSHOT_INTERVAL_BYTES = 64 * 1024 * 1024

_ALLOCATE_PRODUCER_IDS = message("AllocateProducerIdsRequest").cls

# One request must not be able to make the broker open millions of files.
MAX_PARTITIONS_PER_TOPIC = 10000

# A partition offline for want of space retries its failed write after this long, doubling up to the most (no
# busy loop, whatever the disk does meanwhile), once the file system has at least STORAGE_RETRY_FREE_BYTES free: a
# flush with nothing left to write would succeed on a full disk and bring the partition back only to fail again.
STORAGE_RETRY_FIRST_S = 0.5
STORAGE_RETRY_MAX_S = 5.0
STORAGE_RETRY_FREE_BYTES = 1 << 20
# The pause between two cuts of a dropped segment's file (run_segment_release): at RELEASE_STEP_BYTES (4 MiB) a cut,
# 1 GiB of blocks goes in about 13 s rather than at once, and the broker's own fsyncs seldom meet a cut.
RELEASE_PAUSE_S = 0.05
# How long a flush round waits, at most, for the rest of a client's burst of requests (gather_burst).  trio's timers
# wake at millisecond steps, so this is about the least that can be asked; a burst that comes whole ends it sooner.
BURST_WAIT_S = 0.001
# How long an append that no answer waits for (a coordinator record answered once written to the OS, as
# AddPartitionsToTxn's) may wait for a flush round someone else needs before it gets one of its own.
UNAWAITED_FLUSH_S = 0.005
# Zeros are written ahead of appends (PartitionLog.preallocation) only while the file system has this much space free
PREALLOCATE_FREE_BYTES = 256 << 20
# A flush round of one partition whose fsync has data alone to write (over zeros written ahead), at most
# INLINE_FSYNC_MAX_BYTES, runs that fsync on the event loop if the loop goes idle within INLINE_IDLE_WAIT_S
# (Broker._fsync_round), instead of handing it to the flush thread and back (~0.1 ms of the round): only after
# INLINE_FSYNC_STREAK such fsyncs in a row took at most INLINE_FSYNC_MAX_S, the last of them less than
# INLINE_FSYNC_STREAK_S ago, so that a disk that turns slow stalls the event loop once, by that one fsync, before its
# fsyncs go back to the thread.
INLINE_FSYNC_MAX_BYTES = 256 << 10
INLINE_IDLE_WAIT_S = 0.0001
INLINE_FSYNC_MAX_S = 0.0005
INLINE_FSYNC_STREAK = 8
INLINE_FSYNC_STREAK_S = 1.0
# With the PostgreSQL engine, a commit round takes at most this many bytes of each partition (the rest goes in the
# next round): one transaction stays bounded whatever backlog an outage left.
ROUND_BYTES = 8 << 20


class BrokerFenced(Exception):
    """Another process registered this broker's node id (its lease had lapsed): this one must stop serving."""


def _check_partition_count(count: int) -> None:
    if count > MAX_PARTITIONS_PER_TOPIC:
        raise TopicError(E.INVALID_PARTITIONS.code,
                         f"at most {MAX_PARTITIONS_PER_TOPIC} partitions per topic on one node")


@dataclasses.dataclass(slots=True, frozen=True)
class PartitionConfig:
    """The topic configs the produce path consults, typed once per topic change instead of per request."""

    max_message_bytes: int
    log_append_time: bool
    compacted: bool

    @classmethod
    def of(cls, config: dict[str, str]) -> "PartitionConfig":
        return cls(int(config["max.message.bytes"]), config["message.timestamp.type"] == "LogAppendTime",
                   "compact" in config["cleanup.policy"])


@dataclasses.dataclass(slots=True, eq=False)
class Partition:
    """One partition of a topic: its log, its idempotent-producer state and its typed config."""

    topic: Topic
    index: int
    log: PartitionLog
    producers: ProducerStateManager
    config: PartitionConfig
    storage_error: str | None = None       # set when a write or an fsync failed: the partition is offline
    storage_retrying: bool = False         # ... for want of space or of the database: back online once a retry succeeds
    directory: str = ""
    snapshot_offset: int | None = None     # the producer state snapshot start-up began from (None: none)
    snapshot_size: int = 0                 # the log's size when the last snapshot was taken
    runtime: object = None                 # the coordinator runtime whose internal log this is: it appends here
    # With the PostgreSQL engine: the leader epoch this broker leads the partition's row with (its commits are
    # fenced by it), and whether the row may not exist yet (created while this broker runs).
    database_epoch: int | None = None
    database_new: bool = False
    following: bool = False                # a copy of a log another broker leads (``__cluster_metadata``)
    cleaned_ranges: list = dataclasses.field(default_factory=list)  # cleaned, not yet so in the database
    # With the PostgreSQL engine, the leader-epoch cache (None: the local engine's one epoch, from the log start).
    epochs: LeaderEpochCache | None = None

    @property
    def leader_epoch(self) -> int:
        """The partition's leader epoch: the topic registry's with the local engine, the database's (it rises each
        time a broker takes the partition) with the PostgreSQL engine."""
        return self.topic.leader_epoch if self.database_epoch is None else self.database_epoch

    def leader_epoch_error(self, current_leader_epoch: int) -> int:
        """Kafka's check of a request's CurrentLeaderEpoch (-1: not given) against ours."""
        if current_leader_epoch < 0 or current_leader_epoch == self.leader_epoch:
            return 0
        return (E.UNKNOWN_LEADER_EPOCH.code if current_leader_epoch > self.leader_epoch
                else E.FENCED_LEADER_EPOCH.code)

    def end_offset_for(self, requested_epoch: int) -> tuple[int, int]:
        """OffsetsForLeaderEpoch's (epoch, end offset) for ``requested_epoch``, from the leader-epoch cache."""
        return self._epoch_cache().end_offset_for(requested_epoch, self.log.log_end_offset)

    def epoch_at(self, offset: int) -> int:
        """The leader epoch the batch at ``offset`` was written in (-1: unknown), from the leader-epoch cache."""
        return self._epoch_cache().epoch_for_offset(offset)

    def _epoch_cache(self) -> LeaderEpochCache:
        start = self.log.log_start_offset
        if self.epochs is None:
            return LeaderEpochCache([(self.leader_epoch, start)])
        self.epochs.truncate_from_start(start)
        return self.epochs

    def last_stable_offset(self) -> int:
        """The high watermark, held back to the first offset of any open transaction."""
        hw = self.log.high_watermark
        first_unstable = self.producers.first_unstable_offset()
        return hw if first_unstable is None else min(hw, first_unstable)


def log_settings(config: dict[str, str]) -> dict[str, int]:
    """A topic's configs as its PartitionLog takes them.  Time and size retention apply only where cleanup.policy
    includes delete (Kafka's UnifiedLog.deleteOldSegments): a compact-only topic keeps every segment for the cleaner.
    A compacted topic's segments roll by max.compaction.lag.ms too, when it is shorter than segment.ms."""
    policies = {policy.strip() for policy in config["cleanup.policy"].split(",")}
    segment_ms = int(config["segment.ms"])
    if "compact" in policies:       # Kafka's LogConfig.maxSegmentMs: a segment is cleanable by max.compaction.lag.ms
        segment_ms = min(segment_ms, int(config["max.compaction.lag.ms"]))
    return {"segment_bytes": int(config["segment.bytes"]),
            "retention_ms": int(config["retention.ms"]) if "delete" in policies else -1,
            "retention_bytes": int(config["retention.bytes"]) if "delete" in policies else -1,
            "segment_ms": segment_ms, "segment_jitter_ms": int(config["segment.jitter.ms"])}


def _read_marker(plog: PartitionLog, header) -> tuple[bool, int]:
    """(commit?, coordinator epoch) of the marker batch ``header`` heads: its one control record, read from the log."""
    data = plog.read(header.base_offset, header.batch_length + records.LOG_OVERHEAD, header.base_offset + 1)
    kind, coordinator_epoch = records.parse_control_record(records.decode_records(data, 0)[0])
    return kind == records.CONTROL_COMMIT, coordinator_epoch


def _flush_partition(item) -> OSError | None:
    """One partition's part of a flush round (in a flush thread): its log made durable to the target, or why not."""
    p, target = item
    try:
        p.log.flush(target)
    except OSError as e:
        return e
    return None


async def _event_loop_idle() -> bool:
    """Whether the event loop goes idle within INLINE_IDLE_WAIT_S: no task ready to run, and the sockets polled with
    nothing new (trio's wait_all_tasks_blocked), so that blocking it for a moment delays nobody already waiting for
    it.  Meanwhile the other tasks run."""
    with trio.move_on_after(INLINE_IDLE_WAIT_S):
        await trio.testing.wait_all_tasks_blocked()
        return True
    return False


def _preallocate(item) -> None:
    """Zeros written ahead of an active segment's end after a round (PartitionLog.preallocation); a failure only means
    the next appends grow their file as without it (a failed fsync is reported by the next flush: it is sticky)."""
    handle, end = item
    try:
        handle.preallocate(end)
    except OSError:
        pass


class Broker:
    def __init__(self, config: Config, storage: Storage | None = None, *, listen: str | None = None,
                 stop_requested=None, endpoints: dict | None = None):
        """``storage``: where the data lives (default: files under ``config.data_dir``, locked for this broker
        (server/data_dir.py); trireme.testing passes the in-memory twin).  ``listen``: the HOST:PORT this broker
        serves, named in the lock (default: the configured one).  ``stop_requested()`` is polled while the logs
        load: once true, loading stops with StartupInterrupted.  What keeps the broker from starting (the data
        directory unusable or in use) is a StartupError naming it; what was opened by then is closed again."""
        self.data_dir_lock: DataDirLock | None = None
        self.endpoints = endpoints or {}      # listener name → its bound EndPoint (server/listener.py)
        self.membership: Membership | None = None
        self.partitions: dict[tuple[str, int], Partition] = {}
        self._to_release: list[tuple[list, list]] = []   # dropped segments' files to free (run_segment_release)
        self.files_to_release = 0               # log files among them whose blocks are not freed yet (a gauge)
        self._release_wakeup: trio.Event | None = None
        try:
            self._start(config, storage, listen or f"{config.listen_host}:{config.listen_port}",
                        stop_requested or (lambda: False))
        except DatabaseUnavailable as e:
            self._abandon_start()
            raise StartupError(f"cannot load the partitions from {config['trireme.storage']}: {e}") from None
        except OSError as e:
            self._abandon_start()
            raise StartupError(f"cannot load data directory {config.data_dir}: {os_reason(e)}"
                               + (f": {e.filename}" if e.filename else "")) from None
        except BaseException:
            self._abandon_start()
            raise

    def _abandon_start(self) -> None:
        """Start-up failed or was stopped: close what was opened (nothing was appended; recovery's own repairs are
        on disk already) and give the data directory up."""
        for p in self.partitions.values():
            try:
                p.log.close()
            except OSError:
                pass
        if self.data_dir_lock is not None:
            self.data_dir_lock.release()

    def _start(self, config: Config, storage: Storage | None, listen: str, stop_requested) -> None:
        self.config = config
        config.report_no_effect()
        self.limits = Limits(config)
        if storage is None:
            self.data_dir_lock = DataDirLock.acquire(config.data_dir, listen)
            log.info("loading data directory %s", os.path.abspath(config.data_dir))
            storage = FileStorage(config.data_dir, max_open_files=self.limits.max_open_files)
        self.storage = storage
        self.engine: PostgresEngine | None = None
        if str(config["trireme.storage"]).lower() == "postgresql":
            self.engine = self._start_engine(config)
        self.metrics = Metrics()
        self.security = Security(config)
        self.quotas = ClientQuotaManager(config, self.security.client_quotas, self.metrics)
        try:
            self.meta = BrokerMeta.load_or_create(self.storage, node_id=config["node.id"])
        except ValueError as e:             # unreadable, or another node's (BrokerMetaError)
            raise StartupError(f"data directory {config.data_dir}: {e}") from None
        self.node_id = self.meta.node_id
        self.cluster_id = self.meta.cluster_id
        if self.engine is not None:
            self.cluster_id = self.engine.start(self.meta.cluster_id)
        # With the PostgreSQL engine every answer waits for its commit (the flush round's transaction).
        self.fsync = bool(config["trireme.fsync.enable"]) or self.engine is not None
        # Kafka's flush policy, when either property is set: acknowledge after the write, fsync on the interval.
        self.ack_before_flush = self.fsync and self.engine is None and any(name in config.values for name in (
            "log.flush.interval.messages", "log.flush.interval.ms"))
        self.flush_interval_messages = config["log.flush.interval.messages"]
        self.flush_interval_ms = config["log.flush.interval.ms"]
        self._dirty: set[Partition] = set()
        self._dirty_event = trio.Event()
        self._awaited = trio.Event()            # set when something an answer waits for is due (_flush_due)
        self._deleted_in_database: list = []   # deleted partitions the next commit round removes (PostgreSQL engine)
        self._cluster_poke = trio.Event()       # set when the cluster should be polled at once (run_membership)
        self._leadership_lock = trio.Lock()     # _follow_leadership
        self._membership_running = trio.CancelScope()   # cancelled by controlled_shutdown
        self._membership_ended = trio.Event()
        self._bursts: set = set()               # connections in a burst a flush round waits for (gather_burst)
        self._short_fsyncs = 0                  # data-only fsyncs in a row that took at most INLINE_FSYNC_MAX_S
        self._short_fsyncs_at = 0.0             # when the last data-only fsync ended (time.monotonic)
        self._bursts_over: trio.Event | None = None
        self._hw_event = trio.Event()
        self._wake_callbacks: set = set()       # call_on_next_wake
        self._full_event = trio.Event()         # set when a partition goes offline for want of space
        self.advertised_host = config.advertised_host or config.listen_host
        self.advertised_port = config.advertised_port or config.listen_port
        if self.engine is not None:
            self._register(config)
        self._open_metadata(config)
        started = time.perf_counter()
        if self.engine is not None:
            self._open_led_partitions(stop_requested)
        else:
            for topic in self.topics.all():
                for index in range(topic.partitions):
                    if stop_requested():
                        raise StartupInterrupted(f"stopped while loading the logs ({len(self.partitions)} opened)")
                    self._open_partition(topic, index)
        log.info("loaded topics=%d partitions=%d in %.3fs", len(self.topics.all()), len(self.partitions),
                 time.perf_counter() - started)
        if self.membership is None:
            self.cluster = LocalCluster(self)
        self.topics.listeners.append(self._topic_changed)
        # Broker-to-broker requests (server/peers.py): this node's own handlers, other nodes over the wire.
        self.peers = Peers(self.node_id, LocalPeer(self), self._network_peer)
        self.local_peer = self.peers.local
        # Topics a Metadata request auto-creates through the controller, when this broker is not it.
        self.auto_creation = AutoCreation(self)
        self.groups = GroupService(config, self)
        self.transactions = TransactionService(config, self, self.allocate_producer_id, self.producer_ids_ready,
                                               self.peer, self.partition_leader,
                                               self.features.level(TRANSACTION_VERSION))
        # The coordinators' topics: not in the registry (clients neither create nor write them), but described
        # to clients as Kafka describes them, marked internal.
        self.internal_topics = {s.TOPIC.name: s.TOPIC for s in (self.groups, self.transactions)}
        # Each coordinator is active where its partition's leader is: here for good with the local engine, else
        # as the cluster names this broker (_follow_leadership).
        self.coordinators = {s.TOPIC.topic_id: s for s in (self.groups, self.transactions)}
        if self.engine is None:
            for service in self.coordinators.values():
                self._activate(service, self.open_internal_partition(service.TOPIC, 0,
                                                                     segment_bytes=service.segment_bytes))
        self._sweep_orphans()
        self.log_cleaner = LogCleaner(self)

    # --- partitions --------------------------------------------------------------------------

    def _start_engine(self, config: Config) -> PostgresEngine:
        dsn = config["trireme.storage.postgresql.dsn"]
        if not dsn:
            raise StartupError("trireme.storage=postgresql needs trireme.storage.postgresql.dsn")
        ignored = [name for name in ("trireme.fsync.enable", "log.flush.interval.messages", "log.flush.interval.ms")
                   if name in config.values]
        if ignored:
            log.warning("%s: no effect with trireme.storage=postgresql (answers wait for the database's commit)",
                        ", ".join(ignored))
        return PostgresEngine(dsn, config["node.id"])

    def _open_partition(self, topic: Topic, index: int, config: dict[str, str] | None = None, *,
                        new: bool = False) -> Partition:
        """Open (recovering) a partition's log, rebuild its producer state from the batch headers.  With the
        PostgreSQL engine the log is a cache, rebuilt from the database's rows unless the partition is ``new``."""
        partition = self._build_partition(topic, index, config, new=new)
        self.partitions[(topic.name, index)] = partition
        return partition

    def _build_partition(self, topic: Topic, index: int, config: dict[str, str] | None = None, *,
                         new: bool = False, row: PartitionRow | None = None, follow: bool = False) -> Partition:
        """_open_partition's work, without making the partition one of the broker's: safe in a worker thread.
        ``row``: the database's row of a partition this broker was named to lead (PostgresEngine.open)."""
        cfg = config or self.topic_config(topic)
        directory = f"logs/{topic.name}-{index}"
        if self.engine is not None and self.storage.exists(directory):
            PartitionLog.remove_files(self.storage, directory)
        plog = PartitionLog.open(
            self.storage, directory,
            **log_settings(cfg), now_ms=now_ms(), unsafe_no_fsync=not self.fsync or self.engine is not None,
            ack_before_flush=self.ack_before_flush, write_behind=True)
        plog.on_retired = lambda: self.release_later(*plog.take_retired())
        database_epoch = None
        if self.engine is not None:
            plog.on_log_start_moved = lambda: self._log_start_moved(topic.name, index)
            plog.on_cleaned = lambda ranges: self._log_cleaned(topic.name, index, ranges)
            if follow:                      # a copy: the rows as they are (none yet: empty), the partition not taken
                if row is not None:
                    load_partition(self.engine, (topic.topic_id, index), plog, now_ms(), row)
            else:
                database_epoch = 0 if new else load_partition(self.engine, (topic.topic_id, index), plog, now_ms(),
                                                              row)
        producers, start = self._load_producer_snapshot(plog, directory)
        epochs = None if database_epoch is None else LeaderEpochCache()
        for header in plog.iter_batch_headers(start):
            if epochs is not None and header.partition_leader_epoch >= 0:
                epochs.assign(header.partition_leader_epoch, header.base_offset)
            if not header.is_control:
                producers.load_batch(header)
                continue
            # A marker: its record says commit or abort, and an abort goes into the aborted-transaction
            # index (entries that survived on disk are kept; add_aborted_txn skips them).
            commit, coordinator_epoch = _read_marker(plog, header)
            first_offset = producers.load_batch(header, coordinator_epoch)
            if not commit and first_offset is not None:
                unstable = producers.first_unstable_offset()
                plog.add_aborted_txn(AbortedTxn(header.producer_id, first_offset, header.base_offset,
                                                header.base_offset + 1 if unstable is None else unstable))
        if epochs is not None:
            epochs.assign(database_epoch, plog.log_end_offset)        # taken at this epoch: it starts at the log end
        partition = Partition(topic, index, plog, producers, PartitionConfig.of(cfg), directory=directory,
                              snapshot_offset=start, snapshot_size=plog.size_bytes, database_epoch=database_epoch,
                              following=follow,
                              database_new=new and self.engine is not None, epochs=epochs)
        return partition

    # --- the cluster (PostgreSQL engine) ---------------------------------------------------------

    def _register(self, config: Config) -> None:
        """Start-up with the PostgreSQL engine, before the metadata log opens: register this broker (a live duplicate
        node.id is refused) and take the controller's role if nobody holds it; the controller leads
        ``__cluster_metadata``, the others follow it."""
        self.membership = Membership(config["trireme.storage.postgresql.dsn"], self.node_id, self.meta.directory_id,
                                     session_ms=config["broker.session.timeout.ms"])
        try:
            self.membership.register(self._advertised_endpoints(), config["broker.rack"] or None)
        except NodeIdInUse as e:
            raise StartupError(str(e)) from None
        self.cluster = ViewCluster(self._poll_electing())

    def _poll_electing(self):
        """(blocking) Poll the cluster; when there is no live controller, become it (and poll again) → the view."""
        view = self.membership.poll()
        if view.controller_id not in view.brokers and self.membership.elect() is not None:
            view = self.membership.poll()
        return view

    def _open_led_partitions(self, stop_requested) -> None:
        """Start-up with the PostgreSQL engine, once the metadata log names the topics: have leaders assigned (as the
        controller) and open the partitions this broker leads."""
        view = self._refresh_view()
        self.cluster = ViewCluster(view)
        for (topic_id, index), (leader, _epoch) in sorted(view.leaders.items(), key=lambda kv: str(kv[0])):
            topic = self.topics.by_id(topic_id)
            if leader != self.node_id or topic is None or index >= topic.partitions:
                continue
            if stop_requested():
                raise StartupInterrupted(f"stopped while loading the logs ({len(self.partitions)} opened)")
            row = self.engine.open((topic_id, index))
            if row is not None:
                self.partitions[(topic.name, index)] = self._build_partition(topic, index, row=row)

    def _advertised_endpoints(self) -> dict[str, tuple[str, int]]:
        if self.endpoints:
            return {name: (e.advertised_host, e.advertised_port) for name, e in self.endpoints.items()}
        return {"PLAINTEXT": (self.advertised_host, self.advertised_port)}

    def _managed_partitions(self, view) -> dict:
        """What the controller assigns: every partition of every topic, with its reassignment's replicas, and the
        coordinators' partitions (their coordinators follow them); ``__cluster_metadata``'s stays with the
        controller (pinned to this node)."""
        managed = {(t.topic_id, i): view.preferred.get((t.topic_id, i), ()) for t in self.topics.all()
                   for i in range(t.partitions)}
        managed.update({(service.TOPIC.topic_id, 0): view.preferred.get((service.TOPIC.topic_id, 0), ())
                        for service in (GroupService, TransactionService)})
        managed[(CLUSTER_METADATA_TOPIC_ID, 0)] = (self.node_id,)
        return managed

    def _refresh_view(self):
        """(blocking) Poll the cluster; when there is no live controller, become it; as the controller, assign the
        partitions' leaders (and poll again when that changed something) → the view."""
        view = self._poll_electing()
        if view.controller_id == self.node_id and self.membership.assign(view, self._managed_partitions(view)):
            view = self.membership.poll()
        return view

    async def run_membership(self) -> None:
        """Renew this broker's lease every broker.heartbeat.interval.ms and follow the cluster every
        trireme.cluster.metadata.poll.ms: open the partitions this broker was named to lead, close those it no
        longer leads.  A lease another process took over (this broker was stopped longer than its session) stops
        the broker.  The database unreachable: one log line, and it goes on trying."""
        heartbeat_s = self.config["broker.heartbeat.interval.ms"] / 1000
        poll_s = self.config["trireme.cluster.metadata.poll.ms"] / 1000
        worker = WorkerThread("trireme-cluster")
        token = trio.lowlevel.current_trio_token()

        def announced():
            try:
                token.run_sync_soon(lambda: self._cluster_poke.set())
            except trio.RunFinishedError:
                pass
        self.membership.listen(announced)
        try:
            next_heartbeat = 0.0
            unavailable = False
            while True:
                try:
                    if trio.current_time() >= next_heartbeat:
                        next_heartbeat = trio.current_time() + heartbeat_s
                        if not await worker.run(self.membership.heartbeat):
                            log.error("node.id %d was registered by another broker while this one could not renew "
                                      "its lease: stopping", self.node_id)
                            raise BrokerFenced(self.node_id)
                    view = await worker.run(self._refresh_view)
                    if unavailable:
                        log.warning("the cluster's database answers again")
                        unavailable = False
                    self.cluster = ViewCluster(view)
                    await self._follow_metadata(view)     # reads rows too: on a connection a restart may have broken
                except DatabaseUnavailable as e:
                    if not unavailable:
                        log.error("cannot reach the cluster's database: %s; retrying", e)
                        unavailable = True
                    await self._sleep_or_poke(poll_s)
                    continue
                await self._follow_leadership(view)
                await self._sleep_or_poke(poll_s)
        finally:
            worker.close()

    def poll_cluster_soon(self) -> None:
        """Poll the cluster now rather than at the next interval (something here suggests it changed)."""
        self._cluster_poke.set()

    async def _sleep_or_poke(self, seconds: float) -> None:
        """Until the next poll, or sooner: the controller announced new leaders (Membership.listen), or something
        here learned the cluster changed (a fenced commit)."""
        with trio.move_on_after(seconds):
            await self._cluster_poke.wait()
        self._cluster_poke = trio.Event()

    async def _follow_leadership(self, view) -> None:
        """Open the partitions ``view`` names this broker to lead that are not open here, close those it names
        another broker (or nobody live) to lead.  Opening rebuilds the partition from the database in a worker
        thread; only then does it serve.  One at a time (a partition must be taken once, at one leader epoch)."""
        async with self._leadership_lock:
            await self._follow_leadership_now(view)

    async def _follow_leadership_now(self, view) -> None:
        for key, p in [((p.topic.topic_id, p.index), p) for p in self.partitions.values()
                       if p.database_epoch is not None and p.topic.name != CLUSTER_METADATA_TOPIC]:
            found = view.leaders.get(key)
            if found is None and p.database_new:
                continue                        # created here after the poll began: its row comes with a commit
            if found is None or found[0] != self.node_id:
                self._close_partition(p, "its row is gone" if found is None else f"now led by node {found[0]}")
        for (topic_id, index), (leader, _epoch) in list(view.leaders.items()):
            coordinator = self.coordinators.get(topic_id)
            topic = self.topics.by_id(topic_id) if coordinator is None else coordinator.TOPIC
            if leader != self.node_id or topic is None or index >= topic.partitions \
                    or (topic.name, index) in self.partitions:
                continue
            config = None
            if coordinator is not None:
                coordinator.loading()
                config = self._internal_config(topic, coordinator.segment_bytes)
            try:
                row = await trio.to_thread.run_sync(self.engine.open, (topic_id, index))
                if row is None:
                    continue
                p = await trio.to_thread.run_sync(functools.partial(self._build_partition, topic, index, config,
                                                                    row=row))
            except (DatabaseUnavailable, OSError) as e:
                log.error("could not open partition %s-%d (tried again at the next poll): %r", topic.name, index, e)
                continue
            finally:
                if coordinator is not None and not coordinator.active:
                    coordinator.coordinator.unavailable = E.NOT_COORDINATOR.code     # (until the next try)
            current = topic if coordinator is not None else self.topics.by_id(topic_id)
            if current is not topic or (topic.name, index) in self.partitions:
                p.log.close()               # the topic changed meanwhile
                continue
            self.partitions[(topic.name, index)] = p
            log.info("leading partition %s-%d at leader epoch %d (log %d..%d)", topic.name, index, row.leader_epoch,
                     row.log_start_offset, row.log_end_offset)
            if coordinator is not None:
                self._activate(coordinator, p)
            self._wake_waiters()

    def _activate(self, coordinator, partition: Partition) -> None:
        """This broker leads a coordinator's partition: the coordinator serves here (the transaction coordinator
        aborts what the data partitions led here hold open that it never recorded)."""
        if coordinator is self.transactions:
            coordinator.activate(partition, [((p.topic.name, p.index), pid, epoch)
                                             for p in self.partitions.values()
                                             for pid, epoch, _ in p.producers.open_transactions()])
        else:
            coordinator.activate(partition)

    def _close_partition(self, p: Partition, why: str) -> None:
        """This broker no longer leads ``p``: it stops serving it (requests for it are answered
        NOT_LEADER_OR_FOLLOWER; what waited for its commit is answered as for a partition gone) and drops its
        cache."""
        if self.partitions.get((p.topic.name, p.index)) is not p:
            return
        del self.partitions[(p.topic.name, p.index)]
        self._dirty.discard(p)
        log.info("no longer leading partition %s-%d: %s", p.topic.name, p.index, why)
        if p.runtime is not None and p.runtime in self.coordinators.values():
            p.runtime.deactivate(why)        # the coordinator moves with its partition
        try:
            p.log.delete()
        except OSError as e:
            log.warning("could not remove the cache of %s-%d: %r", p.topic.name, p.index, e)
        self._wake_waiters()

    # --- producer state snapshots --------------------------------------------------------------

    def _load_producer_snapshot(self, plog: PartitionLog, directory: str) -> tuple[ProducerStateManager, int | None]:
        """Producer state from the partition's snapshot (→ the offset to replay the log from), or empty (→ None:
        replay it all) when there is none, it is unreadable, or the log no longer reaches its offset."""
        producers = ProducerStateManager()
        path = f"{directory}/{PRODUCER_SNAPSHOT}"
        try:
            if not self.storage.exists(path):
                return producers, None
            offset = producers.load_snapshot(self.storage.read_all(path))
        except (OSError, ProducerStateError) as e:
            log.warning("ignoring producer state snapshot %s: %r", path, e)
            return ProducerStateManager(), None
        if offset > plog.log_end_offset:
            log.info("ignoring producer state snapshot %s at %d: the log ends at %d", path, offset,
                     plog.log_end_offset)
            return ProducerStateManager(), None
        return producers, offset

    def _snapshot_bytes(self, p: Partition) -> tuple[str, bytes] | None:
        """A snapshot of ``p``'s producer state, if everything it covers is durable (log end = high watermark),
        so that a crash never leaves a snapshot ahead of the log or of its aborted-transaction index."""
        if p.storage_error or p.log.log_end_offset != p.log.durable_offset or self.engine is not None:
            return None
        p.snapshot_size = p.log.size_bytes
        return f"{p.directory}/{PRODUCER_SNAPSHOT}", p.producers.snapshot()

    def open_internal_partition(self, topic: Topic, index: int, *, segment_bytes: int) -> Partition:
        """A partition of an internal topic (not in the registry, never subject to retention)."""
        config = self._internal_config(topic, segment_bytes)
        if self.membership is not None and topic.topic_id == CLUSTER_METADATA_TOPIC_ID:
            return self._open_metadata_partition(topic, config)
        return self._open_partition(topic, index, config)

    def _internal_config(self, topic: Topic, segment_bytes: int) -> dict[str, str]:
        return {**self.topic_config(topic), "segment.bytes": str(segment_bytes), "retention.ms": "-1",
                "retention.bytes": "-1", "cleanup.policy": "compact"}

    async def _follow_metadata(self, view) -> None:
        """In a cluster, after each poll: keep this broker's copy of ``__cluster_metadata`` up with what the
        controller committed, and replay it (topics, ACLs, quotas... appear here as the controller writes them); lead
        it once named the controller, with a new leader epoch; follow again once another broker leads it (the copy
        rebuilt from the rows: what this broker appended but never committed is dropped)."""
        p = self.cluster_metadata.partition
        key = (CLUSTER_METADATA_TOPIC_ID, 0)
        leader = view.leaders.get(key, (None, None))[0]
        if not p.following:
            if leader != self.node_id:
                await self._rebuild_metadata_copy(p, f"node {leader} leads it now")
            return
        row = await trio.to_thread.run_sync(self.engine.row, key)
        if row is None:
            return
        if row.log_start_offset > p.log.log_end_offset:
            await self._rebuild_metadata_copy(p, "the controller compacted past this copy")
            return
        self._append_metadata_rows(p, await trio.to_thread.run_sync(
            lambda: list(self.engine.batches(key, p.log.log_end_offset, row.log_end_offset))))
        if leader == self.node_id:
            row = await trio.to_thread.run_sync(self.engine.open, key)
            if row is None:
                return
            self._append_metadata_rows(p, await trio.to_thread.run_sync(
                lambda: list(self.engine.batches(key, p.log.log_end_offset, row.log_end_offset))))
            p.following, p.database_epoch, p.database_new = False, row.leader_epoch, False
            log.info("leading %s at leader epoch %d (this broker is the controller)", CLUSTER_METADATA_TOPIC,
                     row.leader_epoch)

    def _append_metadata_rows(self, p: Partition, rows: list) -> None:
        """Append the controller's committed rows to this broker's copy and replay them."""
        if not rows:
            return
        replayed = p.log.high_watermark
        append_committed(p.log, rows, now_ms())
        self.cluster_metadata.follow(p, replayed)

    async def _rebuild_metadata_copy(self, old: Partition, why: str) -> None:
        """Replace this broker's copy of ``__cluster_metadata`` by one rebuilt from the rows, and go on replaying from
        where the state is (records of the old copy never committed are forgotten, not replayed)."""
        log.warning("following %s again: %s", CLUSTER_METADATA_TOPIC, why)
        key = (CLUSTER_METADATA_TOPIC_ID, 0)
        replayed = old.log.durable_offset
        row = await trio.to_thread.run_sync(self.engine.row, key)
        new = await trio.to_thread.run_sync(functools.partial(
            self._build_partition, old.topic, 0, self._metadata_config, row=row, follow=True))
        self.cluster_metadata.drop_unreplayed()
        self.partitions[(old.topic.name, 0)] = new
        self._dirty.discard(old)
        old.log.close()
        self.cluster_metadata.follow(new, replayed)
        self._wake_waiters()

    def _open_metadata_partition(self, topic: Topic, config: dict[str, str]) -> Partition:
        """``__cluster_metadata`` in a cluster: the controller leads it (a new leader epoch fences the controller
        before it), every other broker keeps a copy it follows (:meth:`_follow_metadata`)."""
        key = (topic.topic_id, 0)
        view = self.cluster.view
        self._metadata_config = config
        row = None
        if view.controller_id == self.node_id:
            self.membership.assign(view, {key: (self.node_id,)})
            row = self.engine.open(key)
        if row is not None:
            p = self._build_partition(topic, 0, config, row=row)
        else:
            p = self._build_partition(topic, 0, config, row=self.engine.row(key), follow=True)
        self.partitions[(topic.name, 0)] = p
        return p

    def _remove_partition_files(self, topic: str, index: int) -> None:
        """Remove whatever a deleted topic of this name left in the partition's directory."""
        directory = f"logs/{topic}-{index}"
        if self.storage.exists(directory):
            PartitionLog.remove_files(self.storage, directory)

    def _sweep_orphans(self) -> None:
        """Directories under logs/ that no topic owns are left over from a deletion cut short."""
        if not self.storage.exists("logs"):
            return
        for name in self.storage.list("logs"):
            topic, _, index = name.rpartition("-")
            if index.isdigit() and (topic, int(index)) not in self.partitions:
                log.info("removing files of deleted partition %s", name)
                try:
                    self._remove_partition_files(topic, int(index))
                except OSError as e:
                    log.warning("could not remove %s: %r", name, e)

    def partition(self, topic: str, index: int) -> Partition | None:
        """A partition clients may name (``__cluster_metadata`` is hidden from them, as in Kafka)."""
        return None if topic == CLUSTER_METADATA_TOPIC else self.partitions.get((topic, index))

    def described_topics(self) -> list[Topic]:
        """Every topic a client may see described: the registry's, then the internal ones."""
        return [*self.topics.all(), *self.internal_topics.values()]

    def described_topic(self, name: str | None = None, topic_id=None) -> Topic | None:
        """A topic by name (or by id when ``name`` is None), internal topics included."""
        if name is None:
            return self.topics.by_id(topic_id) or next(
                (t for t in self.internal_topics.values() if t.topic_id == topic_id), None)
        return self.topics.get(name) or self.internal_topics.get(name)

    def topic_config(self, topic: Topic) -> dict[str, str]:
        return topic.effective_config(self.broker_topic_defaults())

    def broker_topic_defaults(self) -> dict[str, str]:
        """Topic defaults the operator set through broker properties (unset ones stay Kafka's)."""
        return {topic_key: str(self.config[broker_key]) for topic_key, broker_key in TOPIC_DEFAULT_PROPERTIES.items()
                if self.config.is_set(broker_key)}

    def _check_broker_partitions(self, more: int) -> None:
        """trireme.max.partitions: the partitions of all topics, with ``more`` new ones, must stay within it."""
        limit = self.limits.max_partitions
        have = sum(t.partitions for t in self.topics.all())
        if have + more > limit:
            raise TopicError(E.POLICY_VIOLATION.code,
                             f"{more} more partition(s) would make {have + more}, over this broker's limit of "
                             f"{limit} (trireme.max.partitions)")

    # --- cluster metadata: topics, producer ids, features ---------------------------------------

    def _open_metadata(self, config: Config) -> None:
        """Open and replay ``__cluster_metadata`` (before the data partitions: it names them).  Its sections: topics,
        producer id blocks and feature levels here, ACLs, SCRAM credentials and quotas (server/security.py).  Then
        :meth:`_bootstrap_metadata`."""
        self.topics = TopicRegistry()
        self.producer_ids = ProducerIdManager(broker_id=self.meta.node_id)
        self.features = FeatureLevels()
        self._pending_partitions: dict[tuple[str, int], Partition] = {}   # opened for a topic record not yet durable
        self._reserving_ahead = False
        for section in (self.topics, self.producer_ids, self.features):
            self.security.metadata.register(section)
        self.cluster_metadata = ClusterMetadataService(self, self.open_internal_partition, self.security.metadata)
        self.security.attach(self.cluster_metadata)
        try:
            self._bootstrap_metadata(config)
        except ValueError as e:             # a file of an earlier version unreadable
            raise StartupError(f"data directory {config.data_dir}: {e}") from None
        self.producer_ids.loaded()

    def _bootstrap_metadata(self, config: Config) -> None:
        """The records a start writes before the broker serves, in one durable batch: on a new data directory the
        first SCRAM users (when ``__cluster_metadata`` was never written) and the configured feature levels (when
        none were ever finalized); on a data directory an earlier version wrote, its topics.json, producer_ids and
        features.json as records.  Those files are removed only once the records are durable: a start cut short in
        between finds both, and writes only what the log lacks (nothing twice, nothing older over newer).  In a
        cluster only the controller writes them; the others follow."""
        if self.cluster_metadata.partition.following:
            return
        records = []
        if self.cluster_metadata.partition.log.log_end_offset == 0:
            records += self.security.initial_records()
        legacy_topics = read_legacy_registry(self.storage)
        if legacy_topics is not None:
            topics, retired = legacy_topics
            records += [topic_record(t) for t in topics
                        if self.topics.by_id(t.topic_id) is None and t.name not in self.topics]
            known = self.topics.retired_epochs()
            records += [removed_topic_record(name, uuid.UUID(int=0), epoch) for name, epoch in retired.items()
                        if name not in known and name not in self.topics and all(t.name != name for t in topics)]
        block_end = read_legacy_block_end(self.storage)
        if block_end is not None and block_end > self.producer_ids.block_end:
            records.append(reservation_record(block_end, self.meta.node_id))
        legacy_levels = read_legacy_levels(self.storage)
        if self.features.epoch == 0:
            if legacy_levels is not None:
                levels, epoch = legacy_levels
                records += [feature_record(name, level, max(epoch, 1)) for name, level in levels.items()]
            else:
                records += self.features.initial_records({TRANSACTION_VERSION: config["transaction.version"]})
        self.cluster_metadata.bootstrap(records)
        for path in (LEGACY_REGISTRY_FILE, LEGACY_PRODUCER_IDS_FILE, LEGACY_FEATURES_FILE):
            if self.storage.exists(path):
                self.storage.remove(path)
                log.info("upgraded %s into records of %s, and removed it", path, CLUSTER_METADATA_TOPIC)

    def allocate_producer_id(self) -> int:
        """A producer id from the blocks reserved durably (ProducerIdError when none is left: await
        :meth:`producer_ids_ready`).  Once half the current block is handed out, the next one is reserved ahead, in
        the background, so that InitProducerId seldom waits for a reservation."""
        producer_id = self.producer_ids.next_id()
        ids = self.producer_ids
        if ids.available() < ids.block_size // 2 and not self._reserving_ahead:
            self._reserving_ahead = self.cluster_metadata.start_soon(self._reserve_producer_ids_ahead)
        return producer_id

    async def _reserve_producer_ids_ahead(self) -> None:
        ids = self.producer_ids
        try:
            await self._reserve_producer_ids(lambda: ids.available() < ids.block_size // 2)
        except (MetadataUnavailable, ProducerIdError) as e:
            log.warning("could not reserve the next block of producer ids ahead: %s", e)
        finally:
            self._reserving_ahead = False

    async def producer_ids_ready(self) -> None:
        """Until a producer id is reserved durably (at once, unless every reserved one was handed out): a block
        reserved, made durable and replayed.  Raises MetadataUnavailable (or ProducerIdError: the ids exhausted)."""
        await self._reserve_producer_ids(lambda: self.producer_ids.available() == 0)

    async def _reserve_producer_ids(self, wanted) -> None:
        """Reserve the next block of producer ids for this broker if ``wanted()``: a record of ``__cluster_metadata``
        written here, or, in a cluster, asked of the controller (AllocateProducerIds), which writes it, unless this
        broker is the controller.  Raises MetadataUnavailable when neither can be done now."""
        ids = self.producer_ids
        if not self.cluster_metadata.partition.following:
            await self.cluster_metadata.update(lambda: (ids.reserve() if wanted() else [], None))
            return
        if not wanted():
            return
        controller = self.cluster.controller_id
        try:
            answer = await self.peer(controller).call("AllocateProducerIds", 0,
                                                      _ALLOCATE_PRODUCER_IDS(broker_id=self.node_id, broker_epoch=-1))
        except PeerUnavailable as e:
            raise MetadataUnavailable(f"the controller (node {controller}) cannot be reached: {e}") from None
        if answer.error_code:
            raise MetadataUnavailable(f"the controller (node {controller}) answered "
                                      f"{E.for_code(answer.error_code).name}")
        ids.granted(answer.producer_id_start, answer.producer_id_start + answer.producer_id_len)

    def _open_new_partitions(self, topic: Topic, indexes: range) -> None:
        """Create and open the partitions ``indexes`` of ``topic`` before its record is written: they are kept
        apart (not served) until the record is durable and replayed (:meth:`_topic_changed`).  If one fails (out of
        descriptors, disk full), the ones opened are closed and removed again, and the caller writes nothing.  A
        crash in between leaves directories no topic owns, which start-up sweeps."""
        opened = []
        if self.membership is not None:     # in a cluster: only those the controller will name this broker to lead
            live = [b.node_id for b in self.cluster.brokers()]
            indexes = [i for i in indexes if choose_leader((topic.topic_id, i), (), live) == self.node_id]
        try:
            for index in indexes:
                self._remove_partition_files(topic.name, index)
                opened.append(self._build_partition(topic, index, new=True))
        except OSError as e:
            for p in opened:
                self.partitions.pop((topic.name, p.index), None)
                try:
                    p.log.delete()
                except OSError:
                    pass            # start-up sweeps it
            log.error("could not create partitions of %s: %r", topic.name, e)
            raise TopicError(E.KAFKA_STORAGE_ERROR.code,
                             f"could not create the partition files: {e.strerror or e}") from None
        for p in opened:
            self._pending_partitions[(topic.name, p.index)] = p

    def _discard_pending(self, name: str) -> None:
        """The record the pending partitions of topic ``name`` were opened for was not made durable: remove them (if
        it becomes durable later, :meth:`_topic_changed` opens them again)."""
        for key in [key for key in self._pending_partitions if key[0] == name]:
            try:
                self._pending_partitions.pop(key).log.delete()
            except OSError:
                pass                # start-up sweeps it

    async def _change_topics(self, decide, name: str):
        """``decide()`` → (records, answer) through ``__cluster_metadata`` (durable and replayed before it returns);
        the log unwritable → TopicError KAFKA_STORAGE_ERROR, which clients retry."""
        try:
            answer = await self.cluster_metadata.update(decide)
        except MetadataUnavailable as e:
            self._discard_pending(name)
            raise TopicError(E.KAFKA_STORAGE_ERROR.code, f"could not write the topic metadata: {e}") from None
        except BaseException:
            self._discard_pending(name)
            raise
        if self.membership is not None:
            await self._assign_now()
        return answer

    async def _assign_now(self) -> None:
        """In a cluster, after a topic change became durable on the controller: assign the new partitions' leaders
        (and let the others know) before the change is answered, so that the answer, and Metadata after it, name
        them, as Kafka's do.  The database unreachable: the next poll does it."""
        try:
            view = await trio.to_thread.run_sync(self._refresh_view)
        except DatabaseUnavailable:
            return
        self.cluster = ViewCluster(view)
        await self._follow_leadership(view)

    def _topic_changed(self, old: Topic | None, new: Topic | None) -> None:
        """A topic record was replayed (durable): the partitions follow.  A new topic's (or new partitions') opened
        partitions are served from now on; a deleted topic's partitions go, files and committed offsets with them."""
        if new is None:
            self._remove_topic_partitions(old)
            return
        for index in range(0 if old is None else old.partitions, new.partitions):
            pending = self._pending_partitions.pop((new.name, index), None)
            if pending is not None:
                self.partitions[(new.name, index)] = pending
                continue
            if self.membership is not None:
                continue            # the controller names the partition's leader, which opens it
            try:                    # written while a full disk held it up: the request that asked opened none
                self._remove_partition_files(new.name, index)
                self._open_partition(new, index)
            except OSError as e:
                log.error("could not open partition %s-%d: %r", new.name, index, e)
        cfg = self.topic_config(new)
        for index in range(new.partitions):
            p = self.partitions.get((new.name, index))
            if p is None:
                continue
            p.topic = new           # partitions and leader epoch come from the topic
            if old is not None and old.configs != new.configs:
                p.config = PartitionConfig.of(cfg)
                p.log.configure(**log_settings(cfg))

    def _remove_topic_partitions(self, topic: Topic) -> None:
        if self.membership is not None and self.cluster.controller_id == self.node_id:
            # the controller removes the partitions' rows and batches (their leaders close them as they replay this)
            self._deleted_in_database.extend((topic.topic_id, index) for index in range(topic.partitions))
            self._flush_due(())
        for index in range(topic.partitions):
            partition = self.partitions.pop((topic.name, index), None)
            if partition is not None:
                self._dirty.discard(partition)
                try:
                    partition.log.delete()
                except OSError as e:
                    # The registry no longer has the topic: start-up sweeps the files, and a
                    # re-created topic of that name clears them first.
                    log.warning("could not remove files of %s-%d yet: %r", topic.name, index, e)
        self.groups.forget_topic(topic.name)
        self._wake_waiters()                # produce waits on its partitions end now (KAFKA_STORAGE_ERROR)

    def _decide_create(self, name: str, partitions: int, configs: dict[str, str] | None,
                       validate_only: bool, replication_factor: int = -1) -> tuple[list, Topic]:
        if name == CLUSTER_METADATA_TOPIC:           # Kafka's ControllerApis: hidden, so not "already exists"
            raise TopicError(E.INVALID_REQUEST.code, f"Creation of internal topic {name} is prohibited.")
        if name in INTERNAL_TOPICS:
            raise TopicError(E.TOPIC_ALREADY_EXISTS.code, f"{name} is an internal topic of this broker")
        if partitions == -1:
            partitions = self.config["num.partitions"]
        _check_partition_count(partitions)
        records, topic = self.topics.create(name, partitions, configs or {}, replication_factor=replication_factor,
                                            live_brokers=len(self.cluster.brokers()))
        self._check_broker_partitions(topic.partitions)
        if validate_only:
            return [], topic
        self._open_new_partitions(topic, range(topic.partitions))
        return records, topic

    async def create_topic(self, name: str, partitions: int, configs: dict[str, str] | None = None,
                           validate_only: bool = False, replication_factor: int = -1) -> Topic:
        """Create a topic atomically: its partitions are opened first, its record names it last; → once durable."""
        topic = await self._change_topics(
            lambda: self._decide_create(name, partitions, configs, validate_only, replication_factor), name)
        if not validate_only:
            log.info("created topic name=%s partitions=%d id=%s", name, topic.partitions, topic.topic_id)
        return topic

    def ensure_topic(self, name: str, partitions: int, configs: dict[str, str] | None = None) -> None:
        """Create a topic asked for at start-up (``trireme serve --topic``), before the broker serves, unless it
        exists from an earlier run: its record written and fsynced at once."""
        if name not in self.topics:
            records, topic = self._decide_create(name, partitions, configs, False)
            try:
                self.cluster_metadata.bootstrap(records)
            finally:
                self._discard_pending(name)     # none left once the record was replayed
            log.info("created topic name=%s partitions=%d id=%s", name, topic.partitions, topic.topic_id)

    async def auto_create(self, name: str) -> Topic | None:
        """Create a topic a client asked for by name, if auto.create.topics.enable allows it; None if refused.  A
        storage failure (disk full) raises its TopicError (KAFKA_STORAGE_ERROR): the client should ask again."""
        if not self.config["auto.create.topics.enable"]:
            return None
        try:
            return await self.create_topic(name, -1, replication_factor=self.config["default.replication.factor"])
        except TopicError as refused:
            if refused.code == E.TOPIC_ALREADY_EXISTS.code and self.topics.get(name) is not None:
                return self.topics.get(name)    # created by another request meanwhile
            log.warning("not auto-creating topic %s: %s", name, refused.message)
            if refused.code == E.KAFKA_STORAGE_ERROR.code:
                raise
            return None

    async def delete_topic(self, name: str) -> None:
        """Delete a topic: its record removed (durably), then its partitions' files and committed offsets."""
        def decide():
            if self.topics.get(name) is None:
                raise TopicError(E.UNKNOWN_TOPIC_OR_PARTITION.code, f"topic {name} does not exist")
            return self.topics.delete(name)
        await self._change_topics(decide, name)
        log.info("deleted topic name=%s", name)

    async def add_partitions(self, name: str, total: int, validate_only: bool = False) -> None:
        """Grow a topic, atomically as create_topic: the new partitions are opened before the record grows it."""
        _check_partition_count(total)

        def decide():
            records, topic = self.topics.add_partitions(name, total)
            before = self.topics.get(name).partitions
            self._check_broker_partitions(total - before)
            if validate_only:
                return [], None
            self._open_new_partitions(topic, range(before, total))
            return records, None
        await self._change_topics(decide, name)

    async def alter_topic_configs(self, name: str, ops, validate_only: bool = False, whole_set: bool = False) -> None:
        """IncrementalAlterConfigs ``(key, op, value)`` operations on a topic's configs; ``whole_set`` (AlterConfigs):
        the configs not named are deleted."""
        def decide():
            topic_ops = ops
            topic = self.topics.get(name)
            if whole_set and topic is not None:
                named = {key for key, _, _ in ops}
                topic_ops = ops + [(key, OP_DELETE, None) for key in sorted(topic.configs) if key not in named]
            records, _ = self.topics.alter_configs(name, topic_ops)
            return ([] if validate_only else records), None
        await self._change_topics(decide, name)

    # --- durability ----------------------------------------------------------------------------

    def appended(self, partition: Partition, *, awaited: bool = True) -> None:
        """Note that ``partition`` has unflushed data; the flusher will cover it.  ``awaited=False``: no answer
        waits for its flush (written to the OS already), so the round that covers it may be one that something else
        needs, within UNAWAITED_FLUSH_S: a transaction's first Produce then needs no round of its own after the
        AddPartitionsToTxn record's."""
        if not self.fsync:
            partition.log.flush_done(partition.log.flush_begin())
            self._wake_waiters()
            return
        if self.ack_before_flush:
            self._wake_waiters()            # the high watermark is the log end: visible and acknowledged now
            log_ = partition.log
            if log_.log_end_offset - log_.durable_offset < self.flush_interval_messages \
                    and not log_.sealed_segments_unflushed:
                return                      # the interval flusher covers it
        self._flush_due((partition,), awaited=awaited)

    def _flush_due(self, partitions, *, awaited: bool = True) -> None:
        """The flusher's next round covers ``partitions``; ``awaited``: something waits for it, so the round starts
        now (else it may wait UNAWAITED_FLUSH_S for one that something else needs: Broker.appended)."""
        self._dirty.update(partitions)
        if awaited:
            self._awaited.set()
        self._dirty_event.set()

    def write_appended(self, partition: Partition) -> bool:
        """Hand everything appended to ``partition`` to the OS now, without waiting for the flusher or an fsync
        (write-behind keeps small appends in memory until the flusher's round): → whether it was written, so that a
        crash of the process can no longer lose it (a power loss still can).  For an answer sent before the fsync.
        A failed write stays pending: the flush writes it again, and fails with it if it fails again.  Never on the
        PostgreSQL engine: its segment cache survives nothing (a restarted or new leader reads the database), so the
        answer waits for the commit."""
        if partition.storage_error or self.engine is not None:
            return False
        try:
            partition.log.write_tails()
        except OSError:
            return False                    # the flush meets it again and reports it
        return True

    def storage_failed(self, partition: Partition, error: BaseException) -> None:
        """A write or fsync failed: the partition goes offline until restart (Kafka's offline log dir).  Not for
        want of descriptors: nothing was written then, and the partition works again once some are free.  Not
        for want of space either (a write, never an fsync, refused with ENOSPC/EDQUOT): see :meth:`_out_of_space`."""
        if out_of_descriptors(error):
            log.warning("out of file descriptors for partition %s-%d: %r", partition.topic.name, partition.index,
                        error)
            return
        if out_of_space(error):
            if partition.storage_error is None:
                self._out_of_space(partition, error)
            return                              # offline already (retrying, or until restart)
        partition.storage_error = repr(error)
        partition.storage_retrying = False
        log.error("storage error, partition %s-%d is offline until restart: %r",
                  partition.topic.name, partition.index, error)
        self._wake_waiters()

    # --- disk full -----------------------------------------------------------------------------

    def _out_of_space(self, partition: Partition, error: OSError) -> None:
        """A write found no space: the partition goes offline (appends refused with KAFKA_STORAGE_ERROR, waiters
        answered as after any storage error) until :meth:`run_storage_retry` makes its failed write succeed.

        Safe because the write left nothing past the file's logical end (a short write is cut back) and no fsync
        failed: the log is what it was before the write, plus bytes still in memory (write-behind) that the retry
        writes.  What was acknowledged is durable already; what was appended but not yet durable was not
        acknowledged, is kept, and becomes durable (and visible) with the retry."""
        partition.storage_error = f"disk full: {error.strerror or error!r}"
        partition.storage_retrying = True
        log.error("partition %s-%d is offline: disk full (%s); writes refused with KAFKA_STORAGE_ERROR and retried "
                  "until space returns", partition.topic.name, partition.index, error.strerror or repr(error))
        self._full_event.set()
        self._wake_waiters()

    async def run_storage_retry(self) -> None:
        """Bring partitions offline for want of space back: retry each one's failed write (its flush) with a
        backoff; one log line when it is back, none per attempt."""
        while True:
            await self._full_event.wait()
            self._full_event = trio.Event()
            delay = STORAGE_RETRY_FIRST_S
            while any(p.storage_retrying for p in self.partitions.values()):
                await trio.sleep(delay)
                for p in [p for p in self.partitions.values() if p.storage_retrying]:
                    await self._retry_full(p)
                delay = min(delay * 2, STORAGE_RETRY_MAX_S)

    async def _retry_full(self, p: Partition) -> None:
        """One retry of a full partition's write, once there is free space: flush what it holds; on success the
        partition is back online and its coordinator, if any, resumes.  With the PostgreSQL engine the next commit
        round is the retry (_commit_round brings the partition back)."""
        if self.partitions.get((p.topic.name, p.index)) is not p:
            return                              # deleted meanwhile
        if self.engine is not None:
            self._flush_due((p,))
            return
        free = self.storage.available_bytes(p.directory)
        if free is not None and free < STORAGE_RETRY_FREE_BYTES:
            return
        target = p.log.flush_begin()
        try:
            await trio.to_thread.run_sync(p.log.flush, target)
        except OSError as e:
            if p.storage_retrying and not out_of_space(e) and not out_of_descriptors(e) \
                    and self.partitions.get((p.topic.name, p.index)) is p:
                self.storage_failed(p, e)       # offline until restart (logged once there)
            return
        if not p.storage_retrying or self.partitions.get((p.topic.name, p.index)) is not p:
            return                              # failed otherwise, or deleted, meanwhile
        p.log.flush_done(target)
        self._back_online(p)
        self._wake_waiters()

    def _back_online(self, p: Partition) -> None:
        p.storage_retrying = False
        p.storage_error = None
        log.warning("partition %s-%d is back online: its writes succeed again", p.topic.name, p.index)
        if p.runtime is not None:
            p.runtime.storage_recovered()

    def durable_or_lost(self, partition: Partition, offset: int) -> bool:
        """Whether :meth:`wait_durable` would return at once: ``offset`` is durable, or never will be."""
        return partition.log.high_watermark > offset or bool(partition.storage_error) \
            or self.partitions.get((partition.topic.name, partition.index)) is not partition

    async def wait_durable(self, partition: Partition, offset: int) -> bool:
        """Wait until everything up to and including ``offset`` is durable; False if it never will be
        (the fsync failed, or the topic was deleted meanwhile)."""
        while partition.log.high_watermark <= offset:
            if partition.storage_error or self.partitions.get((partition.topic.name, partition.index)) is not partition:
                return False
            await self._hw_event.wait()
        return True

    def data_event(self) -> trio.Event:
        """An event set when any high watermark next moves (take it before reading, wait after)."""
        return self._hw_event

    async def wait_for_data(self, deadline: float, event: trio.Event | None = None) -> None:
        """Sleep until some high watermark moves (after ``event`` was taken) or the deadline passes."""
        with trio.move_on_at(deadline):
            await (event if event is not None else self._hw_event).wait()

    def call_on_next_wake(self, callback) -> None:
        """Call ``callback()`` (once) when high watermarks next move, or a partition fails or goes: how a connection
        whose next answer waits for a flush sleeps until then without a task of its own parked on the event."""
        self._wake_callbacks.add(callback)

    def _wake_waiters(self) -> None:
        self._hw_event.set()
        self._hw_event = trio.Event()
        if self._wake_callbacks:
            callbacks, self._wake_callbacks = self._wake_callbacks, set()
            for callback in callbacks:
                callback()

    def burst_begins(self, connection) -> None:
        """``connection`` reads the first produce request of a burst (server/connection.py, Connection._burst_read): a
        client that got several produce answers at once sends as many requests again, one by one; the next flush round
        waits for the rest of it (:meth:`gather_burst`).  Only where answers wait for the flush."""
        if self.fsync and not self.ack_before_flush:
            self._bursts.add(connection)

    def burst_ends(self, connection) -> None:
        """``connection``'s burst came whole (or the connection is gone)."""
        if connection in self._bursts:
            self._bursts.discard(connection)
            if not self._bursts and self._bursts_over is not None:
                self._bursts_over.set()

    async def gather_burst(self) -> None:
        """Before a flush round: wait until every burst under way came whole, or BURST_WAIT_S passed, so that one
        fsync covers each burst instead of its first request alone and then the rest.  (A client that keeps 5
        requests in flight, answered 1 and 4 at a time, would otherwise alternate rounds of 1 and 4 requests.)  A
        connection whose burst is not whole by then is not waited for again until one comes within
        server/connection.py's BURST_WINDOW_S."""
        self._bursts_over = trio.Event()
        with trio.move_on_after(BURST_WAIT_S):
            await self._bursts_over.wait()
        self._bursts_over = None
        for connection in self._bursts:
            connection.bursts_gathered = False
        self._bursts.clear()

    async def run_interval_flusher(self) -> None:
        """With Kafka's flush policy: every log.flush.interval.ms, flush whatever is not durable yet."""
        while True:
            await trio.sleep(self.flush_interval_ms / 1000)
            due = [p for p in self.partitions.values()
                   if p.storage_error is None and p.log.log_end_offset > p.log.durable_offset]
            if due:
                self._flush_due(due)

    async def run_flusher(self) -> None:
        """Group commit: fsync every partition written since the last round (in the flush thread), then
        move their high watermarks and wake whoever waits for them."""
        # the flush thread and its helpers fsync up to trireme.fsync.threads partitions at once: a round then takes
        # about its slowest fsync, not the sum of them all (issue 11's seventh round)
        with contextlib.ExitStack() as threads:
            worker = WorkerThread("trireme-flush")
            threads.callback(worker.close)
            fan_out = ThreadFanOut("trireme-fsync", helpers=self.config["trireme.fsync.threads"] - 1)
            threads.callback(fan_out.close)         # closed first: the worker's last call has ended (never abandoned)
            await self._flush_rounds(worker, fan_out)

    async def _flush_rounds(self, worker: WorkerThread, fan_out: ThreadFanOut) -> None:
        while True:
            await self._dirty_event.wait()
            if not self._awaited.is_set():             # only appends no answer waits for (Broker.appended)
                with trio.move_on_after(UNAWAITED_FLUSH_S):
                    await self._awaited.wait()
            if self._bursts:
                await self.gather_burst()
            self._dirty_event = trio.Event()
            self._awaited = trio.Event()
            batch = [(p, p.log.flush_begin()) for p in self._dirty]
            self._dirty.clear()
            if self.engine is not None:
                await self._commit_round(worker, batch)
                continue
            started = time.perf_counter()
            failures, worker_seconds = await self._fsync_round(worker, batch, fan_out)
            self.metrics.observe_fsync(time.perf_counter() - started, worker_seconds, len(batch))
            snapshots = []
            retry = False
            for p, target in batch:
                if p in failures and out_of_descriptors(failures[p]):
                    self._dirty.add(p)          # flushed again once descriptors are free
                    retry = True
                elif p in failures:
                    self.storage_failed(p, failures[p])
                elif p.storage_error is None:
                    p.log.flush_done(target)
                    if p.log.size_bytes - p.snapshot_size >= SNAPSHOT_INTERVAL_BYTES:
                        snapshots.append(self._snapshot_bytes(p))
            self._wake_waiters()
            ahead = [a for a in (p.log.preallocation() for p, _ in batch
                                 if p.storage_error is None and p not in failures) if a]
            if ahead:
                await worker.run(self._preallocate_all, ahead, fan_out)
            snapshots = [s for s in snapshots if s is not None]
            if snapshots:
                await worker.run(self._write_snapshots, snapshots)
            if retry:
                log.warning("out of file descriptors: %d partition(s) not flushed, retrying", len(self._dirty))
                await trio.sleep(0.1)
                self._flush_due(())

    def sync_now(self, partition: Partition) -> None:
        """Make everything appended to ``partition`` durable now, blocking (start-up: a coordinator's first records
        or its compaction): an fsync, or with the PostgreSQL engine commits.  Raises OSError (DatabaseUnavailable, or
        a commit refused because another broker leads the partition)."""
        if self.engine is None:
            partition.log.sync(now_ms())
            return
        partition.log.flush_begin()
        while True:
            piece = self._cleaned_piece(partition)
            if piece is not None and piece[1] < piece[2]:
                piece = (piece[0], self.engine.cleaned_piece_end((partition.topic.topic_id, partition.index), *piece))
            a = self._append_of(partition, piece and piece[:2])
            refused = self.engine.commit([a], [])
            if a.key in refused:
                raise OSError(f"partition {partition.topic.name}-{partition.index}: the database refused the commit "
                              f"({refused[a.key]})")
            self._committed(partition, a)
            if a.end_offset >= partition.log.log_end_offset:
                return

    def _cleaned_piece(self, p: Partition) -> tuple[int, int, int] | None:
        """The first range a cleaning rewrote of ``p`` that its next commit replaces, as (first, stop, end): its
        cleaned batches from ``first`` within about ROUND_BYTES reach ``stop`` (``end``: all of them); None: no range
        waits.  Short of ``end``, the commit replaces a piece, from ``first`` to where the database's rows allow
        (PostgresEngine.cleaned_piece_end, in the flush thread), so that a commit's memory, and its read on the event
        loop, stay bounded whatever a cleaning rewrote (up to segment.bytes a range)."""
        if not p.cleaned_ranges:
            return None
        first, end = p.cleaned_ranges[0]
        start = max(first, p.log.log_start_offset)
        rows, stop = rows_of(p.log, start, end, ROUND_BYTES) if start < end else ([], end)
        return first, (min(stop, end) if rows else end), end       # no batch left in it: all of it at once

    def _append_of(self, p: Partition, piece: tuple[int, int] | None = None) -> PartitionAppend:
        """``p``'s part of a commit: its batches from where its last commit left it (at most ROUND_BYTES), and the
        cleaned batches that replace the database's rows in ``piece`` (first, end) of a cleaned range."""
        start = p.log.durable_offset
        rows, end = rows_of(p.log, start, p.log.log_end_offset, ROUND_BYTES)
        cleaned = []
        if piece is not None:
            first, piece_end = piece
            cleaned = [(first, piece_end, rows_of(p.log, max(first, p.log.log_start_offset), piece_end, 1 << 62)[0])]
        return PartitionAppend((p.topic.topic_id, p.index), p.database_epoch, start, end, p.log.log_start_offset,
                               rows, p.database_new, cleaned)

    @staticmethod
    def _committed(p: Partition, a: PartitionAppend) -> None:
        """``p``'s part ``a`` of a commit is in the database: its row exists, the cleaned range (or piece) it
        carried is replaced, and its batches up to ``a``'s end are durable."""
        p.database_new = False
        for _first, piece_end, _rows in a.cleaned:
            end = p.cleaned_ranges[0][1]
            if piece_end >= end:
                del p.cleaned_ranges[0]
            else:
                p.cleaned_ranges[0] = (piece_end, end)
        p.log.flush_done(a.end_offset)

    async def _commit_round(self, worker: WorkerThread, batch) -> None:
        """A flush round with the PostgreSQL engine: one database transaction commits every partition's batches
        since its last commit (at most ROUND_BYTES of each: the rest goes in the next round), then their high
        watermarks move.  The database unreachable: every partition of the round is offline until a retry commits
        (run_storage_retry, as for a full disk), with nothing acknowledged lost and nothing appended dropped."""
        live = [p for p, _target in batch
                if self.partitions.get((p.topic.name, p.index)) is p]    # not deleted meanwhile
        appends = []
        deleted, self._deleted_in_database = self._deleted_in_database, []
        started = time.perf_counter()
        try:
            for p in live:
                piece = self._cleaned_piece(p)
                if piece is not None and piece[1] < piece[2]:
                    piece = (piece[0], await worker.run(self.engine.cleaned_piece_end, (p.topic.topic_id, p.index),
                                                        *piece))
                if self.partitions.get((p.topic.name, p.index)) is p:       # (the await: not deleted meanwhile)
                    appends.append((p, self._append_of(p, piece and piece[:2])))
            refused = await worker.run(self.engine.commit, [a for _, a in appends], deleted)
        except DatabaseUnavailable as e:
            self._deleted_in_database[:0] = deleted
            self._database_unavailable(live, e)
            return
        self.metrics.observe_fsync(time.perf_counter() - started, time.perf_counter() - started, len(appends))
        for p, a in appends:
            row = refused.get(a.key)
            if row is None:
                self._committed(p, a)
            elif row.leader_id == self.node_id and row.leader_epoch == a.leader_epoch \
                    and a.from_offset < row.log_end_offset <= p.log.log_end_offset:
                p.log.flush_done(row.log_end_offset)    # a commit whose answer was lost did commit
            else:
                if p is not self.cluster_metadata.partition:    # that one is followed again (_follow_metadata)
                    self._close_partition(p, f"fenced: the database names node {row.leader_id} its leader at "
                                             f"leader epoch {row.leader_epoch} (this broker led it at "
                                             f"{a.leader_epoch})")
                self._cluster_poke.set()
                continue
            if p.storage_retrying:
                self._back_online(p)
            if p.log.durable_offset < p.log.log_end_offset or p.cleaned_ranges:
                self._dirty.add(p)
        self._wake_waiters()
        if self._dirty:
            self._flush_due(())

    def _database_unavailable(self, partitions: list[Partition], error: DatabaseUnavailable) -> None:
        """A commit failed: its partitions go offline (appends refused with KAFKA_STORAGE_ERROR, waiters answered)
        and run_storage_retry retries them with a backoff until a commit succeeds."""
        newly = [p for p in partitions if p.storage_error is None]
        for p in newly:
            p.storage_error = f"database unavailable: {error}"
            p.storage_retrying = True
        if newly:
            log.error("%d partition(s) offline: %s; writes refused with KAFKA_STORAGE_ERROR and retried until the "
                      "database answers", len(newly), error)
        self._dirty.update(partitions)
        self._full_event.set()
        self._wake_waiters()

    def _log_cleaned(self, topic: str, index: int, ranges: list[tuple[int, int]]) -> None:
        """With the PostgreSQL engine: a cleaning rewrote these ranges of a partition's log: the next commit round
        replaces their rows by the cleaned batches (so the database's copy is compacted too)."""
        p = self.partitions.get((topic, index))
        if p is not None:
            p.cleaned_ranges.extend(ranges)
            self._flush_due((p,))

    def _log_start_moved(self, topic: str, index: int) -> None:
        """With the PostgreSQL engine: a partition's log start moved (retention, DeleteRecords, a coordinator's
        compaction): the next commit round moves its row's and deletes the rows below it."""
        p = self.partitions.get((topic, index))
        if p is not None:
            self._flush_due((p,))

    def _write_snapshots(self, snapshots) -> None:
        for path, data in snapshots:
            try:
                self.storage.write_atomic(path, data, durable=self.fsync)
            except OSError as e:
                log.warning("could not write producer state snapshot %s: %r", path, e)

    def _flush_all(self, batch, fan_out: ThreadFanOut) -> tuple[dict, float]:
        """fsync every log in ``batch``, several at once (in the flush thread and its helpers); → ({partition: error}
        for failures, seconds taken)."""
        started = time.perf_counter()
        live = [(p, target) for p, target in batch
                if self.partitions.get((p.topic.name, p.index)) is p]      # not deleted meanwhile
        errors = fan_out.map(_flush_partition, live)
        failures = {p: error for (p, _), error in zip(live, errors) if error is not None}
        return failures, time.perf_counter() - started

    async def _fsync_round(self, worker: WorkerThread, batch, fan_out: ThreadFanOut) -> tuple[dict, float]:
        """A round's fsyncs (:meth:`_flush_all`) → ({partition: error}, seconds).  In the flush thread; or, for a
        round of one partition with data alone to sync (at most INLINE_FSYNC_MAX_BYTES over zeros written ahead,
        PartitionLog.flush_syncs_data_only) once such fsyncs were short often enough (INLINE_FSYNC_*), on the event
        loop if it goes idle first: the round then saves the hops to the flush thread and back, about 0.1 ms of a
        0.7 ms cycle for the Java producer's five requests in flight (docs/performance.md, "The fsync on the event
        loop")."""
        if time.monotonic() - self._short_fsyncs_at > INLINE_FSYNC_STREAK_S:
            self._short_fsyncs = 0              # a streak from long ago says nothing about the disk now
        data_only = self._syncs_data_only(batch)
        if data_only and self._short_fsyncs >= INLINE_FSYNC_STREAK and await _event_loop_idle() \
                and self._syncs_data_only(batch):       # still: nothing appended meanwhile grew the file
            failures, seconds = self._flush_inline(batch, fan_out)
            self.metrics.fsyncs_inline += 1
        else:
            failures, seconds = await worker.run(self._flush_all, batch, fan_out)
        if data_only:
            self._short_fsyncs = self._short_fsyncs + 1 if seconds <= INLINE_FSYNC_MAX_S else 0
            self._short_fsyncs_at = time.monotonic()
        return failures, seconds

    @staticmethod
    def _syncs_data_only(batch) -> bool:
        return len(batch) == 1 and batch[0][0].log.flush_syncs_data_only(batch[0][1], INLINE_FSYNC_MAX_BYTES)

    @trio.lowlevel.enable_ki_protection
    def _flush_inline(self, batch, fan_out: ThreadFanOut) -> tuple[dict, float]:
        """:meth:`_flush_all` on the event loop, blocking it (a Ctrl-C waits until it is done, as for the flush
        thread's calls)."""
        return self._flush_all(batch, fan_out)

    def _preallocate_all(self, ahead, fan_out: ThreadFanOut) -> None:
        """In the flush thread, after a round was answered: zeros ahead of the active segments that are due
        (PartitionLog.preallocation), several at once as the round's fsyncs, unless the file system is short of
        space (PREALLOCATE_FREE_BYTES)."""
        free = self.storage.available_bytes(ahead[0][0].path)
        if free is not None and free < PREALLOCATE_FREE_BYTES:
            return
        fan_out.map(_preallocate, ahead)

    async def run_retention(self) -> None:
        interval = self.config["log.retention.check.interval.ms"] / 1000
        while True:
            await trio.sleep(interval)
            for p in list(self.partitions.values()):
                if p.topic.is_internal or self.log_cleaner.busy(p):      # Kafka's deletableLogs: not while cleaned
                    continue
                try:
                    deleted = p.log.apply_retention(now_ms())
                except OSError as e:
                    log.error("retention failed for %s-%d: %r", p.topic.name, p.index, e)
                    continue
                if deleted:
                    log.info("retention deleted segments=%d partition=%s-%d", deleted, p.topic.name, p.index)

    def release_later(self, writable: list, handles: list) -> None:
        """Segment files dropped from a log (unlinked already: retention, DeleteRecords, a coordinator's compaction,
        topic deletion, a cleaning's swap) whose blocks run_segment_release frees, off the event loop."""
        if writable or handles:
            self._to_release.append((writable, handles))
            self.files_to_release += len(writable)
            if self._release_wakeup is not None:
                self._release_wakeup.set()

    async def run_segment_release(self) -> None:
        """Free the blocks of dropped segment files RELEASE_STEP_BYTES at a time, RELEASE_PAUSE_S apart, in a worker
        thread (state/log.py's release_files): a 1 GiB segment's last close would otherwise stall the event loop,
        and freeing it all at once (and, on a filesystem mounted with ``discard``, trimming it) every other file's
        fsync, the acknowledgements' included.  A shutdown ends the pauses (the rest goes at once)."""
        hurry = threading.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(set_when_cancelled, hurry)
            while True:
                self._release_wakeup = trio.Event()
                while self._to_release:
                    writable, handles = self._to_release.pop(0)
                    started = time.perf_counter()
                    try:
                        freed = await trio.to_thread.run_sync(release_files, writable, handles,
                                                              lambda: hurry.wait(RELEASE_PAUSE_S))
                    finally:
                        self.files_to_release -= len(writable)
                    if writable:
                        log.info("released segments: files=%d bytes=%d in %.3fs", len(writable), freed,
                                 time.perf_counter() - started)
                await self._release_wakeup.wait()

    def peer(self, node_id: int):
        """The peer that sends broker-to-broker requests to ``node_id`` (server/peers.py): this broker's own handlers
        for its node id, another broker's inter-broker listener for one in ``self.peers``' address book, which
        follows the live brokers of ``self.cluster`` (the address they advertise on the inter-broker listener)."""
        member = self.cluster.broker(node_id) if node_id != self.node_id else None
        address = member.address(self.config.inter_broker_listener) if member is not None else None
        if address is not None:
            self.peers.set_address(node_id, *address)
        return self.peers.peer(node_id)

    def partition_leader(self, topic: str, index: int) -> int:
        """The node id of a partition's leader (``self.cluster``), -1 while none leads it; this broker for a
        partition that no longer exists (its own handlers answer UNKNOWN_TOPIC_OR_PARTITION)."""
        described = self.described_topic(topic)
        if described is None or not 0 <= index < described.partitions:
            return self.node_id
        leadership = self.cluster.leadership(described, index)
        return leadership.leader_id if leadership is not None else -1

    def _network_peer(self, node_id: int, host: str, port: int, nursery) -> NetworkPeer:
        try:
            security = inter_broker_security(self.config)
        except ConfigError as e:
            raise PeerUnavailable(node_id, f"the inter-broker listener's settings: {e}") from None
        return NetworkPeer(node_id, host, port, nursery, request_timeout_s=self.config["request.timeout.ms"] / 1000,
                           security=security, metrics=self.metrics)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """The broker's background tasks; started before the listener."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self.peers.run)
            await nursery.start(self.auto_creation.run)
            nursery.start_soon(self.run_flusher)
            if self.ack_before_flush and self.flush_interval_ms < 9223372036854775807:
                nursery.start_soon(self.run_interval_flusher)
            nursery.start_soon(self.run_retention)
            nursery.start_soon(self.run_segment_release)
            nursery.start_soon(self.run_storage_retry)
            if self.membership is not None:
                nursery.start_soon(self._run_membership_until_shutdown)
            await nursery.start(self.groups.run)
            await nursery.start(self.transactions.run)
            await nursery.start(self.cluster_metadata.run)
            await nursery.start(self.log_cleaner.run)
            task_status.started()

    async def _run_membership_until_shutdown(self) -> None:
        try:
            with self._membership_running:
                await self.run_membership()
        finally:
            self._membership_ended.set()

    async def controlled_shutdown(self) -> None:
        """With the PostgreSQL engine, once the listener stopped (every answer given): a last commit round for what
        is appended but not committed (at most trireme.shutdown.grace.ms), then stop renewing the lease and hand
        every partition this broker leads to the next live broker (Membership.shut_down; Kafka's controlled
        shutdown), so they move at once instead of after broker.session.timeout.ms."""
        if self.membership is None:
            return
        with trio.move_on_after(self.config["trireme.shutdown.grace.ms"] / 1000):
            while pending := [p for p in self.partitions.values()
                              if p.storage_error is None and p.log.durable_offset < p.log.log_end_offset]:
                self._flush_due(pending)
                await self._hw_event.wait()
        self._membership_running.cancel()       # no heartbeat renews the lease, no stale view assigns, once it ends
        await self._membership_ended.wait()
        preferred = self.cluster.view.preferred
        led = {(p.topic.topic_id, p.index): (p.database_epoch, preferred.get((p.topic.topic_id, p.index), ()))
               for p in self.partitions.values() if p.database_epoch is not None and not p.topic.is_internal}
        try:
            moved = await trio.to_thread.run_sync(self.membership.shut_down, led)
        except DatabaseUnavailable as e:
            log.warning("controlled shutdown: could not hand the partitions over (they move when this broker's "
                        "lease ends): %s", e)
            return
        log.info("controlled shutdown: %d of %d partition(s) handed over", len(moved), len(led))

    def close(self) -> None:
        """Final flush of everything and close the files."""
        while self._to_release:                         # what run_segment_release did not get to: at once
            writable, handles = self._to_release.pop(0)
            release_files(writable, handles)
            self.files_to_release -= len(writable)
        for p in self.partitions.values():
            try:
                if p.storage_error is None:
                    p.log.sync(now_ms())
                    snapshot = self._snapshot_bytes(p)      # a clean restart replays nothing
                    if snapshot is not None:
                        self._write_snapshots([snapshot])
                p.log.close()
            except OSError as e:
                log.error("final flush of %s-%d failed: %r", p.topic.name, p.index, e)
        if self.membership is not None:
            try:
                self.membership.unregister()        # its partitions move at once, not after the session
            except DatabaseUnavailable as e:
                log.warning("could not end this broker's lease: %s", e)
            self.membership.close()
        if self.engine is not None:
            self.engine.close()
        if self.data_dir_lock is not None:
            self.data_dir_lock.release()        # after the last write: the next broker may start

