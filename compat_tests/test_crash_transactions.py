"""kill -9 of the broker in the middle of transactions (confluent-kafka): nothing committed is lost, nothing aborted is ever seen.

(a) between the PREPARE record (the commit point: the client was answered) and the markers;
(b) with transactions open; (c) during transactional and idempotent retries, the producer running
across the kill; (d) part-way through writing one transaction's markers.  After each restart every
committed transaction is fully visible to read_committed, every aborted or timed-out one never is,
nothing is duplicated, and the group's transactional offsets become visible exactly with the output.
(e) the instant acknowledged AddPartitionsToTxn answers arrive (nothing acknowledged is lost by a
process crash); (f) a seeded loop of kills right after acknowledged AddPartitionsToTxn /
AddOffsetsToTxn / EndTxn answers, through a proxy that kills the broker as it reads the answer.

``trireme.debug.transaction.marker.delay.ms`` holds the coordinator before each WriteTxnMarkers
request (one partition per request), so that the kill lands where each case needs it.
"""
from __future__ import annotations

import os
import itertools
import random
import signal
import socket
import struct
import threading
import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from compat_tests.clients import wait_until
from compat_tests.test_crash import FLUSH_MODES
from compat_tests.python_clients import create_topics
from trireme.wire import error_codes as E
from trireme.wire.codec import message

PARTITIONS = 2
FAST = {"transaction.abort.timed.out.transaction.cleanup.interval.ms": 300}
FAST_RECONNECT = {"reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 500, "retry.backoff.ms": 50,
                  "socket.connection.setup.timeout.ms": 5000}


def make_topics(bootstrap: str, n: int) -> list[str]:
    return create_topics(bootstrap, [f"crash-tx-{i}-{uuid.uuid4().hex[:8]}" for i in range(n)], PARTITIONS)


def producer(bootstrap: str, txn_id: str, **extra) -> Producer:
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, "linger.ms": 2, **FAST_RECONNECT,
                  **extra})
    p.init_transactions(60)
    return p


def read_all(bootstrap: str, topics: list[str], isolation: str = "read_committed") -> dict[bytes, int]:
    """Every record's key → how many times it was read, reading each partition to its end offset."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader-" + uuid.uuid4().hex,
                  "isolation.level": isolation, "enable.auto.commit": False, **FAST_RECONNECT})
    tps = [TopicPartition(t, p, 0) for t in topics for p in range(PARTITIONS)]
    ends = {(tp.topic, tp.partition): c.get_watermark_offsets(tp, timeout=20)[1] for tp in tps}
    c.assign(tps)
    counts: dict[bytes, int] = {}
    deadline = time.time() + 60
    while time.time() < deadline:
        m = c.poll(0.2)
        if m is not None and not m.error():
            counts[m.key()] = counts.get(m.key(), 0) + 1
        elif m is None:
            pos = c.position([TopicPartition(t, p) for t, p in ends])
            if all(tp.offset >= ends[(tp.topic, tp.partition)] for tp in pos):
                break
    c.close()
    return counts


def committed_offsets(bootstrap: str, group: str, tps: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        got = c.committed([TopicPartition(t, p) for t, p in tps], timeout=20)
        return {(tp.topic, tp.partition): tp.offset for tp in got}
    finally:
        c.close()


def keys(txn: int, topics: list[str], per_partition: int) -> list[tuple[str, int, bytes]]:
    return [(t, p, b"t%d-%s-%d-%d" % (txn, t.encode(), p, i))
            for t in topics for p in range(PARTITIONS) for i in range(per_partition)]


def run_txn(p: Producer, records, commit: bool = True) -> None:
    p.begin_transaction()
    for t, part, k in records:
        p.produce(t, key=k, value=b"v", partition=part)
    p.flush(60)
    if commit:
        p.commit_transaction(60)
    else:
        p.abort_transaction(60)


@pytest.mark.server_config({**FAST, "trireme.debug.transaction.marker.delay.ms": 3000})
def test_kill_between_prepare_and_markers(server):
    bootstrap = server.bootstrap
    topics = make_topics(bootstrap, 2)
    group = "crash-group-" + uuid.uuid4().hex[:6]
    p = producer(bootstrap, "prepare-" + uuid.uuid4().hex[:6])
    records = keys(1, topics, 5)
    p.begin_transaction()
    for t, part, k in records:
        p.produce(t, key=k, value=b"v", partition=part)
    p.flush(60)
    # KIP-447: the consumer's offsets go in the same transaction.
    offsets = [TopicPartition("input-topic-" + group, 0, 42)]
    p.send_offsets_to_transaction(offsets, _group_metadata(bootstrap, group), 60)
    p.commit_transaction(60)           # answered at the commit point; markers wait 3 s
    server.kill9()
    log = server.stderr_path.read_text(errors="replace")
    assert "resuming markers of prepared transaction" in log
    wait_until(lambda: committed_offsets(bootstrap, group, [("input-topic-" + group, 0)])
               == {("input-topic-" + group, 0): 42}, timeout=40, what="the transaction's offsets")
    counts = read_all(bootstrap, topics)
    assert counts == {k: 1 for _, _, k in records}


def _group_metadata(bootstrap: str, group: str):
    """A consumer's group metadata for send_offsets_to_transaction (a standalone commit: generation -1)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        return c.consumer_group_metadata()
    finally:
        c.close()


