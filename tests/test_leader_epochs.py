"""The leader-epoch cache (state/leader_epochs.py) answers OffsetsForLeaderEpoch as Kafka's LeaderEpochFileCache."""
from hypothesis import given, strategies as st

from trireme.state.leader_epochs import LeaderEpochCache

# A log as its batches' (leader epoch, record count): epochs never fall along a log a leader wrote.
logs = st.lists(st.tuples(st.integers(0, 6), st.integers(1, 5)), max_size=12).map(
    lambda batches: [(sum(d for d, _ in batches[:i + 1]), n) for i, (_, n) in enumerate(batches)])


def _batches(log):
    """[(epoch, base offset)] and the log end of a generated log."""
    out, offset = [], 0
    for epoch, count in log:
        out.append((epoch, offset))
        offset += count
    return out, offset


def _kafka_answer(batches, log_end, requested):
    """What Kafka's leader answers, read off the batches themselves: the largest epoch ≤ requested (requested when
    none is) ending where the first batch of a later epoch begins, or at the log end for the latest epoch."""
    epochs = sorted({e for e, _ in batches})
    if requested == -1 or not epochs or requested > epochs[-1]:
        return -1, -1
    if requested == epochs[-1]:
        return requested, log_end
    end = next(base for e, base in batches if e > requested)
    below = [e for e in epochs if e <= requested]
    return (below[-1] if below else requested), end


@given(logs, st.integers(-1, 40))
def test_a_cache_built_from_the_batches_answers_as_kafka(log, requested):
    batches, log_end = _batches(log)
    cache = LeaderEpochCache()
    for epoch, base in batches:
        cache.assign(epoch, base)
    assert cache.end_offset_for(requested, log_end) == _kafka_answer(batches, log_end, requested)


@given(logs)
def test_each_offset_belongs_to_the_epoch_of_its_batch(log):
    batches, log_end = _batches(log)
    cache = LeaderEpochCache(batches)
    for i, (epoch, base) in enumerate(batches):
        end = batches[i + 1][1] if i + 1 < len(batches) else log_end
        assert {cache.epoch_for_offset(o) for o in range(base, end)} == {epoch}


@given(logs, st.integers(0, 40), st.integers(-1, 40))
def test_taking_the_partition_at_a_new_epoch_starts_it_at_the_log_end(log, gap, requested):
    """Kafka's assign when becoming leader: (new epoch, log end); the previous epoch now ends there."""
    batches, log_end = _batches(log)
    cache = LeaderEpochCache(batches)
    new_epoch = cache.latest_epoch + 1 + gap
    cache.assign(new_epoch, log_end)
    assert cache.latest_epoch == new_epoch
    assert cache.end_offset_for(new_epoch, log_end) == (new_epoch, log_end)
    expected = _kafka_answer(batches + [(new_epoch, log_end)], log_end, requested)
    assert cache.end_offset_for(requested, log_end) == expected


def test_assign_keeps_the_first_start_of_an_epoch_and_drops_conflicting_entries():
    cache = LeaderEpochCache([(0, 0), (2, 10), (2, 15)])
    assert cache.entries() == [(0, 0), (2, 10)]
    cache.assign(2, 5)                      # the same epoch starting earlier replaces it
    assert cache.entries() == [(0, 0), (2, 5)]
    cache.assign(1, 7)                      # an older epoch: the later entries that contradict it go
    assert cache.entries() == [(0, 0), (1, 7)]
    cache.assign(3, 7)                      # the same start: the previous epoch had no batch
    assert cache.entries() == [(0, 0), (3, 7)]


def test_truncate_from_start_keeps_the_epoch_of_the_new_log_start():
    cache = LeaderEpochCache([(0, 0), (2, 10), (5, 20)])
    cache.truncate_from_start(12)
    assert cache.entries() == [(2, 12), (5, 20)]
    assert cache.end_offset_for(0, 30) == (0, 12)       # older than any entry: its own epoch, the first start
    assert cache.end_offset_for(3, 30) == (2, 20)
    cache.truncate_from_start(20)
    assert cache.entries() == [(5, 20)]
    cache.truncate_from_start(20)
    assert cache.entries() == [(5, 20)]
    assert cache.end_offset_for(5, 30) == (5, 30)
    assert cache.end_offset_for(6, 30) == (-1, -1)


def test_an_empty_cache_knows_no_epoch():
    assert LeaderEpochCache().end_offset_for(0, 0) == (-1, -1)
    assert LeaderEpochCache().latest_epoch == -1
    assert LeaderEpochCache().epoch_for_offset(0) == -1
    assert LeaderEpochCache([(3, 10)]).epoch_for_offset(9) == -1
