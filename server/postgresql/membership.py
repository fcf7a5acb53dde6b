"""Keeps this broker's membership of a cluster in PostgreSQL: its lease, the controller's choice of partition leaders, and the view every broker polls.

docs/architecture.md ("The cluster") describes the design.  Every call blocks (the broker makes them in a worker
thread of their own); any database error is DatabaseUnavailable, and the next call connects again.
"""
from __future__ import annotations

import json
import logging
import threading
import time
import uuid

import psycopg
from psycopg.types.json import Jsonb

from ..clock import now_ms
from ..cluster import ClusterBroker, ClusterView, choose_leader
from .engine import CONNECT_TIMEOUT_S, Database, PartitionKey, sql

log = logging.getLogger("trireme.cluster")


class NodeIdInUse(Exception):
    """Another live broker holds this node id (Kafka refuses a duplicate broker registration the same way)."""


class Membership:
    def __init__(self, dsn: str, node_id: int, directory_id: str, *, session_ms: int):
        self.node_id = node_id
        self.directory_id = directory_id
        self.session_ms = session_ms
        self.incarnation = uuid.uuid4()
        self._db = Database(dsn, f"trireme node {node_id}: membership")
        self._listener: psycopg.Connection | None = None   # LISTENs for the controller's notices (listen)
        self._closed = False

    def close(self) -> None:
        self._closed = True
        self._db.close()
        listener = self._listener
        if listener is not None:
            listener.cancel_safe()          # ends its notifies() wait

    def listen(self, on_change) -> None:
        """Call ``on_change()`` (from a daemon thread of its own, with a connection of its own) each time the
        controller announces new leaders (NOTIFY trireme_cluster), until :meth:`close`; reconnects after a second
        when the database goes away."""
        def run():
            while not self._closed:
                try:
                    with psycopg.connect(self._db.dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S,
                                         application_name=f"trireme node {self.node_id}: notices") as conn:
                        self._listener = conn
                        conn.execute("LISTEN trireme_cluster")
                        on_change()             # whatever was announced while not listening
                        for _notice in conn.notifies():
                            on_change()
                except psycopg.Error:
                    pass
                finally:
                    self._listener = None
                if not self._closed:
                    time.sleep(1)
        threading.Thread(target=run, name="trireme-cluster-notices", daemon=True).start()

    def _params(self, **more) -> dict:
        return {"node_id": self.node_id, "incarnation": self.incarnation, "session_ms": self.session_ms, **more}

    # --- this broker's lease --------------------------------------------------------------------------------------

    def register(self, endpoints: dict[str, tuple[str, int]], rack: str | None) -> None:
        """Take this node id's lease, or raise NodeIdInUse naming who holds it and for how long."""
        def work(conn):
            params = self._params(directory_id=self.directory_id, rack=rack,
                                  endpoints=Jsonb({name: list(address) for name, address in endpoints.items()}))
            if conn.execute(sql("broker_register"), params).fetchone() is not None:
                conn.execute(sql("cluster_notify"), {"controller_epoch": 0})    # the others see it join at once
                return None
            return conn.execute(sql("broker_select"), params).fetchone()
        held = self._db.run(work)
        if held is not None:
            _directory, endpoints_held, left_ms = held
            raise NodeIdInUse(f"node.id {self.node_id} is registered by a live broker ({_describe(endpoints_held)}) "
                              f"whose lease ends in {max(0, left_ms) / 1000:.1f}s; a second broker with a live "
                              f"node.id is refused")

    def heartbeat(self) -> bool:
        """Renew the lease → False if another process took this node id over (this one must stop serving)."""
        return self._db.run(lambda conn: conn.execute(sql("broker_heartbeat"), self._params()).fetchone()) is not None

    def unregister(self) -> None:
        """End the lease now (a broker stopping): the controller moves what it still leads at once."""
        def work(conn):
            conn.execute(sql("broker_unregister"), self._params())
            conn.execute(sql("cluster_notify"), {"controller_epoch": 0})
        self._db.run(work)

    def shut_down(self, led: dict[PartitionKey, tuple[int, tuple[int, ...]]]) -> dict[PartitionKey, int]:
        """Controlled shutdown, in one transaction: end the lease (so the controller never names this broker again),
        name the next live broker the leader of each partition of ``led`` (key → (the leader epoch this broker leads
        it at, which fences the change; its reassignment's replicas: the first live one of them, else the first in
        rendezvous order), and tell every broker → {key: its new leader} of those moved (none when no other broker
        is live: they wait for one, as after a lost broker)."""
        def work(conn):
            conn.execute(sql("broker_unregister"), self._params())
            live = [n for n, *_ in conn.execute(sql("brokers_live")).fetchall() if n != self.node_id]
            moved = {}
            if live:
                cursor = conn.cursor()
                for (topic_id, partition), (epoch, preferred) in led.items():
                    target = choose_leader((topic_id, partition), preferred, live)
                    cursor.execute(sql("partition_hand_over"), self._params(
                        topic_id=topic_id, partition=partition, leader_id=target, leader_epoch=epoch))
                    if cursor.rowcount:
                        moved[(topic_id, partition)] = target
            conn.execute(sql("cluster_notify"), {"controller_epoch": 0})
            return moved
        moved = self._db.run(work)
        for (topic_id, partition), target in moved.items():
            log.info("partition %s-%d: handed over to node %d (controlled shutdown)", topic_id, partition, target)
        return moved

    # --- the view -------------------------------------------------------------------------------------------------

    def poll(self) -> ClusterView:
        def work(conn):
            live = conn.execute(sql("brokers_live")).fetchall()
            now = now_ms()
            brokers = {n: ClusterBroker(n, {name: (a[0], int(a[1])) for name, a in endpoints.items()}, rack)
                       for n, endpoints, rack, _left in live}
            controller_id, controller_epoch = conn.execute(sql("controller_select")).fetchone()
            rows = conn.execute(sql("partitions_select")).fetchall()
            leaders = {(t, p): (leader, epoch) for t, p, leader, epoch, _assigned in rows}
            return ClusterView(brokers, -1 if controller_id is None else controller_id, controller_epoch, leaders,
                               {n: now + left for n, _endpoints, _rack, left in live},
                               {(t, p): tuple(assigned) for t, p, _leader, _epoch, assigned in rows if assigned})
        return self._db.run(work)

    def reassign(self, replicas: dict[PartitionKey, list[int]]) -> set[PartitionKey]:
        """AlterPartitionReassignments: store each partition's preferred leaders and tell every broker (the controller
        moves the partitions) → the keys stored (a partition without a row yet is not)."""
        return self._update_each("partition_reassign", {key: {"replicas": nodes} for key, nodes in replicas.items()})

    def move(self, moves: dict[PartitionKey, tuple[int, int, int]]) -> set[PartitionKey]:
        """ElectLeaders: name each partition's new leader now (key → (its leader and leader epoch as seen, which
        fence the change, the new leader)) and tell every broker → the keys moved."""
        return self._update_each("partition_assign", {
            key: {"leader_id": target, "seen_leader_id": seen_leader, "seen_leader_epoch": seen_epoch}
            for key, (seen_leader, seen_epoch, target) in moves.items()})

    def _update_each(self, statement: str, params: dict[PartitionKey, dict]) -> set[PartitionKey]:
        """``statement`` once per partition row (with its key and ``params``), then tell every broker, in one
        transaction → the keys whose row it changed."""
        def work(conn):
            changed = set()
            cursor = conn.cursor()
            for (topic_id, partition), values in params.items():
                cursor.execute(sql(statement), {"topic_id": topic_id, "partition": partition, **values})
                if cursor.rowcount:
                    changed.add((topic_id, partition))
            conn.execute(sql("cluster_notify"), {"controller_epoch": 0})
            return changed
        return self._db.run(work)

    # --- the controller -------------------------------------------------------------------------------------------

    def elect(self) -> int | None:
        """Become the controller if there is none or its broker is not live → the new controller epoch, or None."""
        found = self._db.run(lambda conn: conn.execute(sql("controller_elect"), self._params()).fetchone())
        return None if found is None else found[0]

    def assign(self, view: ClusterView, partitions: dict[PartitionKey, tuple[int, ...]]) -> int:
        """As the controller (at ``view.controller_epoch``): give each of ``partitions`` (key → the nodes that should
        lead it, in order of preference: the first live one does; none live, or none named: the first live broker in
        rendezvous order) the leader it should have, and create the rows of those that have none → how many changed
        (0: nothing, or this broker is no longer the controller)."""
        live = sorted(view.brokers)
        if not live:
            return 0
        changes = []
        for key, preferred in partitions.items():
            target = choose_leader(key, preferred, live)
            found = view.leaders.get(key)
            if found is None or found[0] != target:
                changes.append((key, target, found))
        if not changes:
            return 0

        def work(conn):
            if conn.execute(sql("controller_lock"), self._params(controller_epoch=view.controller_epoch)
                            ).fetchone() is None:
                return 0
            cursor = conn.cursor()
            for (topic_id, partition), target, found in changes:
                params = {"topic_id": topic_id, "partition": partition, "leader_id": target}
                if found is None:
                    cursor.execute(sql("partition_create"), params)
                else:
                    cursor.execute(sql("partition_assign"), {**params, "seen_leader_id": found[0],
                                                            "seen_leader_epoch": found[1]})
            conn.execute(sql("cluster_notify"), {"controller_epoch": view.controller_epoch})
            return len(changes)
        changed = self._db.run(work)
        for (topic_id, partition), target, found in changes[:changed]:
            log.info("partition %s-%d: leader %s -> node %d", topic_id, partition,
                     "none" if found is None else found[0], target)
        return changed


def _describe(endpoints) -> str:
    try:
        return ", ".join(f"{name} {a[0]}:{a[1]}" for name, a in dict(endpoints).items())
    except (TypeError, ValueError, IndexError):
        return json.dumps(endpoints)


