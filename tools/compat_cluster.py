"""Run the compatibility suite (tools/compat.py) against a cluster of three trireme serve processes on a PostgreSQL this
command starts and removes (trireme/postgresql.py, compat_tests/cluster_support.py).

    tools/compat_cluster.py                           # the full matrix, report in compat-report/cluster.{json,md}
    tools/compat_cluster.py --quick --out /tmp/r      # arguments go to tools/compat.py
    tools/compat_cluster.py --serve                   # only start the cluster; print its bootstrap list; Ctrl-C or
                                                      # SIGTERM stops it

The brokers' working directories (logs) are kept under a temporary directory this prints.  Exit status: tools/compat.py's.
"""
from __future__ import annotations

import signal
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))

import compat  # noqa: E402
from compat_tests.cluster_support import Cluster  # noqa: E402
from trireme.postgresql import PostgresServer  # noqa: E402

SIZE = 3


def main(argv: list[str]) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="trireme-compat-cluster-"))
    print(f"cluster working directories: {workdir}", flush=True)
    with PostgresServer() as pg, Cluster(workdir, pg.dsn, size=SIZE) as cluster:
        print(f"cluster bootstrap: {cluster.bootstrap}", flush=True)
        if argv == ["--serve"]:
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))    # leaving the with blocks stops it all
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                return 0
        args = ["--bootstrap", cluster.bootstrap, "--name", "cluster", *argv]
        return compat.main(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
