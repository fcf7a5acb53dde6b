"""``trireme serve --topic NAME[:PARTITIONS[:KEY=VALUE,...]]``: topics that exist before the first client connects."""
import subprocess
import sys

import pytest
from kafka import KafkaAdminClient
from kafka.admin import ConfigResource, ConfigResourceType

from trireme.server.config import ConfigError, parse_topic_spec


def test_parse_topic_spec():
    assert parse_topic_spec("orders") == ("orders", -1, {})
    assert parse_topic_spec("orders:3") == ("orders", 3, {})
    assert parse_topic_spec("orders::retention.ms=1000") == ("orders", -1, {"retention.ms": "1000"})
    assert parse_topic_spec("t:2:cleanup.policy=compact,delete,retention.ms=5") == (
        "t", 2, {"cleanup.policy": "compact,delete", "retention.ms": "5"})
    for bad in ("", ":3", "t:x", "t:1:novalue"):
        with pytest.raises(ConfigError):
            parse_topic_spec(bad)


def _serve(tmp_path, *topics, stderr=subprocess.DEVNULL):
    argv = [sys.executable, "-m", "trireme", "serve", "--data-dir", str(tmp_path / "data"), "--listen", "127.0.0.1:0"]
    for spec in topics:
        argv += ["--topic", spec]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=stderr, text=True)


def test_serve_creates_topics_once(tmp_path):
    for run in range(2):                       # the second start finds them and leaves them as they are
        proc = _serve(tmp_path, "orders:3:cleanup.policy=compact,delete", "audit")
        try:
            line = proc.stdout.readline()
            assert line.startswith("listening on "), line
            admin = KafkaAdminClient(bootstrap_servers=line.split()[-1], request_timeout_ms=30000)
            try:
                topics = {t["name"]: len(t["partitions"]) for t in admin.describe_topics(["orders", "audit"])}
                configs = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, "orders")])
            finally:
                admin.close()
            assert topics == {"orders": 3, "audit": 1}
            assert configs["topic"]["orders"]["cleanup.policy"]["value"] == "compact,delete"
        finally:
            proc.terminate()
            assert proc.wait(timeout=30) == 0


def test_serve_refuses_a_bad_topic(tmp_path):
    proc = _serve(tmp_path, "bad name:1", stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "--topic" in err
