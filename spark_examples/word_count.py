"""Structured Streaming word count over a Kafka topic, printed to the console.

The classic example: each record's value is a line of text; the query splits
lines into lower-cased words, keeps a running count per word and prints the
whole table (output mode ``complete``) to stdout after every micro-batch.
With ``trigger(availableNow=True)`` it counts everything in the topic, prints
the result and stops (a plain ``.start()`` without the trigger would keep
running and update the counts as lines arrive).  A missing topic is created
(``--partitions``) before Spark starts.

    python spark_examples/word_count.py --bootstrap 127.0.0.1:9092 --topic lines
"""
from __future__ import annotations

import argparse
import sys

from common import NeededTopic, build_spark, ensure_topics


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bootstrap", default="127.0.0.1:9092",
                   help="Kafka bootstrap servers (default: %(default)s)")
    p.add_argument("--topic", default="lines", help="topic of text lines (default: %(default)s)")
    p.add_argument("--partitions", type=int, default=2,
                   help="partitions of --topic when it does not exist yet and is created "
                        "(default: %(default)s)")
    p.add_argument("--checkpoint", default=None,
                   help="checkpoint directory; without one each run starts from scratch "
                        "(Spark uses a temporary directory)")
    p.add_argument("--max-rows", type=int, default=1000,
                   help="most words printed per batch (default: %(default)s)")
    args = p.parse_args(argv)
    if args.max_rows < 1 or args.partitions < 1:
        p.error("--max-rows and --partitions must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    ensure_topics(args.bootstrap, [NeededTopic(args.topic, args.partitions)])
    spark = build_spark("trireme-word-count")
    from pyspark.sql import functions as F

    try:
        lines = (spark.readStream
                 .format("kafka")
                 .option("kafka.bootstrap.servers", args.bootstrap)
                 .option("subscribe", args.topic)
                 .option("startingOffsets", "earliest")
                 .load()
                 .select(F.col("value").cast("string").alias("line")))

        words = (lines
                 .select(F.explode(F.split(F.lower(F.col("line")), r"\s+")).alias("word"))
                 .where(F.col("word") != ""))

        counts = words.groupBy("word").count().orderBy(F.desc("count"), F.asc("word"))

        writer = (counts.writeStream
                  .outputMode("complete")
                  .format("console")
                  .option("truncate", "false")
                  .option("numRows", str(args.max_rows))
                  .queryName("trireme_word_count")
                  .trigger(availableNow=True))
        if args.checkpoint:
            writer = writer.option("checkpointLocation", args.checkpoint)
        query = writer.start()
        query.awaitTermination()   # raises StreamingQueryException if the query failed
        lines_read = sum(p["numInputRows"] or 0 for p in query.recentProgress)
        print(f"word count done: {lines_read} lines read from {args.topic}", flush=True)
        return 0
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
