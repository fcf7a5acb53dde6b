"""Counters and latency histograms the broker keeps about itself, and their Prometheus text exposition.

Updates on the request path are O(1): a counter increment, or a histogram's bucket found by
bisection over a fixed list of bounds.  Everything read from the broker's state (offsets, groups,
transactions) is computed at scrape time.  ``docs/operations.md`` lists every metric.
"""
from __future__ import annotations

import bisect
import collections
import gc
import time

from trireme.state.txn_records import TxnState

from . import overview
from .clock import now_ms
from .web import Request, Response, Routes

# Request latency from the first byte of the request frame to the last byte of the answer sent.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
FSYNC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)


class GcPauses:
    """The time the cycle collector held the interpreter, per generation (a ``gc.callbacks`` entry): a pause of the
    event loop, whichever thread's allocation started it."""

    def __init__(self):
        self.seconds = [0.0] * len(gc.get_stats())
        self._started = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds[info["generation"]] += time.perf_counter() - self._started


GC_PAUSES: GcPauses | None = None


def time_gc_pauses() -> None:
    """Count the collector's pauses from now on, in this process (``trireme serve``: a broker run inside a test's
    process leaves that process's collector alone)."""
    global GC_PAUSES
    if GC_PAUSES is None:
        GC_PAUSES = GcPauses()
        gc.callbacks.append(GC_PAUSES)


class Histogram:
    """Observations counted in buckets by upper bound (Prometheus' ``le``), plus their sum."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)        # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)


# The security counters are keyed by what clients choose (resource names, client ids, the principals of
# certificates): past this many distinct keys a new one is counted under OTHER, so memory stays bounded whatever
# they send.  Rendering reports the largest series only (trireme.metrics.security.max.series).
MAX_SECURITY_KEYS = 10000
OTHER = "(other)"
# A principal or resource name in a denial key is kept to this many characters (a request may name a resource of
# 32,767 bytes): 10,000 keys stay a few MiB.  The throttle keys need no such cut: their user and client id are the
# very strings of a live quota sensor's key (server/quotas.py), and a key is forgotten when its sensor is dropped.
MAX_LABEL_CHARS = 256
# Mechanism labels: Kafka's SASL mechanisms and SSL (a client certificate); any other name a client sends is OTHER.
KNOWN_MECHANISMS = frozenset({"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER", "GSSAPI", "SSL"})


class Metrics:
    def __init__(self):
        self.requests = collections.Counter()
        self.request_seconds = collections.Counter()
        self.phase_seconds: collections.Counter = collections.Counter()
        self.latency: dict[str, Histogram] = {}
        self.fsync = Histogram(FSYNC_BUCKETS)
        self.fsync_worker = Histogram(FSYNC_BUCKETS)
        self.fsync_partitions = 0
        self.fsyncs_inline = 0          # of those, run on the event loop (Broker._flush_inline)
        self.bytes_in = 0
        self.bytes_out = 0
        self.topic_bytes_in: collections.Counter = collections.Counter()
        self.topic_bytes_out: collections.Counter = collections.Counter()
        # security events (issue 21): counted here, shown by the metrics endpoint and the status page
        self.authentications: collections.Counter = collections.Counter()      # (listener, mechanism, outcome)
        self.denied: collections.Counter = collections.Counter()               # (principal, api, type, name)
        self.throttled: collections.Counter = collections.Counter()            # (user, client id, quota type)
        self.throttle_ms: collections.Counter = collections.Counter()          # (user, client id, quota type)

    def observe_phase(self, api: str, phase: str, seconds: float) -> None:
        """Time a request spent in one phase besides its handler (``observe_request``): receive (its frame), wait
        (the fsync, a coordinator, a long poll), respond (encode and send)."""
        self.phase_seconds[(api, phase)] += seconds

    def observe_request(self, api: str, seconds: float) -> None:
        self.requests[api] += 1
        self.request_seconds[api] += seconds

    def observe_latency(self, api: str, seconds: float) -> None:
        """A request's whole time, from its frame's first byte to its answer sent (or handled, for acks=0)."""
        histogram = self.latency.get(api)
        if histogram is None:
            histogram = self.latency[api] = Histogram(LATENCY_BUCKETS)
        histogram.observe(seconds)

    def observe_fsync(self, seconds: float, worker_seconds: float, partitions: int) -> None:
        """One group commit: its whole round as the flusher saw it (the hop to the worker thread, the fsyncs, the
        hop back to a busy event loop), and the flush threads' own time in the fsyncs (up to trireme.fsync.threads at
        once, so about the slowest), GIL hand-offs included."""
        self.fsync.observe(seconds)
        self.fsync_worker.observe(worker_seconds)
        self.fsync_partitions += partitions

    def count_bytes_in(self, topic: str, size: int) -> None:
        """Record batch bytes appended to a topic by Produce."""
        self.bytes_in += size
        self.topic_bytes_in[topic] += size

    def count_bytes_out(self, by_topic: dict[str, int]) -> None:
        """Record batch bytes a Fetch response carries, per topic."""
        for topic, size in by_topic.items():
            self.bytes_out += size
            self.topic_bytes_out[topic] += size

    def authentication(self, listener: str, mechanism: str, succeeded: bool) -> None:
        """One SASL or TLS authentication on ``listener`` with ``mechanism`` (``SSL`` for a client certificate)."""
        mechanism = mechanism if mechanism in KNOWN_MECHANISMS else OTHER
        self.authentications[(listener, mechanism, "success" if succeeded else "failure")] += 1

    def request_denied(self, principal: str, api: str, resource_type: str, name: str) -> None:
        """The authorizer denied ``principal`` an operation of ``api`` on a resource."""
        if len(principal) > MAX_LABEL_CHARS:
            principal = principal[:MAX_LABEL_CHARS] + "..."
        if len(name) > MAX_LABEL_CHARS:
            name = name[:MAX_LABEL_CHARS] + "..."
        key = (principal, api, resource_type, name)
        if key not in self.denied and len(self.denied) >= MAX_SECURITY_KEYS:
            key = (OTHER, api, resource_type, OTHER)        # at most APIs x resource types more keys
        self.denied[key] += 1

    def client_throttled(self, user: str, client_id: str, quota_type: str, throttle_ms: int) -> None:
        """A response told the client to back off for ``throttle_ms`` under a ``quota_type`` quota."""
        key = (user, client_id, quota_type)
        if key not in self.throttled and len(self.throttled) >= MAX_SECURITY_KEYS:
            key = (OTHER, OTHER, quota_type)
        self.throttled[key] += 1
        self.throttle_ms[key] += throttle_ms

    def forget_throttled(self, user: str, client_id: str, quota_type: str) -> None:
        """The quota sensor of this client was dropped (idle for an hour, or the least recently used past
        MAX_SENSORS): its throttle counters go with it, as Kafka's throttle-time metric goes with its sensor."""
        key = (user, client_id, quota_type)
        self.throttled.pop(key, None)
        self.throttle_ms.pop(key, None)

    def forget_deleted_topics(self, exists) -> None:
        """Drop the per-topic counters of topics ``exists(name)`` denies (deleted): their label values go away."""
        for counter in (self.topic_bytes_in, self.topic_bytes_out):
            for topic in [t for t in counter if not exists(t)]:
                del counter[topic]


