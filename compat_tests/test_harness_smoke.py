"""The client harnesses themselves, without a broker: they start, speak the
line protocol, survive bad commands, load every compression codec they
claim, and give up on an unreachable broker instead of hanging."""
from __future__ import annotations

import socket
import subprocess
import time

import pytest

from compat_tests import clients


def closed_port_bootstrap() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"127.0.0.1:{port}"   # nothing listens there any more


def check_protocol(h: clients.HarnessProcess, expect_version: str, codecs: list[str]) -> None:
    v = h.call("version", timeout=60)
    assert v == {"ok": True, "client": "java" if h.kind == "java" else "kafkajs",
                 "version": expect_version}

    bad = h.send_raw("this is not json")
    assert bad["ok"] is False and bad["error"].startswith("BadCommand:")
    assert h.send_raw("[1, 2]")["ok"] is False
    unknown = h.call("no_such_op")
    assert unknown["ok"] is False and "no_such_op" in unknown["error"]
    missing = h.send_raw('{"topic": "t"}')
    assert missing["ok"] is False

    for codec in codecs:
        r = h.call("selftest_codec", codec=codec)
        assert r["ok"], r
        assert 0 < r["compressed_size"] < r["size"]

    # Unreachable broker: an error within the client's ~10 s timeouts.
    t0 = time.monotonic()
    r = h.call("list_topics", timeout=45)
    assert r["ok"] is False and r["error"]
    assert time.monotonic() - t0 < 40

    # Still alive and answering after all that.
    assert h.call("version")["ok"]
    assert h.call("exit") == {"ok": True}
    assert h.proc.wait(timeout=30) == 0


@pytest.mark.parametrize("version", clients.JAVA_VERSIONS)
def test_java_harness_protocol(version):
    clients.require_java(version)
    h = clients.java_harness(version, closed_port_bootstrap())
    try:
        check_protocol(h, version, ["gzip", "snappy", "lz4", "zstd"])
        # Client logging went to stderr (stdout lines all parsed as JSON above).
        assert "127.0.0.1" in h.stderr_tail()
    finally:
        h.close()


def test_java_classpath_is_hand_picked():
    for version in clients.JAVA_VERSIONS:
        clients.require_java(version)
        jars = sorted(p.rsplit("/", 1)[-1] for p in clients.java_classpath(version).split(":")
                      if p.endswith(".jar"))
        assert f"kafka-clients-{version}.jar" in jars
        assert not [j for j in jars if "debezium" in j], jars
        # Jackson for the client's OAUTHBEARER login (as Kafka's libs/ has it): databind, core, annotations only.
        assert sorted(j.rsplit("-", 1)[0] for j in jars if "jackson" in j) == \
            ["jackson-annotations", "jackson-core", "jackson-databind"], jars
        assert len(jars) == 11 + any(j.startswith("jose4j-") for j in jars), jars


def test_kafkajs_harness_protocol():
    clients.require_kafkajs()
    h = clients.kafkajs_harness(closed_port_bootstrap())
    try:
        check_protocol(h, "2.2.4", ["gzip"])
        # kafkajs ships no snappy/lz4/zstd: reported, not crashed.
    finally:
        h.close()


def test_kafkajs_reports_missing_codecs():
    clients.require_kafkajs()
    with clients.kafkajs_harness(closed_port_bootstrap()) as h:
        r = h.call("selftest_codec", codec="snappy")
        assert r["ok"] is False and "Snappy" in r["error"]
        r = h.produce("t", [clients.record(b"v")], config={"compression.type": "lz4"})
        assert r["ok"] is False and "gzip" in r["error"]


def test_kcat_installed():
    kcat = clients.require_kcat()
    out = subprocess.run([kcat, "-V"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "librdkafka" in out.stdout


def test_kcat_output_parser():
    raw = (b"#0 5 1700000000000 3 11\nkey" b"line1\nline2 a=1,b=2\n"
           b"#1 6 -1 -1 -1\n \n"
           b"#2 7 1700000000001 0 0\n h=\n")
    recs = clients.parse_kcat_output(raw)
    assert [(r.partition, r.offset) for r in recs] == [(0, 5), (1, 6), (2, 7)]
    assert recs[0].key == b"key" and recs[0].value == b"line1\nline2"
    assert recs[0].headers == [("a", "1"), ("b", "2")]
    assert recs[0].timestamp == 1700000000000
    assert recs[1].key is None and recs[1].value is None and recs[1].timestamp is None
    assert recs[1].headers == []
    assert recs[2].key == b"" and recs[2].value == b"" and recs[2].headers == [("h", "")]
