"""The log cleaner's core (state/cleaner.py and the swap in state/log.py) against a model, plus crash tests."""
from __future__ import annotations

import pickle

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from trireme.state import cleaner
from trireme.state.cleaner import CleanerConfig
from trireme.state.log import CLEANER_CHECKPOINT_NAME, AbortedTxn, PartitionLog
from trireme.state.producer_state import ProducerStateManager
from trireme.state.storage import FileStorage, MemoryStorage
from trireme.wire import compression
from trireme.wire.records import (build_batch, build_control_batch, decode_records, iter_batch_headers,
                                  parse_batch_header, parse_control_record, validate_batches, CONTROL_ABORT)

DIR = "logs/t-0"
EAGER = CleanerConfig(min_cleanable_dirty_ratio=0.0, delete_retention_ms=1_000)


class Writer:
    """Appends batches to a log the way the broker does (producer state, aborted-transaction index)."""

    def __init__(self, storage, segment_bytes: int = 400) -> None:
        self.storage = storage
        self.log = PartitionLog.open(storage, DIR, segment_bytes=segment_bytes, now_ms=0)
        self.producers = ProducerStateManager()
        self.seq: dict[int, int] = {}
        self.epoch: dict[int, int] = {}

    def append(self, batch: bytes, now_ms: int = 0) -> int:
        buf = bytearray(batch)
        batches = validate_batches(buf)
        first, _last, _ = self.log.append(buf, batches, now_ms)
        header = parse_batch_header(buf)
        if header.is_control:
            record = decode_records(buf)[0]
            ctype, _ = parse_control_record(record)
            txn_first = self.producers.load_batch(header)
            if ctype == CONTROL_ABORT and txn_first is not None:
                unstable = self.producers.first_unstable_offset()
                self.log.add_aborted_txn(AbortedTxn(header.producer_id, txn_first, first,
                                                    first + 1 if unstable is None else unstable))
        else:
            self.producers.load_batch(header)
        self.log.sync()
        return first

    def data(self, records, *, pid: int = -1, transactional: bool = False, codec: int = 0, ts: int = 1_000) -> int:
        seq = -1
        epoch = -1
        if pid >= 0:
            seq = self.seq.get(pid, 0)
            epoch = self.epoch.setdefault(pid, 0)
            self.seq[pid] = seq + len(records)
        entries = [(k, v, [("h", b"x")], ts + n) for n, (k, v) in enumerate(records)]
        return self.append(build_batch(entries, producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                                       transactional=transactional, compression=codec))

    def end(self, pid: int, commit: bool, ts: int = 1_000) -> int:
        return self.append(build_control_batch(commit, producer_id=pid, producer_epoch=self.epoch.setdefault(pid, 0),
                                               coordinator_epoch=0, timestamp=ts))

    def roll(self) -> None:
        self.log._roll()
        self.log.sync()


def all_batches(log: PartitionLog):
    out = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        data = log.read(offset, 1 << 20, log.log_end_offset)
        if not data:
            break
        for pos, header in iter_batch_headers(data):
            out.append((header, decode_records(data, pos)))
            offset = header.next_offset
    return out


def committed_view(log: PartitionLog) -> dict[bytes, bytes]:
    """What a read_committed consumer ends up with: latest non-null value per key, aborted data skipped."""
    aborted = log.aborted_txns(0, log.log_end_offset)
    view: dict[bytes, bytes | None] = {}
    for header, records in all_batches(log):
        if header.is_control:
            continue
        if header.is_transactional and any(t.producer_id == header.producer_id
                                           and t.first_offset <= header.base_offset < t.last_offset for t in aborted):
            continue
        for r in records:
            view[r.key] = r.value
    return {k: v for k, v in view.items() if v is not None}


def consumer_committed_view(log: PartitionLog, fetch_offset: int | None = None) -> dict[bytes, bytes]:
    """A read_committed fetch of everything from `fetch_offset` as the Java consumer filters it (CompletedFetch):
    the fetch's aborted transactions are taken in first-offset order as batches reach them, a producer goes into
    the aborted set there and leaves it at its next ABORT marker; its transactional batches meanwhile are
    skipped."""
    start = log.log_start_offset if fetch_offset is None else fetch_offset
    return _consumer_view(all_batches(log), log.aborted_txns(start, log.log_end_offset), start)


def _consumer_view(batches, aborted, start: int = 0, end: int = 1 << 62) -> dict[bytes, bytes]:
    pending = sorted(aborted, key=lambda t: t.first_offset)
    aborted_pids: set[int] = set()
    view: dict[bytes, bytes | None] = {}
    for header, records in batches:
        if header.last_offset < start:
            continue
        if header.producer_id >= 0:
            while pending and pending[0].first_offset <= header.last_offset:
                aborted_pids.add(pending.pop(0).producer_id)
            if header.is_control:
                if records and parse_control_record(records[0])[0] == CONTROL_ABORT:
                    aborted_pids.discard(header.producer_id)
                continue
            if header.is_transactional and header.producer_id in aborted_pids:
                continue
        for r in records:
            if start <= r.offset < end:
                view[r.key] = r.value
    return {k: v for k, v in view.items() if v is not None}


def producer_summary(log: PartitionLog):
    m = ProducerStateManager()
    m.rebuild(log.iter_batch_headers())
    return {e.producer_id: (e.producer_epoch, e.last_seq, e.last_offset, e.current_txn_first_offset)
            for e in m.entries()}


