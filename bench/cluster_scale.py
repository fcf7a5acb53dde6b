"""Throughput and database load of the PostgreSQL engine with 1, 2 or 3 brokers on one database, beside the local engine.

    .venv/bin/python bench/cluster_scale.py [--brokers 1,2,3] [--rounds 3] [--local] [--bytes 256MiB]
        [--partitions 12] [--record-size 1024] [--linger-ms 5] [--pg-set NAME=VALUE] [--server-set NAME=VALUE]

Starts one throwaway PostgreSQL (trireme/postgresql.py, fsync and synchronous_commit on: durability as shipped).  A
run of target ``postgresql-N`` creates a fresh database, starts N ``trireme serve`` brokers on it (node ids 1..N,
trireme.storage=postgresql, the lease and poll settings at their defaults), creates a topic of --partitions, produces
--bytes of --record-size records with one confluent-kafka producer over all partitions (acks=all, linger.ms=5:
librdkafka sends each partition's batches to its leader), then consumes them with one consumer assigned every
partition; target ``local`` (--local) is one broker on the local engine (fsync on), the same workload.  Every round
runs every target, their order reversed every other round.  Per phase: MB/s, each broker's CPU (utime+stime, /proc)
per MB, PostgreSQL's CPU (the postmaster and all its processes, exited ones included through cutime/cstime) per MB,
database commits (pg_stat_database.xact_commit of the run's database; write transactions: the next transaction id's
advance) per second and per MB, WAL bytes per MB (pg_current_wal_lsn's advance), rows inserted (trireme_batch rows,
and pg_stat_database.tup_inserted, which counts TOAST chunks too), the 1-minute load and the CPU of everything else
on the machine.  Then per target and phase the median and range over the rounds; the last line is JSON.  Nothing is
asserted: it measures.  See bench/README.md; the figures are in docs/performance.md.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import produce_consume  # noqa: E402
from produce_consume import (CLK_TCK, Server, ServerStats, machine_busy_seconds, parse_size,  # noqa: E402
                             spread)
from produce_consume import _fmt as _f, format_spread as _sp  # noqa: E402

PHASES = ("produce", "consume")
# One query for the database's counters: its commits and inserted tuples (pg_stat_database, flushed by each backend
# at most once a second and when it goes idle), the WAL position, and the next transaction id (every transaction that
# wrote took one: exact at once).
COUNTERS_SQL = """
SELECT xact_commit, tup_inserted, pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint,
       pg_snapshot_xmax(pg_current_snapshot())::text::bigint
  FROM pg_stat_database WHERE datname = current_database()
"""
BATCH_ROWS_SQL = "SELECT count(*), coalesce(sum(octet_length(data)), 0) FROM trireme_batch"
# pg_stat_database lags the backends: an idle backend reports what it did within 10 s (PGSTAT_IDLE_INTERVAL).
STATS_SETTLE_S = 11.0


# --- /proc ---------------------------------------------------------------------------------------

def read_stat(pid: int, proc: str = "/proc") -> dict | None:
    """A process's parent and CPU seconds from ``/proc/PID/stat`` (own user/system, and its reaped children's)."""
    try:
        with open(f"{proc}/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # fields[0] is the state (field 3 of proc(5)): ppid is field 4, utime..cstime fields 14..17.
    return {"ppid": int(fields[1]), "user": int(fields[11]) / CLK_TCK, "system": int(fields[12]) / CLK_TCK,
            "children": (int(fields[13]) + int(fields[14])) / CLK_TCK}


def process_cpu_seconds(pid: int, proc: str = "/proc") -> float | None:
    """utime + stime of one process (a broker)."""
    stat = read_stat(pid, proc)
    return None if stat is None else stat["user"] + stat["system"]


def tree_cpu_seconds(root: int, proc: str = "/proc") -> float | None:
    """CPU seconds of a process and its children (PostgreSQL: the postmaster and its backends, walwriter,
    checkpointer...): each one's own time, plus the root's reaped children, so a backend that exits between two
    readings still counts."""
    stat = read_stat(root, proc)
    if stat is None:
        return None
    total = stat["user"] + stat["system"] + stat["children"]
    for name in os.listdir(proc):
        if name.isdigit() and int(name) != root:
            child = read_stat(int(name), proc)
            if child is not None and child["ppid"] == root:
                total += child["user"] + child["system"]
    return total


# --- the database's counters ---------------------------------------------------------------------

def database_counters(conn) -> dict:
    """The run database's counters now (COUNTERS_SQL), and its trireme_batch rows and their bytes."""
    commits, inserted, wal, next_xid = conn.execute(COUNTERS_SQL).fetchone()
    try:
        rows, row_bytes = conn.execute(BATCH_ROWS_SQL).fetchone()
    except Exception:       # the brokers have not created the tables yet
        conn.rollback()
        rows = row_bytes = 0
    return {"xact_commit": int(commits), "tup_inserted": int(inserted), "wal_bytes": int(wal),
            "next_xid": int(next_xid), "batch_rows": int(rows), "batch_bytes": int(row_bytes)}


