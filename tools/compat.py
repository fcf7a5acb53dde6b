"""Run the compatibility suite against one broker or several and write the client × feature matrix.

    tools/compat.py                                   # a trireme serve the suite starts itself
    tools/compat.py --bootstrap kafka:9092            # a broker you run
    tools/compat.py --bootstrap 127.0.0.1:9092 --name trireme --bootstrap kafka:9092 --name kafka-3.9
    tools/compat.py --quick --clients confluent-kafka,java-3.9 --bootstrap kafka:9092
    tools/compat.py --matrix-only --write-docs docs/compatibility.md
    tools/compat.py --quick --bootstrap kafka:9094 --command-config client.properties   # a SASL_SSL listener

Per broker (in the order given) it runs pytest on compat_tests/ with the matrix plugin (compat_tests/matrix.py)
and writes OUT/NAME.json and OUT/NAME.md; with two or more brokers also OUT/comparison.{json,md}, one row per
client and feature with a column per broker.  ``--restart-command``/``--kill-command``/``--broker-config`` and
``--command-config`` (Kafka client properties every client uses to reach a secured listener) apply to the
``--bootstrap`` before them.  Arguments after ``--`` go to pytest.  Exit status 1 if any cell failed.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from compat_tests import matrix  # noqa: E402


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[dict], list[str]]:
    extra: list[str] = []
    if "--" in argv:
        argv, extra = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--bootstrap", action="append", default=[], metavar="HOST:PORT",
                   help="a broker to run against (repeat for side-by-side columns); none: our own trireme serve")
    p.add_argument("--name", action="append", default=[], help="the name of the broker before it in the report")
    p.add_argument("--restart-command", action="append", default=[], metavar="CMD")
    p.add_argument("--kill-command", action="append", default=[], metavar="CMD")
    p.add_argument("--broker-config", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--command-config", action="append", default=[], metavar="FILE",
                   help="client properties (security.protocol, sasl.mechanism, sasl.jaas.config, PEM ssl.truststore.* / "
                        "ssl.keystore.*) every client uses to reach the --bootstrap before it")
    p.add_argument("--quick", action="store_true", help="one test per client and feature")
    p.add_argument("--matrix-only", action="store_true", help="only the tests behind the matrix's cells")
    p.add_argument("--clients", metavar="A,B", help="only these clients, e.g. confluent-kafka,java-3.9")
    p.add_argument("--out", default="compat-report", help="directory for the reports (default: compat-report)")
    p.add_argument("--write-docs", metavar="PATH", help="also put the matrix of the (single) run into PATH "
                   "(docs/compatibility.md), replacing its generated part")
    args = p.parse_args(argv)
    # Attach per-broker options to the --bootstrap they follow.
    brokers: list[dict] = []
    current: dict = {"bootstrap": None, "extra": []}
    tokens = iter(argv)
    for token in tokens:
        key, eq, inline = token.partition("=")
        if key not in ("--bootstrap", "--name", "--restart-command", "--kill-command", "--broker-config",
                       "--command-config"):
            continue
        value = inline if eq else next(tokens)
        if key == "--bootstrap":
            current = {"bootstrap": value, "extra": []}
            brokers.append(current)
        elif key == "--name":
            current["name"] = value
        else:
            if current["bootstrap"] is None:
                p.error(f"{key} belongs after the --bootstrap it is for")
            current["extra"] += [key, value]
    if not brokers:
        brokers = [current]
    if args.write_docs and len(brokers) > 1:
        p.error("--write-docs takes the matrix of a single broker's run")
    return args, brokers, extra


def run_one(args: argparse.Namespace, broker: dict, out: Path, extra: list[str]) -> Path:
    name = broker.get("name") or (broker["bootstrap"] or "trireme")
    report = out / re.sub(r"[^A-Za-z0-9._-]+", "_", name)
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rN", "compat_tests",
           "--compat-report", str(report), "--broker-name", name, *broker["extra"]]
    if broker["bootstrap"]:
        cmd += ["--bootstrap", broker["bootstrap"]]
    for flag in ("quick", "matrix_only"):
        if getattr(args, flag):
            cmd.append("--" + flag.replace("_", "-"))
    if args.clients:
        cmd += ["--clients", args.clients]
    cmd += extra
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    if not Path(f"{report}.json").exists():
        sys.exit(f"no report from the run against {name}: pytest did not get to the end (see above)")
    return report


def main(argv: list[str] | None = None) -> int:
    args, brokers, extra = parse(sys.argv[1:] if argv is None else argv)
    out = Path(args.out)
    reports = [json.loads(Path(f"{run_one(args, b, out, extra)}.json").read_text()) for b in brokers]
    if len(reports) > 1:
        comparison = matrix.compare(reports)
        (out / "comparison.json").write_text(json.dumps(comparison, indent=1) + "\n")
        (out / "comparison.md").write_text(matrix.render_comparison(comparison))
        print(f"side by side: {out / 'comparison.md'}")
    if args.write_docs:
        matrix.update_docs(Path(args.write_docs), matrix.render_markdown(reports[0]))
        print(f"updated {args.write_docs}")
    failed = [(r["run"]["broker"], client, feature) for r in reports for client, row in r["cells"].items()
              for feature, c in row.items() if c["outcome"] == "fail"]
    for broker, client, feature in failed:
        print(f"FAIL {broker}: {client} / {feature}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
