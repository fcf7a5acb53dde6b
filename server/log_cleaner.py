"""The log cleaner's runtime (Kafka's LogCleanerManager and cleaner threads): picks the dirtiest cleanable compacted
partition, has state/cleaner.py clean it off the event loop under the I/O throttle, swaps the result in on the event
loop, and counts what it did.

Scheduling is Kafka's ``grabFilthiestCompactedLog``: of the partitions whose ``cleanup.policy`` includes compact
(the internal topics' too), not being cleaned and not marked uncleanable after a failure, the core says which are
cleanable now (dirty ratio at least ``min.cleanable.dirty.ratio``, or a segment older than
``max.compaction.lag.ms``; never past the first unstable offset); the one with the highest dirty ratio is cleaned.
When none is, a cleaner sleeps ``log.cleaner.backoff.ms``.

Where the cleaning runs: in a child process when the log is on disk (FileStorage), in a worker thread otherwise
(MemoryStorage, in tests).  Cleaning decodes every record of the dirty segments, pure-Python CPU work; in a thread it
holds the GIL against the event loop for a switch interval at a time, and produce latency during a cleaning rose
several-fold (docs/operations.md, "Compaction", has the numbers), while in a child process it stays as when idle.  The child runs at idle priority (SCHED_IDLE: any other thread that
wakes up preempts it) and is moved to nice 19 if it starves (``keep_from_starving``), and after a swap the old
segments' blocks are freed a few MiB at a time by the broker's ``run_segment_release``, so neither the cleaning's CPU nor its freeing of
disk blocks holds up requests.
The child only reads rolled, immutable segments and writes files under temporary names; the swap by rename
(``begin_finish``: its renames, unlinks, fsyncs and the new segments' indexes) runs in a worker thread, and only the
swap of the segment list in memory on the event loop (fetches read the old segments until then).  Shutdown kills a child (or stops a thread at its next throttle call or
in its throttle sleep); the core's recovery at the next start removes what a cleaning cut short left.

The child dies with the broker, kill -9 included: it is a plain ``sys.executable`` process (no multiprocessing, so no
resource tracker beside it) started from the event loop's thread, which lives as long as the broker; on Linux it
asks for SIGKILL when that thread ends (``PR_SET_PDEATHSIG``: through ``setpriv`` before its interpreter starts
when util-linux is there, and again first thing in the child), and everywhere its throttle callback ends the
cleaning once its parent pid changed.  It inherits the data directory's lock (server/data_dir.py): the lock is
free only once the broker and its child are both gone, and a restarted broker waits for that rather than race the
old child in the directory.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable

import trio

from trireme.state.storage import FileStorage

from .clock import now_ms
from .worker_thread import WorkerThread

log = logging.getLogger("trireme.log_cleaner")

# After a cleaning failed (not for want of space: that is the partition's storage error), the partition is left
# alone for this long (Kafka marks it uncleanable until restart; this retries, since the cause may pass).
UNCLEANABLE_RETRY_MS = 10 * 60_000
# log.cleaner.dedupe.buffer.size (shared by the cleaners) → keys in one cleaning's offset map: a Python dict entry
# with its short bytes key takes about this much (Kafka's map: 24 bytes an entry).
BYTES_PER_MAP_KEY = 128
# Kafka's Throttler checks the observed rate every this many milliseconds.
THROTTLE_CHECK_INTERVAL_S = 0.3
# A cleaner child at idle priority that got less than this share of a core over this long is starving: it goes on at
# nice 19 (keep_from_starving).
STARVED_CPU_SHARE = 0.1
STARVED_WINDOW_S = 5.0


class CleaningAborted(Exception):
    """Raised in a cleaning (from its throttle callback) when the broker shuts down or the partition goes away."""


class Throttler:
    """Kafka's Throttler: callers report bytes; once per check interval, if the rate since the last check exceeds
    the desired rate, the caller sleeps until it does not.  Thread-safe (one is shared by the cleaner threads)."""

    def __init__(self, bytes_per_second: float, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        self.rate = bytes_per_second
        self._clock, self._sleep = clock, sleep
        self._lock = threading.Lock()
        self._period_start = clock()
        self._observed = 0.0
        self.throttled_s = 0.0

    def __call__(self, n: int, sleep: Callable[[float], object] | None = None) -> None:
        """Account for ``n`` bytes; sleeps (with ``sleep`` if given: an interruptible wait) when over the rate."""
        if self.rate == float("inf") or self.rate >= 1.7976931348623157e308:
            return
        with self._lock:
            self._observed += n
            elapsed = self._clock() - self._period_start
            if elapsed < THROTTLE_CHECK_INTERVAL_S:
                return
            pause = self._observed / self.rate - elapsed if self._observed / elapsed > self.rate else 0.0
            if pause > 0:
                (sleep or self._sleep)(pause)
                self.throttled_s += pause
            self._period_start = self._clock()
            self._observed = 0.0


class CleanerCore:
    """The calls the runtime makes into state/cleaner.py (the interface in issue 22's brief), in one place."""

    def __init__(self, module: Any = None):
        if module is None:
            from trireme.state import cleaner as module
        self.module = module

    def config(self, topic_config: dict[str, str], max_map_keys: int):
        return self.module.CleanerConfig(
            delete_retention_ms=int(topic_config["delete.retention.ms"]),
            min_compaction_lag_ms=int(topic_config["min.compaction.lag.ms"]),
            max_compaction_lag_ms=int(topic_config["max.compaction.lag.ms"]),
            min_cleanable_dirty_ratio=float(topic_config["min.cleanable.dirty.ratio"]),
            max_map_keys=max_map_keys)

    def cleanable(self, partition, now: int, cfg):
        """A plan (the log is then marked as being cleaned until finish or abandon), or None."""
        return partition.log.cleanable(now, partition.producers.first_unstable_offset(), cfg)

    def dirty_ratio(self, partition, now: int, cfg) -> float:
        return partition.log.dirty_ratio(now, partition.producers.first_unstable_offset(), cfg)

    def abandon(self, partition, plan) -> None:
        """A cleaning failed or was cut short: its files go, a later one may start."""
        partition.log.abandon_cleaning(plan)

    def clean_function(self) -> Callable:
        """clean(storage, plan, throttle) → result: a module-level function, so a child process can be given it."""
        return self.module.clean

    def finish(self, partition, result) -> None:
        partition.log.finish_cleaning(result)

    def begin_finish(self, partition, result):
        """The swap in steps: → an object whose ``files()`` runs in a worker thread (renames, unlinks, fsyncs,
        index loading) and whose ``commit()`` swaps the segment list on the event loop and retires the old segments
        (their blocks freed as retention's are: Broker.release_later)."""
        return partition.log.begin_finish(result)


@dataclasses.dataclass(slots=True)
class PartitionCleaning:
    """What the cleaner knows of one partition (metrics, status page)."""

    last_cleaning_ms: int = -1
    bytes_read: int = 0
    bytes_written: int = 0
    cleanings: int = 0
    uncleanable_until_ms: int = -1
    last_error: str = ""


def _die_with_parent(parent: int) -> None:
    """In the child, first thing: SIGKILL when the thread that started it ends (Linux), or exit now if the parent
    is gone already (it died before the request took effect)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)        # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass                                               # the throttle callback's check remains
    if os.getppid() != parent:
        os._exit(1)


def _child_main() -> None:
    """A cleaner child process's whole life (argv: the broker's pid): read (sys.path, then clean, root, plan,
    rate) pickled from stdin, clean, write (True, result) or (False, why) pickled to stdout."""
    parent = int(sys.argv[1])
    _die_with_parent(parent)
    answer = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)                                              # a stray print cannot corrupt the answer
    request = sys.stdin.buffer
    sys.path[:] = pickle.load(request)
    try:
        clean, root, plan, rate = pickle.load(request)
        throttler = Throttler(rate)

        def throttle(n: int) -> None:
            if os.getppid() != parent:                        # the broker is gone (where PDEATHSIG is not)
                raise CleaningAborted("the broker is gone")
            throttler(n)
        outcome = (True, clean(FileStorage(root), plan, throttle))
    except BaseException as e:                       # noqa: BLE001 - reported to the parent, which logs it
        outcome = (False, repr(e))
    if os.getppid() != parent:
        os._exit(1)
    with answer:
        pickle.dump(outcome, answer, protocol=pickle.HIGHEST_PROTOCOL)


CHILD_COMMAND = "from trireme.server.log_cleaner import _child_main; _child_main()"
# Where util-linux's setpriv is, the death signal is asked for before the interpreter starts (its start-up takes a
# while, and a broker killed meanwhile would leave the child running until _die_with_parent).
_SETPRIV = shutil.which("setpriv") if sys.platform.startswith("linux") else None
_DIE_WITH_PARENT = [_SETPRIV, "--pdeathsig", "KILL", "--"] if _SETPRIV else []


class LogCleaner:
    def __init__(self, broker, core: CleanerCore | None = None, *, isolation: str | None = None):
        config = broker.config
        self.broker = broker
        self.threads = config["log.cleaner.threads"]
        self.enabled = bool(config["log.cleaner.enable"]) and self.threads > 0
        self.backoff_s = config["log.cleaner.backoff.ms"] / 1000
        self.io_rate = float(config["log.cleaner.io.max.bytes.per.second"])
        self.dedupe_buffer_size = config["log.cleaner.dedupe.buffer.size"]
        self.max_map_keys = max(1, self.dedupe_buffer_size // max(1, self.threads) // BYTES_PER_MAP_KEY)
        self._core = core or CleanerCore()
        if isolation is None:
            isolation = "process" if isinstance(broker.storage, FileStorage) else "thread"
        self.isolation = isolation
        self.in_progress: set = set()               # partitions being cleaned: retention leaves them alone
        self.partitions: dict[tuple[str, int], PartitionCleaning] = {}
        self.bytes_read = self.bytes_written = self.cleanings = self.failures = 0
        self.seconds = 0.0
        self.last_cleaning_ms = -1
        self.max_clean_s = 0.0
        self._throttler = Throttler(self.io_rate)   # shared by the thread-isolated cleanings

    @property
    def core(self) -> CleanerCore:
        return self._core

    def stats(self, partition) -> PartitionCleaning:
        key = (partition.topic.name, partition.index)
        s = self.partitions.get(key)
        if s is None:
            s = self.partitions[key] = PartitionCleaning()
        return s

    def forget_deleted(self) -> None:
        for key in [k for k in self.partitions if k not in self.broker.partitions]:
            del self.partitions[key]

    # --- scheduling (Kafka's LogCleanerManager.grabFilthiestCompactedLog) ---------------------------------------

    def grab_filthiest(self, now: int):
        """→ (partition, plan) of the dirtiest cleanable partition, marked in progress; or None."""
        self.forget_deleted()
        best = None
        for partition in list(self.broker.partitions.values()):
            if (not partition.config.compacted or partition in self.in_progress or partition.storage_error
                    or partition.log is None):
                continue
            stats = self.stats(partition)
            if stats.uncleanable_until_ms > now:
                continue
            try:
                plan = self.core.cleanable(partition, now, self.cleaner_config(partition))
            except OSError as e:
                log.warning("cannot plan cleaning of %s-%d: %r", partition.topic.name, partition.index, e)
                continue
            if plan is None:
                continue
            loser = (partition, plan)
            if best is None or plan.dirty_ratio > best[1].dirty_ratio:
                best, loser = loser, best
            if loser is not None:               # planning marked it as being cleaned: not this round
                self._abandon(*loser)
        if best is not None:
            self.in_progress.add(best[0])
        return best

    def _abandon(self, partition, plan) -> None:
        try:
            self.core.abandon(partition, plan)
        except OSError as e:
            log.warning("could not remove the files of an unfinished cleaning of %s-%d: %r", partition.topic.name,
                        partition.index, e)

    def cleaner_config(self, partition):
        return self.core.config(self.broker.topic_config(partition.topic), self.max_map_keys)

    def dirty_ratios(self, now: int) -> dict:
        """(topic, partition) → dirty ratio now, of every compacted partition (metrics, status page)."""
        out = {}
        for key, partition in list(self.broker.partitions.items()):
            if partition.config.compacted and partition.storage_error is None:
                try:
                    out[key] = self.core.dirty_ratio(partition, now, self.cleaner_config(partition))
                except (OSError, ValueError):
                    continue
        return out

    def _gone(self, partition) -> bool:
        return (self.broker.partitions.get((partition.topic.name, partition.index)) is not partition
                or partition.storage_error is not None)

    def busy(self, partition) -> bool:
        """Whether ``partition`` is being cleaned (Kafka's retention skips such logs)."""
        return partition in self.in_progress

    # --- running ----------------------------------------------------------------------------------------------

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        if not self.enabled:
            task_status.started()
            return
        async with trio.open_nursery() as nursery:
            for i in range(self.threads):
                nursery.start_soon(self._cleaner, i)
            task_status.started()

    async def _cleaner(self, i: int) -> None:
        worker = WorkerThread(f"log-cleaner-{i}") if self.isolation == "thread" else None
        try:
            while True:
                if not await self.clean_once(worker):
                    await trio.sleep(self.backoff_s)
        finally:
            if worker is not None:
                worker.close()

    async def clean_once(self, worker: WorkerThread | None = None) -> bool:
        """Clean the dirtiest cleanable partition, if any → whether one was cleaned (or tried)."""
        grabbed = self.grab_filthiest(now_ms())
        if grabbed is None:
            return False
        partition, plan = grabbed
        name = f"{partition.topic.name}-{partition.index}"
        stats = self.stats(partition)
        started = time.perf_counter()
        finished = False
        try:
            try:
                result = await self._clean_off_loop(plan, worker)
            except CleaningAborted:
                return True
            except Exception as e:                   # noqa: BLE001 - the partition is left alone for a while
                if self._gone(partition):
                    log.info("cleaning %s given up: the partition was deleted or went offline meanwhile", name)
                    return True
                self.failures += 1
                stats.last_error = str(e)[:200]
                stats.uncleanable_until_ms = now_ms() + UNCLEANABLE_RETRY_MS
                log.error("cleaning %s failed, retried in %ds: %s", name, UNCLEANABLE_RETRY_MS // 1000, e)
                return True
            if self._gone(partition):
                return True                          # deleted (its files went with it) or offline meanwhile
            finished = True
            try:
                # Shielded: once its file work began, the swap is seen through (a shutdown waits for it).
                with trio.CancelScope(shield=True):
                    swap = self.core.begin_finish(partition, result)
                    try:
                        await trio.to_thread.run_sync(swap.files)
                    except OSError:
                        if self._gone(partition):        # deleted meanwhile: its files went with it
                            return True
                        raise
                    if self._gone(partition):
                        return True
                    swap.commit()               # the old segments' blocks: freed by the broker's release task
            except OSError as e:                     # as a failed flush: start-up recovery puts the files right
                self.failures += 1
                stats.last_error = str(e)[:200]
                log.error("swapping in the cleaned segments of %s failed: %r", name, e)
                self.broker.storage_failed(partition, e)
                return True
        finally:
            self.in_progress.discard(partition)
            if not finished:
                self._abandon(partition, plan)
        seconds = time.perf_counter() - started
        read, written = getattr(result, "bytes_read", 0), getattr(result, "bytes_written", 0)
        self.cleanings += 1
        self.bytes_read += read
        self.bytes_written += written
        self.seconds += seconds
        self.max_clean_s = max(self.max_clean_s, seconds)
        self.last_cleaning_ms = stats.last_cleaning_ms = now_ms()
        stats.bytes_read += read
        stats.bytes_written += written
        stats.cleanings += 1
        stats.last_error = ""
        log.info("cleaned %s: read=%d written=%d in %.3fs (%.1f MB/s)", name, read, written, seconds,
                 read / seconds / 1e6 if seconds > 0 else 0.0)
        return True

    async def _clean_off_loop(self, plan, worker: WorkerThread | None):
        clean = self.core.clean_function()
        if self.isolation != "thread":
            return await self._clean_in_child(clean, plan)
        abort = threading.Event()

        def throttle(n: int) -> None:           # in the worker thread: a cancellation ends the cleaning here
            if abort.is_set():
                raise CleaningAborted("cleaning aborted")
            self._throttler(n, abort.wait)      # its sleep, too
            if abort.is_set():
                raise CleaningAborted("cleaning aborted")

        own = worker is None
        if own:
            worker = WorkerThread("log-cleaner")
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(set_when_cancelled, abort)
                try:
                    outcome = (True, await worker.run(clean, self.broker.storage, plan, throttle))
                except Exception as e:          # raised below, not as the nursery's exception group
                    outcome = (False, e)
                finally:
                    nursery.cancel_scope.cancel()
        finally:
            if own:
                worker.close()
        ok, value = outcome
        if not ok:
            raise value
        return value

    async def _clean_in_child(self, clean: Callable, plan):
        request = (pickle.dumps(list(sys.path), protocol=pickle.HIGHEST_PROTOCOL)
                   + pickle.dumps((clean, self.broker.storage.root, plan, self.io_rate / self.threads),
                                  protocol=pickle.HIGHEST_PROTOCOL))
        lock = getattr(self.broker, "data_dir_lock", None)
        lock_fds = (lock.fileno(),) if lock is not None and lock.held else ()
        # Started here, on the event loop's thread (fork+exec, a few milliseconds): PR_SET_PDEATHSIG follows the
        # thread that started the child, and this one lives as long as the broker (trio's worker threads do not).
        child = subprocess.Popen([*_DIE_WITH_PARENT, sys.executable, "-c", CHILD_COMMAND, str(os.getpid())],
                                 stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, pass_fds=lock_fds, close_fds=True)
        run_when_idle(child.pid)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(keep_from_starving, child.pid)
                # In threads: the child reads the plan only once its interpreter is up, and the answer may be large.
                await trio.to_thread.run_sync(_send_and_close, child.stdin, request)
                await trio.lowlevel.wait_readable(child.stdout.fileno())
                nursery.cancel_scope.cancel()
            ok, value = await trio.to_thread.run_sync(_read_answer, child.stdout)
        except BaseException:
            child.kill()                             # shutdown or cancellation: its temporary files are recovered
            raise
        finally:
            child.stdout.close()
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(child.wait)
        if not ok:
            raise RuntimeError(f"{value} (exit code {child.returncode})")
        return value


def run_when_idle(pid: int) -> bool:
    """Have process ``pid`` (a cleaner child) take only CPU time that nothing else wants (SCHED_IDLE, Linux): a thread
    of the broker or of its clients that wakes up then preempts the cleaning at once, where at normal priority
    (or niced) it may wait for the cleaner's time slice → whether the policy took."""
    try:
        os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))
        return True
    except (AttributeError, OSError):           # not Linux, or the child is gone already
        return False


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of process ``pid`` from /proc (None where there is none)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


