"""The compatibility suite as a product: tools/compat.py in external mode against trireme serve processes this
test starts (for the suite they are brokers someone else runs), and the reports it writes."""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from compat_tests import matrix
from compat_tests.clients import wait_until
from compat_tests.cluster_support import Cluster
from compat_tests.conftest import ServerProcess, server_command

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.trireme_only("runs the suite itself against trireme serve processes")


def run_compat(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "tools" / "compat.py"), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def test_every_rule_backs_a_test():
    """Each rule of the matrix still matches a collected test (a renamed test does not silently leave its cell)."""
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--collect-only",
                          "compat_tests"], cwd=REPO, capture_output=True, text=True, timeout=300).stdout
    ids = [matrix.test_id(line) for line in out.splitlines() if "::" in line]
    assert len(ids) > 100, out[-2000:]
    unmatched = [r.pattern for r in matrix.RULES if not any(re.match(r.pattern, i) for i in ids)]
    assert unmatched == []
    for client in matrix.CLIENTS:
        for feature in matrix.FEATURES:
            backed = any((client, feature) in matrix.cells_of(i)[0] for i in ids)
            assert backed or (client, feature) in matrix.LACKS, f"no test backs {client} / {feature}"


def test_quick_run_against_an_external_trireme(server, tmp_path):
    """Every cell of the quick run is filled and none failed; what needs the broker's process or a restart
    command is reported not applicable, with its reason."""
    check_quick_run(server.bootstrap, tmp_path)


def test_quick_run_on_postgresql(postgres_database, tmp_path):
    """The same quick run against a broker whose partition logs are durable in PostgreSQL
    (trireme.storage=postgresql): every cell as on the local engine."""
    server = ServerProcess(tmp_path / "broker", config={"trireme.storage": "postgresql",
                                                         "trireme.storage.postgresql.dsn": postgres_database})
    server.start()
    try:
        check_quick_run(server.bootstrap, tmp_path / "report")
        assert "offline" not in server.log_text()           # no commit failed or was fenced
    finally:
        server.stop()


def test_quick_run_on_a_cluster(postgres_database, tmp_path):
    """The quick run against three brokers on one PostgreSQL, given as a bootstrap list: every cell as against one
    broker (each client bootstraps from the list and follows Metadata to the leaders and coordinators)."""
    with Cluster(tmp_path / "cluster", postgres_database, size=3) as cluster:
        check_quick_run(cluster.bootstrap, tmp_path / "report")
        for broker in cluster.brokers.values():
            assert "offline" not in broker.log_text()       # no commit failed or was fenced


def check_quick_run(bootstrap: str, out: Path) -> None:
    done = run_compat("--bootstrap", bootstrap, "--name", "external-trireme", "--quick", "--out", str(out))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    report = json.loads((out / "external-trireme.json").read_text())
    assert report["run"]["bootstrap"] == bootstrap and report["run"]["is_trireme"] is True
    assert report["run"]["mode"] == "quick"
    assert list(report["cells"]) == list(matrix.CLIENTS)
    outcomes = {(c, f): cell["outcome"] for c, row in report["cells"].items() for f, cell in row.items()}
    assert len(outcomes) == len(matrix.CLIENTS) * len(matrix.FEATURES)
    assert {o for o in outcomes.values()} <= {"pass", "n/a", "client lacks", "not tested"}, outcomes
    assert [cell for cell, o in outcomes.items() if o in ("client lacks", "not tested")] == list(matrix.LACKS)
    # The one test behind Spark's cells reads requests only a broker of our own captures.
    spark = report["cells"]["spark"]["produce"]
    assert spark["outcome"] == "n/a" and "TRIREME_CAPTURE_DIR" in spark["message"], spark
    assert sum(o == "pass" for o in outcomes.values()) >= 40
    text = (out / "external-trireme.md").read_text()
    assert text.startswith(matrix.GENERATED_BEGIN) and "| kafkajs 2." in text


def test_two_brokers_side_by_side(server, tmp_path):
    """Two brokers, one client: one comparison with a column per broker."""
    other = ServerProcess(Path(tempfile.mkdtemp(prefix="trireme-compat-other-")))
    other.start()
    try:
        done = run_compat("--bootstrap", server.bootstrap, "--name", "a",
                          "--bootstrap", other.bootstrap, "--name", "b", "--broker-config",
                          "group.min.session.timeout.ms=1000", "--clients", "kcat", "--out", str(tmp_path),
                          "--", "-k", "roundtrip and none or kcat_reads")
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    finally:
        other.stop()
    comparison = json.loads((tmp_path / "comparison.json").read_text())
    assert [run["broker"] for run in comparison["runs"]] == ["a", "b"]
    rows = {(r["client"], r["feature"]): r for r in comparison["rows"]}
    assert set(rows) == {("kcat", f) for f in matrix.FEATURES}
    assert rows[("kcat", "produce")]["outcomes"] == ["pass", "pass"]
    assert rows[("kcat", "read_committed")]["outcomes"] == ["pass", "pass"]
    assert rows[("kcat", "admin")]["outcomes"] == ["client lacks", "client lacks"]
    assert not any(r["differs"] for r in rows.values())
    md = (tmp_path / "comparison.md").read_text()
    assert "| client | feature | a | b | differs |" in md