def run_cleaning(log: PartitionLog, now_ms: int, cfg=EAGER, storage=None):
    plan = log.cleanable(now_ms, None, cfg)
    if plan is None:
        return None
    plan = pickle.loads(pickle.dumps(plan))
    result = cleaner.clean(log.storage if storage is None else storage, plan)
    result = pickle.loads(pickle.dumps(result))
    log.finish_cleaning(result)
    return result


# --- unit tests -----------------------------------------------------------------------------------------------


def test_latest_value_per_key_kept_with_offsets_headers_and_timestamps():
    w = Writer(MemoryStorage())
    offsets = {}
    for i in range(30):
        key = b"k%d" % (i % 5)
        offsets[key] = w.data([(key, b"v%d" % i)], ts=1_000 + i)
    w.roll()
    w.data([(b"tail", b"t")])
    before = committed_view(w.log)
    result = run_cleaning(w.log, now_ms=10_000)
    assert result is not None and result.groups
    batches = all_batches(w.log)
    cleaned = [(h, r) for h, r in batches if h.base_offset < result.end_offset]
    kept = {r.key: (r.offset, r.value, r.headers, r.timestamp) for _, rs in cleaned for r in rs}
    assert len([r for _, rs in cleaned for r in rs]) == 5 + 0 or len(kept) == 5
    for key, (offset, val, headers, ts) in kept.items():
        assert offset == offsets[key]
        assert headers == [("h", b"x")]
        assert ts == 1_000 + int(val[1:])
    assert committed_view(w.log) == before
    offs = [r.offset for _, rs in batches for r in rs]
    assert offs == sorted(set(offs))
    # reads and indexes cope with the gaps: fetch from inside a gap returns the next batch
    gap = next(o for o in range(w.log.log_start_offset, w.log.log_end_offset) if o not in offs)
    data = w.log.read(gap, 1 << 20, w.log.log_end_offset)
    assert parse_batch_header(data).last_offset >= gap
    assert w.log.cleaner_checkpoint == result.end_offset


def test_cleaning_survives_reopen_and_checkpoint_is_durable():
    storage = MemoryStorage()
    w = Writer(storage, segment_bytes=300)
    for i in range(60):
        w.data([(b"k%d" % (i % 7), b"v%d" % i)])
    w.roll()
    before = committed_view(w.log)
    run_cleaning(w.log, 10_000)
    after = [(h.base_offset, [(r.offset, r.key, r.value) for r in rs]) for h, rs in all_batches(w.log)]
    crashed = storage.crash()
    log = PartitionLog.open(crashed, DIR, segment_bytes=300, now_ms=0)
    assert [(h.base_offset, [(r.offset, r.key, r.value) for r in rs]) for h, rs in all_batches(log)] == after
    assert committed_view(log) == before
    assert log.cleaner_checkpoint == w.log.cleaner_checkpoint > 0
    assert crashed.exists(f"{DIR}/{CLEANER_CHECKPOINT_NAME}")
    assert not [n for n in crashed.list(DIR) if n.endswith((".cleaned", ".swap"))]


def test_active_segment_and_lso_and_min_lag_bound_the_range():
    w = Writer(MemoryStorage())
    for i in range(20):
        w.data([(b"k", b"v%d" % i)], ts=1_000 + i)
    plan = w.log.cleanable(10_000, None, EAGER)
    assert plan is not None and all(s.base_offset != w.log.segment_base_offsets[-1] for s in plan.segments)
    assert w.log.cleanable(10_000, None, EAGER) is None     # one cleaning at a time
    w.log.abandon_cleaning()
    w.roll()
    plan = w.log.cleanable(10_000, 3, EAGER)   # an open transaction at offset 3
    assert plan is None or plan.end_offset <= 3
    w.log.abandon_cleaning()
    lagged = CleanerConfig(min_cleanable_dirty_ratio=0.0, min_compaction_lag_ms=100_000)
    assert w.log.cleanable(10_000, None, lagged) is None
    plan = w.log.cleanable(10_000, None, EAGER)
    assert plan is not None and plan.end_offset == 20


def test_dirty_ratio_and_max_compaction_lag_forces():
    w = Writer(MemoryStorage())
    for i in range(20):
        w.data([(b"k%d" % i, b"v")], ts=1_000)
    w.roll()
    run_cleaning(w.log, 10_000)
    w.data([(b"k0", b"new")], ts=5_000)
    w.roll()
    lazy = CleanerConfig(min_cleanable_dirty_ratio=0.9)
    assert 0 < w.log.dirty_ratio(10_000, None, lazy) < 0.9
    assert w.log.cleanable(10_000, None, lazy) is None
    forcing = CleanerConfig(min_cleanable_dirty_ratio=0.9, max_compaction_lag_ms=1_000)
    plan = w.log.cleanable(10_000, None, forcing)
    assert plan is not None and plan.forced


def test_tombstone_kept_until_delete_horizon_then_removed():
    w = Writer(MemoryStorage())
    w.data([(b"a", b"1")])
    w.data([(b"b", b"1")])
    w.data([(b"a", None)])
    w.roll()
    w.data([(b"x", b"y")])
    run_cleaning(w.log, now_ms=10_000)   # first sight: horizon = 10_000 + 1_000
    tomb = [(h, r) for h, rs in all_batches(w.log) for r in rs if r.key == b"a"]
    assert len(tomb) == 1 and tomb[0][1].value is None
    assert tomb[0][0].has_delete_horizon and tomb[0][0].base_timestamp == 11_000
    assert tomb[0][1].timestamp == 1_000 + 0      # the record's own timestamp is kept
    w.data([(b"c", b"1")])
    w.roll()
    run_cleaning(w.log, now_ms=10_500)    # before the horizon: still there
    assert any(r.key == b"a" for _, rs in all_batches(w.log) for r in rs)
    w.data([(b"d", b"1")])
    w.roll()
    run_cleaning(w.log, now_ms=11_000)    # horizon reached: gone
    assert not any(r.key == b"a" for _, rs in all_batches(w.log) for r in rs)
    assert committed_view(w.log) == {b"b": b"1", b"x": b"y", b"c": b"1", b"d": b"1"}