async def keep_from_starving(pid: int) -> None:
    """While a SCHED_IDLE cleaner child runs: if it got less than STARVED_CPU_SHARE of a core over a whole
    STARVED_WINDOW_S (the cores are busy all the time), move it to normal scheduling at the lowest priority (nice
    19) for the rest of its cleaning, so that cleaning still progresses (max.compaction.lag.ms) on a busy machine."""
    last = process_cpu_seconds(pid)
    while last is not None:
        await trio.sleep(STARVED_WINDOW_S)
        now = process_cpu_seconds(pid)
        if now is None:
            return
        if now - last < STARVED_CPU_SHARE * STARVED_WINDOW_S:
            try:
                os.sched_setscheduler(pid, os.SCHED_OTHER, os.sched_param(0))
                os.setpriority(os.PRIO_PROCESS, pid, 19)
            except OSError:
                return
            log.info("the log cleaner got %.0f ms of CPU in %.0f s at idle priority: it continues at nice 19",
                     (now - last) * 1000, STARVED_WINDOW_S)
            return
        last = now


def _read_answer(pipe) -> tuple[bool, Any]:
    try:
        return pickle.loads(pipe.read())
    except Exception:                                # noqa: BLE001 - ended (killed?) without a whole answer
        return False, "the cleaner process ended without an answer"


def _send_and_close(pipe, data: bytes) -> None:
    try:
        pipe.write(data)
    except BrokenPipeError:
        pass                                         # the child died: its missing answer says so
    finally:
        try:
            pipe.close()
        except BrokenPipeError:
            pass


async def set_when_cancelled(event: threading.Event) -> None:
    """Sets ``event`` when cancelled, for a worker thread to see (a thread-isolated cleaning's throttle callback then
    raises CleaningAborted; the broker's segment release stops pausing)."""
    try:
        await trio.sleep_forever()
    finally:
        event.set()
