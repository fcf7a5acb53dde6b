"""Small-request benchmark: many producers sending a few 100-byte records per request, and consumers long-polling many partitions.

    .venv/bin/python bench/small_requests.py                        # the standard matrix (see below)
    .venv/bin/python bench/small_requests.py produce --producers 4 [--records 20000] [--no-fsync]
    .venv/bin/python bench/small_requests.py produce --producers 64 --rate 10000 --seconds 10
    .venv/bin/python bench/small_requests.py consume --consumers 4 --partitions 100 --trickle 100 --seconds 10

``produce``: N confluent-kafka producers (spread over worker processes, one thread per producer,
so the Python client is not the bottleneck), ``acks=all``, ``linger.ms=0``, at most 10 records per
request (``batch.num.messages=10``), records of 100 B; producer i writes partition i mod
``--partitions``.  Without ``--rate`` each producer sends ``--records`` as fast as its queue takes
them (throughput); with ``--rate R`` the producers together send R records/s for ``--seconds``
(latency at a given load).  ``consume``: M consumers each ``assign()`` all ``--partitions`` of a
topic at its end and long-poll (librdkafka's defaults: fetch.wait.max.ms=500, fetch.min.bytes=1)
while one producer writes a trickle of ``--trickle`` records/s round-robin over the partitions.

It prints requests/s and records/s, the broker's CPU per request (``utime+stime`` of the broker
process from ``/proc/PID/stat``, divided by the Produce or Fetch requests the broker counted, from
its metrics endpoint ``trireme.metrics.listen``), produce latency p50/p99 (librdkafka's
``Message.latency()``: ``produce()`` to the delivery report) and, for ``consume``, the delay from
``produce()`` to the consumer receiving the record.  The last stdout line is a JSON summary.
Nothing is asserted.  See bench/README.md and docs/performance.md.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from produce_consume import (PhaseClock, ServerStats, add_cpu_options, broker, broker_latency,  # noqa: E402
                             cpu_affinity_note, create_topic, format_broker_latency, format_fsync_latency,
                             format_placement, fsync_latency, percentile, scrape_metrics)
from speed_sampler import format_reference  # noqa: E402

RECORD = b"x" * 100


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# --- worker processes ---------------------------------------------------------------------------

def _produce_worker(spec: dict) -> dict:
    """Runs in a worker process: its producers, one thread each; → latencies and counts."""
    from confluent_kafka import Producer
    conf = {"bootstrap.servers": spec["bootstrap"], "acks": "all", "linger.ms": 0, "batch.num.messages": 10,
            "enable.idempotence": False, **spec["producer_props"]}
    topic, partitions = spec["topic"], spec["partitions"]
    results = []
    producers = []
    for index in spec["producer_indexes"]:
        counts = {"delivered": 0, "failed": 0, "latencies": [], "errors": []}

        def on_delivery(err, msg, counts=counts):
            if err is not None:
                counts["failed"] += 1
                if len(counts["errors"]) < 3:
                    counts["errors"].append(str(err))
                return
            counts["delivered"] += 1
            counts["latencies"].append(msg.latency())
        producer = Producer({**conf, "on_delivery": on_delivery})
        producer.list_topics(topic, timeout=30)
        producers.append((producer, index % partitions, counts))
        results.append(counts)
    print("ready", flush=True)
    sys.stdin.readline()                                # "go"
    cpu = _cpu_seconds()

    if spec["rate"]:
        _paced(producers, topic, spec["rate"], spec["seconds"])
    else:
        threads = [threading.Thread(target=_as_fast_as_possible, args=(*p, topic, spec["records"]))
                   for p in producers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for producer, _, counts in producers:
        counts["undelivered"] = producer.flush(120)
    return {"cpu_s": _cpu_seconds() - cpu, "delivered": sum(c["delivered"] for c in results), "failed": sum(c["failed"] for c in results),
            "undelivered": sum(c["undelivered"] for c in results),
            "errors": [e for c in results for e in c["errors"]][:5],
            "latencies": [x for c in results for x in c["latencies"]]}


def _as_fast_as_possible(producer, partition: int, counts: dict, topic: str, records: int) -> None:
    """One producer's thread: ``records`` records as fast as its queue takes them."""
    produce, poll = producer.produce, producer.poll
    for i in range(records):
        while True:
            try:
                produce(topic, RECORD, partition=partition)
                break
            except BufferError:
                poll(0.005)
        if not i & 255:
            poll(0)


