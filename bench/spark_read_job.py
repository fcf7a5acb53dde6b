"""The Spark side of bench/spark_read.py: batch reads of a whole topic with spark.read.format("kafka"), timed.

Runs under the interpreter that has PySpark; argv: bootstrap, topic, then isolation levels to read
in order (e.g. read_uncommitted read_committed read_uncommitted read_committed).  Each read counts
the records and sums their value lengths (so every value is fetched and decoded); it prints a JSON
line {"start": isolation} as it begins and {"isolation", "records", "bytes", "seconds", "tasks",
"cores"} when done.
"""
from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "spark_examples"))

from common import build_spark  # noqa: E402


def main() -> int:
    bootstrap, topic, *levels = sys.argv[1:]
    spark = build_spark("trireme-bench-spark-read")
    from pyspark.sql import functions as F

    try:
        for isolation in levels:
            df = (spark.read.format("kafka")
                  .option("kafka.bootstrap.servers", bootstrap)
                  .option("subscribe", topic)
                  .option("startingOffsets", "earliest")
                  .option("endingOffsets", "latest")
                  .option("kafka.isolation.level", isolation)
                  .load())
            print(json.dumps({"start": isolation}), flush=True)
            t0 = time.perf_counter()
            row = df.agg(F.count(F.lit(1)).alias("n"), F.sum(F.length("value")).alias("b")).collect()[0]
            seconds = time.perf_counter() - t0
            print(json.dumps({"isolation": isolation, "records": row.n, "bytes": row.b, "seconds": seconds,
                              "tasks": df.rdd.getNumPartitions(),
                              "cores": spark.sparkContext.defaultParallelism}), flush=True)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