@pytest.mark.server_config({**FAST, "transaction.max.timeout.ms": 60000})
def test_kill_with_transactions_open(server):
    bootstrap = server.bootstrap
    topics = make_topics(bootstrap, 1)
    done = producer(bootstrap, "done-" + uuid.uuid4().hex[:6])
    committed = keys(1, topics, 4)
    run_txn(done, committed)
    stuck = producer(bootstrap, "stuck-" + uuid.uuid4().hex[:6], **{"transaction.timeout.ms": 3000})
    stuck.begin_transaction()
    for t, part, k in keys(2, topics, 4):
        stuck.produce(t, key=k, value=b"v", partition=part)
    stuck.flush(60)
    server.kill9()
    # The coordinator recovered the open transaction and aborts it at its timeout: consumers move past it.
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "x", "isolation.level": "read_committed"})
    wait_until(lambda: all(c.get_watermark_offsets(TopicPartition(topics[0], p), timeout=20)[1] == 10
                           for p in range(PARTITIONS)), timeout=40, what="the abort of the open transaction")
    c.close()
    assert read_all(bootstrap, topics) == {k: 1 for _, _, k in committed}
    assert "timed out" in server.stderr_path.read_text(errors="replace")


@pytest.mark.server_config({**FAST, "trireme.debug.transaction.marker.delay.ms": 1500})
def test_kill_part_way_through_markers(server):
    bootstrap = server.bootstrap
    topics = make_topics(bootstrap, 2)           # 4 partitions: 4 WriteTxnMarkers requests, 1.5 s apart
    p = producer(bootstrap, "partway-" + uuid.uuid4().hex[:6])
    records = keys(1, topics, 3)
    run_txn(p, records)
    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": "x"})
    tps = [TopicPartition(t, q) for t in topics for q in range(PARTITIONS)]
    # Wait until at least one partition has its marker (4 records: 3 data + 1 marker) but not all.
    wait_until(lambda: sum(probe.get_watermark_offsets(tp, timeout=10)[1] == 4 for tp in tps) >= 1, timeout=20,
               what="the first marker")
    written = sum(probe.get_watermark_offsets(tp, timeout=10)[1] == 4 for tp in tps)
    probe.close()
    assert written < len(tps)
    server.kill9()
    assert read_all(bootstrap, topics) == {k: 1 for _, _, k in records}


