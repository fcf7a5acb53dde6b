"""PySpark's kafka sink and source over SASL_SSL with SCRAM-SHA-512, configured with Spark's documented
``kafka.``-prefixed options (the Kafka client properties of docs/security.md's walk-through), against a
``trireme serve`` with a SASL_SSL listener (conftest.py ``secured_server``).  Runs in the Spark phase
(``make test-spark``); when it runs and where PySpark comes from: compat_tests/spark_support.py.
"""
from __future__ import annotations

import uuid

from compat_tests.python_clients import create_topics
from compat_tests.security import ClientSecurity
from compat_tests.spark_support import requires_connector, spark_harness

pytestmark = requires_connector

SPARK_TIMEOUT_S = 420       # hang guard: a JVM start and a job on 2 busy cores


def spark_options(security: ClientSecurity) -> dict[str, str]:
    """What a PySpark user writes: ``kafka.security.protocol``, ``kafka.sasl.mechanism``, ``kafka.sasl.jaas.config``
    and the PEM truststore, each Kafka client property with Spark's ``kafka.`` prefix."""
    return {f"kafka.{k}": v for k, v in security.java().items()}


def test_sink_and_source_over_sasl_ssl(secured_server):
    """The sink writes 30 rows to 3 partitions, the source reads them back (batch, earliest..latest); the same read
    with a wrong password fails with the Java client's SaslAuthenticationException."""
    topic = f"spark-sasl-{uuid.uuid4().hex[:8]}"
    create_topics(secured_server.plaintext, [topic], 3)
    rows = [{"key": f"k{i}", "value": f"v{i}", "partition": i % 3} for i in range(30)]
    options = spark_options(secured_server.scram)
    assert options["kafka.security.protocol"] == "SASL_SSL"
    assert options["kafka.sasl.mechanism"] == "SCRAM-SHA-512"
    with spark_harness(secured_server.sasl_ssl) as spark:
        wrote = spark.call("write", topic=topic, rows=rows, options=options, timeout=SPARK_TIMEOUT_S)
        assert wrote.get("ok"), wrote
        got = spark.call("read", options={"subscribe": topic, "startingOffsets": "earliest",
                                          "endingOffsets": "latest", **options}, timeout=SPARK_TIMEOUT_S)
        assert got.get("ok"), got
        wrong = options | spark_options(secured_server.scram.replace(password="not-the-password"))
        refused = spark.call("read", options={"subscribe": topic, "startingOffsets": "earliest",
                                              "endingOffsets": "latest", **wrong}, timeout=SPARK_TIMEOUT_S)
        assert refused["ok"] is False and "SaslAuthenticationException" in refused["error"], refused
    assert sorted((r["partition"], r["key"], r["value"]) for r in got["rows"]) == \
        sorted((r["partition"], r["key"], r["value"]) for r in rows)
    for p in range(3):
        assert sorted(r["offset"] for r in got["rows"] if r["partition"] == p) == list(range(10))