def _label_value(value) -> str:
    return str(value).replace("\\", r"\\").replace('"', r"\"").replace("\n", r"\n")


def _number(value) -> str:
    if isinstance(value, float):
        return "+Inf" if value == float("inf") else repr(value)
    return str(value)


class Exposition:
    """Prometheus text format 0.0.4: every family once, with HELP and TYPE, its samples right under it."""

    def __init__(self):
        self.lines: list[str] = []

    def family(self, name: str, kind: str, text: str) -> None:
        self.lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]

    def sample(self, name: str, value, labels: dict | None = None) -> None:
        if labels:
            body = ",".join(f'{k}="{_label_value(v)}"' for k, v in labels.items())
            self.lines.append(f"{name}{{{body}}} {_number(value)}")
        else:
            self.lines.append(f"{name} {_number(value)}")

    def metric(self, name: str, kind: str, text: str, samples) -> None:
        """A family and its samples: ``samples`` is a value, or an iterable of (labels, value)."""
        self.family(name, kind, text)
        if isinstance(samples, (int, float)):
            self.sample(name, samples)
        else:
            for labels, value in samples:
                self.sample(name, value, labels)

    def histogram(self, name: str, text: str, series) -> None:
        """``series``: (labels, Histogram) pairs; buckets are written cumulative, as Prometheus reads them."""
        self.family(name, "histogram", text)
        for labels, h in series:
            running = 0
            for bound, n in zip(h.bounds + (float("inf"),), h.counts):
                running += n
                self.sample(name + "_bucket", running, {**labels, "le": _number(float(bound))})
            self.sample(name + "_sum", h.sum, labels)
            self.sample(name + "_count", running, labels)

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def render_broker(broker) -> str:
    """Every metric: the broker's counters and histograms plus gauges read from its state now."""
    m = broker.metrics
    out = Exposition()
    out.metric("trireme_requests_total", "counter", "Requests handled, per API.",
               [({"api": api}, n) for api, n in sorted(m.requests.items())])
    out.metric("trireme_request_handler_seconds_total", "counter",
               "Time spent in request handlers (validate, append; not waiting), per API.",
               [({"api": api}, s) for api, s in sorted(m.request_seconds.items())])
    out.metric("trireme_request_phase_seconds_total", "counter",
               "Time requests spent receiving their frame, waiting (fsync, coordinator, long poll) and responding.",
               [({"api": api, "phase": phase}, s) for (api, phase), s in sorted(m.phase_seconds.items())])
    out.histogram("trireme_request_duration_seconds",
                  "Request latency from the first byte of the request to the last byte of the response, per API.",
                  [({"api": api}, h) for api, h in sorted(m.latency.items())])
    out.metric("trireme_fsyncs_total", "counter", "Group-commit fsyncs (each covers every dirty partition).",
               m.fsync.count)
    out.metric("trireme_fsync_seconds_total", "counter", "Time spent in group-commit fsyncs.", m.fsync.sum)
    out.histogram("trireme_fsync_duration_seconds", "Duration of each group-commit fsync, as the flusher task saw it.",
                  [({}, m.fsync)])
    out.histogram("trireme_fsync_worker_seconds",
                  "Time the flush threads spent on each group commit's fsyncs (run at once), taking back the GIL included.",
                  [({}, m.fsync_worker)])
    out.metric("trireme_fsync_partitions_total", "counter", "Partitions covered by group-commit fsyncs.",
               m.fsync_partitions)
    out.metric("trireme_segment_files_to_release", "gauge",
               "Dropped segment log files (retention, deletion, cleaning) whose blocks are still being freed.",
               broker.files_to_release)
    out.metric("trireme_fsyncs_inline_total", "counter",
               "Group-commit fsyncs run on the event loop: one partition, data alone to write, nothing else ready.",
               m.fsyncs_inline)
    out.metric("trireme_gc_collections_total", "counter", "Collections of the cycle collector, per generation.",
               [({"generation": str(g)}, s["collections"]) for g, s in enumerate(gc.get_stats())])
    if GC_PAUSES is not None:
        out.metric("trireme_gc_pause_seconds_total", "counter",
                   "Time the cycle collector held the interpreter (and so the event loop), per generation.",
                   [({"generation": str(g)}, s) for g, s in enumerate(GC_PAUSES.seconds)])
    out.metric("trireme_gc_frozen_objects", "gauge",
               "Objects start-up made that the collector no longer walks (gc.freeze once serving).",
               gc.get_freeze_count())
    m.forget_deleted_topics(lambda name: broker.topics.get(name) is not None)
    out.metric("trireme_bytes_in_total", "counter", "Record batch bytes appended by Produce.", m.bytes_in)
    out.metric("trireme_bytes_out_total", "counter", "Record batch bytes sent in Fetch responses.", m.bytes_out)
    out.metric("trireme_topic_bytes_in_total", "counter", "Record batch bytes appended by Produce, per topic.",
               [({"topic": t}, n) for t, n in sorted(m.topic_bytes_in.items())])
    out.metric("trireme_topic_bytes_out_total", "counter", "Record batch bytes sent in Fetch responses, per topic.",
               [({"topic": t}, n) for t, n in sorted(m.topic_bytes_out.items())])
    out.metric("trireme_connections", "gauge", "Open client connections.", broker.limits.admission.count)
    _security_metrics(out, broker)
    _partition_metrics(out, broker)
    _group_metrics(out, broker)
    _transaction_metrics(out, broker, now_ms())
    _log_cleaner_metrics(out, broker, now_ms())
    broker.limits.write_metrics(out, broker.storage)
    return out.text()