@pytest.mark.server_config(FAST)
def test_kill_during_transactional_retries(server):
    """A transactional producer keeps going across two kills; what read_committed sees is exactly the
    transactions whose commit returned, each record once (retried batches are deduplicated)."""
    bootstrap = server.bootstrap
    topics = make_topics(bootstrap, 1)
    p = producer(bootstrap, "retry-" + uuid.uuid4().hex[:6], **{"transaction.timeout.ms": 20000})
    outcome: dict[int, bool] = {}
    stop = threading.Event()
    errors: list[BaseException] = []

    def loop() -> None:
        txn = 0
        try:
            while not stop.is_set() and txn < 200:
                txn += 1
                recs = keys(txn, topics, 5)
                try:
                    p.begin_transaction()
                    for t, part, k in recs:
                        p.produce(t, key=k, value=b"v", partition=part)
                    p.flush(60)
                    while True:
                        try:
                            p.commit_transaction(60)
                            outcome[txn] = True
                            break
                        except KafkaException as e:
                            if e.args[0].retriable():
                                continue
                            raise
                except KafkaException as e:
                    if not e.args[0].txn_requires_abort():
                        raise
                    p.abort_transaction(60)
                    outcome[txn] = False
        except BaseException as e:      # reported below
            errors.append(e)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    for _ in range(2):
        wait_until(lambda: len(outcome) >= 5 or errors, timeout=60, what="some transactions")
        server.kill9()
        before = len(outcome)
        wait_until(lambda: len(outcome) > before + 3 or errors, timeout=90, what="transactions after the restart")
    stop.set()
    thread.join(120)
    assert not errors, errors
    assert sum(outcome.values()) >= 10
    counts = read_all(bootstrap, topics)
    want = {k: 1 for txn, ok in outcome.items() if ok for _, _, k in keys(txn, topics, 5)}
    assert counts == want


def test_lost_add_partitions_record_aborts_the_orphaned_transaction(server):
    """AddPartitionsToTxn is answered once its record is staged (its fsync overlaps the producer's Produce).  A power
    loss can then keep the transaction's data (its Produce was answered after its own fsync) but lose the record
    that added the partition: here the broker is killed and the transaction log's tail after the InitProducerId
    record is cut, as the unsynced tail would be.  At start-up the broker finds the producer's transaction open on
    a partition its coordinator never recorded, aborts it (the last stable offset reaches the high watermark,
    read_committed sees nothing), and the producer's commit is refused (INVALID_TXN_STATE)."""
    import struct

    from compat_tests.test_bad_input import RawConn, create_topic, list_offset, unique
    from compat_tests.test_bad_transactions import add_partitions, end_txn, init, produce_txn, txn_batch
    from trireme.wire import error_codes as E

    with RawConn(server.bootstrap) as conn:
        topic = unique("orphan")
        create_topic(conn, topic, partitions=PARTITIONS)
        tid = unique("tx")
        _, pid, epoch = init(conn, tid)
        assert add_partitions(conn, tid, pid, epoch, topic, [0]) == {(topic, 0): 0}
        assert produce_txn(conn, tid, topic, 0, txn_batch(pid, epoch, values=(b"a", b"b"))) == 0
        assert list_offset(conn, topic, 0) == 2 and list_offset(conn, topic, 0, isolation_level=1) == 0

    def lose_the_add_record():
        segment = server.data_dir / "logs" / "__transaction_state-0" / "00000000000000000000.log"
        data = segment.read_bytes()
        first_batch = 12 + struct.unpack_from(">i", data, 8)[0]     # the InitProducerId record's batch
        assert len(data) > first_batch + 12 and struct.unpack_from(">i", data, first_batch + 8)[0] > 0, \
            "the AddPartitionsToTxn record should follow it"
        segment.write_bytes(data[:first_batch])
        (segment.parent / "producer-state.snapshot").unlink(missing_ok=True)
    server.kill9(between=lose_the_add_record)

    with RawConn(server.bootstrap) as conn:
        wait_until(lambda: list_offset(conn, topic, 0, isolation_level=1) == 3, timeout=20,
                   what="the orphaned transaction's ABORT marker")
        assert list_offset(conn, topic, 0) == 3
        assert end_txn(conn, tid, pid, epoch, True) == E.INVALID_TXN_STATE.code
    assert read_all(server.bootstrap, [topic]) == {}
    assert "never recorded" in server.stderr_tail(200)


# --------------------------------------------------------------------------- acknowledged, then killed at once

