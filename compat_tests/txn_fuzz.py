"""Valid transactional request frames and their mutations, for the transactional fuzzers (no sockets here).

A :class:`Scene` names the transactional ids (with the producer id and epoch each last got), topics and
group the frames talk about; :func:`templates` builds a valid request of each transactional API at several
versions (InitProducerId, AddPartitionsToTxn v1-v5, AddOffsetsToTxn, TxnOffsetCommit, EndTxn,
WriteTxnMarkers, DescribeTransactions, ListTransactions, and a transactional Produce, whose data the
markers act on); :func:`mutate` turns one into what a hostile client could send: fields set to boundary
values or to another id, topic or producer (still decodable), byte flips, truncations, splices and wrong
size prefixes.  Every choice comes from one ``random.Random``, so a seed replays a run.
"""
from __future__ import annotations

import dataclasses
import random
import struct
from typing import Any

from trireme.wire import headers, records
from trireme.wire.codec import message
from trireme.wire.schema import api_names

API_KEYS = {name: key for key, name in api_names().items()}
INTERNAL_TOPICS = ("__consumer_offsets", "__transaction_state")

# Integers a hostile client tries: the edges of int16/int32/int64, the "none" values, small ones.
BOUNDARY_INTS = (0, 1, 2, -1, -2, -3, 5, 100, 32766, 32767, -32768, 65535, 2**31 - 1, -2**31, 2**31,
                 2**63 - 1, -2**63)


@dataclasses.dataclass
class Scene:
    """What the frames are about: transactional ids → (producer id, epoch), the topics, the group."""

    producers: dict[str, tuple[int, int]]
    topics: list[str]                       # the fuzz's own topics (two partitions each)
    other_topics: list[str]                 # topics it may wander into (the data written before the fuzz)
    group: str
    coordinator_epoch: int = 0

    def strings(self) -> list[str]:
        return [*self.producers, *self.topics, *self.other_topics, *INTERNAL_TOPICS, self.group, "", "unknown-topic",
                "x" * 300, "\u00e9\u2713"]


def frame(api: str, version: int, obj: Any, correlation_id: int) -> bytes:
    """A whole request frame (size, header, body)."""
    codec = message(api + "Request")
    head = headers.encode_request_header(API_KEYS[api], version, correlation_id, "txn-fuzz", codec.is_flexible(version))
    body = head + codec.encode_bytes(obj, version)
    return struct.pack(">i", len(body)) + body


def txn_batch(pid: int, epoch: int, seq: int = 0, n: int = 2, transactional: bool = True) -> bytes:
    return records.build_batch([(None, b"fuzz-%d" % i) for i in range(n)], producer_id=pid, producer_epoch=epoch,
                               base_sequence=seq, transactional=transactional)


def templates(scene: Scene, rnd: random.Random) -> list[tuple[str, int, Any]]:
    """(api, version, request object) for valid requests of every transactional API about one of the scene's ids."""
    tid = rnd.choice(list(scene.producers))
    pid, epoch = scene.producers[tid]
    topic = rnd.choice(scene.topics)
    parts = [0, 1]
    R = {n: message(n + "Request").cls for n in ("InitProducerId", "AddPartitionsToTxn", "AddOffsetsToTxn",
                                                   "TxnOffsetCommit", "EndTxn", "WriteTxnMarkers",
                                                   "DescribeTransactions", "ListTransactions", "Produce")}
    apt = R["AddPartitionsToTxn"]
    toc = R["TxnOffsetCommit"]
    wtm = R["WriteTxnMarkers"].WritableTxnMarker
    prod = R["Produce"].TopicProduceData
    commit = rnd.random() < 0.5
    out: list[tuple[str, int, Any]] = []
    for v in (1, 3, 4, 5):
        out.append(("InitProducerId", v, R["InitProducerId"](
            transactional_id=tid, transaction_timeout_ms=rnd.choice((60000, 10000, 1)),
            producer_id=pid if v >= 3 else -1, producer_epoch=epoch if v >= 3 else -1)))
    for v in (1, 3):
        out.append(("AddPartitionsToTxn", v, apt(
            v3_and_below_transactional_id=tid, v3_and_below_producer_id=pid, v3_and_below_producer_epoch=epoch,
            v3_and_below_topics=[apt.AddPartitionsToTxnTopic(name=topic, partitions=parts)])))
    for v in (4, 5):
        out.append(("AddPartitionsToTxn", v, apt(transactions=[apt.AddPartitionsToTxnTransaction(
            transactional_id=tid, producer_id=pid, producer_epoch=epoch, verify_only=rnd.random() < 0.5,
            topics=[apt.AddPartitionsToTxnTopic(name=topic, partitions=parts)])])))
    for v in (1, 3, 4):
        out.append(("AddOffsetsToTxn", v, R["AddOffsetsToTxn"](transactional_id=tid, producer_id=pid,
                                                               producer_epoch=epoch, group_id=scene.group)))
    for v in (2, 3, 5):
        out.append(("TxnOffsetCommit", v, toc(
            transactional_id=tid, group_id=scene.group, producer_id=pid, producer_epoch=epoch,
            generation_id=-1, member_id="", group_instance_id=None,
            topics=[toc.TxnOffsetCommitRequestTopic(name=topic, partitions=[
                toc.TxnOffsetCommitRequestTopic.TxnOffsetCommitRequestPartition(
                    partition_index=p, committed_offset=rnd.randrange(0, 5), committed_leader_epoch=-1,
                    committed_metadata="fz") for p in parts])])))
    for v in (1, 3, 5):
        out.append(("EndTxn", v, R["EndTxn"](transactional_id=tid, producer_id=pid, producer_epoch=epoch,
                                             committed=commit)))
    for v in (1, 2):
        out.append(("WriteTxnMarkers", v, R["WriteTxnMarkers"](markers=[wtm(
            producer_id=pid, producer_epoch=epoch, transaction_result=commit, coordinator_epoch=scene.coordinator_epoch,
            transaction_version=2 if v >= 2 and rnd.random() < 0.5 else 0,
            topics=[wtm.WritableTxnMarkerTopic(name=topic, partition_indexes=[rnd.choice(parts)])])])))
    out.append(("DescribeTransactions", 0, R["DescribeTransactions"](transactional_ids=list(scene.producers))))
    for v in (0, 1, 2):
        out.append(("ListTransactions", v, R["ListTransactions"](
            state_filters=rnd.choice(([], ["Ongoing"], ["PrepareCommit", "Nope"])), producer_id_filters=[],
            duration_filter=-1, transactional_id_pattern=rnd.choice((None, "fz.*", "(f+)+x")) if v >= 2 else None)))
    out.append(("Produce", 9, R["Produce"](transactional_id=tid, acks=-1, timeout_ms=10000, topic_data=[
        prod(name=topic, partition_data=[prod.PartitionProduceData(index=rnd.choice(parts),
                                                                    records=txn_batch(pid, epoch))])])))
    return out