def _paced(producers: list, topic: str, rate: float, seconds: float) -> None:
    """All of a process's producers from one thread (threads would fight over the GIL): each sends ``rate``
    records/s, their schedules staggered, delivery reports served between sends.  A report waits at most
    until the next send (1 / (rate x producers) s) to be served, which the latency then includes."""
    n = len(producers)
    interval = 1.0 / rate
    start = time.perf_counter()
    due = [start + interval * i / n for i in range(n)]
    end = start + seconds
    while True:
        now = time.perf_counter()
        for i, (producer, partition, _) in enumerate(producers):
            if due[i] <= now:
                producer.produce(topic, RECORD, partition=partition)
                due[i] += interval
            producer.poll(0)
        following = min(due)
        if following >= end:
            break
        wait = following - time.perf_counter()
        if wait > 0:
            time.sleep(wait)


def _consume_worker(spec: dict) -> dict:
    """Runs in a worker process: one consumer long-polling every partition from its end → end-to-end delays."""
    from confluent_kafka import Consumer, TopicPartition
    consumer = Consumer({"bootstrap.servers": spec["bootstrap"], "group.id": "bench-" + uuid.uuid4().hex[:8],
                         "enable.auto.commit": False, **spec["consumer_props"]})
    topic = spec["topic"]
    partitions = []
    for p in range(spec["partitions"]):
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
        partitions.append(TopicPartition(topic, p, high))
    consumer.assign(partitions)
    consumer.poll(0.5)                                   # the first fetches go out before "go"
    print("ready", flush=True)
    sys.stdin.readline()
    cpu = _cpu_seconds()
    delays = []
    received = 0
    end = time.time() + spec["seconds"]
    while time.time() < end:
        msg = consumer.poll(0.1)            # returns as soon as a record is there (consume(n) waits for n)
        if msg is not None and msg.error() is None:
            received += 1
            delays.append(time.time() - float(msg.value()))
    cpu = _cpu_seconds() - cpu
    consumer.close()
    return {"cpu_s": cpu, "received": received, "latencies": delays}


def _worker_main() -> int:
    spec = json.loads(sys.argv[2])
    result = _produce_worker(spec) if spec["kind"] == "produce" else _consume_worker(spec)
    print(json.dumps(result), flush=True)
    return 0


class Workers:
    """Worker processes started together: each says ``ready``, all get ``go`` at once, each prints its result."""

    def __init__(self, specs: list[dict]):
        self.procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", json.dumps(spec)],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for spec in specs]
        for proc in self.procs:
            line = proc.stdout.readline()
            if line.strip() != "ready":
                self.kill()
                raise SystemExit(f"bench worker failed to start (said {line!r})")

    def go(self) -> None:
        for proc in self.procs:
            proc.stdin.write("go\n")
            proc.stdin.flush()

    def results(self) -> list[dict]:
        out = []
        for proc in self.procs:
            line = proc.stdout.readline()
            proc.wait()
            if not line:
                raise SystemExit(f"bench worker exited with {proc.returncode} without a result")
            out.append(json.loads(line))
        return out

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _split(n: int, parts: int) -> list[list[int]]:
    return [list(range(i, n, parts)) for i in range(min(n, parts))]


def _latency_ms(values: list[float]) -> dict:
    values = sorted(v for v in values if v is not None)
    return {name: (None if v is None else round(v * 1000, 3)) for name, v in (
        ("p50", percentile(values, 0.50)), ("p99", percentile(values, 0.99)), ("max", values[-1] if values else None))}


def _broker_counts(stats: ServerStats) -> tuple[dict, float | None, dict | None]:
    """(requests per API, the broker's CPU seconds, the whole scrape) now."""
    metrics = scrape_metrics(stats.metrics_url)
    return (metrics["requests"] if metrics else {}), stats.cpu_seconds(), metrics


def _per_request(api: str, before, after) -> tuple[int, float | None]:
    """Requests of ``api`` the broker counted between two samples, and its CPU µs per such request."""
    requests = after[0].get(api, 0) - before[0].get(api, 0)
    if not requests or before[1] is None or after[1] is None:
        return requests, None
    return requests, (after[1] - before[1]) / requests * 1e6


def _measure(workers: Workers, stats: ServerStats, meanwhile=None) -> tuple:
    """Start the workers, run ``meanwhile(start time)`` if given, collect their results → (broker counts before,
    after, the phase's times, the workers' results)."""
    try:
        before = _broker_counts(stats)
        clock = PhaseClock(stats)
        start = clock.start()
        workers.go()
        if meanwhile is not None:
            meanwhile(start)
        results = workers.results()
        times = clock.stop()
        return before, _broker_counts(stats), times, results
    finally:
        workers.kill()


# --- scenarios ----------------------------------------------------------------------------------

