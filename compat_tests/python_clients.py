"""Shared data and checks for the Python client compat tests
(test_confluent_kafka.py, test_kafka_python.py, test_aiokafka.py).

Each client test builds the same record set with ``make_records``, produces
it with the client, turns what the client acknowledged and what it consumed
back into ``Got`` tuples, and hands both to ``check_roundtrip``, which
compares every field and reports the first mismatches readably.
"""
from __future__ import annotations

import random
import time
import uuid
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
N_RECORDS = 10_000
N_PARTITIONS = 3

# Client-side timeouts: generous for 2 busy cores, but nothing waits forever.
OP_TIMEOUT_S = 30.0
CONSUME_DEADLINE_S = 60.0


def unique_topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def create_topics(bootstrap: str, names: Iterable[str], partitions: int) -> list[str]:
    """Create topics with confluent-kafka's AdminClient (the admin kept alive until every result is in)."""
    from confluent_kafka.admin import AdminClient, NewTopic
    names = list(names)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(n, partitions, 1) for n in names], operation_timeout=30).values():
        f.result(timeout=30)
    return names


def describe_transaction(bootstrap: str, transactional_id: str):
    """DescribeTransactions with kafka-python's admin client → its description of ``transactional_id``."""
    from kafka import KafkaAdminClient
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        return admin.describe_transactions([transactional_id])[transactional_id]
    finally:
        admin.close()


@dataclass(frozen=True)
class Rec:
    """One record to produce (``index`` is its position in the send order)."""
    index: int
    partition: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp: int


@dataclass(frozen=True)
class Got:
    """One record as a client consumed it, normalised across clients.
    ``create_time`` is True when the client says the timestamp type is
    CreateTime; ``headers`` is () when there are none."""
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp: int
    create_time: bool


def poll_values(consumer, count: int, what: str, timeout: float = CONSUME_DEADLINE_S) -> list[bytes | None]:
    """The values of the next ``count`` records a confluent-kafka consumer polls (fails after ``timeout``)."""
    values: list[bytes | None] = []
    deadline = time.monotonic() + timeout
    while len(values) < count:
        assert time.monotonic() < deadline, f"{what}: got {len(values)} of {count} records"
        m = consumer.poll(0.5)
        if m is not None and not m.error():
            values.append(m.value())
    return values


def make_records(n: int = N_RECORDS, *, null_header_values: bool = True,
                 null_key_and_value: bool = True, seed: int = 7,
                 partitions: int = N_PARTITIONS, base_ts: int | None = None) -> list[Rec]:
    """Records spread round-robin over ``partitions`` with:

    * keys (some NULL, one empty), values of 0..600 random bytes (some NULL
      tombstones, some empty, some highly compressible);
    * headers: none on every 7th record, otherwise several, including a
      repeated key (order matters), an empty value, a non-ASCII key and -
      when ``null_header_values`` - a NULL value;
    * with ``null_key_and_value`` some records have both key and value NULL
      (otherwise those get a key);
    * explicit CreateTime timestamps about an hour ago, deliberately NOT
      monotonic inside a partition (negative deltas within a batch).
    """
    rng = random.Random(seed)
    if base_ts is None:
        base_ts = int(time.time() * 1000) - 3_600_000
    out = []
    for i in range(n):
        if i % 101 == 5:
            key = None
        elif i == 17:
            key = b""
        else:
            key = b"key-%06d" % i
        if i % 211 == 9:
            value = None
        elif i % 211 == 10:
            value = b""
        elif i % 3 == 0:
            value = (b"compressible-%d-" % i) * rng.randint(1, 40)
        else:
            value = rng.randbytes(rng.randint(1, 600))
        if key is None and value is None and not null_key_and_value:
            key = b"key-%06d" % i
        if i % 7 == 0:
            headers: tuple = ()
        else:
            hs = [("idx", b"%d" % i), ("dup", b"first"), ("dup", b"second"), ("empty", b""),
                  ("ключ", "значение".encode())]
            if null_header_values:
                hs.insert(3, ("nil", None))
            if i % 5 == 0:
                hs.append(("dup", b"third-%d" % i))
            headers = tuple(hs)
        ts = base_ts + (i * 7919) % 200_000
        out.append(Rec(i, i % partitions, key, value, headers, ts))
    return out