ADD_ROUNDS = int(os.environ.get("TRIREME_CRASH_ADD_ROUNDS", "3"))
ADDS_PER_ROUND = 40


def kill_now(server) -> None:
    """SIGKILL the broker this instant (the caller then restarts it with ``server.kill9()``)."""
    os.kill(server.proc.pid, signal.SIGKILL)
    server.proc.wait(timeout=10)


def describe_transactions(conn, tids: list[str]) -> dict[str, tuple[int, str, set[tuple[str, int]]]]:
    """DescribeTransactions → {id: (error code, state, partitions in the transaction)}."""
    from compat_tests.test_bad_input import req
    r = conn.request("DescribeTransactions", 0, req("DescribeTransactions", transactional_ids=tids))
    return {s.transactional_id: (s.error_code, s.transaction_state,
                                 {(t.topic, p) for t in s.topics for p in t.partitions})
            for s in r.transaction_states}


@pytest.mark.parametrize("mode", FLUSH_MODES)
def test_acknowledged_add_partitions_survive_an_immediate_kill(server, mode):
    """Issue 20 item 4: AddPartitionsToTxn is answered before its record's fsync; a process crash right after the
    answers must still find every acknowledged add (the record reached the OS before the answer left).  Each round
    pipelines 40 adds (40 transactional ids, one partition each), reads every answer, SIGKILLs the broker at once,
    restarts it and describes the transactions.  Before the fix most of the last adds of a round were gone (with
    fsync per acknowledgement; with Kafka's flush policy or fsync off every append is written at once)."""
    from compat_tests.test_bad_input import RawConn, create_topic, unique
    from compat_tests.test_bad_transactions import init

    add_cls = message("AddPartitionsToTxnRequest").cls
    lost: list[str] = []
    for round_ in range(ADD_ROUNDS):
        with RawConn(server.bootstrap) as conn:
            topic = unique("acked-add")
            create_topic(conn, topic, partitions=ADDS_PER_ROUND)
            ids = []
            for i in range(ADDS_PER_ROUND):
                tid = unique(f"add{round_}-{i}")
                error, pid, epoch = init(conn, tid)
                assert error == 0
                ids.append((tid, pid, epoch))
            cids = [conn.send_request("AddPartitionsToTxn", 3, add_cls(
                v3_and_below_transactional_id=tid, v3_and_below_producer_id=pid, v3_and_below_producer_epoch=epoch,
                v3_and_below_topics=[add_cls.AddPartitionsToTxnTopic(name=topic, partitions=[i])]))
                for i, (tid, pid, epoch) in enumerate(ids)]
            acknowledged = []
            for i, cid in enumerate(cids):
                r = conn.read_response("AddPartitionsToTxn", 3, cid)
                if r.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code == 0:
                    acknowledged.append((ids[i][0], (topic, i)))
            kill_now(server)
        assert len(acknowledged) == ADDS_PER_ROUND
        server.kill9()
        with RawConn(server.bootstrap) as conn:
            described = describe_transactions(conn, [tid for tid, _ in acknowledged])
        for tid, tp in acknowledged:
            error, state, partitions = described[tid]
            if error != 0 or state != "Ongoing" or tp not in partitions:
                lost.append(f"round {round_}: {tid} {tp}: error {error} state {state} partitions {partitions}")
    assert not lost, f"{len(lost)} of {ADD_ROUNDS * ADDS_PER_ROUND} acknowledged adds lost:\n" + "\n".join(lost)


# --------------------------------------------------------------------------- the crash loop

CRASH_LOOP_KILLS = int(os.environ.get("TRIREME_CRASH_LOOP_KILLS", "6"))
CRASH_LOOP_SEED = int(os.environ.get("TRIREME_CRASH_SEED", "7331"))
KILL_AFTER = ("AddPartitionsToTxn", "AddOffsetsToTxn", "EndTxn")


def _recv_frame(stream) -> bytes | None:
    """One size-prefixed frame, size included, from a socket's buffered reader; None at EOF."""
    head = stream.read(4)
    if len(head) < 4:
        return None
    size = struct.unpack(">i", head)[0]
    payload = stream.read(size)
    return head + payload if len(payload) == size else None