def test_markers_two_pass_removal_and_aborted_data_removed():
    w = Writer(MemoryStorage())
    w.data([(b"a", b"1")], pid=7, transactional=True)
    w.end(7, commit=False)                        # aborted
    w.data([(b"a", b"2")], pid=8, transactional=True)
    w.end(8, commit=True)
    w.data([(b"a", b"3")], pid=9)                 # supersedes pid 8's record
    w.data([(b"z", b"z")])
    w.roll()
    w.data([(b"t", b"t")])
    before = producer_summary(w.log)
    run_cleaning(w.log, now_ms=10_000)
    batches = all_batches(w.log)
    assert not any(r.key == b"a" and r.value == b"1" for _, rs in batches for r in rs)
    markers = [h for h, _ in batches if h.is_control]
    # pid 7's batch is its last: kept empty, so its marker stays; pid 8's batch likewise
    assert {h.producer_id for h in markers} == {7, 8}
    assert producer_summary(w.log) == before
    assert committed_view(w.log) == {b"a": b"3", b"z": b"z", b"t": b"t"}


def test_marker_removed_after_horizon_once_no_data_remains():
    w = Writer(MemoryStorage())
    w.data([(b"a", b"1")], pid=8, transactional=True)
    w.end(8, commit=True)
    w.data([(b"a", b"2")], pid=8, transactional=True)   # pid 8's last batch is a later one
    w.end(8, commit=True)
    w.data([(b"a", b"3")])
    w.roll()
    w.data([(b"t", b"t")])
    run_cleaning(w.log, now_ms=10_000)
    markers = [h for h, _ in all_batches(w.log) if h.is_control]
    assert len(markers) == 2    # first pass: the first txn's batch was seen, so its marker stays
    w.data([(b"u", b"u")])
    w.roll()
    run_cleaning(w.log, now_ms=10_000)
    markers = [h for h, _ in all_batches(w.log) if h.is_control]
    first = [h for h in markers if h.base_offset == 1]
    assert first and first[0].has_delete_horizon   # no data left: horizon set, marker kept for now
    w.data([(b"v", b"v")])
    w.roll()
    run_cleaning(w.log, now_ms=20_000)
    assert not [h for h, _ in all_batches(w.log) if h.is_control and h.base_offset == 1]
    assert [h for h, _ in all_batches(w.log) if h.is_control and h.base_offset == 3]   # data of it remains (empty)


def test_compressed_batches_keep_their_codec():
    w = Writer(MemoryStorage(), segment_bytes=2_000)
    for i in range(10):
        w.data([(b"k%d" % (j % 3), b"v%d-%d" % (i, j)) for j in range(6)], codec=compression.GZIP)
    w.roll()
    w.data([(b"t", b"t")])
    before = committed_view(w.log)
    run_cleaning(w.log, 10_000)
    cleaned = [h for h, rs in all_batches(w.log) if rs and h.base_offset < w.log.cleaner_checkpoint]
    assert cleaned and all(h.compression == compression.GZIP for h in cleaned)
    assert committed_view(w.log) == before


def test_idempotent_producer_continues_after_cleaning():
    w = Writer(MemoryStorage())
    for i in range(10):
        w.data([(b"k", b"v%d" % i)], pid=5)
    w.roll()
    w.data([(b"t", b"t")])
    run_cleaning(w.log, 10_000)
    m = ProducerStateManager()
    m.rebuild(w.log.iter_batch_headers())
    assert m.entry(5).last_seq == 9
    assert m.check(5, 0, 10, 0, False).accepted
    assert not m.check(5, 0, 12, 0, False).accepted


def test_unchanged_groups_are_not_rewritten_and_file_storage_subprocess_entry(tmp_path):
    storage = FileStorage(tmp_path)
    w = Writer(storage)
    for i in range(12):
        w.data([(b"k%d" % i, b"v")])
    w.roll()
    w.data([(b"t", b"t")])
    plan = w.log.cleanable(10_000, None, EAGER)
    result = cleaner.clean_directory(str(tmp_path), pickle.loads(pickle.dumps(plan)))
    assert result.groups == ()          # every key unique: nothing to rewrite
    w.log.finish_cleaning(result)
    assert w.log.cleaner_checkpoint == 12


# --- crash at every step of the swap ----------------------------------------------------------------------------


class _Stop(Exception):
    pass


class StepStorage(MemoryStorage):
    """A MemoryStorage that stops (as a crash would) before its n-th rename, remove or directory fsync."""

    def __init__(self) -> None:
        super().__init__()
        self.stop_at = None
        self.steps = 0

    def _step(self):
        if self.stop_at is not None:
            self.steps += 1
            if self.steps >= self.stop_at:
                raise _Stop()

    def rename(self, src, dst):
        self._step()
        super().rename(src, dst)

    def remove(self, path, missing_ok=False):
        self._step()
        super().remove(path, missing_ok)

    def sync_dir(self, directory):
        self._step()
        super().sync_dir(directory)

    def write_atomic(self, path, data, durable=True):
        self._step()
        super().write_atomic(path, data, durable)


