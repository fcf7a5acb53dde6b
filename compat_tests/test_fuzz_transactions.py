"""The transactional fuzzer: mutated transactional requests against a real broker must not break it.

Valid frames of every transactional API (compat_tests/txn_fuzz.py) about a few transactional ids are
mutated (fields set to boundary values or to other ids, topics and producers; byte flips, truncations,
splices, wrong size prefixes) and sent to a real `trireme serve`; now and then a valid InitProducerId
picks up an id's new producer id and epoch so the frames keep reaching deep states.  Afterwards:

- no traceback (or "internal error") in the broker's log, and every request was answered or its
  connection closed within ANSWER_TIMEOUT_S;
- no wedged transactional id: during the run, an id whose InitProducerId stays CONCURRENT_TRANSACTIONS
  for BUSY_REFRESHES refreshes in a row is reported (and replaced, so the run goes on at speed);
  afterwards a confluent-kafka producer with each id used (and a fresh one) initialises, writes and
  commits within WEDGE_TIMEOUT_S, and a read_committed consumer sees it;
- the read_committed data written before the fuzz is unchanged.

TRIREME_FUZZ_FRAMES (default 5,000: a few seconds, in the normal suite) and TRIREME_FUZZ_SEED
(default 20) set the run; ``make fuzz`` runs 20,000 frames.  A failure names the seed and the frames sent
just before each traceback, so the run can be replayed.
"""
from __future__ import annotations

import collections
import os
import random
import socket
import struct
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from compat_tests.python_clients import create_topics
from compat_tests.test_bad_input import Closed, LogWatch, RawConn, decode_response, unique
from compat_tests.test_bad_transactions import init
from compat_tests.txn_fuzz import API_KEYS, Scene, mutate, templates
from trireme.wire import error_codes as E
from trireme.wire import headers, records
from trireme.wire.codec import message

FRAMES = int(os.environ.get("TRIREME_FUZZ_FRAMES", "5000"))
SEED = int(os.environ.get("TRIREME_FUZZ_SEED", "20"))
NAMES = {key: name for name, key in API_KEYS.items()}
ANSWER_TIMEOUT_S = 15.0
WEDGE_TIMEOUT_S = 60.0
FUZZ_IDS = 4
BUSY_REFRESHES = 3

pytestmark = [
    pytest.mark.trireme_only("reads the broker's log"),
    pytest.mark.server_config({"transaction.abort.timed.out.transaction.cleanup.interval.ms": 500}),
]