def test_restart_tests_need_a_restart_command(tmp_path):
    """A test that restarts the broker is not applicable without --restart-command, and runs with one (here: a
    shell command that stops this trireme serve and starts it again in the background, as a supervisor would)."""
    srv = ServerProcess(tmp_path / "broker")
    srv.start()
    pidfile = tmp_path / "pid"
    pidfile.write_text(str(srv.proc.pid))
    serve = " ".join(shlex.quote(a) for a in server_command() + [
        "--data-dir", str(srv.data_dir), "--listen", srv.bootstrap, "--config", str(srv.config_path)])
    restart = (f"pid=$(cat {pidfile}); kill -TERM $pid; "
               f"while ps -o stat= -p $pid | grep -q '^[^Z]'; do sleep 0.1; done; "
               f"{serve} >>{tmp_path / 'restarted.log'} 2>&1 </dev/null & echo $! >{pidfile}")
    test = "compat_tests/test_groups_python.py::test_committed_offsets_survive_server_restart[confluent-kafka]"
    try:
        results = {}
        for name, extra in (("without", []), ("with", ["--restart-command", restart])):
            subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", test, "--bootstrap",
                            srv.bootstrap, "--compat-report", str(tmp_path / name), *extra], cwd=REPO,
                           capture_output=True, text=True, timeout=600)
            results[name] = json.loads((tmp_path / f"{name}.json").read_text())["cells"]["confluent-kafka"]["groups"]
    finally:
        pid = int(pidfile.read_text())
        if pid != srv.proc.pid:
            os.kill(pid, signal.SIGTERM)
            wait_until(lambda: subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True,
                                              text=True).stdout.strip() in ("", "Z"), timeout=30,
                       what="the restarted broker to stop")
        srv.stop()
    assert results["without"]["outcome"] == "n/a", results
    assert results["without"]["message"] == "restarts the broker: needs --restart-command"
    assert results["with"]["outcome"] == "pass", results
    assert int(pidfile.read_text()) != srv.proc.pid           # it really was restarted


def test_quick_run_over_sasl_ssl(secured_server, tmp_path):
    """The quick matrix with every client on a SASL_SSL listener (SCRAM-SHA-512, the first SCRAM user), its
    settings given as a Kafka client properties file (--command-config): each cell passes as it does over
    PLAINTEXT, except kcat's, which this machine's kcat cannot reach (librdkafka 2.0.2's SCRAM, see
    test_security_clients.py::test_kcat_scram_login_refused_as_by_kafka_4)."""
    props = tmp_path / "client.properties"
    props.write_text("".join(f"{k}={v}\n" for k, v in secured_server.scram.java().items()))
    done = run_compat("--bootstrap", secured_server.sasl_ssl, "--command-config", str(props), "--name", "sasl-ssl",
                      "--quick", "--out", str(tmp_path / "report"))
    report = json.loads((tmp_path / "report" / "sasl-ssl.json").read_text())
    assert report["run"]["security"] == "SASL_SSL SCRAM-SHA-512" and report["run"]["is_trireme"] is True, \
        report["run"]
    outcomes = {(c, f): (cell["outcome"], cell.get("message")) for c, row in report["cells"].items()
                for f, cell in row.items()}
    failed = {cell: o for cell, o in outcomes.items() if o[0] == "fail"}
    assert failed == {}, (failed, done.stdout[-4000:])
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    for (client, feature), (outcome, message) in outcomes.items():
        if client == "kcat" and (client, feature) not in matrix.LACKS:
            assert outcome == "skipped" and "librdkafka 2.0.2" in message, (feature, outcome, message)
    passed = {cell for cell, (o, _) in outcomes.items() if o == "pass"}
    for client in ("confluent-kafka", "kafka-python", "aiokafka", "kafkajs", "java-3.9.0", "java-4.3.0"):
        assert {(client, f) for f in ("produce", "consume", "groups", "transactions", "read_committed")} <= passed, \
            client
    assert "over SASL_SSL SCRAM-SHA-512" in (tmp_path / "report" / "sasl-ssl.md").read_text()