def _build(storage, segment_bytes=300, roll_every=0):
    w = Writer(storage, segment_bytes=segment_bytes)
    for i in range(40):
        w.data([(b"k%d" % (i % 6), b"v%d" % i)], pid=3 if i % 4 == 0 else -1)
        if roll_every and i % roll_every == roll_every - 1:
            w.roll()
    w.data([(b"k0", None)])
    w.data([(b"x", b"1")], pid=4, transactional=True)
    w.end(4, commit=False)
    w.roll()
    w.data([(b"tail", b"t")])
    return w


def _content(log):
    return [(h.base_offset, h.last_offset, [(r.offset, r.key, r.value) for r in rs]) for h, rs in all_batches(log)]


def _slice(content, lo, hi):
    return [b for b in content if lo <= b[0] < hi]


@pytest.mark.parametrize("segment_bytes,roll_every", [(300, 0), (1_200, 3)])
def test_crash_at_every_step_leaves_old_or_new_segments(segment_bytes, roll_every):
    ref = _build(MemoryStorage(), segment_bytes, roll_every)
    old_content = _content(ref.log)
    old_view = committed_view(ref.log)
    old_producers = producer_summary(ref.log)
    run_cleaning(ref.log, 10_000)
    new_content = _content(ref.log)
    assert new_content != old_content
    step = 1
    seen = set()
    while True:
        storage = StepStorage()
        w = _build(storage, segment_bytes, roll_every)
        plan = w.log.cleanable(10_000, None, EAGER)
        result = cleaner.clean(w.log.storage, plan)
        if roll_every:
            assert any(len(g.old_bases) > 1 for g in result.groups)
        bounds = [(g.base_offset, g.next_offset) for g in result.groups]
        assert len(bounds) > 1
        storage.stop_at = storage.steps = 0
        storage.stop_at = step
        try:
            w.log.finish_cleaning(result)
            finished = True
        except _Stop:
            finished = False
        for torn in (False, True):
            crashed = storage.crash(torn_tail=torn)
            log = PartitionLog.open(crashed, DIR, segment_bytes=segment_bytes, now_ms=0)
            content = _content(log)
            # group by group (in order), each holds its old or its new batches, never a mixture
            state = [_slice(content, lo, hi) == _slice(new_content, lo, hi) for lo, hi in bounds]
            for (lo, hi), is_new in zip(bounds, state):
                assert _slice(content, lo, hi) == _slice(new_content if is_new else old_content, lo, hi), step
            assert state == sorted(state, reverse=True), step
            assert _slice(content, bounds[-1][1], 1 << 62) == _slice(old_content, bounds[-1][1], 1 << 62)
            seen.add(all(state))
            assert committed_view(log) == old_view
            assert producer_summary(log) == old_producers
            assert not [n for n in crashed.list(DIR) if n.endswith((".cleaned", ".swap"))]
            # and the recovered log cleans and reads again
            reopened = PartitionLog.open(crashed.crash(), DIR, segment_bytes=segment_bytes, now_ms=0)
            assert _content(reopened) == content
        if finished:
            break
        step += 1
    assert seen == {False, True} and step > 5


def test_failed_clean_leaves_log_untouched_and_abandon_removes_files():
    storage = MemoryStorage()
    w = _build(storage)
    before = _content(w.log)
    plan = w.log.cleanable(10_000, None, EAGER)
    storage.fail_next_write(1, after=1)
    with pytest.raises(OSError):
        cleaner.clean(w.log.storage, plan)
    w.log.abandon_cleaning(plan)
    assert not [n for n in storage.list(DIR) if n.endswith(".cleaned")]
    assert _content(w.log) == before
    assert run_cleaning(w.log, 10_000) is not None


def test_finish_drops_a_group_whose_segments_went_meanwhile():
    w = _build(MemoryStorage())
    plan = w.log.cleanable(10_000, None, EAGER)
    result = cleaner.clean(w.log.storage, plan)
    w.log.delete_records(w.log.segment_base_offsets[2])
    w.log.finish_cleaning(result)
    offs = [r.offset for _, rs in all_batches(w.log) for r in rs]
    assert offs == sorted(set(offs)) and offs[0] >= w.log.log_start_offset
    assert not [n for n in w.storage.list(DIR) if n.endswith((".cleaned", ".swap"))]


# --- property test against a model -----------------------------------------------------------------------------

KEYS = [b"a", b"b", b"c", b"d", b"e"]
PIDS = [11, 12]          # transactional producers
IDEMPOTENT = 21

op = st.one_of(
    st.tuples(st.just("put"), st.sampled_from(KEYS), st.one_of(st.none(), st.binary(min_size=1, max_size=4)),
              st.booleans()),
    st.tuples(st.just("txn"), st.sampled_from(PIDS), st.sampled_from(KEYS), st.binary(min_size=1, max_size=4)),
    st.tuples(st.just("end"), st.sampled_from(PIDS), st.booleans()),
    st.tuples(st.just("roll")),
    st.tuples(st.just("clean"), st.integers(0, 3_000)),
)


@settings(max_examples=int(__import__("os").environ.get("CLEANER_EXAMPLES", "60")), deadline=None,
          suppress_health_check=list(HealthCheck))
@given(st.lists(op, min_size=5, max_size=80), st.sampled_from([0, compression.GZIP]), st.sampled_from([250, 1_000]))
@example([("txn", 11, b"a", b"1"), ("end", 11, True), ("txn", 11, b"b", b"1"), ("end", 11, True),
          ("put", b"a", b"2", False), ("clean", 0), ("put", b"c", b"1", False), ("clean", 0),
          ("put", b"d", b"1", False), ("clean", 2000), ("put", b"e", b"1", False), ("clean", 2000)], 0, 250)