def run_produce(args, bootstrap: str, stats: ServerStats) -> dict:
    topic = f"small-{uuid.uuid4().hex[:8]}"
    partitions = args.partitions or min(args.producers, 4)
    create_topic(bootstrap, topic, partitions)
    processes = args.processes or min(args.producers, 8)
    specs = [{"kind": "produce", "bootstrap": bootstrap, "topic": topic, "partitions": partitions,
              "producer_indexes": indexes, "records": args.records,
              "rate": args.rate / args.producers if args.rate else 0, "seconds": args.seconds,
              "producer_props": dict(p.split("=", 1) for p in args.producer_prop)}
             for indexes in _split(args.producers, processes)]
    before, after, times, results = _measure(Workers(specs), stats)
    requests, cpu_us = _per_request("Produce", before, after)
    delivered = sum(r["delivered"] for r in results)
    seconds = times["seconds"]
    return {"scenario": "produce", "producers": args.producers, "processes": len(specs), "partitions": partitions,
            "rate": args.rate, "fsync": args.fsync, "records": delivered,
            "failed": sum(r["failed"] for r in results), "undelivered": sum(r["undelivered"] for r in results),
            "errors": [e for r in results for e in r["errors"]][:5],
            "seconds": round(seconds, 3), "records_per_s": round(delivered / seconds),
            "produce_requests": requests, "requests_per_s": round(requests / seconds),
            "records_per_request": round(delivered / requests, 2) if requests else None,
            "broker_cpu_us_per_request": None if cpu_us is None else round(cpu_us, 1),
            "latency_ms": _latency_ms([x for r in results for x in r["latencies"]]),
            "broker_latency": broker_latency(before[2], after[2]), "fsync_latency": fsync_latency(before[2], after[2]),
            "workers_cpu_s": round(sum(r["cpu_s"] for r in results), 2),
            **{k: times[k] for k in ("server_cpu_s", "client_cpu_s", "other_processes_cpu_s", "loadavg_1m",
                                     "reference_us")}}


def run_consume(args, bootstrap: str, stats: ServerStats) -> dict:
    from confluent_kafka import Producer
    topic = f"trickle-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, args.partitions)
    specs = [{"kind": "consume", "bootstrap": bootstrap, "topic": topic, "partitions": args.partitions,
              "seconds": args.seconds, "consumer_props": dict(p.split("=", 1) for p in args.consumer_prop)}
             for _ in range(args.consumers)]
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})
    producer.list_topics(topic, timeout=30)
    sent = 0

    def trickle(start: float) -> None:
        nonlocal sent
        interval = 1.0 / args.trickle if args.trickle else args.seconds
        due = start
        while due < start + args.seconds:
            now = time.perf_counter()
            if now < due:
                producer.poll(due - now)
                continue
            if args.trickle:
                producer.produce(topic, repr(time.time()).encode(), partition=sent % args.partitions)
                sent += 1
            due += interval
        producer.flush(30)
    before, after, times, results = _measure(Workers(specs), stats, trickle)
    fetches, cpu_us = _per_request("Fetch", before, after)
    produces = after[0].get("Produce", 0) - before[0].get("Produce", 0)
    seconds = times["seconds"]
    cpu = times["server_cpu_s"]
    return {"scenario": "consume", "consumers": args.consumers, "partitions": args.partitions,
            "trickle": args.trickle, "fsync": args.fsync, "records_sent": sent,
            "records_received": sum(r["received"] for r in results), "seconds": round(seconds, 3),
            "fetch_requests": fetches, "fetch_requests_per_s": round(fetches / seconds),
            "produce_requests": produces,
            "broker_cpu_us_per_fetch": None if cpu_us is None else round(cpu_us, 1),
            "broker_cpu_share": None if cpu is None else round(cpu / seconds, 3),
            "delivery_latency_ms": _latency_ms([x for r in results for x in r["latencies"]]),
            "workers_cpu_s": round(sum(r["cpu_s"] for r in results), 2),
            **{k: times[k] for k in ("server_cpu_s", "client_cpu_s", "other_processes_cpu_s", "loadavg_1m",
                                     "reference_us")}}