def counters_delta(before: dict, after: dict) -> dict:
    return {k: after[k] - before[k] for k in before}


# --- one phase's figures --------------------------------------------------------------------------

class Snapshot:
    """Everything read at a phase's start and end: time, each broker's and PostgreSQL's CPU, the machine's busy
    time, the brokers' flush rounds (their metrics: with the PostgreSQL engine a round is one database commit) and
    the database's counters."""

    def __init__(self, broker_pids: list[int], metrics_urls: list[str | None], postmaster_pid: int | None, conn):
        self.broker_pids, self.metrics_urls = broker_pids, metrics_urls
        self.postmaster_pid, self.conn = postmaster_pid, conn

    def database(self) -> dict | None:
        return None if self.conn is None else {"t": time.perf_counter(), **database_counters(self.conn)}

    def take(self) -> dict:
        metrics = [produce_consume.scrape_metrics(url) for url in self.metrics_urls]
        return {"t": time.perf_counter(), "machine": machine_busy_seconds(),
                "brokers": [process_cpu_seconds(p) for p in self.broker_pids],
                "postgres": None if self.postmaster_pid is None else tree_cpu_seconds(self.postmaster_pid),
                "rounds": None if None in metrics else sum(m["fsyncs"] for m in metrics),
                "round_seconds": None if None in metrics else sum(m["fsync_seconds"] for m in metrics),
                "produce_requests": None if None in metrics else sum(m["requests"].get("Produce", 0)
                                                                     for m in metrics),
                "database": self.database()}


def background_rate(first: dict, second: dict) -> float:
    """xact_commit per second between two settled readings with nothing but the brokers' own polling and
    heartbeats between them."""
    return (second["xact_commit"] - first["xact_commit"]) / max(second["t"] - first["t"], 1e-9)


def phase_figures(before: dict, after: dict, mb: float, client_cpu_s: float | None, seconds: float | None = None,
                  settled: tuple[dict, dict, float] | None = None) -> dict:
    """A phase's figures from its snapshots; ``mb`` the 10^6 bytes of record values it moved, ``seconds`` the
    client's own timing (default: between the snapshots).  pg_stat_database lags the backends (a backend reports
    when it goes idle, at most once a second, or up to 10 s later), so its counters come from ``settled``: (the
    settled reading before the phase, the one STATS_SETTLE_S after it, the background xact_commit per second), and
    the polling and heartbeats of the idle time between them are taken off.  The WAL, transaction ids and rows are
    exact at once, from the snapshots."""
    wall = after["t"] - before["t"]
    seconds = seconds or wall
    brokers = [None if a is None or b is None else a - b for b, a in zip(before["brokers"], after["brokers"])]
    pg = None if before["postgres"] is None or after["postgres"] is None else after["postgres"] - before["postgres"]
    out = {"mb": mb, "seconds": seconds, "mb_per_s": mb / seconds if seconds > 0 else None,
           "broker_cpu_s": brokers,
           "broker_cpu_ms_per_mb": [None if c is None else c / mb * 1000 for c in brokers],
           "brokers_cpu_ms_per_mb": (None if None in brokers or not brokers else sum(brokers) / mb * 1000),
           "postgres_cpu_s": pg, "postgres_cpu_ms_per_mb": None if pg is None else pg / mb * 1000,
           "client_cpu_s": client_cpu_s, "loadavg_1m": os.getloadavg()[0]}
    busy = None if before["machine"] is None or after["machine"] is None else after["machine"] - before["machine"]
    if busy is not None and None not in brokers:
        others = busy - sum(brokers) - (pg or 0.0) - (client_cpu_s or 0.0)
        out["others_cores"] = max(0.0, others) / wall if wall > 0 else None
    if before.get("rounds") is not None and after.get("rounds") is not None:
        rounds = after["rounds"] - before["rounds"]
        requests = after["produce_requests"] - before["produce_requests"]
        out.update({"rounds": rounds, "rounds_per_s": rounds / seconds, "rounds_per_mb": rounds / mb,
                    "round_ms": (after["round_seconds"] - before["round_seconds"]) / rounds * 1000 if rounds else None,
                    "produce_requests": requests})
    if before["database"] is not None and after["database"] is not None:
        d = counters_delta(before["database"], after["database"])
        out.update({"write_txns": d["next_xid"], "write_txns_per_s": d["next_xid"] / seconds,
                    "write_txns_per_mb": d["next_xid"] / mb,
                    "wal_bytes": d["wal_bytes"], "wal_bytes_per_mb": d["wal_bytes"] / mb,
                    "batch_rows": d["batch_rows"], "batch_bytes": d["batch_bytes"]})
    if settled is not None:
        first, second, rate = settled
        idle = max(0.0, (second["t"] - first["t"]) - wall)
        commits = (second["xact_commit"] - first["xact_commit"]) - rate * idle
        out.update({"commits": commits, "commits_per_s": commits / seconds, "commits_per_mb": commits / mb,
                    "background_commits_per_s": rate,
                    "tup_inserted": second["tup_inserted"] - first["tup_inserted"]})
    return out


