"""What the compat suite knows of a broker apart from any test: the settings it gives the brokers it starts, and what it learns by asking one (over the admin client's connection); conftest.py and matrix.py both import it, it imports neither."""
from __future__ import annotations

import time
from typing import Any

from trireme.server.admin.client import API_KEYS, AdminError, Connection, parse_host_port, request, request_class

# Short group timings so rebalances in tests are quick.
BASE_SERVER_CONFIG: dict[str, Any] = {
    "group.initial.rebalance.delay.ms": 0,
    "group.min.session.timeout.ms": 1000,
}

# How the probe's connections reach the broker (conftest.py's --command-config: the admin client's settings read from
# that file, trireme.server.admin.security.load_command_config); None: PLAINTEXT.
PROBE_SECURITY: Any = None

# What a probe of a broker that is not (yet) answering may raise.
PROBE_ERRORS = (AdminError, OSError, IndexError)


class BrokerInfo:
    """What the suite learns of a broker by asking it: its API ranges, the Kafka generation they are
    (``kafka_major``: 4 once Fetch v0-3 are gone, KIP-896), and whether it is Trireme (its broker
    configs include ``trireme.*`` properties)."""

    def __init__(self, bootstrap: str, timeout: float = 10.0):
        self.bootstrap = bootstrap
        conn = self._connect(timeout)             # its ApiVersions gives the ranges
        try:
            self.api_versions = dict(conn.versions)
            meta = conn.send("Metadata", 12, request("Metadata", topics=[]))
            cls = request_class("DescribeConfigs")
            configs = conn.send("DescribeConfigs", 4, cls(resources=[cls.DescribeConfigsResource(
                resource_type=4, resource_name=str(meta.brokers[0].node_id),
                configuration_keys=["trireme.shutdown.grace.ms"])]))
        finally:
            conn.close()
        self.kafka_major = 4 if self.api_versions.get(API_KEYS["Fetch"], (0, 0))[0] >= 4 else 3
        self.is_trireme = any(c.name.startswith("trireme.") for r in configs.results for c in r.configs)

    def _connect(self, timeout: float = 10.0) -> Connection:
        secured = {} if PROBE_SECURITY is None else {"security": PROBE_SECURITY}
        return Connection(*parse_host_port(self.bootstrap), timeout=timeout, **secured)

    def partitions(self, topic: str) -> list[int]:
        """The topic's partitions in the order the broker's Metadata lists them (Kafka's is not sorted)."""
        cls = request_class("Metadata")
        conn = self._connect()
        try:
            meta = conn.send("Metadata", 12, cls(topics=[cls.MetadataRequestTopic(name=topic)]))
        finally:
            conn.close()
        [t] = meta.topics
        assert t.error_code == 0, t
        return [p.partition_index for p in t.partitions]


_BROKER_INFO: dict[str, BrokerInfo] = {}


def broker_info(bootstrap: str) -> BrokerInfo:
    if bootstrap not in _BROKER_INFO:
        _BROKER_INFO[bootstrap] = BrokerInfo(bootstrap)
    return _BROKER_INFO[bootstrap]


def wait_until_answering(bootstrap: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            BrokerInfo(bootstrap, timeout=5)
            return
        except PROBE_ERRORS:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
