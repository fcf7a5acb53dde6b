"""Several `trireme serve` processes on one PostgreSQL database: a cluster for the tests, with short leases."""
from __future__ import annotations

import re
import urllib.request
from pathlib import Path

from compat_tests.clients import wait_until
from compat_tests.conftest import ServerProcess

# Leases short enough that a lost broker's partitions move within a test's patience.
FAST_LEASES = {"broker.heartbeat.interval.ms": 200, "broker.session.timeout.ms": 2000,
               "trireme.cluster.metadata.poll.ms": 200}


def wait_for(what: str, check, timeout: float = 30.0):
    """``check()`` until it is truthy → its value (compat_tests.clients.wait_until, with what it waits for first)."""
    return wait_until(check, timeout=timeout, what=what)


def cluster_config(dsn: str, node_id: int, **extra) -> dict:
    return {"node.id": node_id, "trireme.storage": "postgresql", "trireme.storage.postgresql.dsn": dsn,
            **FAST_LEASES, **extra}


class Cluster:
    """``size`` brokers (node ids 1..size), each in a directory of its own under ``workdir``, on ``dsn``."""

    def __init__(self, workdir: Path, dsn: str, size: int = 3, **config):
        self.dsn = dsn
        self.brokers = {n: ServerProcess(Path(workdir) / f"broker-{n}", config=cluster_config(dsn, n, **config))
                        for n in range(1, size + 1)}

    def __enter__(self) -> "Cluster":
        try:
            for broker in self.brokers.values():
                broker.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers.values() if b.running)

    def stop(self) -> None:
        for broker in self.brokers.values():
            broker.stop()


def requests_handled(broker, api: str) -> int:
    """How many ``api`` requests the broker handled, from its metrics endpoint (``trireme.metrics.listen`` on)."""
    urls = wait_until(lambda: re.findall(r"metrics on (http://\S+/metrics)",
                                         broker.stderr_path.read_text(errors="replace")),
                      timeout=20, what=f"{broker}'s metrics address in its log")
    page = urllib.request.urlopen(urls[-1], timeout=10).read().decode()
    found = re.search(rf'^trireme_requests_total\{{api="{api}"\}} (\S+)$', page, re.M)
    return int(float(found.group(1))) if found else 0
