"""Spark batch-read benchmark: transactional data read with spark.read.format("kafka") at both isolation levels, beside the Java 3.9 consumer.

    .venv/bin/python bench/spark_read.py [--bytes 1GiB] [--record-size 1024] [--partitions 4]
        [--transactional 1000] [--abort-every 10] [--runs 2] [--no-fsync]

Starts ``python -m trireme serve`` on a fresh temporary data dir (bench/produce_consume.py's
Server), writes --bytes of records in transactions of --transactional records with every
--abort-every-th aborted (bench/produce_consume.py's produce phase: one transactional
confluent-kafka producer, librdkafka's partitioner), then, --runs times over, reads the whole
topic

* with Spark (bench/spark_read_job.py under the PySpark interpreter: one local[2] session,
  ``count`` and ``sum(length(value))`` over ``spark.read.format("kafka")``, one Spark task per
  partition on 2 executor cores), at read_uncommitted and at read_committed;
* with the Apache Kafka Java client 3.9 (bench/spark_java_read.java: one consumer, assign +
  seek + poll to the end offsets, Spark's executor settings), at both levels.

PySpark and the connector come from TRIREME_SPARK_PYTHON and TRIREME_SPARK_KAFKA_JARS, defaulting
to what ``make test`` sets up (.cache/spark/venv, ../shared/spark-connector); the Java client from
.cache/java/3.9.0-* (``make clients``).  Prints one line per read (records/s, MB/s of values, server
CPU seconds, other processes' CPU seconds) and a JSON summary last.  Nothing is asserted.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import produce_consume  # noqa: E402
from produce_consume import REPO, PhaseClock, Server, ServerStats, parse_size  # noqa: E402

LEVELS = ("read_uncommitted", "read_committed")


def spark_env() -> tuple[str, dict]:
    python = os.environ.get("TRIREME_SPARK_PYTHON") or os.path.join(REPO, ".cache", "spark", "venv", "bin", "python")
    jars = os.environ.get("TRIREME_SPARK_KAFKA_JARS") or os.path.join(os.path.dirname(REPO), "shared", "spark-connector")
    if not os.path.exists(python) or not os.path.isdir(jars):
        raise SystemExit(f"needs PySpark ({python}) and the connector jars ({jars}): see docs/spark.md")
    return python, {**os.environ, "TRIREME_SPARK_KAFKA_JARS": os.path.abspath(jars), "SPARK_LOG_LEVEL": "ERROR"}


def java_classpath() -> str:
    sys.path.insert(0, REPO)
    from tools.java_clients import harness_dir
    path = harness_dir("3.9.0") / "classpath.txt"
    if not path.exists():
        raise SystemExit("needs the Java client 3.9.0 under .cache/java (make clients)")
    with open(path) as f:
        return f.read().strip()


def result(kind: str, run: int, read: dict, phase: dict) -> dict:
    out = {"reader": kind, "run": run, **read, "server_cpu_s": phase["server_cpu_s"],
           "other_processes_cpu_s": phase["other_processes_cpu_s"]}
    print(f"{kind:5} run {run} {read['isolation']:16} {read['records']:>9} records {read['seconds']:7.1f} s "
          f"{read['records'] / read['seconds'] / 1000:7.0f}k rec/s {read['bytes'] / read['seconds'] / 1e6:6.1f} MB/s "
          f"server {phase['server_cpu_s']:.1f} CPU s, others {phase['other_processes_cpu_s'] or 0:.1f}"
          + (f", {read['tasks']} tasks on {read['cores']} cores" if "tasks" in read else ""), flush=True)
    return out


def spark_reads(python: str, env: dict, bootstrap: str, topic: str, levels: list[str], stats: ServerStats,
                run0: int) -> list[dict]:
    proc = subprocess.Popen([python, os.path.join(REPO, "bench", "spark_read_job.py"), bootstrap, topic, *levels],
                            stdout=subprocess.PIPE, text=True, env=env)
    out, clock = [], PhaseClock(stats, sample_speed=False)    # started as Spark reads: a sampler's start would be in it
    for line in proc.stdout:
        if not line.startswith("{"):
            continue
        msg = json.loads(line)
        if "start" in msg:
            clock.start()
        else:
            out.append(result("spark", run0 + len(out) // len(LEVELS), msg, clock.stop()))
    if proc.wait() != 0:
        raise SystemExit(f"the Spark job failed ({proc.returncode})")
    return out


def java_read(classpath: str, bootstrap: str, topic: str, level: str, stats: ServerStats, run: int) -> dict:
    clock = PhaseClock(stats, sample_speed=False)
    clock.start()
    line = subprocess.run(["java", "-cp", classpath, os.path.join(REPO, "bench", "spark_java_read.java"),
                           bootstrap, topic, level], capture_output=True, text=True, check=True).stdout
    phase = clock.stop()
    return result("java", run, json.loads(line.strip().splitlines()[-1]), phase)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bytes", default="1GiB")
    ap.add_argument("--record-size", default="1024")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--transactional", type=int, default=1000, metavar="N", help="records per transaction")
    ap.add_argument("--abort-every", type=int, default=10, metavar="K", help="abort every K-th transaction")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--fsync", action=argparse.BooleanOptionalAction, default=True)
    args = ap.parse_args(argv)
    python, env = spark_env()
    classpath = java_classpath()
    temp_root = tempfile.mkdtemp(prefix="trireme-bench-spark-")
    server = Server(os.path.join(temp_root, "data"), args.fsync, None, [])
    topic = f"bench-spark-{uuid.uuid4().hex[:8]}"
    try:
        stats = ServerStats(server.proc.pid)
        rc = produce_consume.main(["--bootstrap", server.bootstrap, "--server-pid", str(server.proc.pid),
                                   "--topic", topic, "--phases", "produce", "--bytes", str(parse_size(args.bytes)),
                                   "--record-size", str(parse_size(args.record_size)),
                                   "--partitions", str(args.partitions), "--transactional", str(args.transactional),
                                   "--abort-every", str(args.abort_every)])
        if rc != 0:
            return rc
        reads = spark_reads(python, env, server.bootstrap, topic, list(LEVELS) * args.runs, stats, 1)
        for run in range(1, args.runs + 1):
            reads += [java_read(classpath, server.bootstrap, topic, level, stats, run) for level in LEVELS]
        print(json.dumps({"config": vars(args), "cores": os.cpu_count(), "reads": reads,
                          "server_peak_rss_mib": stats.peak_rss_mib()}, separators=(",", ":")), flush=True)
        return 0
    finally:
        server.stop()
        shutil.rmtree(temp_root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