# --------------------------------------------------------------------------- mutations

def _leaves(obj: Any, out: list) -> list:
    """(owner, field name or list index, value) for every field of a request object, nested ones included."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        out.append((obj, f.name, value))
        if isinstance(value, list):
            for item in value:
                if dataclasses.is_dataclass(item):
                    _leaves(item, out)
    return out


def _new_value(value: Any, scene: Scene, rnd: random.Random) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        pids = [p for p, _ in scene.producers.values()]
        epochs = [e for _, e in scene.producers.values()]
        return rnd.choice((rnd.choice(BOUNDARY_INTS), value + rnd.choice((-1, 1)), rnd.choice(pids),
                           rnd.choice(epochs) + rnd.choice((-1, 0, 1)), rnd.randrange(-3, 8)))
    if isinstance(value, str) or value is None:
        return rnd.choice(scene.strings() + [None])
    if isinstance(value, (bytes, memoryview)):
        pid, epoch = rnd.choice(list(scene.producers.values()))
        return rnd.choice((
            txn_batch(pid, epoch + rnd.choice((-1, 0, 1)), seq=rnd.choice((0, 1, 5, 2**31 - 1))),
            txn_batch(pid, epoch, transactional=False),
            records.build_control_batch(rnd.random() < 0.5, producer_id=pid, producer_epoch=epoch,
                                        coordinator_epoch=rnd.choice((0, -1, 7)), timestamp=0),
            bytes(rnd.randrange(256) for _ in range(rnd.randrange(0, 80))),
            b"",
        ))
    if isinstance(value, list):
        if not value:
            return [rnd.choice(BOUNDARY_INTS)] if rnd.random() < 0.3 else value
        kind = rnd.randrange(4)
        if kind == 0:
            return []
        if kind == 1:
            return value + [rnd.choice(value)]              # a duplicate (the same partition twice, ...)
        if kind == 2:
            return value[1:]
        if isinstance(value[0], int):
            return value + [rnd.choice(BOUNDARY_INTS)]
        return value * rnd.choice((2, 3))
    return value


def mutate_fields(api: str, version: int, obj: Any, scene: Scene, rnd: random.Random, correlation_id: int) -> bytes:
    """The request with one to three fields changed, encoded (still a decodable request); the valid one when no
    change could be encoded (a value out of its field's range)."""
    for _ in range(8):
        copy = message(api + "Request").decode(message(api + "Request").encode_bytes(obj, version), version)[0]
        for _ in range(rnd.randint(1, 3)):
            owner, name, value = rnd.choice(_leaves(copy, []))
            setattr(owner, name, _new_value(value, scene, rnd))
        try:
            return frame(api, version, copy, correlation_id)
        except Exception:  # noqa: BLE001 - a value its field cannot hold: draw again
            continue
    return frame(api, version, obj, correlation_id)


def mutate(api: str, version: int, obj: Any, scene: Scene, rnd: random.Random,
           correlation_id: int) -> tuple[str, bytes]:
    """(kind, frame): the valid frame, a field mutation, or a byte-level one."""
    kind = rnd.choices(("valid", "fields", "flip", "truncate", "splice", "resize"), (3, 8, 3, 1, 1, 1))[0]
    if kind == "fields":
        return kind, mutate_fields(api, version, obj, scene, rnd, correlation_id)
    base = bytearray(frame(api, version, obj, correlation_id))
    if kind == "valid":
        return kind, bytes(base)
    if kind == "flip":
        for _ in range(rnd.randint(1, 4)):
            i = rnd.randrange(4, len(base))
            base[i] = rnd.randrange(256) if rnd.random() < 0.5 else base[i] ^ (1 << rnd.randrange(8))
        return kind, bytes(base)
    body = base[4:]
    if kind == "truncate":
        body = body[:rnd.randrange(1, len(body))]
    elif kind == "splice":
        i = rnd.randrange(0, len(body) + 1)
        body = body[:i] + bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 12))) + body[i:]
    else:
        return kind, struct.pack(">i", len(body) + rnd.choice((-7, -1, 1, 9))) + bytes(body)
    return kind, struct.pack(">i", len(body)) + bytes(body)