# --- the targets ---------------------------------------------------------------------------------

def target_names(brokers: list[int], local: bool) -> list[str]:
    return [f"postgresql-{n}" for n in brokers] + (["local"] if local else [])


def round_order(names: list[str], rnd: int) -> list[str]:
    """Every target once a round, the order reversed every other round (so each pair is adjacent both ways)."""
    return list(names) if rnd % 2 == 1 else list(reversed(names))


@contextlib.contextmanager
def started(target: str, pg, args, run_id: int):
    """(bootstrap, the brokers' Servers, database connection or None) for one run of ``target``; everything stopped
    and removed afterwards (the run's database dropped)."""
    import psycopg
    temp = tempfile.mkdtemp(prefix="trireme-scale-")
    servers: list[Server] = []
    database = conn = None
    # auto.create.topics.enable=false: a broker that does not know the topic says so instead of making its own
    common = ["trireme.metrics.listen=127.0.0.1:0", "auto.create.topics.enable=false", *args.server_set]
    try:
        if target == "local":
            servers.append(Server(os.path.join(temp, "data"), True, None, common))
        else:
            count = int(target.rsplit("-", 1)[1])
            database = f"scale_{run_id}"
            dsn = pg.create_database(database)
            conn = psycopg.connect(dsn, autocommit=True)
            for node in range(1, count + 1):
                servers.append(Server(os.path.join(temp, f"broker-{node}"), True, None,
                                      [f"node.id={node}", "trireme.storage=postgresql",
                                       f"trireme.storage.postgresql.dsn={dsn}", *common]))
        yield ",".join(s.bootstrap for s in servers), servers, conn
    finally:
        if conn is not None:
            conn.close()
        for server in servers:
            server.stop()
        if database is not None:
            pg.drop_database(database)
        shutil.rmtree(temp, ignore_errors=True)


class RunFailed(Exception):
    """A run that could not measure (e.g. a broker that never saw the topic): reported, the other runs go on."""


def wait_for_leaders(bootstrap: str, topic: str, partitions: int, timeout: float = 30.0) -> dict[int, int]:
    """Until every broker's metadata lists the topic with a leader for each partition → {node id: partitions it
    leads}, as the last broker asked says."""
    from confluent_kafka.admin import AdminClient
    deadline = time.monotonic() + timeout
    for one in bootstrap.split(","):
        admin = AdminClient({"bootstrap.servers": one})
        while True:
            md = admin.list_topics(topic, timeout=10)
            t = md.topics.get(topic)
            if (t is not None and t.error is None and len(t.partitions) == partitions
                    and all(p.leader >= 0 for p in t.partitions.values())):
                leaders = leader_counts(p.leader for p in t.partitions.values())
                break
            if time.monotonic() > deadline:
                raise RunFailed(f"{one}: topic {topic} has no leader for every partition after {timeout:.0f}s "
                                 f"({'absent' if t is None else t.error or len(t.partitions)})")
            time.sleep(0.2)
    return leaders


def leader_counts(leaders) -> dict[int, int]:
    """{node id: how many of the partitions it leads}, by node id."""
    counts: dict[int, int] = {}
    for node in leaders:
        counts[node] = counts.get(node, 0) + 1
    return dict(sorted(counts.items()))


def client_args(args) -> argparse.Namespace:
    """What produce_consume.py's phases read from their arguments."""
    return argparse.Namespace(client="confluent", bytes=args.bytes, record_size=args.record_size, acks="all",
                              linger_ms=args.linger_ms, compression="none", idempotent=False, transactional=0,
                              abort_every=0, isolation="read_uncommitted", client_prop=[], producer_prop=[],
                              consumer_prop=[], consume_timeout=600.0)


