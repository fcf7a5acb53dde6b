"""One PySpark session driven over stdin/stdout with the JSON-lines protocol of compat_tests/clients.HarnessProcess.

Runs under the interpreter that has PySpark (TRIREME_SPARK_PYTHON), with the
SparkSession of spark_examples/common.py, so that a test module pays for one
JVM however many reads it makes.  Commands (one JSON object per line, one
answer each):

* ``{"op": "read", "options": {...}}``: ``spark.read.format("kafka")`` with
  these options (``kafka.bootstrap.servers`` added); answers ``rows`` (key and
  value as text, partition, offset, timestamp in ms, headers, ``split``: the
  Spark partition the row came from) and ``splits`` (the number of Spark
  partitions of the read);
* ``{"op": "write", "topic": ..., "rows": [{"key", "value", "partition"}],
  "options": {...}}``: ``df.write.format("kafka")`` of those rows (text key
  and value, a partition column when given) with these options
  (``kafka.bootstrap.servers`` and ``topic`` added); answers ``written``;
* ``{"op": "read_parquet", "path": ...}``: the rows of a Parquet table, as
  JSON (timestamps in ms);
* ``{"op": "exit"}``.

A failing command answers ``{"ok": false, "error": "<class>: <message>"}``.

HARNESS_CLIENT_CONFIG (a JSON object of Kafka client properties, set by
clients.HarnessProcess for a secured listener) goes to every read and write
as Spark takes client properties: ``kafka.``-prefixed options; a command's
own options win.
"""
from __future__ import annotations

import datetime
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "spark_examples"))


def jsonable(value):
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, datetime.datetime):
        return int(value.timestamp() * 1000)
    if hasattr(value, "asDict"):       # a Row (a tuple too)
        return {k: jsonable(v) for k, v in value.asDict().items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def main() -> int:
    bootstrap = sys.argv[1]
    # Answers go to the real stdout; everything else (the JVM inherits fd 1)
    # to stderr.
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    from common import build_spark, with_options
    from pyspark.sql import functions as F

    spark = build_spark("trireme-spark-harness", {"spark.sql.session.timeZone": "UTC"})
    client = {f"kafka.{k}": str(v) for k, v in json.loads(os.environ.get("HARNESS_CLIENT_CONFIG") or "{}").items()}

    def read(options: dict) -> dict:
        df = with_options(spark.read.format("kafka"),
                          {"kafka.bootstrap.servers": bootstrap, **client, **options}).load()
        rows = (df.select(F.col("key").cast("string").alias("key"),
                          F.col("value").cast("string").alias("value"),
                          "partition", "offset", F.unix_millis("timestamp").alias("timestamp"),
                          *(["headers"] if options.get("includeHeaders") == "true" else []),
                          F.spark_partition_id().alias("split"))
                .collect())
        return {"rows": [jsonable(r) for r in rows], "splits": df.rdd.getNumPartitions()}

    def write(topic: str, rows: list[dict], options: dict) -> dict:
        from pyspark.sql.types import IntegerType, StringType, StructField, StructType
        schema = StructType([StructField("key", StringType()), StructField("value", StringType()),
                             StructField("partition", IntegerType())])
        df = spark.createDataFrame([(r.get("key"), r.get("value"), r.get("partition")) for r in rows], schema)
        if all(r.get("partition") is None for r in rows):
            df = df.drop("partition")
        with_options(df.write.format("kafka"),
                     {"kafka.bootstrap.servers": bootstrap, **client, "topic": topic, **options}).save()
        return {"written": len(rows)}

    def read_parquet(path: str) -> dict:
        return {"rows": [jsonable(r) for r in spark.read.parquet(path).collect()]}

    try:
        for line in sys.stdin:
            cmd = json.loads(line)
            op = cmd.pop("op")
            if op == "exit":
                answers.write(json.dumps({"ok": True}) + "\n")
                break
            try:
                if op == "read":
                    answer = read(cmd["options"])
                elif op == "write":
                    answer = write(cmd["topic"], cmd["rows"], cmd.get("options") or {})
                elif op == "read_parquet":
                    answer = read_parquet(cmd["path"])
                else:
                    raise ValueError(f"unknown op {op!r}")
                answer["ok"] = True
            except Exception as e:   # the test decides whether a failure was expected
                answer = {"ok": False, "error": f"{type(e).__name__}: {str(e)[:4000]}"}
            answers.write(json.dumps(answer) + "\n")
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