def top(counter, n: int) -> list:
    """The ``n`` largest (key, count) pairs of ``counter``, ties by key: what a label set is bounded to."""
    return sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))[:n]


def denied_by(counter, fields: tuple[int, ...]) -> collections.Counter:
    """Denied-request counts summed over the key fields not in ``fields`` (0 principal, 1 API, 2 resource type,
    3 resource name)."""
    out: collections.Counter = collections.Counter()
    for key, n in counter.items():
        out[tuple(key[i] for i in fields)] += n
    return out


def _security_metrics(out: Exposition, broker) -> None:
    """Authentications, denied requests and throttled clients (issue 21): the per-principal/resource/client ones
    only for the largest series (trireme.metrics.security.max.series), so no client can grow the label set."""
    m = broker.metrics
    n = broker.config["trireme.metrics.security.max.series"]
    out.metric("trireme_authentications_total", "counter",
               "Authentications per listener, mechanism (SSL: a client certificate) and outcome (success, failure).",
               [({"listener": listener, "mechanism": mechanism, "outcome": outcome}, count)
                for (listener, mechanism, outcome), count in sorted(m.authentications.items())])
    out.metric("trireme_authorization_denials_total", "counter",
               "Operations the authorizer denied, all principals and resources.", sum(m.denied.values()))
    out.metric("trireme_authorization_denials_by_principal_total", "counter",
               "Operations the authorizer denied per principal, API and resource type; the series with the largest "
               "counts (trireme.metrics.security.max.series).",
               [({"principal": principal, "api": api, "resource_type": kind}, count)
                for (principal, api, kind), count in top(denied_by(m.denied, (0, 1, 2)), n)])
    out.metric("trireme_authorization_denials_by_resource_total", "counter",
               "Operations the authorizer denied per resource; the series with the largest counts.",
               [({"resource_type": kind, "resource": name}, count)
                for (kind, name), count in top(denied_by(m.denied, (2, 3)), n)])
    most = top(m.throttle_ms, n)
    out.metric("trireme_client_throttles_total", "counter",
               "Responses that told a client to back off, per user, client id and quota type; the clients with the "
               "most throttle time.",
               [({"user": user, "client_id": client, "quota_type": kind}, m.throttled[(user, client, kind)])
                for (user, client, kind), _ in most])
    out.metric("trireme_client_throttle_seconds_total", "counter",
               "Throttle time given to a client, per user, client id and quota type; the clients with the most.",
               [({"user": user, "client_id": client, "quota_type": kind}, ms / 1000)
                for (user, client, kind), ms in most])


