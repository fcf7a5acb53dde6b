"""Consumer groups (classic protocol) with the three Python clients -
confluent-kafka (librdkafka), kafka-python 3.0 and aiokafka 0.14 - against a
real Trireme process.  Every test runs once per client:

* ``test_group_shares_partitions``: three consumers on a 6-partition topic get
  disjoint shares covering all partitions (the broker's DescribeGroups agrees)
  and consume every record exactly once between them;
* ``test_left_member_partitions_reassigned``: a consumer that closes
  (LeaveGroup) has its partitions taken over within the session timeout;
* ``test_dead_member_partitions_reassigned_after_session_timeout``: a
  consumer process that is SIGKILLed (no LeaveGroup) has its partitions
  reassigned once its session expires - not before;
* ``test_new_members_resume_from_committed_offsets``: commitSync, close,
  new consumers in the same group start from the committed offsets;
* ``test_committed_offsets_survive_server_restart`` / ``..._kill9``: the
  committed offsets come back after a graceful restart and after SIGKILL;
* ``test_static_member_rejoins_without_rebalance``: a ``group.instance.id``
  consumer that restarts within its session gets its old partitions back
  while the other member sees no rebalance;
* ``test_assignor_gives_disjoint_cover``: range, roundrobin and the sticky
  assignors each client has;
* ``test_group_admin``: list / describe groups, group offsets, delete
  offsets, delete group - as far as each client's admin API reaches.

Each group member runs in a thread of its own (an asyncio loop in that thread
for aiokafka), polling continuously; commands (commit, committed, close) are
run by that thread between polls.  Records are produced with confluent-kafka
once a group is stable, so that no partition moves after it has been read
(without commits, a moved partition is re-read from the start by its new
owner - client semantics, not a broker matter).

Client gaps met here: confluent-kafka 2.16's AdminClient has no binding for
DeleteConsumerGroupOffsets (OffsetDelete) - its test alters offsets instead;
aiokafka's admin client has neither DeleteGroups nor OffsetDelete; aiokafka has
no cooperative-sticky assignor (its eager "sticky" one is tested) and no
public accessor for the group generation (its private coordinator attributes
are read).  confluent-kafka cannot make a consumer "die" in-process: an
unpolled librdkafka consumer keeps heartbeating from its own thread and,
after max.poll.interval.ms, leaves the group on purpose - so the dead member
is a separate process that is SIGKILLed (the same for all clients).
All three clients support static membership (group.instance.id).

Client bugs worked around (each would hit a real Kafka broker the same way;
details where the workaround is):
* kafka-python 3.0.0: with a rebalance listener, partitions kept across an
  EAGER rebalance are never fetched again (dpkp/kafka-python#3131, fixed by
  #3132) - its consumers get a listener only with cooperative-sticky;
* kafka-python 3.0.0: a leader's metadata-triggered rejoin can be lost when
  poll()'s timer expires while its SyncGroup is in flight: the consumer keeps
  the assignment of the generation before for good (no partitions, or - with
  cooperative-sticky - all of them next to the others' disjoint shares) and
  never heartbeats again - its consumers fetch the topic metadata after
  subscribing, so that no such rejoin comes;
* aiokafka 0.14: StickyPartitionAssignor keeps its state in class attributes,
  shared by all consumers of a process - one subclass per consumer.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterable

import pytest
from confluent_kafka import (ConsumerGroupState, ConsumerGroupTopicPartitions, Consumer,
                             KafkaException, Producer, TopicPartition)
from confluent_kafka.admin import AdminClient, NewTopic

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.timeout(150)

CLIENTS = ("confluent-kafka", "kafka-python", "aiokafka")
PARTITIONS = 6
ALL = frozenset(range(PARTITIONS))
SESSION_MS = 6000            # the broker's group.min.session.timeout.ms is 1000 in the tests
HEARTBEAT_MS = 500
KAFKA_PYTHON_REBALANCE_MS = 20000
POLL_S = 0.1
OP_TIMEOUT_S = 30.0
STABLE_TIMEOUT_S = 40.0
SETTLE_S = 1.5               # three heartbeats without a change = stable
CONSUME_TIMEOUT_S = 30.0

# Assignor names per client (confluent: partition.assignment.strategy).
ASSIGNORS = {
    "confluent-kafka": ("range", "roundrobin", "cooperative-sticky"),
    "kafka-python": ("range", "roundrobin", "sticky", "cooperative-sticky"),
    # aiokafka lacks cooperative-sticky (client has only eager assignors).
    "aiokafka": ("range", "roundrobin", "sticky"),
}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


# ================================================================== members

class Member:
    """One subscribed group consumer driven by a thread of its own.

    ``records`` ([(partition, offset, value)]), ``assigned`` (partitions after
    the last poll) and ``events`` ([(monotonic time, "assigned"|"revoked"|
    "lost", partitions)]) are filled by that thread; ``call(fn)`` runs
    ``fn(adapter)`` there (awaited for aiokafka) and returns its result.
    """

    def __init__(self, client: str, bootstrap: str, group: str, topic: str, *,
                 assignor: str | None = None, instance_id: str | None = None,
                 session_ms: int = SESSION_MS, name: str | None = None):
        self.client, self.bootstrap, self.group, self.topic = client, bootstrap, group, topic
        self.assignor, self.instance_id, self.session_ms = assignor, instance_id, session_ms
        self.name = name or unique("m")
        self.lock = threading.Lock()
        self.records: list[tuple[int, int, bytes | None]] = []
        self.events: list[tuple[float, str, frozenset[int]]] = []
        self.assigned: frozenset[int] = frozenset()
        self.error: BaseException | None = None
        self.closed = False
        self._cmds: queue.Queue = queue.Queue()
        self._opened = threading.Event()
        self._done = threading.Event()
        self.thread = threading.Thread(target=self._main, name=f"member-{self.name}", daemon=True)
        self.thread.start()
        if not self._opened.wait(OP_TIMEOUT_S):
            raise AssertionError(f"{self.name}: consumer not created within {OP_TIMEOUT_S}s")
        if self.error is not None:
            raise AssertionError(f"{self.name}: consumer failed to start: {self.error!r}") from self.error

    def __repr__(self) -> str:
        return f"<Member {self.name} {self.client} assigned={sorted(self.assigned)}>"

    # ------------------------------------------------------ thread side

    def event(self, kind: str, partitions: Iterable[Any]) -> None:
        ps = frozenset(tp.partition for tp in partitions)
        with self.lock:
            self.events.append((time.monotonic(), kind, ps))

    def _main(self) -> None:
        try:
            if self.client == "aiokafka":
                asyncio.run(self._amain())
            else:
                self._smain()
        except BaseException as e:  # noqa: BLE001 - reported to the test thread
            self.error = e
        finally:
            self._opened.set()
            self._done.set()
            while True:
                try:
                    _, fut = self._cmds.get_nowait()
                except queue.Empty:
                    break
                fut.set_exception(RuntimeError(f"{self.name}: member thread ended ({self.error!r})"))

    def _next_cmd(self):
        try:
            return self._cmds.get_nowait()
        except queue.Empty:
            return None

    def _smain(self) -> None:
        adapter = ADAPTERS[self.client](self)
        adapter.open()
        self._opened.set()
        try:
            self._sloop(adapter)
        except BaseException:
            try:                     # do not leave a consumer heartbeating behind
                adapter.close()
            except BaseException:  # noqa: BLE001
                pass
            raise

    def _sloop(self, adapter) -> None:
        while True:
            while (cmd := self._next_cmd()) is not None:
                fn, fut = cmd
                try:
                    fut.set_result(fn(adapter))
                except BaseException as e:  # noqa: BLE001
                    fut.set_exception(e)
                if fn is _close:
                    return
            recs = adapter.poll(POLL_S)
            asg = adapter.assignment()
            with self.lock:
                self.records.extend(recs)
                self.assigned = asg

    async def _amain(self) -> None:
        adapter = ADAPTERS[self.client](self)
        await adapter.open()
        self._opened.set()
        try:
            await self._aloop(adapter)
        except BaseException:
            try:
                await adapter.close()
            except BaseException:  # noqa: BLE001
                pass
            raise

    async def _aloop(self, adapter) -> None:
        while True:
            while (cmd := self._next_cmd()) is not None:
                fn, fut = cmd
                try:
                    res = fn(adapter)
                    if inspect.isawaitable(res):
                        res = await res
                    fut.set_result(res)
                except BaseException as e:  # noqa: BLE001
                    fut.set_exception(e)
                if fn is _close:
                    return
            recs = await adapter.poll(POLL_S)
            asg = adapter.assignment()
            with self.lock:
                self.records.extend(recs)
                self.assigned = asg

    # -------------------------------------------------------- test side

    def call(self, fn: Callable[[Any], Any], timeout: float = OP_TIMEOUT_S) -> Any:
        if self._done.is_set():
            raise AssertionError(f"{self.name}: member thread ended: {self.error!r}")
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._cmds.put((fn, fut))
        return fut.result(timeout=timeout)

    def commit(self) -> None:
        """Synchronous commit of the consumed positions."""
        self.call(lambda a: a.commit())

    def committed(self, partitions: Iterable[int] = ALL) -> dict[int, int | None]:
        return self.call(lambda a: a.committed(sorted(partitions)))

    def identity(self) -> tuple[int | None, str | None]:
        """(generation id or None when the client does not tell, member id)."""
        return self.call(lambda a: a.identity())

    def close(self, timeout: float = OP_TIMEOUT_S) -> None:
        if self.closed:
            return
        self.closed = True
        self.call(_close, timeout=timeout)
        self.thread.join(timeout)

    def check(self) -> None:
        if self.error is not None:
            raise AssertionError(f"{self.name}: consumer thread failed: {self.error!r}") from self.error

    def snapshot(self) -> tuple[list, list]:
        with self.lock:
            return list(self.records), list(self.events)


def _close(adapter):
    return adapter.close()


def recording_listener(base: type, m: Member):
    """A rebalance listener (a subclass of the client's abstract
    ConsumerRebalanceListener ``base``) that records every callback as an
    event of ``m``.  (aiokafka's listener has no on_partitions_lost; aiokafka
    never calls it.)"""
    class Listener(base):
        def on_partitions_revoked(self, revoked):
            m.event("revoked", revoked)

        def on_partitions_assigned(self, assigned):
            m.event("assigned", assigned)

        def on_partitions_lost(self, lost):
            m.event("lost", lost)

    return Listener()


class ConfluentAdapter:
    def __init__(self, m: Member):
        self.m = m
        self.c: Consumer | None = None

    def open(self) -> None:
        m = self.m
        conf = {"bootstrap.servers": m.bootstrap, "group.id": m.group, "client.id": m.name,
                "session.timeout.ms": m.session_ms, "heartbeat.interval.ms": HEARTBEAT_MS,
                "enable.auto.commit": False, "auto.offset.reset": "earliest",
                "fetch.wait.max.ms": 100, "socket.timeout.ms": 20000,
                "broker.address.family": "v4"}
        if m.assignor:
            conf["partition.assignment.strategy"] = m.assignor
        if m.instance_id:
            conf["group.instance.id"] = m.instance_id
        if os.environ.get("TRIREME_GROUP_DEBUG"):
            conf["debug"] = "cgrp,protocol"
        self.c = Consumer(conf)
        # Without an explicit assign() in the callbacks the binding does the
        # (incremental_)assign/unassign itself.
        self.c.subscribe([m.topic],
                         on_assign=lambda c, ps: m.event("assigned", ps),
                         on_revoke=lambda c, ps: m.event("revoked", ps),
                         on_lost=lambda c, ps: m.event("lost", ps))

    def poll(self, timeout: float):
        out = []
        for msg in self.c.consume(num_messages=1000, timeout=timeout):
            if msg.error() is not None:
                raise KafkaException(msg.error())
            out.append((msg.partition(), msg.offset(), msg.value()))
        return out

    def assignment(self) -> frozenset[int]:
        return frozenset(tp.partition for tp in self.c.assignment())

    def commit(self) -> None:
        res = self.c.commit(asynchronous=False)
        bad = [(tp.partition, tp.error) for tp in res or () if tp.error is not None]
        assert not bad, f"commit errors: {bad}"

    def committed(self, partitions) -> dict[int, int | None]:
        tps = self.c.committed([TopicPartition(self.m.topic, p) for p in partitions],
                               timeout=OP_TIMEOUT_S)
        bad = [(tp.partition, tp.error) for tp in tps if tp.error is not None]
        assert not bad, f"committed() errors: {bad}"
        return {tp.partition: (tp.offset if tp.offset >= 0 else None) for tp in tps}

    def identity(self):
        return None, self.c.memberid()      # librdkafka does not expose the generation

    def close(self) -> None:
        self.c.close()


class KafkaPythonAdapter:
    def __init__(self, m: Member):
        self.m = m

    def open(self) -> None:
        from kafka import KafkaConsumer
        from kafka.consumer.subscription_state import ConsumerRebalanceListener
        m = self.m
        kw: dict[str, Any] = {}
        if m.assignor:
            kw["partition_assignment_strategy"] = [kafka_python_assignor(m.assignor)]
        self.c = KafkaConsumer(
            bootstrap_servers=m.bootstrap, group_id=m.group, client_id=m.name,
            group_instance_id=m.instance_id, session_timeout_ms=m.session_ms,
            heartbeat_interval_ms=HEARTBEAT_MS, enable_auto_commit=False,
            auto_offset_reset="earliest", fetch_max_wait_ms=100,
            request_timeout_ms=int(OP_TIMEOUT_S * 1000),
            # Its rebalance timeout: bounds how long a member that failed to leave lingers (see
            # _admin_kafka_python); the default is 5 minutes.
            max_poll_interval_ms=KAFKA_PYTHON_REBALANCE_MS,
            # kafka-python 3.0.0's default (1 MB) is below its own fetch sizes
            # (dpkp/kafka-python#3074); see test_kafka_python.py.
            receive_message_max_bytes=100_000_000, **kw)
        # kafka-python 3.0.0 bug: with a rebalance listener, an EAGER
        # rebalance marks every owned partition "pending revocation" and
        # partitions assigned again keep that mark - never fetched again
        # (dpkp/kafka-python#3131, fixed by #3132).  So the listener is only
        # registered for the cooperative assignor; otherwise there are no
        # events and the generation id tells about rebalances.
        if m.assignor == "cooperative-sticky":
            self.c.subscribe([m.topic], listener=recording_listener(ConsumerRebalanceListener, m))
        else:
            self.c.subscribe([m.topic])
        # kafka-python 3.0.0 race (client side; the broker's answers are
        # right and prompt).  The coordinator's metadata snapshot of the
        # subscribed topics is rebuilt only when a Metadata response arrives
        # (kafka/coordinator/consumer.py:183-203, _handle_metadata_update,
        # called from kafka/cluster.py:642-643); a leader records it as its
        # assignment snapshot (consumer.py:473) and rejoins when the two
        # differ (consumer.py:605-606).  A consumer that subscribes and polls
        # before any Metadata response has a snapshot of {}: its first
        # assignment is made with snapshot {}, the Metadata update that
        # _perform_assignment itself requests (consumer.py:471) turns the
        # snapshot into {topic: {0..5}}, and the leader rejoins.  If poll()'s
        # timer then runs out while that JoinGroup/SyncGroup is in flight
        # (kafka/coordinator/base.py:516-521 leaves the join task running,
        # to be awaited again only inside base.py:486's need_rejoin() loop),
        # the next poll's need_rejoin() (consumer.py:408) is already False -
        # the leader's _perform_assignment set the assignment snapshot to the
        # current one - so the finished join is never awaited: _on_join_complete
        # never runs, the member stays REBALANCING with heartbeats disabled
        # (base.py:511) and keeps the previous generation's assignment for
        # good.  The broker completes that generation, expires the silent
        # member after its session and gives the others a disjoint cover
        # without it: seen under CPU load as one consumer with all 6
        # partitions next to two with 3 each (cooperative-sticky), or as a
        # consumer with no partitions.  KafkaConsumer.topics() always sends
        # a Metadata request; once subscribed, its response rebuilds the
        # snapshot with the topic, before the first JoinGroup, so the
        # leader's assignment snapshot is current and no such rejoin comes.
        # (Looking the topic up before subscribing does not help: the
        # snapshot only covers subscribed topics.)
        assert m.topic in self.c.topics()
        assert self.c.partitions_for_topic(m.topic) == set(range(PARTITIONS))

    def poll(self, timeout: float):
        out = []
        for recs in self.c.poll(timeout_ms=int(timeout * 1000)).values():
            out.extend((r.partition, r.offset, r.value) for r in recs)
        return out

    def assignment(self) -> frozenset[int]:
        return frozenset(tp.partition for tp in self.c.assignment())

    def commit(self) -> None:
        self.c.commit()

    def committed(self, partitions) -> dict[int, int | None]:
        from kafka import TopicPartition as KTP
        return {p: self.c.committed(KTP(self.m.topic, p), timeout_ms=int(OP_TIMEOUT_S * 1000))
                for p in partitions}

    def identity(self):
        md = self.c.group_metadata()
        return md.generation_id, md.member_id

    def close(self) -> None:
        self.c.close(autocommit=False)


def kafka_python_assignor(name: str):
    from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor
    from kafka.coordinator.assignors.range import RangePartitionAssignor
    from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
    from kafka.coordinator.assignors.sticky.sticky_assignor import StickyPartitionAssignor
    return {"range": RangePartitionAssignor, "roundrobin": RoundRobinPartitionAssignor,
            "sticky": StickyPartitionAssignor,
            "cooperative-sticky": CooperativeStickyAssignor}[name]


class AiokafkaAdapter:
    def __init__(self, m: Member):
        self.m = m

    async def open(self) -> None:
        from aiokafka import AIOKafkaConsumer
        from aiokafka.abc import ConsumerRebalanceListener
        m = self.m
        kw: dict[str, Any] = {}
        if m.assignor:
            kw["partition_assignment_strategy"] = (aiokafka_assignor(m.assignor),)
        self.c = AIOKafkaConsumer(
            bootstrap_servers=m.bootstrap, group_id=m.group, client_id=m.name,
            group_instance_id=m.instance_id, session_timeout_ms=m.session_ms,
            heartbeat_interval_ms=HEARTBEAT_MS, enable_auto_commit=False,
            auto_offset_reset="earliest", fetch_max_wait_ms=100,
            request_timeout_ms=int(OP_TIMEOUT_S * 1000), **kw)
        self.c.subscribe([m.topic], listener=recording_listener(ConsumerRebalanceListener, m))
        await self.c.start()

    async def poll(self, timeout: float):
        out = []
        for recs in (await self.c.getmany(timeout_ms=int(timeout * 1000))).values():
            out.extend((r.partition, r.offset, r.value) for r in recs)
        return out

    def assignment(self) -> frozenset[int]:
        return frozenset(tp.partition for tp in self.c.assignment())

    async def commit(self) -> None:
        await self.c.commit()

    async def committed(self, partitions) -> dict[int, int | None]:
        from aiokafka import TopicPartition as ATP
        return {p: await self.c.committed(ATP(self.m.topic, p)) for p in partitions}

    def identity(self):
        # aiokafka has no public accessor for its group generation.
        coord = self.c._coordinator
        return coord.generation, coord.member_id

    async def close(self) -> None:
        await self.c.stop()


def aiokafka_assignor(name: str):
    from aiokafka.coordinator.assignors.range import RangePartitionAssignor
    from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
    from aiokafka.coordinator.assignors.sticky.sticky_assignor import StickyPartitionAssignor
    if name == "sticky":
        # aiokafka's StickyPartitionAssignor keeps the member's previous
        # assignment and generation in CLASS attributes (classmethods
        # on_assignment/metadata), so consumers of one process share them and
        # send each other's "previous assignment": stickiness breaks.  One
        # subclass per consumer keeps them apart (same protocol name).
        return type("StickyPartitionAssignorOfOneConsumer", (StickyPartitionAssignor,), {})
    return {"range": RangePartitionAssignor, "roundrobin": RoundRobinPartitionAssignor}[name]


ADAPTERS = {"confluent-kafka": ConfluentAdapter, "kafka-python": KafkaPythonAdapter,
            "aiokafka": AiokafkaAdapter}


class DyingMember:
    """A group member in a separate process (this module run as a script),
    reporting its assignment on stdout, to be SIGKILLed: no LeaveGroup, no
    more heartbeats."""

    def __init__(self, client: str, bootstrap: str, group: str, topic: str, name: str):
        self.name = name
        fd, self.log_path = tempfile.mkstemp(prefix=f"dying-{client}-", suffix=".log")
        self._log = os.fdopen(fd, "wb")
        spec = {"client": client, "bootstrap": bootstrap, "group": group, "topic": topic,
                "name": name}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "compat_tests.test_groups_python", json.dumps(spec)],
            cwd=str(REPO), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self._log)
        self.assigned: frozenset[int] = frozenset()
        self.error: str | None = None
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            msg = json.loads(line)
            if "error" in msg:
                self.error = msg["error"]
            else:
                self.assigned = frozenset(msg["assigned"])

    def check(self) -> None:
        if self.error is not None:
            raise AssertionError(f"{self.name} (subprocess) failed: {self.error}")
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.name} (subprocess) exited with {self.proc.returncode}: "
                                 f"{Path(self.log_path).read_text(errors='replace')[-3000:]}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def cleanup(self) -> None:
        self.kill()
        self._log.close()
        try:
            os.unlink(self.log_path)
        except OSError:
            pass


def _dying_member_main(spec_json: str) -> None:
    spec = json.loads(spec_json)
    try:
        m = Member(spec["client"], spec["bootstrap"], spec["group"], spec["topic"],
                   name=spec["name"])
    except BaseException as e:  # noqa: BLE001
        print(json.dumps({"error": repr(e)}), flush=True)
        os._exit(1)
    last = None
    deadline = time.monotonic() + 120        # never outlive a broken test run
    while time.monotonic() < deadline:
        if m.error is not None:
            print(json.dumps({"error": repr(m.error)}), flush=True)
            os._exit(1)
        if m.assigned != last:
            last = m.assigned
            print(json.dumps({"assigned": sorted(last)}), flush=True)
        time.sleep(0.05)
    os._exit(0)


# ================================================================== helpers

def common(bootstrap: str) -> dict:
    return {"bootstrap.servers": bootstrap, "socket.timeout.ms": 20000,
            "broker.address.family": "v4", "log.connection.close": False}


@pytest.fixture(scope="module")
def admin(module_server) -> AdminClient:
    return AdminClient(common(module_server.bootstrap))


@pytest.fixture
def members():
    """Factory for Members (and DyingMembers via ``members.dying``); all are
    closed / killed at teardown."""
    made: list = []

    class Factory:
        def __call__(self, *a, **kw) -> Member:
            m = Member(*a, **kw)
            made.append(m)
            return m

        def dying(self, *a, **kw) -> DyingMember:
            d = DyingMember(*a, **kw)
            made.append(d)
            return d

    yield Factory()
    for m in made:
        try:
            if isinstance(m, DyingMember):
                m.cleanup()
            elif not m.closed and not m._done.is_set():
                m.close(timeout=15)
        except Exception:  # noqa: BLE001 - teardown of a failed test
            pass


def create_topic(bootstrap: str, name: str, partitions: int = PARTITIONS) -> None:
    admin = AdminClient(common(bootstrap))
    fs = admin.create_topics([NewTopic(name, partitions, 1)], request_timeout=OP_TIMEOUT_S,
                             operation_timeout=OP_TIMEOUT_S)
    assert fs[name].result(timeout=OP_TIMEOUT_S) is None


def produce(bootstrap: str, topic: str, counts: dict[int, int], tag: str) -> dict[tuple[int, int], bytes]:
    """Produce ``counts[p]`` records to each partition p (acks=all); returns
    {(partition, offset): value} from the delivery reports."""
    producer = Producer({**common(bootstrap), "acks": "all", "linger.ms": 5})
    acked: dict[tuple[int, int], bytes] = {}
    errors: list = []

    def cb(err, msg):
        if err is not None:
            errors.append(err)
        else:
            acked[(msg.partition(), msg.offset())] = msg.value()

    for p, n in counts.items():
        for i in range(n):
            producer.produce(topic, value=b"%s-p%d-%d" % (tag.encode(), p, i), key=b"k%d" % i,
                             partition=p, on_delivery=cb)
        producer.poll(0)
    assert producer.flush(60) == 0
    assert not errors, errors[:3]
    assert len(acked) == sum(counts.values())
    return acked


def ends(*batches: dict[tuple[int, int], bytes]) -> dict[int, int]:
    """Per partition: the offset after the last record of all batches."""
    out = {p: 0 for p in range(PARTITIONS)}
    for b in batches:
        for p, o in b:
            out[p] = max(out[p], o + 1)
    return out


def valid_cover(assignments: list[frozenset[int]]) -> bool:
    return (all(assignments) and sum(len(a) for a in assignments) == PARTITIONS
            and frozenset().union(*assignments) == ALL)


def wait_stable(group: list, timeout: float = STABLE_TIMEOUT_S,
                settle: float = SETTLE_S) -> tuple[list[frozenset[int]], float]:
    """Wait until every member's assignment is non-empty, they are pairwise
    disjoint and cover all partitions, and stay unchanged for ``settle``
    seconds.  Returns (assignments, monotonic time they first held)."""
    deadline = time.monotonic() + timeout
    first: float | None = None
    seen: list[frozenset[int]] | None = None
    while True:
        for m in group:
            m.check()
        now = time.monotonic()
        asg = [m.assigned for m in group]
        if valid_cover(asg):
            if asg != seen:
                seen, first = asg, now
            elif now - first >= settle:
                return asg, first
        else:
            seen = first = None
        if now > deadline:
            raise AssertionError(f"no stable disjoint cover of {PARTITIONS} partitions within "
                                 f"{timeout}s: {[(getattr(m, 'name', m), sorted(a)) for m, a in zip(group, asg)]}")
        time.sleep(0.05)


def wait_consumed(group: list[Member], total: int, timeout: float = CONSUME_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while True:
        for m in group:
            m.check()
        n = sum(len(m.snapshot()[0]) for m in group)
        if n >= total:
            time.sleep(0.5)          # anything extra (duplicates) would show up now
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"consumed {n} of {total} records within {timeout}s: "
                                 f"{[(m.name, len(m.snapshot()[0])) for m in group]}")
        time.sleep(0.05)


def check_exactly_once(group: list[Member], expected: dict[tuple[int, int], bytes]) -> None:
    """The members' records are exactly ``expected``, each read once, each by
    the member that owns its partition, in offset order per partition."""
    seen: dict[tuple[int, int], bytes | None] = {}
    dupes = []
    for m in group:
        recs, _ = m.snapshot()
        for p, o, v in recs:
            if (p, o) in seen:
                dupes.append((p, o))
            seen[(p, o)] = v
            assert p in m.assigned, f"{m.name} read partition {p} but owns {sorted(m.assigned)}"
        for p in range(PARTITIONS):
            offs = [o for q, o, _ in recs if q == p]
            assert offs == sorted(offs), f"{m.name}: partition {p} read out of order"
    assert not dupes, f"records read twice: {sorted(dupes)[:10]}"
    missing = sorted(set(expected) - set(seen))
    extra = sorted(set(seen) - set(expected))
    assert not missing and not extra, (f"missing {len(missing)} (first {missing[:10]}), "
                                       f"unexpected {len(extra)} (first {extra[:10]})")
    wrong = [pos for pos in expected if seen[pos] != expected[pos]]
    assert not wrong, f"values differ at {wrong[:10]}"


def describe(admin: AdminClient, group: str):
    return admin.describe_consumer_groups([group], request_timeout=OP_TIMEOUT_S)[group].result(
        timeout=OP_TIMEOUT_S)


def broker_view(admin: AdminClient, group: str) -> dict[str, tuple[str | None, frozenset[int]]]:
    """DescribeGroups: {client id: (group instance id, assigned partitions)}."""
    d = describe(admin, group)
    return {m.client_id: (m.group_instance_id, frozenset(tp.partition for tp in m.assignment.topic_partitions))
            for m in d.members}


def start_group(members, client: str, server, n: int, *, assignor: str | None = None,
                tag: str = "g") -> tuple[str, str, list[Member]]:
    topic, group = unique(f"{tag}-t"), unique(f"{tag}-g")
    create_topic(server.bootstrap, topic)
    ms = [members(client, server.bootstrap, group, topic, assignor=assignor, name=f"{group}-c{i}")
          for i in range(n)]
    return topic, group, ms


# ==================================================================== tests

@pytest.mark.parametrize("client", CLIENTS)
def test_group_shares_partitions(module_server, admin, members, client):
    topic, group, ms = start_group(members, client, module_server, 3, tag="share")
    asg, _ = wait_stable(ms)
    assert sorted(len(a) for a in asg) == [2, 2, 2], asg
    # The broker's view (DescribeGroups) is the members' own.
    d = describe(admin, group)
    assert d.state == ConsumerGroupState.STABLE
    assert broker_view(admin, group) == {m.name: (None, a) for m, a in zip(ms, asg)}

    expected = produce(module_server.bootstrap, topic, {p: 40 + 7 * p for p in range(PARTITIONS)}, "a")
    wait_consumed(ms, len(expected))
    check_exactly_once(ms, expected)
    assert [m.assigned for m in ms] == asg, "assignment changed while consuming"


@pytest.mark.parametrize("client", CLIENTS)
def test_left_member_partitions_reassigned(module_server, admin, members, client):
    topic, group, ms = start_group(members, client, module_server, 3, tag="leave")
    asg, _ = wait_stable(ms)
    leaver, survivors = ms[1], [ms[0], ms[2]]
    t0 = time.monotonic()
    leaver.close()
    new, first = wait_stable(survivors, timeout=SESSION_MS / 1000 + 10)
    took = first - t0
    print(f"{client}: partitions of the leaver taken over after {took:.2f}s")
    assert took < SESSION_MS / 1000, (
        f"survivors took over only after {took:.2f}s (session timeout {SESSION_MS} ms): "
        f"the LeaveGroup did not trigger the rebalance")
    assert sorted(len(a) for a in new) == [3, 3]
    assert set(broker_view(admin, group)) == {m.name for m in survivors}
    # The taken-over partitions are consumed by their new owners.
    expected = produce(module_server.bootstrap, topic, {p: 10 + p for p in range(PARTITIONS)}, "b")
    wait_consumed(survivors, len(expected))
    check_exactly_once(survivors, expected)


@pytest.mark.parametrize("client", CLIENTS)
def test_dead_member_partitions_reassigned_after_session_timeout(module_server, admin, members, client):
    topic, group = unique("dead-t"), unique("dead-g")
    create_topic(module_server.bootstrap, topic)
    ms = [members(client, module_server.bootstrap, group, topic, name=f"{group}-c{i}") for i in range(2)]
    dying = members.dying(client, module_server.bootstrap, group, topic, name=f"{group}-dies")
    asg, _ = wait_stable([*ms, dying])
    assert len(broker_view(admin, group)) == 3
    t0 = time.monotonic()
    dying.kill()
    new, first = wait_stable(ms, timeout=SESSION_MS / 1000 + 15)
    took = first - t0
    print(f"{client}: partitions of the killed member reassigned after {took:.2f}s")
    # Membership is session based: the dead member's partitions stay with it
    # until its session expires (~SESSION_MS after its last heartbeat, which
    # was at most one heartbeat interval before the kill).
    assert took >= (SESSION_MS - 2 * HEARTBEAT_MS) / 1000, (
        f"partitions of the killed member moved after {took:.2f}s, before its "
        f"{SESSION_MS} ms session could expire")
    assert took < SESSION_MS / 1000 + 5, f"reassignment took {took:.2f}s"
    assert frozenset().union(*new) == ALL and sorted(len(a) for a in new) == [3, 3]
    assert set(broker_view(admin, group)) == {m.name for m in ms}


@pytest.mark.parametrize("client", CLIENTS)
def test_new_members_resume_from_committed_offsets(module_server, admin, members, client):
    topic, group, ms = start_group(members, client, module_server, 3, tag="resume")
    wait_stable(ms)
    batch1 = produce(module_server.bootstrap, topic, {p: 20 + 3 * p for p in range(PARTITIONS)}, "one")
    wait_consumed(ms, len(batch1))
    check_exactly_once(ms, batch1)
    for m in ms:
        m.commit()
    want = ends(batch1)
    assert ms[0].committed() == want
    for m in ms:
        m.close()

    # New consumers (auto.offset.reset=earliest): they must start at the
    # committed offsets, not at 0.
    ms2 = [members(client, module_server.bootstrap, group, topic, name=f"{group}-n{i}")
           for i in range(2)]
    wait_stable(ms2)
    for m in ms2:
        assert m.committed() == want
    batch2 = produce(module_server.bootstrap, topic, {p: 5 + p for p in range(PARTITIONS)}, "two")
    wait_consumed(ms2, len(batch2))
    check_exactly_once(ms2, batch2)
    for m in ms2:
        m.commit()
    assert ms2[1].committed() == ends(batch1, batch2)


def _committed_offsets_survive(server, members, client: str, how: str) -> None:
    topic, group, ms = start_group(members, client, server, 2, tag=how)
    wait_stable(ms)
    batch1 = produce(server.bootstrap, topic, {p: 15 + 4 * p for p in range(PARTITIONS)}, "one")
    wait_consumed(ms, len(batch1))
    check_exactly_once(ms, batch1)
    for m in ms:
        m.commit()
    want = ends(batch1)
    assert ms[1].committed() == want
    for m in ms:
        m.close()
    # Records that must be read after the restart, and only they.
    batch2 = produce(server.bootstrap, topic, {p: 3 + 2 * p for p in range(PARTITIONS)}, "two")

    if how == "restart":
        server.restart()
    else:
        server.kill9()

    m = members(client, server.bootstrap, group, topic, name=f"{group}-after")
    assert m.committed() == want
    wait_stable([m])
    wait_consumed([m], len(batch2))
    check_exactly_once([m], batch2)
    m.commit()
    assert m.committed() == ends(batch1, batch2)


@pytest.mark.parametrize("client", CLIENTS)
def test_committed_offsets_survive_server_restart(server, members, client):
    _committed_offsets_survive(server, members, client, "restart")


@pytest.mark.parametrize("client", CLIENTS)
def test_committed_offsets_survive_server_kill9(server, members, client):
    _committed_offsets_survive(server, members, client, "kill9")


@pytest.mark.parametrize("client", CLIENTS)
def test_static_member_rejoins_without_rebalance(module_server, admin, members, client):
    # All three clients support static membership (KIP-345): confluent
    # group.instance.id, kafka-python/aiokafka group_instance_id; none of them
    # sends LeaveGroup when a static member closes.
    topic, group = unique("static-t"), unique("static-g")
    create_topic(module_server.bootstrap, topic)
    bs = module_server.bootstrap
    other = members(client, bs, group, topic, name=f"{group}-dyn")
    wait_stable([other])                            # the dynamic member is the leader
    static = members(client, bs, group, topic, instance_id="static-1", name=f"{group}-st")
    (asg_other, asg_static), _ = wait_stable([other, static])
    gen_before, other_id = other.identity()
    _, static_id_before = static.identity()
    view_before = broker_view(admin, group)
    assert view_before == {other.name: (None, asg_other), static.name: ("static-1", asg_static)}
    events_before = len(other.snapshot()[1])

    t0 = time.monotonic()
    static.close()
    again = members(client, bs, group, topic, instance_id="static-1", name=f"{group}-st")
    _, first = wait_stable([other, again])
    took = first - t0
    assert took < SESSION_MS / 1000, f"static member back only after {took:.2f}s"
    assert again.assigned == asg_static
    time.sleep(2 * HEARTBEAT_MS / 1000)
    events = other.snapshot()[1][events_before:]
    assert events == [], f"the other member saw a rebalance: {events}"
    assert other.assigned == asg_other
    gen_after, other_id_after = other.identity()
    gen_static, static_id_after = again.identity()
    assert other_id_after == other_id
    assert static_id_after and static_id_after != static_id_before, "the static member got a new member id"
    if gen_before is not None:
        assert gen_after == gen_before, f"generation went {gen_before} -> {gen_after}"
        assert gen_static == gen_before
    d = describe(admin, group)
    assert d.state == ConsumerGroupState.STABLE
    by_instance = {m.group_instance_id: m for m in d.members}
    assert set(by_instance) == {None, "static-1"}
    assert by_instance["static-1"].member_id == static_id_after
    assert by_instance[None].member_id == other_id
    assert frozenset(tp.partition for tp in by_instance["static-1"].assignment.topic_partitions) == asg_static


def _assignor_params():
    return [pytest.param(c, a, id=f"{c}-{a}") for c in CLIENTS for a in ASSIGNORS[c]]


@pytest.mark.parametrize("client,assignor", _assignor_params())
def test_assignor_gives_disjoint_cover(module_server, admin, members, client, assignor):
    """Each assignor gives three members a stable disjoint cover (two partitions each); sticky
    ones keep the survivors' partitions when a member goes, cooperative-sticky without revoking.

    kafka-python 3.0.0 can leave a leader holding the previous generation's assignment for good
    when its poll() times out during a rejoin that only its metadata snapshot asked for
    (kafka/coordinator/consumer.py:473 and :605-606 with kafka/coordinator/base.py:486 and
    :516-521): under load one consumer kept all 6 partitions while the other two, in a
    generation without it, got 3 each.  KafkaPythonAdapter.open fetches the metadata after
    subscribing, which keeps that rejoin from happening; see there.
    """
    topic, group, ms = start_group(members, client, module_server, 3, assignor=assignor,
                                   tag=assignor[:6])
    asg, _ = wait_stable(ms)
    assert sorted(len(a) for a in asg) == [2, 2, 2], asg
    d = describe(admin, group)
    assert d.partition_assignor == assignor
    assert broker_view(admin, group) == {m.name: (None, a) for m, a in zip(ms, asg)}
    # Members are ordered by member id, which start with the client id for
    # Java/kafka-python/aiokafka ("<client.id>-<uuid>") and librdkafka alike.
    by_id = [a for _, a in sorted(zip([m.identity()[1] for m in ms], asg))]
    if assignor == "range":
        assert by_id == [frozenset({0, 1}), frozenset({2, 3}), frozenset({4, 5})], by_id
    elif assignor == "roundrobin":
        assert by_id == [frozenset({0, 3}), frozenset({1, 4}), frozenset({2, 5})], by_id
    else:
        # Sticky assignors keep what survivors had when a member goes.
        events_before = [len(m.snapshot()[1]) for m in ms]
        ms[0].close()
        new, _ = wait_stable(ms[1:])
        for old, now in zip(asg[1:], new):
            assert old < now, f"{assignor}: survivor went {sorted(old)} -> {sorted(now)}"
        if assignor == "cooperative-sticky":
            for m, n in zip(ms[1:], events_before[1:]):
                revoked = [e for e in m.snapshot()[1][n:] if e[1] != "assigned" and e[2]]
                assert not revoked, f"{m.name}: cooperative rebalance revoked {revoked}"


def _admin_group(members, client, server):
    topic, group, ms = start_group(members, client, server, 2, assignor="range", tag="admin")
    asg, _ = wait_stable(ms)
    batch = produce(server.bootstrap, topic, {p: 6 + p for p in range(PARTITIONS)}, "adm")
    wait_consumed(ms, len(batch))
    for m in ms:
        m.commit()
    return topic, group, ms, asg, ends(batch)


@pytest.mark.parametrize("client", CLIENTS)
def test_group_admin(module_server, members, client):
    topic, group, ms, asg, want = _admin_group(members, client, module_server)
    {"confluent-kafka": _admin_confluent, "kafka-python": _admin_kafka_python,
     "aiokafka": _admin_aiokafka}[client](module_server, topic, group, ms, asg, want)


def _admin_confluent(server, topic, group, ms, asg, want) -> None:
    from confluent_kafka import KafkaError
    a = AdminClient(common(server.bootstrap))
    listing = a.list_consumer_groups(request_timeout=OP_TIMEOUT_S).result(timeout=OP_TIMEOUT_S)
    assert not listing.errors
    mine = [g for g in listing.valid if g.group_id == group]
    assert len(mine) == 1 and mine[0].state == ConsumerGroupState.STABLE
    assert mine[0].is_simple_consumer_group is False

    d = describe(a, group)
    assert (d.group_id, d.state, d.partition_assignor, d.is_simple_consumer_group) == \
        (group, ConsumerGroupState.STABLE, "range", False)
    assert {m.client_id: frozenset(tp.partition for tp in m.assignment.topic_partitions)
            for m in d.members} == {m.name: x for m, x in zip(ms, asg)}
    assert {m.member_id for m in d.members} == {m.identity()[1] for m in ms}

    def offsets() -> dict[int, int]:
        res = a.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)],
                                            request_timeout=OP_TIMEOUT_S)[group].result(timeout=OP_TIMEOUT_S)
        assert res.group_id == group
        assert all(tp.error is None and tp.topic == topic for tp in res.topic_partitions)
        return {tp.partition: tp.offset for tp in res.topic_partitions}

    assert offsets() == want

    # A group with members cannot be deleted.
    fut = a.delete_consumer_groups([group], request_timeout=OP_TIMEOUT_S)[group]
    with pytest.raises(KafkaException) as ei:
        fut.result(timeout=OP_TIMEOUT_S)
    assert ei.value.args[0].code() == KafkaError.NON_EMPTY_GROUP

    for m in ms:
        m.close()
    d = describe(a, group)
    assert (d.state, list(d.members)) == (ConsumerGroupState.EMPTY, [])
    assert offsets() == want

    # No DeleteConsumerGroupOffsets in confluent-kafka's AdminClient (client
    # gap): alter (admin OffsetCommit on the empty group) instead.
    new = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0, 1), TopicPartition(topic, 5, 2)])
    res = a.alter_consumer_group_offsets([new], request_timeout=OP_TIMEOUT_S)[group].result(
        timeout=OP_TIMEOUT_S)
    assert all(tp.error is None for tp in res.topic_partitions)
    assert offsets() == {**want, 0: 1, 5: 2}

    assert a.delete_consumer_groups([group], request_timeout=OP_TIMEOUT_S)[group].result(
        timeout=OP_TIMEOUT_S) is None
    listing = a.list_consumer_groups(request_timeout=OP_TIMEOUT_S).result(timeout=OP_TIMEOUT_S)
    assert group not in {g.group_id for g in listing.valid}
    assert offsets() == {}
    d = describe(a, group)
    assert d.state == ConsumerGroupState.DEAD and list(d.members) == []
    fut = a.delete_consumer_groups([group], request_timeout=OP_TIMEOUT_S)[group]
    with pytest.raises(KafkaException) as ei:
        fut.result(timeout=OP_TIMEOUT_S)
    assert ei.value.args[0].code() == KafkaError.GROUP_ID_NOT_FOUND


def _admin_kafka_python(server, topic, group, ms, asg, want) -> None:
    from kafka import KafkaAdminClient
    from kafka import TopicPartition as KTP
    a = KafkaAdminClient(bootstrap_servers=server.bootstrap, request_timeout_ms=int(OP_TIMEOUT_S * 1000))
    try:
        mine = [g for g in a.list_groups() if g["group_id"] == group]
        assert mine == [{"group_id": group, "protocol_type": "consumer", "group_state": "Stable",
                         "group_type": "classic"}]

        d = a.describe_groups([group])[group]
        assert d["error"] is None
        assert (d["group_state"], d["protocol_type"], d["protocol_data"]) == ("Stable", "consumer", "range")
        # Members come back as dicts, with the consumer-protocol metadata and
        # assignment decoded.
        got = {}
        for m in d["members"]:
            assert m["member_metadata"]["topics"] == [topic]
            assert m["group_instance_id"] is None
            (a_topic,) = m["member_assignment"]["assigned_partitions"]
            assert a_topic["topic"] == topic
            got[m["client_id"]] = frozenset(a_topic["partitions"])
        assert got == {m.name: x for m, x in zip(ms, asg)}
        assert {m["member_id"] for m in d["members"]} == {m.identity()[1] for m in ms}

        def offsets() -> dict[int, int]:
            res = a.list_group_offsets(group)[group]
            assert all(tp.topic == topic for tp in res)
            return {tp.partition: om.offset for tp, om in res.items()}

        assert offsets() == want
        assert a.delete_groups([group]) == {group: "NonEmptyGroupError"}
        # Offsets of a topic the active group consumes cannot be deleted.
        res = a.delete_group_offsets(group, [KTP(topic, 0)])
        assert {tp.partition: err.__name__ for tp, err in res.items()} == \
            {0: "GroupSubscribedToTopicError"}
        assert offsets() == want

        for m in ms:
            m.close()
        # kafka-python 3.0.0 bug: a heartbeat answered REBALANCE_IN_PROGRESS (the first member's
        # leave starts a rebalance) also marks the coordinator dead (kafka/coordinator/base.py
        # _failed_request), and close() then skips LeaveGroup.  Such a member stays until the
        # rebalance timeout, as with Apache Kafka; the group must then be Empty.
        deadline = time.monotonic() + KAFKA_PYTHON_REBALANCE_MS / 1000 + 5
        while True:
            d = a.describe_groups([group])[group]
            if d["group_state"] == "Empty" or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert (d["group_state"], d["members"]) == ("Empty", [])

        res = a.delete_group_offsets(group, [KTP(topic, 0), KTP(topic, 3)])
        assert {tp.partition: err.__name__ for tp, err in res.items()} == {0: "NoError", 3: "NoError"}
        assert offsets() == {p: o for p, o in want.items() if p not in (0, 3)}

        assert a.delete_groups([group]) == {group: "OK"}
        assert group not in {g["group_id"] for g in a.list_groups()}
        assert offsets() == {}
        assert a.delete_groups([group]) == {group: "GroupIdNotFoundError"}
    finally:
        a.close()


def _admin_aiokafka(server, topic, group, ms, asg, want) -> None:
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.protocol.group import MemberAssignment

    async def body():
        a = AIOKafkaAdminClient(bootstrap_servers=server.bootstrap,
                                request_timeout_ms=int(OP_TIMEOUT_S * 1000))
        await a.start()
        try:
            groups = await a.list_consumer_groups()
            assert (group, "consumer") in [tuple(g[:2]) for g in groups], groups

            (resp,) = await a.describe_consumer_groups([group])
            (g,) = resp.groups
            error_code, group_id, state, protocol_type, protocol, members_ = g[:6]
            assert (error_code, group_id, state, protocol_type, protocol) == \
                (0, group, "Stable", "consumer", "range")
            got = {}
            for mem in members_:
                # v0-3: (member_id, client_id, host, metadata, assignment); v4+
                # has group_instance_id after member_id.
                client_id = mem[1] if len(mem) == 5 else mem[2]
                decoded = MemberAssignment.decode(mem[-1])
                got[client_id] = frozenset(p for t, ps in decoded.assignment for p in ps if t == topic)
            assert got == {m.name: x for m, x in zip(ms, asg)}

            res = await a.list_consumer_group_offsets(group)
            assert {tp.partition: om.offset for tp, om in res.items()} == want
            # aiokafka's admin client has no DeleteGroups / OffsetDelete (client gap).
        finally:
            await a.close()

    asyncio.run(asyncio.wait_for(body(), 60))
    for m in ms:
        m.close()


if __name__ == "__main__":
    _dying_member_main(sys.argv[1])
