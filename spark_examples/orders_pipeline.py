"""An orders pipeline: transactional producers, one exactly-once streaming aggregation into Parquet and a topic.

Three sub-commands, one per program a user would run:

``produce``
    A transactional producer of orders (confluent-kafka): each transaction
    writes ``--per-transaction`` orders spread over the topic's partitions and
    is committed, except every ``--abort-every``-th one, which is aborted.
    Each order is a JSON value ``{"order_id", "customer", "amount",
    "order_time_ms"}`` keyed by its order id; the record timestamp is the
    order time.

``run``
    One Structured Streaming query: ``readStream.format("kafka")`` with
    ``kafka.isolation.level=read_committed`` (aborted orders never appear),
    an event-time window aggregation per minute with a watermark, output
    mode ``update``, and ``foreachBatch`` writing each micro-batch's updated
    windows

    * to Parquet under ``<work-dir>/totals/batch_id=<id>`` with mode
      ``overwrite``: a micro-batch that is run again after a failure (Spark
      replays it with the same offsets and the same state) rewrites the same
      directory with the same rows, so the table is exact across restarts;
      the current total of a window is its row with the highest batch id;
    * to the ``--results-topic`` with Spark's kafka sink (key: the window's
      start): at-least-once, so a replayed micro-batch writes its rows again,
      and a reader keeps, per window key, the record with the highest batch id.

    The checkpoint is ``<work-dir>/checkpoint``: stop the job (or kill it) and
    run it again, and it resumes where it stopped.  It runs until interrupted,
    or with ``--available-now`` until it has processed what the topic holds.

``check``
    Proves the outputs: the committed orders read back in batch
    (read_committed) are aggregated per window and compared with the Parquet
    totals (``spark.read.parquet``: count, amount and the list of order ids,
    so a lost or doubled order shows) and with the results topic
    (deduplicated by window key).  Exits 1 on any difference.

    python spark_examples/orders_pipeline.py produce --bootstrap 127.0.0.1:9092 --transactions 20
    python spark_examples/orders_pipeline.py run --bootstrap 127.0.0.1:9092 --available-now
    python spark_examples/orders_pipeline.py check --bootstrap 127.0.0.1:9092

Each command first creates the two topics when they do not exist (``--partitions``
each) and says so in one line.  Only ``run`` and ``check`` need PySpark; every
command needs confluent-kafka.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

from common import NeededTopic, build_spark, ensure_topics, follow, report, with_options

WINDOW = "1 minute"
WATERMARK = "10 minutes"        # how late an order may arrive (in event time) and still count
WINDOW_KEY_FORMAT = "yyyy-MM-dd'T'HH:mm:ss"


# ---------------------------------------------------------------- produce

@dataclass(frozen=True)
class Order:
    """One order as produced: where it landed and whether its transaction committed."""
    order_id: str
    customer: str
    amount: int                 # cents
    order_time_ms: int
    partition: int
    offset: int
    committed: bool


def order_value(order_id: str, customer: str, amount: int, order_time_ms: int) -> bytes:
    return json.dumps({"order_id": order_id, "customer": customer, "amount": amount,
                       "order_time_ms": order_time_ms}, separators=(",", ":")).encode()


def produce_orders(bootstrap: str, topic: str, producer: str, transactions: int, *,
                   per_transaction: int = 6, abort_every: int = 4, first_transaction: int = 0,
                   start_ms: int | None = None, pause_s: float = 0.0,
                   step: Callable[[int, str], None] | None = None) -> list[Order]:
    """Runs ``transactions`` transactions with the transactional id
    ``orders-<producer>``.  Order ``j`` of transaction ``t`` has the id
    ``<producer>-<t>-<j>``, goes to partition ``j % partitions`` and has the
    order time ``start_ms + (t * per_transaction + j)`` seconds; transaction
    ``t`` is aborted when ``(t + 1) % abort_every == 0`` (never when
    ``abort_every`` is 0).  Returns every order with its offset (aborted ones
    included).  ``step(t, stage)``, if given, is called at each stage of
    transaction ``t``: "begin" (before it begins), "written" (its orders
    acknowledged, before it ends) and "ended"."""
    from confluent_kafka import KafkaException, Producer

    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"orders-{producer}",
                  "linger.ms": 5})
    meta = p.list_topics(topic, timeout=30).topics[topic]
    if meta.error is not None:
        raise SystemExit(f"topic {topic}: {meta.error}")
    partitions = len(meta.partitions)
    start_ms = int(time.time() * 1000) if start_ms is None else start_ms
    p.init_transactions(30)
    out: list[Order] = []
    for t in range(first_transaction, first_transaction + transactions):
        commit = abort_every <= 0 or (t + 1) % abort_every != 0
        acked: dict[str, tuple[int, int]] = {}
        errors: list[str] = []

        def on_delivery(err, msg) -> None:
            if err is not None:
                errors.append(str(err))
            else:
                acked[msg.key().decode()] = (msg.partition(), msg.offset())

        if step is not None:
            step(t, "begin")
        p.begin_transaction()
        rows = []
        for j in range(per_transaction):
            order_id = f"{producer}-{t}-{j}"
            customer = f"customer-{(t * 7 + j) % 5}"
            amount = 100 + (t * 37 + j * 11) % 900
            ts = start_ms + (t * per_transaction + j) * 1000
            p.produce(topic, key=order_id.encode(), value=order_value(order_id, customer, amount, ts),
                      partition=j % partitions, timestamp=ts,
                      headers=[("producer", producer.encode()), ("transaction", str(t).encode())],
                      on_delivery=on_delivery)
            rows.append((order_id, customer, amount, ts))
        if p.flush(30) != 0 or errors:
            raise KafkaException(f"transaction {t}: not delivered: {errors[:3]}")
        if step is not None:
            step(t, "written")
        if commit:
            p.commit_transaction(30)
        else:
            p.abort_transaction(30)
        out += [Order(i, c, a, ts, *acked[i], commit) for i, c, a, ts in rows]
        if step is not None:
            step(t, "ended")
        if pause_s:
            time.sleep(pause_s)
    return out


# -------------------------------------------------------------------- run

def order_schema():
    from pyspark.sql.types import LongType, StringType, StructField, StructType
    return StructType([StructField("order_id", StringType()), StructField("customer", StringType()),
                       StructField("amount", LongType()), StructField("order_time_ms", LongType())])


def parse_orders(df):
    """Kafka rows -> order columns with the event time ``order_time``."""
    from pyspark.sql import functions as F
    return (df.select(F.from_json(F.col("value").cast("string"), order_schema()).alias("o"))
            .select("o.*")
            .withColumn("order_time", F.timestamp_millis("order_time_ms")))


def window_totals(orders):
    """Orders -> one row per event-time window: orders, amount, order_ids."""
    from pyspark.sql import functions as F
    return (orders.groupBy(F.window("order_time", WINDOW).alias("window"))
            .agg(F.count(F.lit(1)).alias("orders"), F.sum("amount").alias("amount"),
                 F.array_sort(F.collect_list("order_id")).alias("order_ids"))
            .select(F.col("window.start").alias("window_start"), "orders", "amount", "order_ids"))


def start_query(spark, args: argparse.Namespace):
    from pyspark.sql import functions as F

    reader = with_options(spark.readStream.format("kafka"), {
        "kafka.bootstrap.servers": args.bootstrap,
        "subscribe": args.orders_topic,
        "startingOffsets": "earliest",
        "kafka.isolation.level": "read_committed",     # aborted orders never show
        "failOnDataLoss": "true",
        "maxOffsetsPerTrigger": args.max_offsets_per_trigger,
        "minPartitions": args.min_partitions,
    })
    orders = parse_orders(reader.load()).withWatermark("order_time", WATERMARK)
    totals_dir = os.path.join(args.work_dir, "totals")

    def write_batch(batch, batch_id: int) -> None:
        rows = batch.withColumn("batch_id", F.lit(batch_id)).persist()
        try:
            if rows.isEmpty():
                return
            # (the directory name holds the batch id: Parquet's partition discovery reads it back)
            (rows.drop("batch_id").write.mode("overwrite")
             .parquet(os.path.join(totals_dir, f"batch_id={batch_id}")))
            (rows.select(window_key(),
                         F.to_json(F.struct("orders", "amount", "order_ids", "batch_id")).alias("value"))
             .write.format("kafka")
             .option("kafka.bootstrap.servers", args.bootstrap)
             .option("topic", args.results_topic)
             .save())
        finally:
            rows.unpersist()

    writer = (window_totals(orders).writeStream
              .outputMode("update")
              .foreachBatch(write_batch)
              .option("checkpointLocation", os.path.join(args.work_dir, "checkpoint"))
              .queryName("orders_pipeline"))
    if args.available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{args.trigger_seconds} seconds")
    return writer.start()


def run(spark, args: argparse.Namespace) -> None:
    for restart in range(args.restarts):
        follow(lambda: start_query(spark, args), args.batches_per_run)
        print(f"STOPPED run {restart + 1}: restarting from the checkpoint", flush=True)
    print("RUNNING", flush=True)
    follow(lambda: start_query(spark, args))


# ------------------------------------------------------------------ check

def read_orders(spark, args: argparse.Namespace):
    return parse_orders(spark.read.format("kafka")
                        .option("kafka.bootstrap.servers", args.bootstrap)
                        .option("subscribe", args.orders_topic)
                        .option("startingOffsets", "earliest")
                        .option("endingOffsets", "latest")
                        .option("kafka.isolation.level", "read_committed")
                        .load())


def window_key():
    """The column a window is known by in the results topic and in `check`: its start as text
    (in the session's time zone, UTC here)."""
    from pyspark.sql import functions as F
    return F.date_format("window_start", WINDOW_KEY_FORMAT).alias("key")


def latest_per_window(rows) -> dict[str, tuple]:
    """Rows with key, batch_id, orders, amount, order_ids -> per key, (orders, amount, order_ids)
    of the row with the highest batch id (a replayed batch's rows are the same as the first)."""
    best: dict[str, Any] = {}
    for r in rows:
        if r["key"] not in best or r["batch_id"] >= best[r["key"]]["batch_id"]:
            best[r["key"]] = r
    return {k: (r["orders"], r["amount"], list(r["order_ids"])) for k, r in best.items()}


def parquet_totals(spark, totals_dir: str) -> dict[str, tuple]:
    """The Parquet table (the batch id comes from the directory names)."""
    return latest_per_window(spark.read.parquet(totals_dir)
                             .select(window_key(), "batch_id", "orders", "amount", "order_ids").collect())


def topic_totals(spark, args: argparse.Namespace) -> dict[str, tuple]:
    """The results topic, deduplicated by window key."""
    rows = (spark.read.format("kafka")
            .option("kafka.bootstrap.servers", args.bootstrap)
            .option("subscribe", args.results_topic)
            .option("startingOffsets", "earliest")
            .option("endingOffsets", "latest")
            .load()
            .selectExpr("CAST(key AS STRING) AS key", "CAST(value AS STRING) AS value")
            .collect())
    return latest_per_window([{"key": r.key, **json.loads(r.value)} for r in rows])


def check(spark, args: argparse.Namespace) -> list[str]:
    totals_dir = os.path.join(args.work_dir, "totals")
    expected = {r.key: (r.orders, r.amount, list(r.order_ids))
                for r in window_totals(read_orders(spark, args))
                .select(window_key(), "orders", "amount", "order_ids").collect()}
    print(f"committed input: {sum(n for n, _, _ in expected.values())} orders in {len(expected)} windows")
    if not os.path.isdir(totals_dir):
        return ["no Parquet totals yet (run the pipeline first)"]
    problems: list[str] = []
    for name, got in (("parquet", parquet_totals(spark, totals_dir)), ("topic", topic_totals(spark, args))):
        print(f"{name}: {sum(n for n, _, _ in got.values())} orders in {len(got)} windows")
        for key in sorted(set(expected) | set(got)):
            want, have = expected.get(key, (0, 0, [])), got.get(key, (0, 0, []))
            if want != have:
                problems.append(f"{name} window {key}: expected {want[0]} orders / amount {want[1]}, got "
                                f"{have[0]} / {have[1]}; missing {sorted(set(want[2]) - set(have[2]))[:5]}, "
                                f"unexpected {sorted(set(have[2]) - set(want[2]))[:5]}, "
                                f"doubled {sorted({i for i in have[2] if have[2].count(i) > 1})[:5]}")
    return problems


# ------------------------------------------------------------------- main

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=("produce", "run", "check"))
    p.add_argument("--bootstrap", default="127.0.0.1:9092",
                   help="Kafka bootstrap servers (default: %(default)s)")
    p.add_argument("--orders-topic", default="orders", help="input topic (default: %(default)s)")
    p.add_argument("--results-topic", default="order-totals",
                   help="output topic of window totals (default: %(default)s)")
    p.add_argument("--work-dir", default="orders-pipeline",
                   help="holds checkpoint/ and the Parquet totals/ (default: ./%(default)s)")
    p.add_argument("--partitions", type=int, default=3,
                   help="partitions of each topic that does not exist yet and is created "
                        "(default: %(default)s)")
    g = p.add_argument_group("produce")
    g.add_argument("--producer", default="p1", help="producer name: transactional id orders-<name>")
    g.add_argument("--transactions", type=int, default=20)
    g.add_argument("--first-transaction", type=int, default=0,
                   help="number of the first transaction (to continue an earlier run's ids)")
    g.add_argument("--per-transaction", type=int, default=6)
    g.add_argument("--abort-every", type=int, default=4, help="abort every N-th transaction (0: never)")
    g = p.add_argument_group("run")
    g.add_argument("--available-now", action="store_true",
                   help="process what the topic holds, then stop (default: run until interrupted)")
    g.add_argument("--trigger-seconds", type=float, default=1.0)
    g.add_argument("--max-offsets-per-trigger", type=int, default=None)
    g.add_argument("--min-partitions", type=int, default=None)
    g.add_argument("--restarts", type=int, default=0,
                   help="stop the query and start it again from its checkpoint N times first")
    g.add_argument("--batches-per-run", type=int, default=2,
                   help="with --restarts: micro-batches with input per run before the stop")
    g.add_argument("--check", action="store_true", help="run `check` when the query ends")
    args = p.parse_args(argv)
    if args.partitions < 1:
        p.error("--partitions must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    ensure_topics(args.bootstrap, [NeededTopic(args.orders_topic, args.partitions),
                                   NeededTopic(args.results_topic, args.partitions)])
    if args.command == "produce":
        orders = produce_orders(args.bootstrap, args.orders_topic, args.producer, args.transactions,
                                per_transaction=args.per_transaction, abort_every=args.abort_every,
                                first_transaction=args.first_transaction)
        print(f"produced {len(orders)} orders to {args.orders_topic}: "
              f"{sum(o.committed for o in orders)} committed, {sum(not o.committed for o in orders)} aborted")
        return 0

    spark = build_spark("trireme-orders-pipeline", {"spark.sql.session.timeZone": "UTC"})
    try:
        if args.command == "run":
            run(spark, args)
            if not args.check:
                return 0
        problems = check(spark, args)
    finally:
        spark.stop()
    return report(problems)


if __name__ == "__main__":
    sys.exit(main())