def report(r: dict) -> None:
    others = r["other_processes_cpu_s"]
    if r["scenario"] == "produce":
        lat = r["latency_ms"]
        load = f"{r['rate']:,} records/s for {r['seconds']:.1f} s" if r["rate"] else f"{r['records']:,} records"
        print(f"produce {r['producers']} producers ({r['processes']} processes, {r['partitions']} partitions, "
              f"fsync {'on' if r['fsync'] else 'off'}, {load}): {r['requests_per_s']:,} requests/s, "
              f"{r['records_per_s']:,} records/s, {r['records_per_request']} records/request; broker CPU "
              f"{r['broker_cpu_us_per_request']} us/request; latency ms p50 {lat['p50']} p99 {lat['p99']} "
              f"max {lat['max']}; CPU s: broker {r['server_cpu_s']}, producers {r['workers_cpu_s']}, others "
              f"{others if others is None else round(max(0.0, others - r['workers_cpu_s']), 2)}"
              f"{format_broker_latency(r['broker_latency'])}{format_fsync_latency(r['fsync_latency'])}"
              f"{format_reference(r['reference_us'])}{format_placement(r['placement'])}", flush=True)
        if r["failed"] or r["undelivered"]:
            print(f"  failed {r['failed']}, undelivered {r['undelivered']}: {r['errors']}", flush=True)
    else:
        lat = r["delivery_latency_ms"]
        print(f"consume {r['consumers']} consumers x {r['partitions']} partitions, trickle {r['trickle']} records/s "
              f"(fsync {'on' if r['fsync'] else 'off'}): {r['fetch_requests_per_s']:,} fetches/s, "
              f"{r['records_received']:,} records received of {r['records_sent']:,} sent x {r['consumers']}; broker "
              f"CPU {r['broker_cpu_us_per_fetch']} us/fetch, {r['broker_cpu_share']} of a core; delivery ms "
              f"p50 {lat['p50']} p99 {lat['p99']}; CPU s: broker {r['server_cpu_s']}, consumers {r['workers_cpu_s']}, "
              f"others {others if others is None else round(max(0.0, others - r['workers_cpu_s']), 2)}"
              f"{format_reference(r['reference_us'])}{format_placement(r['placement'])}", flush=True)


# The standard matrix: the issue's three producer counts, with fsync on and off, a latency run, consumers.
MATRIX = [
    ["produce", "--producers", "1", "--records", "20000"],
    ["produce", "--producers", "4", "--records", "20000"],
    ["produce", "--producers", "64", "--records", "2000"],
    ["produce", "--producers", "1", "--records", "20000", "--no-fsync"],
    ["produce", "--producers", "4", "--records", "20000", "--no-fsync"],
    ["produce", "--producers", "64", "--records", "2000", "--no-fsync"],
    ["produce", "--producers", "64", "--rate", "10000", "--seconds", "10"],
    ["consume", "--consumers", "4", "--partitions", "100", "--trickle", "100", "--seconds", "10"],
]


def parse(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scenario", nargs="?", choices=["produce", "consume"], default=None,
                    help="one scenario (default: the standard matrix)")
    ap.add_argument("--producers", type=int, default=4)
    ap.add_argument("--processes", type=int, default=0, help="worker processes for the producers (min(N, 8))")
    ap.add_argument("--records", type=int, default=20000, help="records per producer (throughput runs)")
    ap.add_argument("--rate", type=int, default=0, help="records/s of all producers together (latency runs)")
    ap.add_argument("--seconds", type=float, default=10, help="length of --rate and consume runs")
    ap.add_argument("--partitions", type=int, default=0,
                    help="topic partitions (produce: min(producers, 4); consume: 100)")
    ap.add_argument("--consumers", type=int, default=4)
    ap.add_argument("--trickle", type=float, default=100, help="records/s written while consumers long-poll")
    ap.add_argument("--fsync", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--bootstrap", default=None, help="a running broker (with --server-pid and --metrics-url)")
    ap.add_argument("--server-pid", type=int, default=None)
    ap.add_argument("--metrics-url", default=None, help="the running broker's http://HOST:PORT/metrics")
    ap.add_argument("--server-set", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--profile-server", metavar="OUT.prof", default=None,
                    help="run the broker under cProfile (main thread CPU time), writing OUT.prof on exit")
    ap.add_argument("--producer-prop", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--consumer-prop", action="append", default=[], metavar="KEY=VALUE")
    add_cpu_options(ap)
    args = ap.parse_args(argv)
    if args.scenario == "consume" and not args.partitions:
        args.partitions = 100
    return args


def run_one(args) -> dict:
    """One scenario on a fresh broker (or on --bootstrap)."""
    with broker(args, "trireme-small-") as (bootstrap, stats):
        result = (run_produce if args.scenario == "produce" else run_consume)(args, bootstrap, stats)
    result["placement"] = cpu_affinity_note(args)
    report(result)
    return result


def main(argv=None) -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        return _worker_main()
    args = parse(argv)
    runs = [args] if args.scenario else [parse(m + [a for a in (argv or sys.argv[1:])]) for m in MATRIX]
    summary = [run_one(a) for a in runs]
    print(json.dumps(summary, separators=(",", ":")), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