def expected_by_position(records: Sequence[Rec],
                         acked: dict[int, tuple[int, int]]) -> dict[tuple[int, int], Rec]:
    """Check the acknowledgements (partition as asked, offsets dense from 0
    per partition, in send order per partition) and index the records by
    (partition, offset)."""
    assert len(acked) == len(records), f"{len(records) - len(acked)} records were not acknowledged"
    by_pos: dict[tuple[int, int], Rec] = {}
    per_partition: dict[int, list[tuple[int, int]]] = {}
    for rec in records:
        part, off = acked[rec.index]
        assert part == rec.partition, f"record {rec.index} acked on partition {part}, sent to {rec.partition}"
        assert (part, off) not in by_pos, f"two records acked at {(part, off)}"
        by_pos[(part, off)] = rec
        per_partition.setdefault(part, []).append((rec.index, off))
    for part, items in per_partition.items():
        offsets = [off for _, off in sorted(items)]
        assert offsets == list(range(len(offsets))), (
            f"partition {part}: acked offsets are not 0..{len(offsets) - 1} in send order: "
            f"first differences {_first_diffs(offsets, list(range(len(offsets))))}")
    return by_pos


def _first_diffs(a: list, b: list, n: int = 5) -> list:
    return [(i, x, y) for i, (x, y) in enumerate(zip(a, b)) if x != y][:n]


def check_roundtrip(records: Sequence[Rec], acked: dict[int, tuple[int, int]],
                    consumed: Iterable[Got]) -> None:
    """Every record consumed exactly once at the offset it was acked at,
    with identical key, value, headers (order and repeats), timestamp and
    CreateTime type; per partition the consumed offsets are dense."""
    by_pos = expected_by_position(records, acked)
    got = list(consumed)
    seen: dict[tuple[int, int], Got] = {}
    dupes = []
    for g in got:
        if (g.partition, g.offset) in seen:
            dupes.append((g.partition, g.offset))
        seen[(g.partition, g.offset)] = g
    assert not dupes, f"records consumed twice: {dupes[:10]}"
    missing = sorted(set(by_pos) - set(seen))
    extra = sorted(set(seen) - set(by_pos))
    assert not missing and not extra, (
        f"{len(missing)} records missing (first {missing[:10]}), {len(extra)} unexpected "
        f"(first {extra[:10]})")
    mismatches = []
    for pos, rec in sorted(by_pos.items()):
        g = seen[pos]
        want = Got(rec.partition, pos[1], rec.key, rec.value, rec.headers, rec.timestamp, True)
        if g != want:
            fields = [f for f in ("key", "value", "headers", "timestamp", "create_time")
                      if getattr(g, f) != getattr(want, f)]
            mismatches.append((pos, rec.index, {f: (_short(getattr(want, f)), _short(getattr(g, f)))
                                                for f in fields}))
    assert not mismatches, (f"{len(mismatches)} records differ (want, got); first: "
                            + "\n".join(repr(m) for m in mismatches[:5]))
    # Dense offsets per partition, in consumption order too.
    for part in {p for p, _ in by_pos}:
        offs = [g.offset for g in got if g.partition == part]
        assert offs == sorted(offs), f"partition {part} consumed out of order"
        assert offs == list(range(len(offs))), f"partition {part}: offsets not dense"


def assign_and_seek(consumer, tps: list, start: dict[int, int] | None) -> None:
    """kafka-python / aiokafka (the same consumer API here): assign() the
    TopicPartitions ``tps`` and seek() each to ``start[partition]`` (default
    offset 0)."""
    start = start or {}
    consumer.assign(tps)
    for tp in tps:
        consumer.seek(tp, start.get(tp.partition, 0))


class Collected:
    """What a client's consume() loop has read so far, against ``counts``
    (how many records it wants from each partition):

        c = Collected(counts)
        while c.want_more():
            for msg in <one fetch>:
                c.add(to_got(msg))

    ``want_more`` fails the test once CONSUME_DEADLINE_S has passed without
    all of them; ``got`` is every record in the order read."""

    def __init__(self, counts: dict[int, int]):
        self.counts = counts
        self.got: list[Got] = []
        self.per: dict[int, int] = {p: 0 for p in counts}
        self.deadline = time.monotonic() + CONSUME_DEADLINE_S

    def want_more(self) -> bool:
        if not any(self.per[p] < self.counts[p] for p in self.counts):
            return False
        assert time.monotonic() < self.deadline, f"consumed only {self.per} of {self.counts}"
        return True

    def add(self, g: Got) -> None:
        self.got.append(g)
        self.per[g.partition] += 1