@example([("txn", 11, b"a", b"1"), ("end", 11, False), ("txn", 12, b"a", b"3"), ("txn", 11, b"b", b"1"),
          ("end", 11, True), ("clean", 0), ("put", b"c", None, True), ("clean", 0), ("end", 12, False),
          ("put", b"d", b"1", False), ("clean", 2000), ("txn", 11, b"c", b"2"), ("end", 11, True),
          ("clean", 2000), ("put", b"e", b"1", False), ("clean", 2000)], compression.GZIP, 1_000)
def test_cleaning_matches_the_model(ops, codec, segment_bytes):
    storage = MemoryStorage()
    w = Writer(storage, segment_bytes=segment_bytes)
    appended: list = []            # (key, value, transaction id or None), in log order
    aborted_txns: set = set()
    txn_id: dict[int, int] = {}    # producer id -> id of its open transaction
    pending: dict[int, list] = {}
    now = 10_000
    for o in ops:
        if o[0] == "put":
            _, key, val, idem = o
            w.data([(key, val)], pid=IDEMPOTENT if idem else -1, codec=codec)
            appended.append((key, val, None))
        elif o[0] == "txn":
            _, pid, key, val = o
            w.data([(key, val)], pid=pid, transactional=True, codec=codec)
            pending.setdefault(pid, []).append((key, val))
            tid = txn_id.setdefault(pid, len(appended))
            appended.append((key, val, tid))
        elif o[0] == "end":
            _, pid, commit = o
            if pid in pending:
                w.end(pid, commit)
                if not commit:
                    aborted_txns.add(txn_id[pid])
                del pending[pid], txn_id[pid]
        elif o[0] == "roll":
            if w.log.log_end_offset > w.log.segment_base_offsets[-1]:
                w.roll()
        else:
            now += o[1]
            if w.log.log_end_offset > w.log.segment_base_offsets[-1]:
                w.roll()                       # so that each cleaning has something dirty to do
            unstable = w.producers.first_unstable_offset()
            before_producers = producer_summary(w.log)
            before = all_batches(w.log)
            before_aborted = w.log.aborted_txns(0, w.log.log_end_offset)
            plan = w.log.cleanable(now, unstable, EAGER)
            if plan is not None:
                assert unstable is None or plan.end_offset <= unstable
                res = cleaner.clean(w.log.storage, pickle.loads(pickle.dumps(plan)))
                event(f"cleaning rewrote groups: {bool(res.groups)}")
                event(f"cleaning removed batches: {res.batches_removed > 0}")
                w.log.finish_cleaning(res)
                markers_before = sum(1 for h, _ in before if h.is_control)
                event(f"markers removed: {sum(1 for h, _ in all_batches(w.log) if h.is_control) < markers_before}")
                _check_clean(w.log, before, plan.end_offset)
                assert _consumer_view(all_batches(w.log), w.log.aborted_txns(0, w.log.log_end_offset),
                                      end=plan.end_offset) == _consumer_view(before, before_aborted,
                                                                             end=plan.end_offset)
            assert producer_summary(w.log) == before_producers
    for pid in list(pending):
        w.end(pid, True)
    w.data([(b"zz", b"end")])
    model = {}
    for key, val, tid in appended + [(b"zz", b"end", None)]:
        if tid not in aborted_txns:
            model[key] = val
    w.roll()
    before_producers = producer_summary(w.log)
    before = all_batches(w.log)
    result = run_cleaning(w.log, now + 5_000)
    if result is not None:
        _check_clean(w.log, before, result.end_offset)
    expected = {k: v for k, v in model.items() if v is not None}
    assert committed_view(w.log) == expected
    assert consumer_committed_view(w.log) == expected
    assert producer_summary(w.log) == before_producers
    # the next idempotent append is accepted
    m = ProducerStateManager()
    m.rebuild(w.log.iter_batch_headers())
    if IDEMPOTENT in w.seq:
        assert m.check(IDEMPOTENT, 0, w.seq[IDEMPOTENT], 0, False).accepted
    # a fetch from any offset, gaps included, starts at the batch holding the next offset there is
    offsets = sorted(h.last_offset for h, _ in all_batches(w.log))
    for o in range(w.log.log_start_offset, w.log.log_end_offset):
        header = parse_batch_header(w.log.read(o, 1, w.log.log_end_offset))
        assert header.last_offset == next(x for x in offsets if x >= o)
    # and everything survives a crash and reopen
    reopened = PartitionLog.open(storage.crash(), DIR, segment_bytes=segment_bytes, now_ms=0)
    assert committed_view(reopened) == expected
    assert _content(reopened) == _content(w.log)


def _check_clean(log: PartitionLog, before, end_offset: int) -> None:
    """Offsets strictly increasing, nothing invented, no aborted data and no duplicate key below the end."""
    originals = {r.offset: (r.key, r.value, r.timestamp, r.headers) for _, rs in before for r in rs}
    aborted = log.aborted_txns(0, log.log_end_offset)
    offs = []
    keys = set()
    for header, records in all_batches(log):
        for r in records:
            offs.append(r.offset)
            if not header.is_control:
                assert originals[r.offset] == (r.key, r.value, r.timestamp, r.headers)
            if r.offset < end_offset and not header.is_control:
                assert r.key not in keys
                keys.add(r.key)
                assert not (header.is_transactional and any(
                    t.producer_id == header.producer_id and t.first_offset <= r.offset < t.last_offset
                    for t in aborted))
    assert offs == sorted(set(offs))

    # read_uncommitted: the latest value per key is what it was, less aborted data below the cleaned end
    def latest(batches, drop_aborted_below):
        view = {}
        for header, records in batches:
            if header.is_control:
                continue
            if header.is_transactional and header.base_offset < drop_aborted_below and any(
                    t.producer_id == header.producer_id and t.first_offset <= header.base_offset < t.last_offset
                    for t in aborted):
                continue
            for r in records:
                view[r.key] = r.value
        return {k: v for k, v in view.items() if v is not None}
    assert latest(all_batches(log), 0) == latest(before, end_offset)