def _acknowledged(api: str, response) -> bool:
    """Whether ``response`` acknowledges the state change its request asked for."""
    if api == "AddPartitionsToTxn":
        return all(p.partition_error_code == 0 for t in response.results_by_topic_v3_and_below
                   for p in t.results_by_partition)
    return response.error_code == 0


class KillingProxy:
    """A TCP proxy in front of the broker, which advertises it (so every client connection goes through it).  Armed
    with an API, it lets ``skip`` acknowledged answers of that API pass, then SIGKILLs the broker the moment it has
    read the next one from the broker — then passes that answer on: the broker dies right after it acknowledged.
    Paused (``running`` clear), it holds new client connections until it runs again (the broker is being restarted
    and checked)."""

    def __init__(self, server):
        from compat_tests.test_bad_input import API_KEYS
        self.server = server
        self.names = {key: name for name, key in API_KEYS.items()}
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        self.armed: tuple[str, int] | None = None
        self.killed = threading.Event()
        self.kill_info: tuple[str, object] | None = None      # (API, the acknowledged request)
        self.running = threading.Event()
        self.running.set()
        self.sockets: set[socket.socket] = set()
        self.trace: list[str] = []          # what went through, for a failure's message
        self._links = itertools.count(1)
        threading.Thread(target=self._accept, daemon=True).start()

    def note(self, text: str) -> None:
        self.trace.append(f"{time.monotonic():.3f} {text}")

    def recent(self, n: int = 40) -> str:
        return "\n".join(self.trace[-n:])

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def arm(self, api: str, skip: int) -> None:
        with self.lock:
            self.killed.clear()
            self.kill_info = None
            self.armed = (api, skip)

    def close(self) -> None:
        self.listener.close()
        with self.lock:
            for s in list(self.sockets):
                s.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._link, args=(client,), daemon=True).start()

    def _link(self, client: socket.socket) -> None:
        """Connect a client to the broker (once not paused) and pass frames both ways."""
        self.running.wait()
        try:
            upstream = socket.create_connection((self.server.host, self.server.port), timeout=5)
            upstream.settimeout(None)
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError as e:
            self.note(f"could not link a client: {e!r}")
            client.close()
            return
        with self.lock:
            self.sockets |= {client, upstream}
        inflight: dict[int, tuple[int, int, bytes]] = {}
        link = next(self._links)
        self.note(f"link {link} open")
        threading.Thread(target=self._requests, args=(link, client, upstream, inflight), daemon=True).start()
        self._answers(link, client, upstream, inflight)

    def _end(self, *socks) -> None:
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
            with self.lock:
                self.sockets.discard(s)

    def _requests(self, link, client, upstream, inflight) -> None:
        try:
            stream = client.makefile("rb")
            while (frame := _recv_frame(stream)) is not None:
                api_key, version, cid = struct.unpack_from(">hhi", frame, 4)
                inflight[cid] = (api_key, version, frame[4:])
                self.note(f"link {link} -> {self.names.get(api_key)} v{version} #{cid}")
                upstream.sendall(frame)
        except OSError:
            pass
        self.note(f"link {link} client side ended")
        self._end(client, upstream)

    def _answers(self, link, client, upstream, inflight) -> None:
        from compat_tests.test_bad_input import decode_response
        from trireme.wire import headers
        try:
            stream = upstream.makefile("rb")
            while (frame := _recv_frame(stream)) is not None:
                cid = struct.unpack_from(">i", frame, 4)[0]
                api_key, version, request = inflight.pop(cid)
                api = self.names.get(api_key)
                self.note(f"link {link} <- {api} #{cid}")
                with self.lock:
                    armed = self.armed is not None and self.armed[0] == api
                if armed and _acknowledged(api, decode_response(api, version, frame[4:])[1]):
                    with self.lock:
                        name, skip = self.armed
                        if skip:
                            self.armed = (name, skip - 1)
                        else:
                            os.kill(self.server.proc.pid, signal.SIGKILL)      # right after the acknowledgement
                            self.running.clear()        # clients wait for the restart rather than being refused
                            self.armed = None
                            codec = message(api + "Request")
                            header = headers.decode_request_header(request, codec.is_flexible(version))
                            self.kill_info = (api, codec.decode(memoryview(request), version, header.size)[0])
                            self.killed.set()
                            self.note(f"link {link} killed the broker after {api} #{cid}")
                client.sendall(frame)
        except OSError:
            pass
        self.note(f"link {link} broker side ended")
        self._end(client, upstream)