def check_read_from(records: Sequence[Rec], acked: dict[int, tuple[int, int]], got: Sequence[Got],
                    partition: int, start: int, n: int = 5) -> None:
    """``got``, a read of ``partition`` after a seek to offset ``start`` (into
    the middle of the log), begins with the ``n`` records acked at ``start``,
    ``start + 1``, ...: same offsets, keys, values, headers and timestamps."""
    by_pos = expected_by_position(records, acked)
    want = [by_pos[(partition, o)] for o in range(start, start + n)]
    assert [(g.offset, g.key, g.value, g.headers, g.timestamp) for g in got[:n]] == \
        [(start + i, r.key, r.value, r.headers, r.timestamp) for i, r in enumerate(want)]


def _short(v):
    r = repr(v)
    return r if len(r) < 120 else r[:117] + "..."


def partition_counts(records: Sequence[Rec], partitions: int = N_PARTITIONS) -> dict[int, int]:
    counts = {p: 0 for p in range(partitions)}
    for r in records:
        counts[r.partition] += 1
    return counts


OFFSETS_PER_PARTITION = 20
OFFSETS_SPIKE = 12          # index (= offset) of each partition's max timestamp
OFFSETS_FIRST_FLUSH = 8     # records 0..7 of each partition go in a first produce call


def offsets_records(base_ts: int) -> list[Rec]:
    """60 records for the ListOffsets tests, round-robin over 3 partitions
    (``index = 3*i + p``, so record i of partition p lands at offset i).
    Timestamps: ``base_ts + 1000*i + p``, except record ``OFFSETS_SPIKE``
    which is 1e6 ms later (the max timestamp sits in the middle of the log).
    Produce ``[:3*OFFSETS_FIRST_FLUSH]`` and the rest separately so every
    partition has at least two batches."""
    out = []
    for i in range(OFFSETS_PER_PARTITION):
        for p in range(N_PARTITIONS):
            ts = base_ts + 1000 * i + p
            if i == OFFSETS_SPIKE:
                ts = base_ts + 1_000_000 + p
            out.append(Rec(N_PARTITIONS * i + p, p, b"k%d-%d" % (p, i), b"v%d-%d" % (p, i),
                           (("i", b"%d" % i),), ts))
    return out


def offsets_base_ts() -> int:
    """A ``base_ts`` for ``offsets_records``: an hour ago."""
    return int(time.time() * 1000) - 3_600_000


def offsets_produce_calls(records: Sequence[Rec]) -> list[Sequence[Rec]]:
    """``offsets_records`` split into the two produce calls described there."""
    split = N_PARTITIONS * OFFSETS_FIRST_FLUSH
    return [records[:split], records[split:]]


def offsets_acked(records: Sequence[Rec]) -> dict[int, tuple[int, int]]:
    """The acknowledgements ``offsets_records`` must get: {index: (partition,
    offset)}, record i of partition p at offset i."""
    return {r.index: (r.partition, r.index // N_PARTITIONS) for r in records}


def produce_offsets_records(produce: Callable[[Sequence[Rec]], dict[int, tuple[int, int]]]
                            ) -> tuple[int, list[Rec]]:
    """Produce ``offsets_records`` with a client's ``produce(records) ->
    {index: (partition, offset)}`` in the two calls, check where they were
    acked, and return (base_ts, records)."""
    base = offsets_base_ts()
    records = offsets_records(base)
    acked: dict[int, tuple[int, int]] = {}
    for batch in offsets_produce_calls(records):
        acked.update(produce(batch))
    assert acked == offsets_acked(records)
    return base, records


def spike_ts(base_ts: int, p: int) -> int:
    return base_ts + 1_000_000 + p


def timestamp_cases(base_ts: int) -> list[dict[int, tuple[int, tuple[int, int] | None]]]:
    """Offset-for-timestamp lookups on ``offsets_records(base_ts)``: each
    case maps partition -> (target timestamp, expected (offset, timestamp)
    or None when no record is that late).  Kafka answers with the FIRST
    record in log order whose timestamp is >= the target."""
    def case(f):
        return {p: f(p) for p in range(N_PARTITIONS)}
    return [
        case(lambda p: (base_ts - 10_000, (0, base_ts + p))),
        case(lambda p: (base_ts + p, (0, base_ts + p))),                       # exact
        case(lambda p: (base_ts + 5000 + p - 500, (5, base_ts + 5000 + p))),
        case(lambda p: (base_ts + 5000 + p, (5, base_ts + 5000 + p))),         # exact
        # Between record 14 and 15: only the spike at offset 12 is later.
        case(lambda p: (base_ts + 14_500 + p, (OFFSETS_SPIKE, spike_ts(base_ts, p)))),
        case(lambda p: (spike_ts(base_ts, p), (OFFSETS_SPIKE, spike_ts(base_ts, p)))),
        case(lambda p: (spike_ts(base_ts, p) + 1, None)),                      # later than all
    ]