# --- more unit tests --------------------------------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.none(), st.binary(max_size=200)), st.one_of(st.none(), st.binary(max_size=300)),
                          st.integers(-10**6, 10**6)), min_size=1, max_size=20),
       st.sampled_from([0, compression.GZIP, compression.ZSTD]))
def test_scan_keys_agrees_with_decode_records(entries, codec):
    from trireme.wire.records import scan_keys
    batch = build_batch([(k, v, [("h", b"x")], 10**12 + ts) for k, v, ts in entries], base_offset=77,
                        compression=codec)
    assert scan_keys(batch) == [(r.offset, r.key, r.value is not None) for r in decode_records(batch)]


def test_rebuilt_batch_keeps_fields_and_crc():
    from trireme.wire.records import crc_ok, rebuild_batch
    batch = build_batch([(b"a", b"1", [("h", b"v")], 5_000), (b"b", None, None, 6_000), (b"c", b"3", None, 4_000)],
                        base_offset=100, producer_id=9, producer_epoch=2, base_sequence=40, transactional=True,
                        compression=compression.LZ4)
    header = parse_batch_header(batch)
    records = decode_records(batch)
    new = rebuild_batch(header, [records[0], records[2]], delete_horizon_ms=99_000)
    h2 = parse_batch_header(new)
    assert crc_ok(new, 0, h2)
    assert (h2.base_offset, h2.last_offset_delta, h2.producer_id, h2.producer_epoch, h2.base_sequence) == \
        (100, 2, 9, 2, 40)
    assert h2.compression == compression.LZ4 and h2.is_transactional and h2.has_delete_horizon
    assert h2.base_timestamp == 99_000 and h2.max_timestamp == 5_000
    assert [(r.offset, r.key, r.value, r.headers, r.timestamp) for r in decode_records(new)] == \
        [(100, b"a", b"1", [("h", b"v")], 5_000), (102, b"c", b"3", [], 4_000)]
    empty = rebuild_batch(header, [])
    h3 = parse_batch_header(empty)
    assert crc_ok(empty, 0, h3) and h3.records_count == 0 and h3.last_offset == 102 and h3.base_sequence == 40
    assert decode_records(empty) == []


def test_time_index_and_offset_for_timestamp_after_cleaning():
    w = Writer(MemoryStorage(), segment_bytes=100_000)
    for i in range(200):
        w.data([(b"k%d" % (i % 10), b"v%d" % i)], ts=1_000 + 10 * i)
    w.roll()
    w.data([(b"t", b"t")], ts=9_000)
    run_cleaning(w.log, 100_000)
    kept = [(r.offset, r.timestamp) for h, rs in all_batches(w.log) for r in rs if h.base_offset < 200]
    assert len(kept) == 10
    for ts in (0, 1_000, 2_905, 2_906, 2_990, 2_991):
        found = w.log.offset_for_timestamp(ts)
        expect = next(((o, t) for o, t in kept if t >= ts), None)
        if expect is None:
            assert found[0] >= 200
        else:
            assert found == expect
    reopened = PartitionLog.open(w.storage.crash(), DIR, segment_bytes=100_000, now_ms=0)
    assert reopened.offset_for_timestamp(2_905) == w.log.offset_for_timestamp(2_905)


def test_marker_that_is_a_producers_last_entry_is_kept_past_the_horizon():
    w = Writer(MemoryStorage())
    w.data([(b"a", b"1")], pid=8, transactional=True)
    w.end(8, commit=True)
    w.epoch[8] = 3
    w.end(8, commit=False)            # a marker with no data of its own: the producer's epoch 3 is only here
    w.data([(b"a", b"2")])
    w.roll()
    before = producer_summary(w.log)
    for now in (10_000, 20_000, 30_000):
        w.data([(b"x%d" % now, b"y")])
        w.roll()
        run_cleaning(w.log, now)
    assert producer_summary(w.log) == before
    assert producer_summary(w.log)[8][0] == 3


def _clean_in_child(data_dir, plan):
    return cleaner.clean_directory(data_dir, plan)


def test_clean_runs_in_a_fresh_subprocess(tmp_path):
    import multiprocessing
    w = Writer(FileStorage(tmp_path))
    for i in range(30):
        w.data([(b"k%d" % (i % 3), b"v%d" % i)])
    w.roll()
    w.data([(b"t", b"t")])
    before = committed_view(w.log)
    plan = w.log.cleanable(10_000, None, EAGER)
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        result = pool.apply(_clean_in_child, (str(tmp_path), plan))
    assert w.log.finish_cleaning(result) == len(result.groups) > 0
    assert committed_view(w.log) == before
    assert sum(len(rs) for h, rs in all_batches(w.log) if h.base_offset < 30) == 3


