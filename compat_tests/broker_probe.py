"""What the compat suite knows of a broker apart from any test: the settings it gives the brokers it starts, and what it learns by asking one (over the admin client's connection); conftest.py and matrix.py both import it, it imports neither."""
from __future__ import annotations

import time
from typing import Any

from compat_tests.clients import wait_until
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
    (``kafka_major``: 4 once Fetch v0-3 are gone, KIP-896), whether it is Trireme (its broker
    configs include ``trireme.*`` properties), and the cluster's brokers (``brokers``: node id → (host, port), in
    node id order) and controller (``controller_id``), as its Metadata lists them: one broker, or a cluster's."""

    def __init__(self, bootstrap: str, timeout: float = 10.0):
        self.bootstrap = bootstrap
        conn = self._connect(timeout)             # its ApiVersions gives the ranges
        try:
            self.api_versions = dict(conn.versions)
            meta = conn.send("Metadata", 12, request("Metadata", topics=[]))
            self.brokers = {b.node_id: (b.host, b.port) for b in sorted(meta.brokers, key=lambda b: b.node_id)}
            self.controller_id = meta.controller_id
            cls = request_class("DescribeConfigs")
            configs = conn.send("DescribeConfigs", 4, cls(resources=[cls.DescribeConfigsResource(
                resource_type=4, resource_name=str(meta.brokers[0].node_id),
                configuration_keys=["trireme.shutdown.grace.ms"])]))
        finally:
            conn.close()
        self.kafka_major = 4 if self.api_versions.get(API_KEYS["Fetch"], (0, 0))[0] >= 4 else 3
        self.is_trireme = any(c.name.startswith("trireme.") for r in configs.results for c in r.configs)

    def _connect(self, timeout: float = 10.0, address: tuple[str, int] | None = None) -> Connection:
        """A connection to ``address``, by default the bootstrap list's first broker (every broker answers for the
        cluster)."""
        secured = {} if PROBE_SECURITY is None else {"security": PROBE_SECURITY}
        return Connection(*(address or bootstrap_addresses(self.bootstrap)[0]), timeout=timeout, **secured)

    def partitions(self, topic: str) -> list[int]:
        """The topic's partitions in the order the broker's Metadata lists them (Kafka's is not sorted)."""
        return [p.partition_index for p in self._topic(topic).partitions]

    def leaders(self, topic: str, timeout: float = 30.0) -> dict[int, int]:
        """The topic's partitions → their leaders' node ids, once every broker's Metadata lists the same ones (a
        cluster's brokers learn a topic the controller created a moment after it answered, as Kafka's do; Kafka's
        own tests wait for every broker the same way)."""
        def agreed():
            seen = [self._topic_at(address, topic) for address in self.addresses()]
            found = [None if t.error_code else {p.partition_index: p.leader_id for p in t.partitions} for t in seen]
            return found[0] if found[0] and all(f == found[0] for f in found) and -1 not in found[0].values() else None
        return wait_until(agreed, timeout, interval=0.05, what=f"every broker to list {topic} with the same leaders")

    def wait_gone(self, topic: str, timeout: float = 30.0) -> None:
        """Until no broker's Metadata lists the (deleted) topic."""
        wait_until(lambda: all(self._topic_at(a, topic).error_code for a in self.addresses()), timeout,
                   interval=0.05, what=f"every broker to forget {topic}")

    def _topic(self, topic: str) -> Any:
        t = self._topic_at(None, topic)
        assert t.error_code == 0, t
        return t

    def _topic_at(self, address: tuple[str, int] | None, topic: str) -> Any:
        cls = request_class("Metadata")
        conn = self._connect(address=address)
        try:
            meta = conn.send("Metadata", 12, cls(topics=[cls.MetadataRequestTopic(name=topic)],
                                                allow_auto_topic_creation=False))
        finally:
            conn.close()
        [t] = meta.topics
        return t

    def addresses(self) -> list[tuple[str, int]]:
        """The brokers' (host, port), in node id order."""
        return list(self.brokers.values())


def bootstrap_addresses(bootstrap: str) -> list[tuple[str, int]]:
    """The (host, port) of each broker of a bootstrap list, in its order."""
    return [parse_host_port(a) for a in bootstrap.split(",")]


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