def read_committed(bootstrap: str, topic: str, ends: dict[int, int]) -> dict[int, list[tuple[int, bytes]]]:
    """(offset, value) of every record a read_committed consumer sees below ``ends[partition]``."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("fz-reader"), "enable.auto.commit": False,
                  "isolation.level": "read_committed"})
    got: dict[int, list[tuple[int, bytes]]] = {p: [] for p in ends}
    try:
        c.assign([TopicPartition(topic, p, 0) for p in ends])
        deadline = time.monotonic() + 30
        while True:
            positions = {tp.partition: tp.offset for tp in c.position([TopicPartition(topic, p) for p in ends])}
            if all(positions[p] >= end for p, end in ends.items()):
                return got
            assert time.monotonic() < deadline, f"read_committed stuck at {positions}, want {ends}"
            msg = c.poll(0.2)
            if msg is not None and msg.error() is None and msg.offset() < ends[msg.partition()]:
                got[msg.partition()].append((msg.offset(), msg.value()))
    finally:
        c.close()


def high_watermarks(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("fz-hw")})
    try:
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)}
    finally:
        c.close()


def transact(bootstrap: str, txn_id: str, topic: str, values: list[bytes], commit: bool = True,
             timeout: float = WEDGE_TIMEOUT_S) -> None:
    """A normal confluent-kafka transaction: init (fencing whatever the id had open), produce, commit/abort."""
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, "linger.ms": 5})
    p.init_transactions(timeout)
    p.begin_transaction()
    for i, v in enumerate(values):
        p.produce(topic, value=v, partition=i % 2)
    (p.commit_transaction if commit else p.abort_transaction)(timeout)


def _acks_zero(data: bytes) -> bool:
    """Whether a frame is a Produce request asking for no answer (acks=0): the broker then sends nothing."""
    try:
        api_key, version = struct.unpack_from(">hh", data, 4)
        if api_key != 0:
            return False
        codec = message("ProduceRequest")
        head = headers.decode_request_header(data[4:], codec.is_flexible(version))
        return codec.decode(memoryview(data[4:]), version, head.size)[0].acks == 0
    except Exception:  # noqa: BLE001 - undecodable: the broker closes the connection
        return False


class Fuzzer:
    def __init__(self, bootstrap: str, scene: Scene, rnd: random.Random, log: LogWatch):
        self.bootstrap, self.scene, self.rnd, self.log = bootstrap, scene, rnd, log
        self.conn: RawConn | None = None
        self.stats: collections.Counter = collections.Counter()
        self.recent: collections.deque = collections.deque(maxlen=4)
        self.findings: list[str] = []
        self.seconds: collections.Counter = collections.Counter()     # time spent per API, to see where it goes
        self.busy: dict[str, int] = {}          # id → InitProducerId answered CONCURRENT_TRANSACTIONS in a row
        self.retired: list[str] = []            # ids reported wedged and replaced
        self.accepted: collections.deque = collections.deque(maxlen=2000)   # (producer id, accepted write)
        self._log_size = 0

    def refresh(self, index: int) -> None:
        """A valid InitProducerId for one id: its current producer id and epoch for the next templates.  An id that
        stays busy (CONCURRENT_TRANSACTIONS) for BUSY_REFRESHES refreshes in a row is reported as wedged and
        replaced by a fresh one: every request about it waits for the broker's busy timeout, which would slow the
        rest of the run down."""
        tid = self.rnd.choice(list(self.scene.producers))
        started = time.monotonic()
        with RawConn(self.bootstrap, timeout=ANSWER_TIMEOUT_S) as c:
            err, pid, epoch = init(c, tid, timeout_ms=self.rnd.choice((60000, 5000)))
        self.stats[f"refresh error {err}"] += 1
        self.seconds["refresh"] += time.monotonic() - started
        if err == 0:
            self.scene.producers[tid] = (pid, epoch)
            self.busy.pop(tid, None)
        elif err == E.CONCURRENT_TRANSACTIONS.code:
            self.busy[tid] = self.busy.get(tid, 0) + 1
            if self.busy[tid] >= BUSY_REFRESHES:
                pid = self.scene.producers[tid][0]
                writes = [w for p, w in self.accepted if p == pid][-6:]
                self.findings.append(f"wedged {tid} (producer id {pid}): CONCURRENT_TRANSACTIONS to {BUSY_REFRESHES} "
                                     f"InitProducerId in a row (by frame #{index}); the last writes accepted for its "
                                     f"producer id:\n  " + "\n  ".join(writes))
                self.retired.append(tid)
                del self.scene.producers[tid], self.busy[tid]
                fresh = unique("fz-r")
                with RawConn(self.bootstrap, timeout=ANSWER_TIMEOUT_S) as c:
                    err, pid, epoch = init(c, fresh)
                assert err == 0, f"a fresh transactional id got {err}"
                self.scene.producers[fresh] = (pid, epoch)

    def send(self, index: int) -> None:
        api, version, obj = self.rnd.choice(templates(self.scene, self.rnd))
        kind, data = mutate(api, version, obj, self.scene, self.rnd, index)
        self.recent.append(f"#{index} {kind} {api} v{version}: {data.hex()}")
        self.stats[kind] += 1
        started = time.monotonic()
        try:
            if kind == "resize":                # a wrong size prefix: the broker waits for the rest; half-close
                self._one_shot(data)
            else:
                self._exchange(data)
        finally:
            self.seconds[api] += time.monotonic() - started

    def _exchange(self, data: bytes) -> None:
        if self.conn is None:
            self.conn = RawConn(self.bootstrap, timeout=ANSWER_TIMEOUT_S)
        try:
            self.conn.send(data)
            if _acks_zero(data):
                self.stats["acks=0"] += 1
                return
            self._note_accepted(data, self.conn.read_frame(timeout=ANSWER_TIMEOUT_S))
            self.stats["answered"] += 1
        except (Closed, BrokenPipeError, ConnectionResetError):
            self.stats["closed"] += 1
            self.conn.close()
            self.conn = None
        except TimeoutError:
            self.findings.append(f"no answer within {ANSWER_TIMEOUT_S}s to {self.recent[-1]}")
            self.conn.close()
            self.conn = None

    def _note_accepted(self, data: bytes, answer: bytes) -> None:
        """Follow what the broker accepted: an InitProducerId (or a transaction version 2 EndTxn) that gave an id a new
        producer id or epoch updates the scene, so the next frames reach the states past it; a WriteTxnMarkers or
        transactional Produce accepted is remembered: when an id wedges, the report names the ones about its
        producer id, the likely cause."""
        try:
            api_key, version = struct.unpack_from(">hh", data, 4)
            api = NAMES.get(api_key)
            if api not in ("WriteTxnMarkers", "Produce", "InitProducerId", "EndTxn", "AddPartitionsToTxn"):
                return
            codec = message(api + "Request")
            head = headers.decode_request_header(data[4:], codec.is_flexible(version))
            request = codec.decode(memoryview(data[4:]), version, head.size)[0]
            response = decode_response(api, version, answer)[1]
        except Exception:  # noqa: BLE001 - whatever cannot be read back is not an accepted write
            return
        if api in ("InitProducerId", "EndTxn"):
            tid = request.transactional_id
            if response.error_code == 0 and tid in self.scene.producers and response.producer_id >= 0 \
                    and (api == "InitProducerId" or version >= 5):
                self.scene.producers[tid] = (response.producer_id, response.producer_epoch)
            self.stats[f"{api} ok" if response.error_code == 0 else f"{api} error"] += 1
            return
        if api == "AddPartitionsToTxn":
            codes = [p.partition_error_code for t in response.results_by_topic_v3_and_below
                     for p in t.results_by_partition] if version <= 3 else []
            self.stats["AddPartitionsToTxn ok" if codes and not any(codes) else "AddPartitionsToTxn other"] += 1
            return
        if api == "WriteTxnMarkers":
            for m, r in zip(request.markers, response.markers):
                if any(p.error_code == 0 for t in r.topics for p in t.partitions):
                    self.stats["WriteTxnMarkers accepted"] += 1
                    self.accepted.append((m.producer_id, f"{self.recent[-1]}\n    accepted: {m}"))
        elif any(p.error_code == 0 for t in response.responses for p in t.partition_responses):
            for t in request.topic_data:
                for part in t.partition_data:
                    header = records.parse_batch_header(bytes(part.records or b""))
                    self.stats["Produce accepted"] += 1
                    self.accepted.append((header.producer_id, f"{self.recent[-1]}\n    accepted produce of producer "
                                                              f"{header.producer_id} epoch {header.producer_epoch}"))

    def _one_shot(self, data: bytes) -> None:
        with RawConn(self.bootstrap, timeout=ANSWER_TIMEOUT_S) as c:
            try:
                c.send(data)
                c.sock.shutdown(socket.SHUT_WR)
                while True:
                    c.read_frame(timeout=ANSWER_TIMEOUT_S)
            except (Closed, BrokenPipeError, ConnectionResetError):
                self.stats["closed"] += 1
            except TimeoutError:
                self.findings.append(f"neither answered nor closed within {ANSWER_TIMEOUT_S}s: {self.recent[-1]}")

    def check_log(self) -> None:
        """A new traceback in the broker's log: note it with the frames sent just before."""
        text = self.log.text()
        if len(text) == self._log_size:
            return
        new, self._log_size = text[self._log_size:], len(text)
        for marker in ("Traceback", "internal error"):
            if marker in new:
                at = new.index(marker)
                self.findings.append(f"{marker} after frames\n  " + "\n  ".join(self.recent)
                                     + "\n" + new[max(0, at - 300):at + 3000])
                return

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