def test_recovery_when_renames_reach_the_disk_out_of_order():
    """A file system may make the log file's rename durable before the index files' ones: a committed swap
    still finds its index files (as .cleaned), and an uncommitted one leaves the old segment intact."""
    from trireme.state.log import cleaned_name
    for commit in (True, False):
        storage = MemoryStorage()
        w = _build(storage, 1_200, 3)
        old = _content(w.log)
        plan = w.log.cleanable(10_000, None, EAGER)
        result = cleaner.clean(w.log.storage, plan)
        group = result.groups[0]
        base = group.base_offset
        if commit:
            storage.rename(f"{DIR}/{cleaned_name(base, 'log')}", f"{DIR}/{cleaned_name(base, 'log', '.swap')}")
        else:
            for kind in ("index", "txnindex"):
                storage.rename(f"{DIR}/{cleaned_name(base, kind)}", f"{DIR}/{cleaned_name(base, kind, '.swap')}")
        storage.sync_dir(DIR)
        log = PartitionLog.open(storage.crash(), DIR, segment_bytes=1_200, now_ms=0)
        content = _content(log)
        lo, hi = base, group.next_offset
        ref = _build(MemoryStorage(), 1_200, 3)
        ref_plan = ref.log.cleanable(10_000, None, EAGER)
        new = _content(ref.log) if not commit else None
        if commit:
            ref.log.finish_cleaning(cleaner.clean(ref.log.storage, ref_plan))
            new = _content(ref.log)
            assert _slice(content, lo, hi) == _slice(new, lo, hi) != _slice(old, lo, hi)
            assert len(log.segment_base_offsets) == len(w.log.segment_base_offsets) - len(group.old_bases) + 1
        else:
            assert content == old
        assert log.aborted_txns(0, log.log_end_offset) == w.log.aborted_txns(0, w.log.log_end_offset) != []
        assert _slice(content, hi, 1 << 62) == _slice(old, hi, 1 << 62)
        assert not [n for n in log._storage.list(DIR) if n.endswith((".cleaned", ".swap"))]


def test_crash_during_clean_leaves_the_old_log():
    storage = MemoryStorage()
    w = _build(storage)
    old = _content(w.log)
    cleaner.clean(w.log.storage, w.log.cleanable(10_000, None, EAGER))
    crashed = storage.crash(torn_tail=True)
    log = PartitionLog.open(crashed, DIR, segment_bytes=300, now_ms=0)
    assert _content(log) == old
    assert not [n for n in crashed.list(DIR) if n.endswith((".cleaned", ".swap"))]


def test_throttle_sees_every_chunk_and_a_full_map_cleans_in_steps():
    w = Writer(MemoryStorage(), segment_bytes=300)
    for i in range(60):
        w.data([(b"k%d" % i, b"v")])          # 60 distinct keys
    for i in range(60):
        w.data([(b"k%d" % i, b"w")])          # each superseded once
    w.roll()
    w.data([(b"t", b"t")])
    expected = committed_view(w.log)
    small = CleanerConfig(min_cleanable_dirty_ratio=0.0, max_map_keys=20)
    seen = []
    plan = w.log.cleanable(10_000, None, small)
    result = cleaner.clean(w.log.storage, plan, throttle=seen.append)
    assert sum(seen) >= result.bytes_read > 0
    assert result.end_offset < plan.end_offset       # the map filled: only part of the range was cleaned
    w.log.finish_cleaning(result)
    assert w.log.cleaner_checkpoint == result.end_offset
    for _ in range(20):
        if run_cleaning(w.log, 10_000, small) is None:
            break
    assert w.log.cleaner_checkpoint == plan.end_offset
    assert committed_view(w.log) == expected
    assert sum(len(rs) for h, rs in all_batches(w.log) if h.base_offset < plan.end_offset) == 60


def test_failed_fsync_during_the_swap_recovers_to_old_or_new_segments():
    ref = _build(MemoryStorage(), 1_200, 3)
    old_content = _content(ref.log)
    run_cleaning(ref.log, 10_000)
    new_content = _content(ref.log)
    k = 0
    while True:
        storage = MemoryStorage()
        w = _build(storage, 1_200, 3)
        result = cleaner.clean(w.log.storage, w.log.cleanable(10_000, None, EAGER))
        bounds = [(g.base_offset, g.next_offset) for g in result.groups]
        storage.fail_next_sync(1, after=k)
        try:
            w.log.finish_cleaning(result)
            done = True
        except OSError:
            done = False
        log = PartitionLog.open(storage.crash(), DIR, segment_bytes=1_200, now_ms=0)
        content = _content(log)
        for lo, hi in bounds:
            assert _slice(content, lo, hi) in (_slice(old_content, lo, hi), _slice(new_content, lo, hi)), k
        assert committed_view(log) == committed_view(ref.log)
        if done:
            break
        k += 1
    assert k > 3


@pytest.mark.parametrize("final_checkpoint_written", [True, False])
def test_cleaned_segments_without_indexes_recover_with_their_gaps(final_checkpoint_written):
    storage = MemoryStorage()
    w = _build(storage, 1_200, 3)
    result = run_cleaning(w.log, 10_000)
    content = _content(w.log)
    if not final_checkpoint_written:   # a crash after the swaps, before the first dirty offset moved
        storage.write_atomic(f"{DIR}/{CLEANER_CHECKPOINT_NAME}", b"0\n0\n%d\n" % result.end_offset)
    for name in storage.list(DIR):
        if name.endswith((".index", ".timeindex")):
            storage.remove(f"{DIR}/{name}")
    storage.sync_dir(DIR)
    log = PartitionLog.open(storage.crash(), DIR, segment_bytes=1_200, now_ms=0)
    assert _content(log) == content
    assert log.cleaner_checkpoint == (result.end_offset if final_checkpoint_written else 0)


