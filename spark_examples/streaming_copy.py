"""Structured Streaming: copy a Kafka topic to another one, upper-casing the values.

Reads ``--source`` with ``spark.readStream.format("kafka")`` from
``startingOffsets=earliest`` (headers included, read_committed), upper-cases
each value, and writes key/value/headers/partition to ``--sink`` with
``writeStream.format("kafka")``: each record goes to the partition it came
from, so the sink needs at least as many partitions as the source.  By
default the query runs with ``trigger(availableNow=True)``: it processes
everything in the source when it starts, then stops; ``--trigger-seconds N``
keeps it running (a micro-batch every N seconds) until interrupted.  Its
progress lives in ``--checkpoint``, so running the job again copies only what
arrived since.

Spark's kafka sink is at-least-once: a micro-batch that was written but not
yet committed to the checkpoint when the job died is written again when it
restarts, so the sink can then hold that batch's records twice.

Before Spark starts, a missing ``--source`` is created with ``--partitions``
partitions and a missing ``--sink`` with as many as the source has; an existing
sink with fewer partitions than the source is refused with one line.

Afterwards both topics are read in batch (read_committed) and compared: the
sink must hold exactly the source's records, upper-cased (so the sink should
be written by this job only).  Exits with status 1 on a mismatch.

    python spark_examples/streaming_copy.py --bootstrap 127.0.0.1:9092 \\
        --source spark-in --sink spark-out
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections import Counter

from common import NeededTopic, build_spark, ensure_topics, follow, report, with_options


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bootstrap", default="127.0.0.1:9092",
                   help="Kafka bootstrap servers (default: %(default)s)")
    p.add_argument("--source", default="spark-in", help="topic to read (default: %(default)s)")
    p.add_argument("--sink", default="spark-out", help="topic to write (default: %(default)s)")
    p.add_argument("--partitions", type=int, default=2,
                   help="partitions of --source when it does not exist yet and is created "
                        "(default: %(default)s)")
    p.add_argument("--checkpoint", default=None,
                   help="checkpoint directory (default: <tmp>/trireme-spark-checkpoints/"
                        "copy-<source>-to-<sink>; reused by later runs)")
    p.add_argument("--trigger-seconds", type=float, default=None,
                   help="run until interrupted, a micro-batch every N seconds "
                        "(default: trigger(availableNow=True), then stop)")
    p.add_argument("--max-offsets-per-trigger", type=int, default=None,
                   help="most offsets one micro-batch reads (Spark's maxOffsetsPerTrigger)")
    p.add_argument("--no-verify", action="store_true",
                   help="skip the comparison of the two topics afterwards")
    args = p.parse_args(argv)
    if args.source == args.sink:
        p.error("--source and --sink must differ")
    if args.partitions < 1:
        p.error("--partitions must be positive")
    if args.checkpoint is None:
        args.checkpoint = os.path.join(tempfile.gettempdir(), "trireme-spark-checkpoints",
                                       f"copy-{args.source}-to-{args.sink}")
    return args


def read_topic(spark, bootstrap: str, topic: str) -> list[tuple]:
    """Every record of a topic as (key, value, headers, partition), read in batch."""
    rows = (spark.read
            .format("kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .option("endingOffsets", "latest")
            .option("includeHeaders", "true")
            .option("kafka.isolation.level", "read_committed")
            .load()
            .select("key", "value", "headers", "partition")
            .collect())
    return [(None if r.key is None else bytes(r.key),
             None if r.value is None else bytes(r.value),
             tuple((h.key, None if h.value is None else bytes(h.value)) for h in (r.headers or [])),
             r.partition)
            for r in rows]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    ensure_topics(args.bootstrap, [
        NeededTopic(args.source, args.partitions),
        NeededTopic(args.sink, like=args.source,
                    why=f"each record keeps its partition: as many as {args.source}")])
    spark = build_spark("trireme-streaming-copy")
    from pyspark.sql import functions as F

    try:
        reader = with_options(spark.readStream.format("kafka"), {
            "kafka.bootstrap.servers": args.bootstrap,
            "subscribe": args.source,
            "startingOffsets": "earliest",
            "includeHeaders": "true",
            "kafka.isolation.level": "read_committed",
            "maxOffsetsPerTrigger": args.max_offsets_per_trigger,
        })

        upper = reader.load().select(
            "key",
            F.upper(F.col("value").cast("string")).alias("value"),
            "headers",
            "partition",
        )

        writer = (upper.writeStream
                  .format("kafka")
                  .option("kafka.bootstrap.servers", args.bootstrap)
                  .option("topic", args.sink)
                  .option("checkpointLocation", args.checkpoint)
                  .outputMode("append")
                  .queryName("trireme_streaming_copy"))
        if args.trigger_seconds:
            writer = writer.trigger(processingTime=f"{args.trigger_seconds} seconds")
        else:
            writer = writer.trigger(availableNow=True)
        copied = follow(writer.start)
        print(f"copied {copied} records from {args.source} to {args.sink} "
              f"(checkpoint {args.checkpoint})")

        if args.no_verify:
            return 0

        src = read_topic(spark, args.bootstrap, args.source)
        dst = read_topic(spark, args.bootstrap, args.sink)
        print(f"{args.source}: {len(src)} records; {args.sink}: {len(dst)} records")
        expected = Counter((k, None if v is None else v.decode("utf-8", "replace").upper().encode(), h, p)
                           for k, v, h, p in src)
        got = Counter(dst)
        missing = expected - got
        unexpected = got - expected
        problems = []
        if missing or unexpected:
            problems.append(f"{sum(missing.values())} source records missing from {args.sink}, "
                            f"{sum(unexpected.values())} unexpected records in it; missing "
                            f"{list(missing)[:5]}, unexpected {list(unexpected)[:5]}")
        return report(problems)
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
