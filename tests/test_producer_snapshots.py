"""Producer state snapshots: a clean restart starts from the snapshot and replays nothing; a bad or stale one is ignored."""
import json

from trireme.server.broker import PRODUCER_SNAPSHOT, Broker
from trireme.server.clock import now_ms
from trireme.server.config import Config
from trireme.state.log import AbortedTxn
from trireme.wire import records as rec


TS = 1_700_000_000_000


def _broker(tmp_path) -> Broker:
    return Broker(Config(data_dir=str(tmp_path)))


def _crash(broker: Broker) -> None:
    """What kill -9 does to a broker's hold on its data directory: the kernel drops the lock (nothing is flushed)."""
    broker.data_dir_lock.release()


def _append(broker, partition, *, pid, epoch, seq, n=3, transactional=False):
    data = bytearray(rec.build_batch([(b"k", b"v%d" % i, [], TS) for i in range(n)], producer_id=pid,
                                     producer_epoch=epoch, base_sequence=seq, transactional=transactional,
                                     base_timestamp=TS))
    base, _, _ = partition.log.append(data, rec.validate_batches(data), now_ms())
    partition.producers.commit(pid, epoch, seq, n - 1, base, TS, transactional)
    return base


def _abort(broker, partition, *, pid, epoch):
    data = bytearray(rec.build_control_batch(False, producer_id=pid, producer_epoch=epoch, coordinator_epoch=0,
                                             timestamp=TS))
    offset, _, _ = partition.log.append(data, rec.validate_batches(data), now_ms())
    first = partition.producers.commit_end_txn(pid, epoch, offset, TS, 0)
    partition.log.add_aborted_txn(AbortedTxn(pid, first, offset, offset + 1))


def _fill(broker):
    broker.ensure_topic("t", 1)
    p = broker.partition("t", 0)
    _append(broker, p, pid=7, epoch=0, seq=0)
    _append(broker, p, pid=7, epoch=0, seq=3)
    _append(broker, p, pid=9, epoch=2, seq=0, transactional=True)
    _abort(broker, p, pid=9, epoch=2)
    _append(broker, p, pid=11, epoch=0, seq=0, transactional=True)       # left open
    p.log.sync(now_ms())
    return p


def _state(p):
    return (p.producers.snapshot(), p.last_stable_offset(), p.log.aborted_txns(0, p.log.log_end_offset))


def test_clean_restart_starts_from_the_snapshot(tmp_path):
    broker = _broker(tmp_path)
    p = _fill(broker)
    before = _state(p)
    end = p.log.log_end_offset
    broker.close()
    assert (tmp_path / "logs" / "t-0" / PRODUCER_SNAPSHOT).exists()
    again = _broker(tmp_path)
    q = again.partition("t", 0)
    assert q.snapshot_offset == end            # nothing after it to replay
    assert _state(q) == before
    assert q.last_stable_offset() == end - 3   # the open transaction still pins it
    again.close()


def test_crash_without_a_snapshot_replays_the_log(tmp_path):
    broker = _broker(tmp_path)
    p = _fill(broker)
    before = _state(p)
    # No close(): no snapshot, as after kill -9 before the first one.
    _crash(broker)
    again = _broker(tmp_path)
    q = again.partition("t", 0)
    assert q.snapshot_offset is None
    assert _state(q) == before


def test_snapshot_then_more_data_replays_only_the_tail(tmp_path):
    broker = _broker(tmp_path)
    p = _fill(broker)
    broker.close()
    broker = _broker(tmp_path)
    p = broker.partition("t", 0)
    start = p.log.log_end_offset
    _append(broker, p, pid=7, epoch=0, seq=6)
    _abort(broker, p, pid=11, epoch=0)
    p.log.sync(now_ms())
    before = _state(p)
    _crash(broker)
    again = _broker(tmp_path)                  # a crash: the snapshot is the one from the clean stop
    q = again.partition("t", 0)
    assert q.snapshot_offset == start
    assert _state(q) == before
    assert q.last_stable_offset() == q.log.high_watermark


def test_stale_or_corrupt_snapshot_is_ignored(tmp_path):
    broker = _broker(tmp_path)
    p = _fill(broker)
    before = _state(p)
    broker.close()
    path = tmp_path / "logs" / "t-0" / PRODUCER_SNAPSHOT
    doc = json.loads(path.read_bytes())
    doc["offset"] += 100                       # ahead of the log: the log lost its tail since
    doc["producers"] = []
    path.write_text(json.dumps(doc))
    again = _broker(tmp_path)
    q = again.partition("t", 0)
    assert q.snapshot_offset is None and _state(q) == before
    again.close()
    path.write_bytes(b"{not json")
    third = _broker(tmp_path)
    assert third.partition("t", 0).snapshot_offset is None and _state(third.partition("t", 0)) == before
