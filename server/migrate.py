"""``trireme migrate``: copies a stopped local broker's partition logs (every topic's and the coordinators' internal ones, so group offsets too) into an empty PostgreSQL database, as batches with unchanged bytes at their offsets.

The data directory is opened as the broker opens it (its lock taken, so a running broker refuses the migration;
recovery and producer state as at start-up).  Transactions still open on a partition are refused with a message:
their markers would be missing in the database.  Each partition is then written with the PostgreSQL engine's own
commit (PostgresEngine.lead, then commit rounds of at most ROUND_BYTES), led by this data directory's node id at
leader epoch 0: the first broker started with ``trireme.storage=postgresql`` on this data directory (its topic
registry, node id and cluster id) serves them, and the controller spreads them over the brokers that join.
"""
from __future__ import annotations

import argparse
import logging
import sys

from .config import ConfigError
from .broker import ROUND_BYTES, Broker
from .data_dir import StartupError
from .postgresql.engine import DatabaseUnavailable, PartitionAppend, PostgresEngine, rows_of

HELP = "copy a stopped local broker's data directory into a PostgreSQL database (trireme.storage=postgresql)"
log = logging.getLogger("trireme.migrate")


def add_parser(sub) -> None:
    p = sub.add_parser("migrate", help=HELP, description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default="./data", help="the stopped broker's data directory (default ./data)")
    p.add_argument("--config", default=None, help="the broker's configuration file (topic defaults, node.id)")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="one broker property")
    p.add_argument("--dsn", required=True, help="the PostgreSQL database to fill (postgresql://...); must be empty")
    p.set_defaults(listen=None, advertised=None)


class MigrationRefused(Exception):
    """What keeps the data directory from being migrated, said in one sentence."""


def run(args, load_config) -> int:
    """``trireme migrate``; ``load_config(args)``: the serve command's configuration, as the broker reads it."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        config = load_config(args)
        copied = migrate(config, args.dsn)
    except (ConfigError, StartupError, MigrationRefused, DatabaseUnavailable, OSError) as e:
        print(f"trireme migrate: {e}", file=sys.stderr)
        return 1
    partitions, batches_bytes = copied
    print(f"migrated {partitions} partition(s), {batches_bytes} bytes of record batches")
    return 0


def migrate(config, dsn: str) -> tuple[int, int]:
    """Copy every partition of the local data directory ``config.data_dir`` into ``dsn`` → (partitions, bytes)."""
    if str(config["trireme.storage"]).lower() != "local":
        raise MigrationRefused("the data directory to migrate is the local engine's (trireme.storage=local)")
    broker = Broker(config, listen="trireme migrate")
    try:
        open_txns = sorted(f"{p.topic.name}-{p.index} (producer {pid})" for p in broker.partitions.values()
                           for pid, _epoch, _first in p.producers.open_transactions())
        if open_txns:
            raise MigrationRefused(f"transactions are still open on {', '.join(open_txns)}: start the broker, let "
                                   f"them commit or abort (trireme transactions abort / force-terminate), stop it, "
                                   f"then migrate")
        engine = PostgresEngine(dsn, broker.node_id)
        try:
            engine.start(broker.cluster_id)
            if engine.holds_partitions():
                raise MigrationRefused("the database already holds partitions: migrate into an empty database")
            total = 0
            for p in sorted(broker.partitions.values(), key=lambda p: (p.topic.name, p.index)):
                total += _copy(engine, p)
            return len(broker.partitions), total
        finally:
            engine.close()
    finally:
        broker.close()


def _copy(engine: PostgresEngine, p) -> int:
    """One partition: its row (led by this node at epoch 0), then its batches from the log start to the high
    watermark, a commit round at a time → the bytes copied."""
    key = (p.topic.topic_id, p.index)
    log_ = p.log
    offset, end, copied = log_.log_start_offset, log_.high_watermark, 0
    committed, new = 0, True        # the first commit creates the row, led by this node at epoch 0
    while offset < end:
        rows, next_offset = rows_of(log_, offset, end, ROUND_BYTES)
        if not rows:
            break
        refused = engine.commit([PartitionAppend(key, 0, committed, next_offset, log_.log_start_offset, rows,
                                                 new)], [])
        if refused:
            raise MigrationRefused(f"partition {p.topic.name}-{p.index} changed in the database during the migration")
        copied += sum(len(data) for _, _, data in rows)
        committed = offset = next_offset
        new = False
    if offset < end:
        raise MigrationRefused(f"partition {p.topic.name}-{p.index}: nothing could be read at offset {offset}")
    if new:                         # an empty log (its start may have moved): the row records where it starts
        engine.commit([PartitionAppend(key, 0, committed, end, log_.log_start_offset, [], new)], [])
    log.info("partition %s-%d: offsets %d..%d, %d bytes", p.topic.name, p.index, log_.log_start_offset, end, copied)
    return copied
