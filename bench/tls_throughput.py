"""Produce and consume throughput over PLAINTEXT and over SSL on one broker, and the broker CPU each costs (docs/performance.md, "TLS").

    .venv/bin/python bench/tls_throughput.py [--bytes 256MiB] [--rounds 2] [--record-size 1024] [--fsync/--no-fsync]

Starts one ``trireme serve`` on a temporary data directory with two listeners: the PLAINTEXT one (--listen) and
``SSL://127.0.0.1:0`` with a certificate made by ``trustme`` for this run (never stored).  Each round runs
bench/produce_consume.py against each listener in turn (its --bootstrap/--server-pid mode; for SSL its
--client-prop security.protocol=SSL and the run's CA), so the two protocols alternate on the same broker and
machine.  Per phase it prints MB/s and the broker's CPU seconds per GB moved; the last stdout line is a JSON
summary.  Nothing is asserted.  Needs the test extra (trustme).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile

import trustme
from cryptography.hazmat.primitives import serialization

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
LISTENING = re.compile(r"listening on (\S+?):(\d+)(?: listener=(\S+))?")


def write_certificates(directory: str) -> tuple[str, str]:
    """(the broker's PEM keystore: PKCS#8 key + chain, the CA file) for 127.0.0.1/localhost."""
    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    key = serialization.load_pem_private_key(cert.private_key_pem.bytes(), None).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    keystore, ca_path = os.path.join(directory, "keystore.pem"), os.path.join(directory, "ca.pem")
    with open(keystore, "wb") as f:
        f.write(key + b"".join(c.bytes() for c in cert.cert_chain_pems))
    ca.cert_pem.write_to_path(ca_path)
    return keystore, ca_path


def start_broker(directory: str, keystore: str, fsync: bool) -> tuple[subprocess.Popen, dict[str, str]]:
    """The broker process and {listener name: HOST:PORT} from its stdout lines."""
    cmd = [sys.executable, "-m", "trireme", "serve", "--data-dir", os.path.join(directory, "data"),
           "--listen", "127.0.0.1:0", "--set", "listeners=SSL://127.0.0.1:0",
           "--set", f"ssl.keystore.location={keystore}", "--set", f"trireme.fsync.enable={str(fsync).lower()}"]
    log = open(os.path.join(directory, "server.log"), "wb")
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=log)
    addresses = {}
    for _ in range(2):
        m = LISTENING.match(proc.stdout.readline().decode())
        if m is None:
            proc.kill()
            raise SystemExit(f"the broker did not start; see {log.name}")
        addresses[m.group(3) or "PLAINTEXT"] = f"{m.group(1)}:{m.group(2)}"
    return proc, addresses


def run_round(bootstrap: str, pid: int, args, ssl_props: list[str]) -> dict:
    cmd = [sys.executable, os.path.join(HERE, "produce_consume.py"), "--bootstrap", bootstrap, "--server-pid",
           str(pid), "--bytes", str(args.bytes), "--record-size", str(args.record_size)]
    for prop in ssl_props:
        cmd += ["--client-prop", prop]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv=None) -> int:
    sys.path.insert(0, HERE)
    from produce_consume import parse_size
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bytes", type=parse_size, default=parse_size("256MiB"), help="record bytes a phase (256MiB)")
    ap.add_argument("--record-size", type=parse_size, default=1024)
    ap.add_argument("--rounds", type=int, default=2, help="PLAINTEXT then SSL, this many times (2)")
    ap.add_argument("--fsync", action=argparse.BooleanOptionalAction, default=True)
    args = ap.parse_args(argv)
    directory = tempfile.mkdtemp(prefix="trireme-tls-bench-")
    proc = None
    try:
        keystore, ca_path = write_certificates(directory)
        proc, addresses = start_broker(directory, keystore, args.fsync)
        props = {"PLAINTEXT": [], "SSL": ["security.protocol=SSL", f"ssl.ca.location={ca_path}"]}
        runs: dict[str, list[dict]] = {"PLAINTEXT": [], "SSL": []}
        for round_ in range(args.rounds):
            for name in ("PLAINTEXT", "SSL"):
                summary = run_round(addresses[name], proc.pid, args, props[name])
                row = {}
                for phase in ("produce", "consume"):
                    r = summary[phase]
                    cpu = r.get("server_cpu_s")
                    row[phase] = {"mb_per_s": round(r["mb_per_s"], 1),
                                  "server_cpu_s": None if cpu is None else round(cpu, 2),
                                  "server_cpu_s_per_gb": None if cpu is None else round(cpu / (r["bytes"] / 1e9), 2)}
                runs[name].append(row)
                print(f"round {round_ + 1} {name:9} produce {row['produce']['mb_per_s']:7.1f} MB/s "
                      f"(broker {row['produce']['server_cpu_s_per_gb']} CPU s/GB)   consume "
                      f"{row['consume']['mb_per_s']:7.1f} MB/s (broker {row['consume']['server_cpu_s_per_gb']} "
                      f"CPU s/GB)", flush=True)
        medians = {name: {phase: {key: statistics.median(r[phase][key] for r in rows)
                                  for key in ("mb_per_s", "server_cpu_s_per_gb")}
                          for phase in ("produce", "consume")} for name, rows in runs.items()}
        print(json.dumps({"config": {"bytes": args.bytes, "record_size": args.record_size, "rounds": args.rounds,
                                     "fsync": args.fsync, "cores": os.cpu_count()},
                          "runs": runs, "medians": medians}, separators=(",", ":")), flush=True)
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