# (name, help, value of a partition)
_PARTITION_GAUGES = (
    ("trireme_partition_log_start_offset", "First offset of the partition's log.", lambda p: p.log.log_start_offset),
    ("trireme_partition_log_end_offset", "Offset the next appended record gets.", lambda p: p.log.log_end_offset),
    ("trireme_partition_high_watermark", "End of the durable records consumers may read.",
     lambda p: p.log.high_watermark),
    ("trireme_partition_last_stable_offset", "End of what read_committed consumers may read.",
     lambda p: p.last_stable_offset()),
    ("trireme_partition_lso_lag", "High watermark minus last stable offset: what open transactions hold back.",
     lambda p: p.log.high_watermark - p.last_stable_offset()),
    ("trireme_partition_producers", "Producer ids the partition's producer state knows.", lambda p: len(p.producers)),
    ("trireme_partition_size_bytes", "Bytes of the partition's log segments.", lambda p: p.log.size_bytes),
    ("trireme_partition_offline", "1 while the partition refuses writes after a storage error (disk full: until its "
     "retried write succeeds; any other error: until restart).", lambda p: int(p.storage_error is not None)),
)


def _partition_metrics(out: Exposition, broker) -> None:
    partitions = sorted(broker.partitions.items())
    for name, text, value in _PARTITION_GAUGES:
        out.metric(name, "gauge", text, [({"topic": topic, "partition": index}, value(p))
                                          for (topic, index), p in partitions])