def _check_acknowledged(bootstrap: str, api: str, request) -> None:
    """After the restart: the state change the broker acknowledged just before it was killed is there."""
    from compat_tests.test_bad_input import RawConn
    with RawConn(bootstrap) as conn:
        if api == "EndTxn":
            tid = request.transactional_id
            result = "Commit" if request.committed else "Abort"
            error, state, _ = describe_transactions(conn, [tid])[tid]
            assert error == 0 and state in ("Prepare" + result, "Complete" + result), (api, tid, state)
            wait_until(lambda: describe_transactions(conn, [tid])[tid][1] == "Complete" + result, timeout=30,
                       what=f"{tid}'s prepared {result.lower()} to complete")
            return
        if api == "AddPartitionsToTxn":
            tid = request.v3_and_below_transactional_id
            want = {(t.name, p) for t in request.v3_and_below_topics for p in t.partitions}
        else:
            tid = request.transactional_id
            want = {("__consumer_offsets", 0)}
        error, state, partitions = describe_transactions(conn, [tid])[tid]
        assert error == 0 and state == "Ongoing" and want <= partitions, \
            f"acknowledged {api} of {tid} for {sorted(want)} lost: state {state}, partitions {sorted(partitions)}"


RETRIABLE = {E.COORDINATOR_NOT_AVAILABLE.code, E.NOT_COORDINATOR.code, E.CONCURRENT_TRANSACTIONS.code,
             E.COORDINATOR_LOAD_IN_PROGRESS.code}


def _raw_until_settled(bootstrap: str, call) -> int:
    """``call(conn)`` → error code, on a new connection, again while the answer is retriable or the connection breaks
    (the broker restarting), as a client would; → the final error code."""
    from compat_tests.test_bad_input import Closed, RawConn
    deadline = time.monotonic() + 30
    while True:
        try:
            with RawConn(bootstrap) as conn:
                error = call(conn)
        except (Closed, OSError):
            error = None
        if error is not None and error not in RETRIABLE or time.monotonic() > deadline:
            return error
        time.sleep(0.1)


class RawOffsetsClient:
    """A transactional client in raw frames that commits a group's offsets in transactions (AddOffsetsToTxn,
    TxnOffsetCommit, EndTxn), for the kills after AddOffsetsToTxn: librdkafka's send_offsets_to_transaction can hang
    for good when its coordinator restarts under it (librdkafka issues 5456 and 5511; the broker holds no request of
    it then), which no broker can help."""

    def __init__(self, bootstrap: str, group: str, source: str):
        from compat_tests.test_bad_transactions import init
        self.bootstrap, self.group, self.source = bootstrap, group, source
        self.tid = "offsets-" + uuid.uuid4().hex[:6]
        results = []
        assert _raw_until_settled(bootstrap, lambda c: results.append(init(c, self.tid)) or results[-1][0]) == 0
        _, self.pid, self.epoch = results[-1]
        self.committed = -1

    def add_offsets(self, conn) -> int:
        from compat_tests.test_bad_input import req
        return conn.request("AddOffsetsToTxn", 0, req(
            "AddOffsetsToTxn", transactional_id=self.tid, producer_id=self.pid, producer_epoch=self.epoch,
            group_id=self.group)).error_code

    def finish(self, offset: int) -> None:
        """TxnOffsetCommit of ``offset`` and EndTxn(commit), each retried across a restart as a client would."""
        from compat_tests.test_bad_transactions import end_txn
        cls = message("TxnOffsetCommitRequest").cls
        tcls = cls.TxnOffsetCommitRequestTopic

        def commit_offset(conn) -> int:
            r = conn.request("TxnOffsetCommit", 3, cls(
                transactional_id=self.tid, group_id=self.group, producer_id=self.pid, producer_epoch=self.epoch,
                generation_id=-1, member_id="", group_instance_id=None, topics=[tcls(name=self.source, partitions=[
                    tcls.TxnOffsetCommitRequestPartition(partition_index=0, committed_offset=offset,
                                                         committed_metadata="")])]))
            return r.topics[0].partitions[0].error_code
        assert _raw_until_settled(self.bootstrap, commit_offset) == 0
        assert _raw_until_settled(self.bootstrap, lambda c: end_txn(c, self.tid, self.pid, self.epoch, True)) == 0
        self.committed = offset


