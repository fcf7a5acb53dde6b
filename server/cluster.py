"""What a broker knows of its cluster: the live brokers and their listeners, the controller, and who leads each partition.

Handlers ask ``broker.cluster`` instead of assuming one node.  :class:`LocalCluster` is a cluster of this broker
alone (the local storage engine: every partition is led here).  With the PostgreSQL engine the database keeps the
cluster (server/postgresql/membership.py: broker leases, partition leaders and leader epochs) and the broker's view
is refreshed from it; both answer the same questions.
"""
from __future__ import annotations

import dataclasses
import hashlib
from typing import Protocol


@dataclasses.dataclass(frozen=True, slots=True)
class ClusterBroker:
    """A live broker: its node id, rack, and each listener's advertised (host, port)."""

    node_id: int
    endpoints: dict[str, tuple[str, int]]
    rack: str | None = None

    def address(self, listener: str) -> tuple[str, int] | None:
        """Where a client of ``listener`` reaches this broker (Kafka answers per listener); None: not on it."""
        return self.endpoints.get(listener)


@dataclasses.dataclass(frozen=True, slots=True)
class PartitionLeadership:
    """Who leads a partition, at which leader epoch, and the brokers Metadata lists as its replicas (leader first):
    with the database keeping the data every one of them can take over without loss, so they are also the ISR."""

    leader_id: int
    leader_epoch: int
    replicas: tuple[int, ...]


class Cluster(Protocol):
    @property
    def controller_id(self) -> int: ...

    def brokers(self) -> list[ClusterBroker]:
        """The live brokers, by node id."""

    def broker(self, node_id: int) -> ClusterBroker | None:
        """A live broker, or None."""

    def leadership(self, topic, index: int) -> PartitionLeadership | None:
        """Who leads partition ``index`` of ``topic`` (a state/topics.Topic); None while no live broker does."""


class LocalCluster:
    """A cluster of one: this broker leads every partition, at the leader epoch the topic registry keeps."""

    def __init__(self, broker):
        self._broker = broker
        self._led: dict[int, PartitionLeadership] = {}      # by leader epoch: the produce path asks per request

    @property
    def controller_id(self) -> int:
        return self._broker.node_id

    def _self(self) -> ClusterBroker:
        b = self._broker
        endpoints = getattr(b, "endpoints", None) or {}
        addresses = {name: (e.advertised_host, e.advertised_port) for name, e in endpoints.items()}
        return ClusterBroker(b.node_id, addresses or {"PLAINTEXT": (b.advertised_host, b.advertised_port)},
                             b.config["broker.rack"] or None)

    def brokers(self) -> list[ClusterBroker]:
        return [self._self()]

    def broker(self, node_id: int) -> ClusterBroker | None:
        return self._self() if node_id == self._broker.node_id else None

    def leadership(self, topic, index: int) -> PartitionLeadership | None:
        found = self._led.get(topic.leader_epoch)
        if found is None:
            node = self._broker.node_id
            found = self._led[topic.leader_epoch] = PartitionLeadership(node, topic.leader_epoch, (node,))
        return found


PartitionKey = tuple  # (topic id, partition index)


@dataclasses.dataclass(frozen=True, slots=True)
class ClusterView:
    """The cluster as one poll found it."""

    brokers: dict[int, ClusterBroker]                   # the live ones
    controller_id: int                                  # -1: none
    controller_epoch: int
    leaders: dict[PartitionKey, tuple[int, int]]        # (leader id, leader epoch) of every partition with a row
    lease_expires_ms: dict[int, int] = dataclasses.field(default_factory=dict)   # node id → on this broker's clock
    preferred: dict[PartitionKey, tuple[int, ...]] = dataclasses.field(default_factory=dict)  # reassigned replicas

    def preferred_leader(self, key: PartitionKey) -> int | None:
        """Who should lead ``key``: the first live broker of its reassignment's replica list, else the first live
        broker in rendezvous order; None while no broker is live."""
        return choose_leader(key, self.preferred.get(key, ()), self.brokers)

    def leadership(self, key: PartitionKey, replication_factor: int = 1) -> PartitionLeadership | None:
        """Who leads ``key`` while its leader is live; its replicas: the leader, then the brokers that would lead
        it next, ``replication_factor`` in all (as many as are live)."""
        found = self.leaders.get(key)
        if found is None or found[0] not in self.brokers:
            return None
        leader_id, epoch = found
        epoch = max(epoch, 0)               # -1: its first leader has not opened it yet; it will at epoch 0
        assigned = self.preferred.get(key)
        if assigned:                        # a reassignment's replicas, as Kafka lists them (the live ones)
            live = tuple(n for n in assigned if n in self.brokers)
            return PartitionLeadership(leader_id, epoch, live if leader_id in live else (leader_id, *live))
        others = [n for n in rendezvous(key, self.brokers) if n != leader_id]
        return PartitionLeadership(leader_id, epoch, (leader_id, *others[:max(0, replication_factor - 1)]))


def rendezvous(key: PartitionKey, node_ids) -> list[int]:
    """``node_ids`` in the order they should lead ``key`` (highest random weight first): the same order on every
    broker, and a broker joining or leaving changes the first choice of only its share of the partitions."""
    prefix = f"{key[0]}:{key[1]}:".encode()
    return sorted(node_ids, key=lambda n: hashlib.blake2b(prefix + str(n).encode(), digest_size=8).digest(),
                  reverse=True)


def choose_leader(key: PartitionKey, preferred, live) -> int | None:
    """The first of ``preferred`` (a reassignment's replicas, in order) that is in ``live``, else the first of
    ``live`` in rendezvous order; None when ``live`` is empty."""
    for node in preferred:
        if node in live:
            return node
    return rendezvous(key, live)[0] if live else None


class ViewCluster:
    """The cluster as this broker's last poll of the database found it (server/postgresql/membership.py)."""

    def __init__(self, view: ClusterView):
        self.view = view
        self._leadership: dict = {}        # (topic id, index) → PartitionLeadership | None: asked per request

    @property
    def controller_id(self) -> int:
        return self.view.controller_id

    def brokers(self) -> list[ClusterBroker]:
        return [self.view.brokers[n] for n in sorted(self.view.brokers)]

    def broker(self, node_id: int) -> ClusterBroker | None:
        return self.view.brokers.get(node_id)

    def leadership(self, topic, index: int) -> PartitionLeadership | None:
        key = (topic.topic_id, index)
        try:
            return self._leadership[key]
        except KeyError:
            found = self._leadership[key] = self.view.leadership(key, topic.replication_factor)
            return found