def _log_cleaner_metrics(out: Exposition, broker, now: int) -> None:
    """The log cleaner (server/log_cleaner.py): Kafka's LogCleaner metrics (max-dirty-percent, max-clean-time-secs,
    time-since-last-run-ms, uncleanable-partitions-count) and totals; dirty ratios only for the dirtiest partitions."""
    cleaner = broker.log_cleaner
    ratios = cleaner.dirty_ratios(now)
    out.metric("trireme_log_cleaner_dirty_ratio", "gauge",
               "Dirty bytes over cleanable bytes of a compacted partition (cleaned once at least "
               "min.cleanable.dirty.ratio); the partitions with the highest (trireme.metrics.log.cleaner.max.partitions).",
               [({"topic": topic, "partition": index}, ratio) for (topic, index), ratio in
                top(ratios, broker.config["trireme.metrics.log.cleaner.max.partitions"])])
    out.metric("trireme_log_cleaner_max_dirty_ratio", "gauge", "The highest dirty ratio of any compacted partition.",
               max(ratios.values(), default=0.0))
    out.metric("trireme_log_cleaner_cleanings_total", "counter", "Cleanings finished.", cleaner.cleanings)
    out.metric("trireme_log_cleaner_failures_total", "counter",
               "Cleanings that failed (the partition is left alone for a while).", cleaner.failures)
    out.metric("trireme_log_cleaner_bytes_read_total", "counter", "Log bytes the cleaner read.", cleaner.bytes_read)
    out.metric("trireme_log_cleaner_bytes_written_total", "counter", "Log bytes the cleaner wrote (the cleaned "
               "segments).", cleaner.bytes_written)
    out.metric("trireme_log_cleaner_seconds_total", "counter", "Time spent cleaning.", cleaner.seconds)
    out.metric("trireme_log_cleaner_max_clean_seconds", "gauge", "The longest cleaning.", cleaner.max_clean_s)
    out.metric("trireme_log_cleaner_last_cleaning_timestamp_seconds", "gauge",
               "When the last cleaning finished (0: none yet).", max(cleaner.last_cleaning_ms, 0) / 1000)
    out.metric("trireme_log_cleaner_uncleanable_partitions", "gauge",
               "Partitions left alone after a failed cleaning.",
               sum(1 for s in cleaner.partitions.values() if s.uncleanable_until_ms > now))


def _group_metrics(out: Exposition, broker) -> None:
    views = overview.groups(broker)
    out.metric("trireme_groups", "gauge", "Consumer groups the coordinator holds.",
               len(broker.groups.coordinator.groups))
    most = sorted(views, key=lambda g: (-g.lag, g.group_id))[:broker.config["trireme.metrics.group.lag.max.groups"]]
    out.metric("trireme_group_lag", "gauge",
               "Sum over a group's committed partitions of high watermark minus committed offset; only the groups "
               "with the largest lag (trireme.metrics.group.lag.max.groups).",
               [({"group": g.group_id}, g.lag) for g in most])


def _transaction_metrics(out: Exposition, broker, now: int) -> None:
    """Transactions per coordinator state, the age of the oldest open one (what pins an LSO longest), hanging and
    stuck ones, moot markers."""
    coordinator = broker.transactions.coordinator
    counts = {state: 0 for state in TxnState}
    oldest = 0
    for meta in coordinator.transactions.values():
        counts[meta.state] += 1
        if meta.state is TxnState.ONGOING and meta.value.start_timestamp_ms >= 0:
            oldest = max(oldest, now - meta.value.start_timestamp_ms)
    out.metric("trireme_transactions", "gauge", "Transactional ids per transaction coordinator state.",
               [({"state": state.kafka_name}, n) for state, n in counts.items()])
    out.metric("trireme_transaction_oldest_open_age_seconds", "gauge", "Age of the oldest Ongoing transaction.",
               oldest / 1000)
    out.metric("trireme_transactions_timed_out_total", "counter", "Transactions aborted at their timeout.",
               coordinator.timed_out)
    out.metric("trireme_transactions_fenced_total", "counter",
               "Open transactions fenced by InitProducerId of the same transactional id.", coordinator.fenced)
    out.metric("trireme_hanging_transactions", "gauge",
               "Transactions open on a partition that the coordinator has no open transaction for (KIP-664).",
               sum(t.hanging for t in overview.open_transactions(broker)))
    out.metric("trireme_transactions_stuck", "gauge",
               "Transactions left in PrepareCommit/PrepareAbort because a partition refused a marker for good "
               "(TRANSACTION_COORDINATOR_FENCED, ...): free each with trireme transactions complete.",
               len(broker.transactions.stuck_transactions()))
    out.metric("trireme_transaction_markers_moot_total", "counter",
               "Markers refused with INVALID_PRODUCER_EPOCH (the partition had seen a newer producer epoch) and "
               "counted as written.", broker.transactions.moot_markers)


def routes(broker) -> Routes:
    def metrics(request: Request) -> Response:
        return Response(200, render_broker(broker).encode(), "text/plain; version=0.0.4; charset=utf-8")
    return {("GET", "/metrics"): metrics}
