"""Batch write to Kafka and read it back with Spark's built-in ``kafka`` source/sink.

1. Builds a DataFrame of ``--count`` rows with the columns the Kafka sink
   understands: ``key``, ``value``, ``headers`` (array<struct<key: string,
   value: binary>>) and ``partition`` (row i goes to partition
   i % --partitions), and writes it with ``df.write.format("kafka")``.
2. Reads the topic back with ``spark.read.format("kafka")`` from
   ``startingOffsets=earliest`` to ``endingOffsets=latest`` with
   ``kafka.isolation.level=read_committed`` and checks every row of this run
   (keys are prefixed with the run id, so the topic may hold older data).
3. Reads a bounded slice of partition 0 with per-partition JSON
   ``startingOffsets``/``endingOffsets`` and checks exactly that slice comes back.

Prints the counts; exits with status 1 on any mismatch.

    python spark_examples/batch_write_read.py --bootstrap 127.0.0.1:9092 \\
        --topic spark-batch --partitions 3 --count 300

Before Spark starts, the topic is created with --partitions partitions if it
does not exist; an existing topic needs at least --partitions partitions (the
example exits with one line saying so otherwise).
"""
from __future__ import annotations

import argparse
import json
import sys
import uuid
from collections import Counter

from common import NeededTopic, build_spark, ensure_topics, report


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bootstrap", default="127.0.0.1:9092",
                   help="Kafka bootstrap servers (default: %(default)s)")
    p.add_argument("--topic", default="spark-batch", help="topic to write and read (default: %(default)s)")
    p.add_argument("--partitions", type=int, default=1,
                   help="spread rows over partitions 0..N-1 of the topic; a missing topic is created "
                        "with N partitions (default: %(default)s)")
    p.add_argument("--count", type=int, default=100, help="rows to write (default: %(default)s)")
    p.add_argument("--run-id", default=None,
                   help="prefix of this run's keys (default: a random one)")
    p.add_argument("--skip-write", action="store_true",
                   help="only read and check the rows of an earlier run (needs --run-id)")
    args = p.parse_args(argv)
    if args.partitions < 1 or args.count < 1:
        p.error("--partitions and --count must be positive")
    if args.skip_write and not args.run_id:
        p.error("--skip-write needs the --run-id of the run to check")
    args.run_id = args.run_id or uuid.uuid4().hex[:12]
    return args


def expected_row(run_id: str, i: int, partitions: int) -> tuple:
    """(key, value, headers, partition) of row i."""
    return (f"{run_id}:{i}", f"value-{i}",
            [("run", run_id.encode()), ("index", str(i).encode())],
            i % partitions)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    ensure_topics(args.bootstrap, [NeededTopic(
        args.topic, args.partitions, at_least=args.partitions,
        why=f"rows go to partitions 0..{args.partitions - 1}; see --partitions")])
    spark = build_spark("trireme-batch-write-read")
    from pyspark.sql import functions as F
    from pyspark.sql.types import (ArrayType, BinaryType, IntegerType, StringType,
                                   StructField, StructType)

    problems: list[str] = []
    try:
        # ------------------------------------------------------------ write
        if not args.skip_write:
            headers_type = ArrayType(StructType([StructField("key", StringType()),
                                                 StructField("value", BinaryType())]))
            schema = StructType([
                StructField("key", StringType()),
                StructField("value", StringType()),
                StructField("headers", headers_type),
                StructField("partition", IntegerType()),
            ])
            rows = [expected_row(args.run_id, i, args.partitions) for i in range(args.count)]
            df = spark.createDataFrame(rows, schema)
            (df.write
               .format("kafka")
               .option("kafka.bootstrap.servers", args.bootstrap)
               .option("topic", args.topic)
               .save())
            print(f"wrote {args.count} rows to {args.topic} (run {args.run_id})")

        # ------------------------------------------------------- full read
        full = (spark.read
                .format("kafka")
                .option("kafka.bootstrap.servers", args.bootstrap)
                .option("subscribe", args.topic)
                .option("startingOffsets", "earliest")
                .option("endingOffsets", "latest")
                .option("includeHeaders", "true")
                .option("kafka.isolation.level", "read_committed")
                .load())
        total = full.count()
        mine = (full
                .where(F.col("key").cast("string").startswith(args.run_id + ":"))
                .select(F.col("key").cast("string").alias("key"),
                        F.col("value").cast("string").alias("value"),
                        "headers", "partition", "offset")
                .collect())
        print(f"read {total} rows from {args.topic}; {len(mine)} from run {args.run_id}")

        seen: Counter[int] = Counter()
        for row in mine:
            i = int(row.key.rsplit(":", 1)[1])
            seen[i] += 1
            _, value, headers, partition = expected_row(args.run_id, i, args.partitions)
            got_headers = [(h.key, bytes(h.value)) for h in (row.headers or [])]
            if (row.value, got_headers, row.partition) != (value, headers, partition):
                problems.append(f"row {i}: got value={row.value!r} headers={got_headers!r} "
                                f"partition={row.partition}, expected value={value!r} "
                                f"headers={headers!r} partition={partition}")
        missing = [i for i in range(args.count) if i not in seen]
        dupes = sorted(i for i, n in seen.items() if n > 1)
        extra = sorted(i for i in seen if not 0 <= i < args.count)
        if len(mine) != args.count:
            problems.append(f"expected {args.count} rows of run {args.run_id}, read {len(mine)}")
        if missing:
            problems.append(f"missing rows: {missing[:20]}{' ...' if len(missing) > 20 else ''}")
        if dupes:
            problems.append(f"duplicated rows: {dupes[:20]}")
        if extra:
            problems.append(f"unexpected row indexes: {extra[:20]}")
        per_partition = Counter(row.partition for row in mine)
        print("rows per partition:", dict(sorted(per_partition.items())))

        # ---------------------------------------------------- bounded read
        p0 = sorted(row.offset for row in mine if row.partition == 0)
        if len(p0) >= 3 and p0[-1] - p0[0] == len(p0) - 1:
            start, end = p0[0] + 1, p0[0] + 3       # end is exclusive
            bounded = (spark.read
                       .format("kafka")
                       .option("kafka.bootstrap.servers", args.bootstrap)
                       .option("assign", json.dumps({args.topic: [0]}))
                       .option("startingOffsets", json.dumps({args.topic: {"0": start}}))
                       .option("endingOffsets", json.dumps({args.topic: {"0": end}}))
                       .option("kafka.isolation.level", "read_committed")
                       .load()
                       .select("offset")
                       .collect())
            offsets = sorted(r.offset for r in bounded)
            print(f"bounded read of partition 0 [{start}, {end}): offsets {offsets}")
            if offsets != list(range(start, end)):
                problems.append(f"bounded read of partition 0 [{start}, {end}) returned "
                                f"offsets {offsets}")
        else:
            print("bounded read skipped (fewer than 3 contiguous rows of this run in partition 0)")
    finally:
        spark.stop()
    return report(problems)


if __name__ == "__main__":
    sys.exit(main())