@pytest.mark.server_config({"transaction.max.timeout.ms": 120000})
def test_crash_loop_kill_right_after_acknowledged_transaction_answers(server):
    """Issue 20's crash test: the broker is SIGKILLed right after it sent an acknowledged AddPartitionsToTxn,
    AddOffsetsToTxn or EndTxn answer (seeded choice of API and occurrence; TRIREME_CRASH_LOOP_KILLS kills, `make
    crash-loop` runs many), while a confluent-kafka transactional producer runs transactions (AddPartitionsToTxn,
    Produce, EndTxn; one in five aborted) and a raw-frame client commits a group's offsets in transactions.  After
    each restart the acknowledged change is there (the adds, the prepared result completed); the producer carries on
    without a fatal error; at the end read_committed holds exactly the transactions whose commit returned, once each,
    and the group's offset is the last one committed."""
    rng = random.Random(f"{CRASH_LOOP_SEED}:crash-loop")
    proxy = KillingProxy(server)
    try:
        server.extra_args += ["--advertised", proxy.bootstrap]
        server.restart()
        topics = make_topics(server.bootstrap, 1)
        group = "crash-loop-" + uuid.uuid4().hex[:6]
        offsets = RawOffsetsClient(proxy.bootstrap, group, "input-" + group)
        txn_id = "loop-" + uuid.uuid4().hex[:6]
        settings = {"transaction.timeout.ms": 60000, "message.timeout.ms": 60000}
        p = producer(proxy.bootstrap, txn_id, **settings)
        outcome: dict[int, bool] = {}
        as_on_kafka: list[int] = []         # transactions whose abort met the fatal error Kafka gives too (below)
        stop = threading.Event()
        errors: list[str] = []
        phase = ["starting"]

        def retrying(call):
            while True:
                try:
                    return call()
                except KafkaException as e:
                    if not e.args[0].retriable() or e.args[0].txn_requires_abort() or stop.is_set():
                        raise
                    phase[0] += f" (retrying after {e.args[0].name()})"

        def loop() -> None:
            try:
                transactions()
            except BaseException as e:          # reported by the main thread
                errors.append(f"{phase[0]}: {e!r}")

        def nothing_open_at_the_coordinator() -> bool:
            """Whether the coordinator has no transaction open for the producer's id: then an AddPartitionsToTxn that
            was in flight when the broker died never arrived, and librdkafka (which counts such a request as possibly
            received, rdkafka_txnmgr.c) still sends EndTxn(abort), which Kafka answers INVALID_TXN_STATE too under
            the classic protocol (only transactions V2 accepts an abort with nothing added), fatal for the client."""
            from compat_tests.test_bad_input import Closed, RawConn
            deadline = time.monotonic() + 60
            while True:                         # the broker may be restarting under the proxy
                try:
                    with RawConn(server.bootstrap) as conn:
                        error, state, _ = describe_transactions(conn, [txn_id])[txn_id]
                    return error == 0 and state in ("CompleteCommit", "CompleteAbort")
                except (OSError, Closed):
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)

        def abort(txn: int) -> bool:
            """Abort ``txn``; → False when the producer hit an error that Kafka would not give it."""
            nonlocal p
            try:
                retrying(lambda: p.abort_transaction(60))
            except KafkaException as abort_error:
                err = abort_error.args[0]
                if not (err.fatal() and err.code() == KafkaError.INVALID_TXN_STATE and nothing_open_at_the_coordinator()):
                    errors.append(f"abort of transaction {txn}: {err}")
                    return False
                as_on_kafka.append(txn)
                p = producer(proxy.bootstrap, txn_id, **settings)     # as an application does after a fatal error
            outcome[txn] = False
            return True

        def transactions() -> None:
            txn = 0
            while not stop.is_set() and txn < 5000:
                txn += 1
                commit = txn % 5 != 0
                try:
                    phase[0] = f"transaction {txn}: produce"
                    p.begin_transaction()
                    for t, part, k in keys(txn, topics, 2):
                        p.produce(t, key=k, value=b"v", partition=part)
                    phase[0] = f"transaction {txn}: {'commit' if commit else 'abort'}_transaction"
                    if commit:
                        retrying(lambda: p.commit_transaction(60))
                        outcome[txn] = True
                    elif not abort(txn):
                        return
                except KafkaException as e:
                    err = e.args[0]
                    if err.fatal() or not err.txn_requires_abort():
                        errors.append(f"transaction {txn}: {err.name()} {err.str()} (fatal={err.fatal()})")
                        return
                    if not abort(txn):
                        return

        def load() -> None:
            """Keep the broker's flusher busy, as other producers would: acks=all records in a stream."""
            stream = Producer({"bootstrap.servers": proxy.bootstrap, "linger.ms": 0, "acks": "all",
                               "message.timeout.ms": 300000, **FAST_RECONNECT})
            while not stop.is_set():
                try:
                    stream.produce(load_topic, b"x" * 100)
                except BufferError:
                    pass
                stream.poll(0.001)
            stream.flush(30)

        load_topic = make_topics(server.bootstrap, 1)[0]
        threads = [threading.Thread(target=loop, daemon=True), threading.Thread(target=load, daemon=True)]
        for thread in threads:
            thread.start()
        kills: list[str] = []
        for kill in range(CRASH_LOOP_KILLS):
            api, skip = rng.choice(KILL_AFTER), rng.randrange(3)
            before = sum(outcome.values())
            if api == "AddOffsetsToTxn":
                proxy.arm(api, 0)
                assert _raw_until_settled(proxy.bootstrap, offsets.add_offsets) == 0
            else:
                proxy.arm(api, skip)
            wait_until(lambda: proxy.killed.is_set() or errors, timeout=90, what=f"an acknowledged {api} to kill after")
            assert not errors, f"{errors} (kill {kill + 1}, armed for {api}); through the proxy lately:\n{proxy.recent()}"
            server.kill9()
            _check_acknowledged(server.bootstrap, *proxy.kill_info)
            kills.append(api)
            proxy.running.set()
            if api == "AddOffsetsToTxn":
                offsets.finish(kill)
            try:
                wait_until(lambda: sum(outcome.values()) > before + 1 or errors, timeout=120,
                           what="committed transactions after the restart")
            except AssertionError as e:
                raise AssertionError(f"{e} (kill {len(kills)}, after {api}; the producer is at {phase[0]}); "
                                     f"through the proxy lately:\n{proxy.recent()}") from None
            assert not errors, f"{errors} (kill {len(kills)}, after {api}); through the proxy lately:\n{proxy.recent()}"
        stop.set()
        for thread in threads:
            thread.join(180)
            assert not thread.is_alive(), "a producer did not finish"
        assert not errors, errors
        assert read_all(server.bootstrap, topics) == {k: 1 for txn, ok in outcome.items() if ok
                                                     for _, _, k in keys(txn, topics, 2)}
        if offsets.committed >= 0:
            assert committed_offsets(server.bootstrap, group, [(offsets.source, 0)]) == \
                {(offsets.source, 0): offsets.committed}
        print(f"crash loop: {len(kills)} kills ({', '.join(f'{a} x{kills.count(a)}' for a in KILL_AFTER)}), "
              f"{sum(outcome.values())} transactions committed, {list(outcome.values()).count(False)} aborted, "
              f"{len(as_on_kafka)} aborts refused as on Kafka after a lost AddPartitionsToTxn")
    finally:
        proxy.running.set()
        proxy.close()