def test_transactional_fuzz(server):
    bootstrap = server.bootstrap
    rnd = random.Random(SEED)
    log = LogWatch(server)
    committed, fuzz_topic = unique("fz-committed"), unique("fz-txn")
    create_topics(bootstrap, [committed, fuzz_topic], 2)

    # Data written before the fuzz: two committed transactions around an aborted one.
    base_id = unique("fz-base")
    transact(bootstrap, base_id, committed, [b"c1-%d" % i for i in range(6)])
    transact(bootstrap, base_id, committed, [b"aborted-%d" % i for i in range(4)], commit=False)
    transact(bootstrap, base_id, committed, [b"c2-%d" % i for i in range(4)])
    ends = high_watermarks(bootstrap, committed, 2)
    before = read_committed(bootstrap, committed, ends)
    assert sum(len(v) for v in before.values()) == 10

    producers = {}
    with RawConn(bootstrap) as c:
        for i in range(FUZZ_IDS):
            tid = unique(f"fz-{i}")
            err, pid, epoch = init(c, tid)
            assert err == 0
            producers[tid] = (pid, epoch)
        desc = c.request("DescribeTransactions", 0, message("DescribeTransactionsRequest").cls(
            transactional_ids=[base_id])).transaction_states[0]
        producers[base_id] = (desc.producer_id, desc.producer_epoch)
    scene = Scene(producers, topics=[fuzz_topic], other_topics=[committed], group=unique("fz-group"))

    fuzzer = Fuzzer(bootstrap, scene, rnd, log)
    started = time.monotonic()
    try:
        for i in range(FRAMES):
            if i % 40 == 0:
                fuzzer.refresh(i)
            fuzzer.send(i)
            if i % 20 == 0:
                fuzzer.check_log()
            assert server.proc.poll() is None, f"broker died (seed {SEED}, frame {i})\n{server.stderr_tail()}"
    finally:
        fuzzer.close()
    fuzzer.check_log()
    elapsed = time.monotonic() - started
    print(f"transactional fuzz: seed {SEED}, {FRAMES} frames in {elapsed:.1f}s: {dict(fuzzer.stats)}; seconds per "
          f"API: { {api: round(t, 1) for api, t in fuzzer.seconds.most_common()} }")

    # No wedged id: each can initialise and commit again, and so can a fresh one.  (An id reported wedged during
    # the run is tried once more with InitProducerId, and with a client only if that works now.)
    wedged = []
    used = [*scene.producers, unique("fz-fresh")]
    for tid in fuzzer.retired:
        with RawConn(bootstrap, timeout=ANSWER_TIMEOUT_S) as c:
            err = init(c, tid)[0]
        if err == 0:
            used.append(tid)
        else:
            wedged.append(f"{tid} (still): InitProducerId answers {err}")
    for tid in used:
        try:
            transact(bootstrap, tid, fuzz_topic, [b"after-" + tid.encode()])
        except Exception as e:  # noqa: BLE001 - collected and reported together
            wedged.append(f"{tid}: {e!r}")
    after_ends = high_watermarks(bootstrap, fuzz_topic, 2)
    seen = {v for vs in read_committed(bootstrap, fuzz_topic, after_ends).values() for _, v in vs}
    missing = [tid for tid in used if b"after-" + tid.encode() not in seen and not any(
        w.startswith(tid + ":") for w in wedged)]
    assert read_committed(bootstrap, committed, ends) == before, "read_committed data from before the fuzz changed"
    fuzzer.check_log()
    problems = (fuzzer.findings + [f"wedged {w}" for w in wedged]
                + [f"committed but not visible to read_committed: {m}" for m in missing])
    assert not problems, f"seed {SEED}: {len(problems)} problem(s):\n\n" + "\n\n".join(problems)[:20000]