def test_clean_in_a_worker_thread_while_the_log_takes_appends(tmp_path):
    import threading
    w = Writer(FileStorage(tmp_path), segment_bytes=600)
    for i in range(80):
        w.data([(b"k%d" % (i % 9), b"v%d" % i)])
    w.roll()
    plan = w.log.cleanable(10_000, None, EAGER)
    out = {}
    worker = threading.Thread(target=lambda: out.setdefault("result", cleaner.clean(w.log.storage, plan)))
    worker.start()
    for i in range(80):                       # appends, rolls and flushes go on meanwhile
        w.data([(b"k%d" % (i % 9), b"late%d" % i)])
    worker.join(60)
    assert not worker.is_alive()
    w.log.finish_cleaning(out["result"])
    view = committed_view(w.log)
    assert view == {b"k%d" % (i % 9): b"late%d" % i for i in range(80)}
    assert sum(len(rs) for h, rs in all_batches(w.log) if h.base_offset < plan.end_offset) == 9


def test_removed_abort_marker_takes_its_index_entry_with_it():
    """Once an ABORT marker is gone its aborted-transaction entry must go too: a read_committed Java consumer
    puts the producer in its aborted set at the entry's first offset and takes it out only at an ABORT marker,
    so a stale entry would hide the producer's later committed transactions."""
    w = Writer(MemoryStorage())
    w.data([(b"a", b"aborted")], pid=7, transactional=True)
    w.end(7, commit=False)
    w.data([(b"b", b"committed")], pid=7, transactional=True)
    w.end(7, commit=True)
    w.data([(b"c", b"1")], pid=9)
    w.roll()
    expected = {b"b": b"committed", b"c": b"1"}
    for now in (10_000, 10_100, 20_000, 30_000):
        w.data([(b"x", b"%d" % now)], pid=9)
        w.roll()
        run_cleaning(w.log, now)
        expected[b"x"] = b"%d" % now
        assert consumer_committed_view(w.log) == expected, now
    assert not [h for h, _ in all_batches(w.log) if h.is_control and h.base_offset == 1]   # the marker went
    assert w.log.aborted_txns(0, w.log.log_end_offset) == []
    w.data([(b"d", b"aborted")], pid=7, transactional=True)    # a later entry, chained to the dropped one
    w.end(7, commit=False)
    later = w.log.aborted_txns(0, w.log.log_end_offset)
    assert len(later) == 1
    reopened = PartitionLog.open(w.storage.crash(), DIR, segment_bytes=400, now_ms=0)
    assert reopened.aborted_txns(0, reopened.log_end_offset) == later    # start-up accepts the broken link
    assert consumer_committed_view(reopened) == expected


def test_old_segments_are_cut_down_step_by_step_then_closed(tmp_path, monkeypatch):
    """The swap's commit retires the old segments as retention does (on_retired, take_retired); release_files(pause)
    frees a cleaned-away log file RELEASE_STEP_BYTES at a time, pause() between the cuts, and leaves no descriptor of
    a deleted file open."""
    import math
    import os

    from trireme.state import log as log_mod
    monkeypatch.setattr(log_mod, "RELEASE_STEP_BYTES", 256)
    w = Writer(FileStorage(tmp_path), segment_bytes=2000)
    for i in range(120):
        w.data([(b"k%d" % (i % 5), b"v%d" % i)])
    w.roll()
    w.data([(b"t", b"t")])
    plan = w.log.cleanable(10_000, None, EAGER)
    told = []
    w.log.on_retired = lambda: told.append(1)
    finish = w.log.begin_finish(cleaner.clean(w.log.storage, plan))
    finish.files()
    assert finish.commit() > 0 and told == [1]
    writable, handles = w.log.take_retired()
    sizes = [h.size for h in writable]
    assert len(sizes) >= 2 and set(sizes) <= {ref.size for ref in plan.segments}
    cuts = []
    log_mod.release_files(writable, handles, lambda: cuts.append(1))
    assert len(cuts) == sum(math.ceil(s / 256) - 1 for s in sizes)
    fd_dir = "/proc/self/fd"
    if os.path.isdir(fd_dir):
        for fd in os.listdir(fd_dir):
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            assert not (target.startswith(str(tmp_path)) and target.endswith("(deleted)")), target
    assert committed_view(w.log) == {b"k%d" % (i % 5): b"v%d" % i for i in range(115, 120)} | {b"t": b"t"}


def test_a_durable_cleaning_fsyncs_its_new_segment_as_it_writes(monkeypatch):
    """Every SYNC_STEP_BYTES written (in _CHUNK writes), not only once at the end of the new segment."""
    def syncs_of_a_cleaning(step: int) -> tuple[int, dict]:
        monkeypatch.setattr(cleaner, "_CHUNK", 256)
        monkeypatch.setattr(cleaner, "SYNC_STEP_BYTES", step)
        storage = MemoryStorage()
        w = Writer(storage, segment_bytes=100_000)
        for i in range(200):
            w.data([(b"k%d" % i, b"v" * 40)])       # unique keys: everything is kept, ~20 KB of output
        w.data([(b"k0", b"new")])
        w.roll()
        w.data([(b"t", b"t")])
        plan = w.log.cleanable(10_000, None, EAGER)
        assert plan.durable
        before = storage.syncs
        w.log.finish_cleaning(cleaner.clean(storage, plan))
        return storage.syncs - before, committed_view(w.log)

    at_end, view = syncs_of_a_cleaning(1 << 40)
    as_written, same_view = syncs_of_a_cleaning(2048)
    assert as_written >= at_end + 5                      # ~20 KB in 2 KB steps
    assert view == same_view and view[b"k0"] == b"new" and len(view) == 201