def run_target(target: str, pg, args, rnd: int, run_id: int) -> dict:
    """One run: start, create the topic, produce, consume → the run's figures per phase."""
    cargs = client_args(args)
    topic = f"scale-{uuid.uuid4().hex[:8]}"
    run = {"round": rnd, "target": target}
    try:
        with started(target, pg, args, run_id) as (bootstrap, servers, conn):
            produce_consume.create_topic(bootstrap, topic, args.partitions)
            run["leaders"] = wait_for_leaders(bootstrap, topic, args.partitions)
            measure(run, cargs, args, pg, bootstrap, topic, servers, conn)
    except RunFailed as e:
        run["failed"] = str(e)
        print(f"round {rnd} {target:<13} FAILED: {e}", flush=True)
    return run


def measure(run: dict, cargs, args, pg, bootstrap: str, topic: str, servers, conn) -> None:
    """Produce then consume, each phase's figures into ``run``."""
    snap = Snapshot([s.proc.pid for s in servers], [s.metrics_url() for s in servers],
                    pg.pid if conn is not None else None, conn)
    run["brokers"] = len(servers)
    settled = rate = None
    if conn is not None:            # the idle background of pg_stat_database's commits: polls and heartbeats
        time.sleep(args.settle)
        first = snap.database()
        time.sleep(args.settle)
        settled = snap.database()
        rate = background_rate(first, settled)
    for phase in PHASES:
        before = snap.take()
        result = (produce_consume.produce_phase if phase == "produce" else produce_consume.consume_phase)(
            cargs, bootstrap, topic, ServerStats(None))
        after = snap.take()
        window = None
        if conn is not None:
            time.sleep(args.settle)
            window = (settled, snap.database(), rate)
            settled = window[1]
        expected = max(1, args.bytes // args.record_size) if phase == "produce" else result["expected_records"]
        if result["records"] < expected or not result["records"]:
            raise RunFailed(f"{phase}: {result['records']} of {expected} records "
                            f"({'; '.join(map(str, result.get('first_errors') or result.get('errors') or []))})")
        mb = result["records"] * args.record_size / 1e6
        figures = phase_figures(before, after, mb, result.get("client_cpu_s"), result["seconds"], window)
        figures["errors"] = (result.get("errors") or 0) if phase == "produce" else len(result.get("errors") or [])
        run[phase] = figures
        print(format_run(run, phase), flush=True)


# --- the figures over rounds ---------------------------------------------------------------------

SUMMARY_FIGURES = ("mb_per_s", "brokers_cpu_ms_per_mb", "postgres_cpu_ms_per_mb", "rounds_per_s", "rounds_per_mb",
                   "round_ms", "commits_per_s", "commits_per_mb", "write_txns_per_s", "write_txns_per_mb",
                   "wal_bytes_per_mb", "loadavg_1m", "others_cores")


def summarize(runs: list[dict]) -> list[dict]:
    """Per target (in the order first seen) and phase: the spread of each figure over the rounds, and of each
    broker's CPU per MB."""
    out = []
    for target in dict.fromkeys(r["target"] for r in runs):
        mine = [r for r in runs if r["target"] == target]
        for phase in PHASES:
            rows = [r[phase] for r in mine if phase in r and "failed" not in r]
            if not rows:
                continue
            entry = {"target": target, "phase": phase, "rounds": len(rows),
                     "failed": sum(1 for r in mine if "failed" in r)}
            for name in SUMMARY_FIGURES:
                entry[name] = spread(row.get(name) for row in rows)
            width = max(len(row["broker_cpu_ms_per_mb"]) for row in rows)
            entry["broker_cpu_ms_per_mb"] = [spread(row["broker_cpu_ms_per_mb"][i] for row in rows
                                                    if i < len(row["broker_cpu_ms_per_mb"])) for i in range(width)]
            out.append(entry)
    return out


def format_run(run: dict, phase: str) -> str:
    r = run[phase]
    leaders = "/".join(str(n) for n in (run.get("leaders") or {}).values())
    line = (f"round {run['round']} {run['target']:<13} {phase:<7} {_f(r['mb_per_s'], '7.1f')} MB/s  leaders {leaders}  "
            f"brokers CPU "
            f"{'/'.join(_f(c, '.2f') for c in r['broker_cpu_ms_per_mb'])} ms/MB  postgres "
            f"{_f(r['postgres_cpu_ms_per_mb'], '.2f')} ms/MB")
    if r.get("rounds") is not None:
        line += f"  flush rounds {r['rounds']} ({r['rounds_per_s']:.0f}/s, {_f(r['round_ms'], '.1f')} ms)"
    if "commits" in r:
        line += (f"  commits {r['commits']:.0f} ({r['commits_per_s']:.0f}/s, {r['commits_per_mb']:.2f}/MB; idle "
                 f"{r['background_commits_per_s']:.1f}/s)  writing txns {r['write_txns']}")
    if "wal_bytes" in r:
        line += (f"  WAL {r['wal_bytes_per_mb'] / 1e6:.3f} MB/MB  rows {r['batch_rows']} (tuples "
                 f"{r.get('tup_inserted', 'n/a')})")
    return line + f"  load {r['loadavg_1m']:.2f}, others {_f(r.get('others_cores'), '.2f')} cores"


def format_summary(entry: dict) -> str:
    line = (f"{entry['target']:<13} {entry['phase']:<7} {_sp(entry['mb_per_s'], '.1f')} MB/s  brokers CPU "
            f"{_sp(entry['brokers_cpu_ms_per_mb'], '.2f')} ms/MB (each "
            f"{' / '.join(_sp(s, '.2f') for s in entry['broker_cpu_ms_per_mb'])})  postgres "
            f"{_sp(entry['postgres_cpu_ms_per_mb'], '.2f')} ms/MB")
    if entry["rounds_per_s"] is not None:
        line += (f"  flush rounds {_sp(entry['rounds_per_s'], '.0f')}/s {_sp(entry['rounds_per_mb'], '.3f')}/MB "
                 f"{_sp(entry['round_ms'], '.1f')} ms")
    if entry["commits_per_s"] is not None:
        line += f"  commits {_sp(entry['commits_per_s'], '.0f')}/s {_sp(entry['commits_per_mb'], '.3f')}/MB"
    if entry["wal_bytes_per_mb"] is not None:
        wal = {k: (v / 1e6 if k != "n" else v) for k, v in entry["wal_bytes_per_mb"].items()}
        line += f"  writing txns {_sp(entry['write_txns_per_mb'], '.3f')}/MB  WAL {_sp(wal, '.3f')} MB/MB"
    return line + f"  load {_sp(entry['loadavg_1m'], '.1f')}  others {_sp(entry['others_cores'], '.2f')} cores"


def parse_brokers(text: str) -> list[int]:
    counts = [int(x) for x in text.split(",") if x.strip()]
    if not counts or any(n < 1 for n in counts):
        raise argparse.ArgumentTypeError("broker counts: a comma list of positive integers, e.g. 1,2,3")
    return counts


def parse(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--brokers", type=parse_brokers, default=[1, 2, 3],
                    help="broker counts on the PostgreSQL engine, a comma list (default 1,2,3)")
    ap.add_argument("--local", action="store_true", help="also one broker on the local engine (fsync on)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bytes", type=parse_size, default=parse_size("256MiB"), help="record value bytes per run")
    ap.add_argument("--record-size", type=parse_size, default=1024)
    ap.add_argument("--partitions", type=int, default=12)
    ap.add_argument("--linger-ms", type=float, default=5)
    ap.add_argument("--settle", type=float, default=STATS_SETTLE_S,
                    help="seconds to wait for pg_stat_database after each phase (and twice before the first, for its "
                         "idle background)")
    ap.add_argument("--pg-set", action="append", default=[], metavar="NAME=VALUE",
                    help="a PostgreSQL setting (default: its own, fsync and synchronous_commit on)")
    ap.add_argument("--server-set", action="append", default=[], metavar="NAME=VALUE",
                    help="extra --set for every broker")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.partitions < 1:
        ap.error("--rounds and --partitions must be at least 1")
    return args


def main(argv=None) -> int:
    args = parse(argv)
    from trireme.postgresql import PostgresServer
    settings = dict(item.split("=", 1) for item in args.pg_set)
    names = target_names(args.brokers, args.local)
    print(f"cluster_scale: targets {', '.join(names)}; {args.rounds} rounds of {args.bytes / 1e6:.0f} MB, "
          f"{args.record_size} B records, {args.partitions} partitions; PostgreSQL settings {settings or 'default'}",
          flush=True)
    runs = []
    with PostgresServer(settings=settings) as pg:
        run_id = 0
        for rnd in range(1, args.rounds + 1):
            for target in round_order(names, rnd):
                run_id += 1
                runs.append(run_target(target, pg, args, rnd, run_id))
    print("\nmedian [range] over the rounds:")
    summary = summarize(runs)
    for entry in summary:
        print(format_summary(entry))
    print(json.dumps({"runs": runs, "summary": summary}, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
