"""Produce: validate each partition's record batch by its header and CRC, append the bytes as they came, answer once durable.

Behaviour / version notes:
- Served v3-13; advertised 0-13 like Kafka 4 (KAFKA-18659: librdkafka < 2.12, e.g. Debian's kcat,
  enables features only if the advertised range contains Produce 0/2/3/7).  v0-2 are read with
  wire/definitions/LegacyProduce*.json and every partition is answered UNSUPPORTED_VERSION;
  nothing is stored.
- v13 names topics by id (UNKNOWN_TOPIC_ID when unknown); v8+ responses carry RecordErrors
  and ErrorMessage.
- Authorization (Kafka's KafkaApis.handleProduceRequest), before anything else is looked at:
  * a request whose first batch in any partition has the transactional bit (a control batch too)
    needs a transactional id and Write on that TransactionalId; without either it is refused as a
    whole: every partition → TRANSACTIONAL_ID_AUTHORIZATION_FAILED (acks=0: the connection is
    closed, as Kafka answers an error it cannot send).  A transactional id with no transactional
    batch is not checked (as Kafka);
  * Write on each topic (asked once per topic and request): every partition of a topic without it
    → TOPIC_AUTHORIZATION_FAILED, before the topic's existence, acks or an internal topic are
    checked (v13: an unknown topic id is UNKNOWN_TOPIC_ID first, it has no name to check);
  * idempotent batches need nothing more: Kafka 3+ dropped Produce's IdempotentWrite check
    (KIP-679; InitProducerId makes it).
  A refused partition appends nothing, changes no producer state and (transactions V2) adds nothing
  to the producer's transaction.
- Per partition, as Kafka: exactly one v2 batch (INVALID_RECORD otherwise, also for an old message
  set of magic 0/1); bad CRC or a malformed batch → CORRUPT_MESSAGE; a control batch written by a
  client → INVALID_RECORD;
  a batch over the
  topic's max.message.bytes → MESSAGE_TOO_LARGE; unknown partition → UNKNOWN_TOPIC_OR_PARTITION;
  a partition this broker does not lead (another broker does, none does at the moment, or it is
  not open here: server/routing.py over ``broker.cluster``) → NOT_LEADER_OR_FOLLOWER, as Kafka's
  ReplicaManager (never LEADER_NOT_AVAILABLE), with no message; from v10 (KIP-951) its
  CurrentLeader is the leader's id and epoch (-1, -1 while none) and NodeEndpoints lists each
  such leader that is live, at its address on the request's listener, once, by node id (the fast
  path leaves such a partition to :func:`produce`).  With the local engine every partition is
  led here;
  a record without a key on a compacted topic → INVALID_RECORD (the only check that decodes
  records, and only on such topics).  An internal topic (`__consumer_offsets`,
  `__transaction_state`) → INVALID_TOPIC_EXCEPTION, as Kafka answers clients (Kafka lets a client
  with client id `__admin_client` write there; we don't: only the coordinators write them).
  Nothing is stored for a refused partition.
- Transactions (KIP-890 part 1): the first transactional batch of a producer's transaction in a
  partition is checked with the transaction coordinator (AddPartitionsToTxn VerifyOnly, encoded:
  at once through server/local_peer.py when the coordinator is here, else over the wire to its
  broker, the answer waiting for it): a partition not in its ongoing transaction → INVALID_TXN_STATE;
  an old epoch → INVALID_PRODUCER_EPOCH; the coordinator still completing the previous
  transaction, moving or without a leader → NOT_ENOUGH_REPLICAS (retriable); its broker not
  answering → NETWORK_EXCEPTION (retriable).  So a late batch of a fenced or finished
  transaction never opens a transaction that would pin the last stable offset.
- Transactions V2 (KIP-890 part 2): from v12 such a partition is *added* instead (AddPartitionsToTxn
  v5 without VerifyOnly, through the same path), and the batch is appended once the coordinator made
  that durable.  The request then waits, and so do the produce requests pipelined after it on the
  same connection (:func:`_in_connection_order`), so that a producer's batches are appended in the
  order it sent them.
- Idempotence: check-then-commit against the partition's producer state; an exact duplicate
  of one of the producer's last 5 batches answers NONE with the original base offset and is
  not appended again.
- Records are otherwise never decoded: the base offset (and, for LogAppendTime topics, the timestamp and
  CRC) are rewritten in the request frame and those bytes are what the log writes.
- Fast path (:func:`produce_small`): a request of one partition of one existing topic, with no
  transactional id and acks 1 or -1, is read and (once accepted) answered by wire/small_produce.py
  without message objects; its batch takes the same checks and append as any other.  It asks for
  Write on its topic once (not at all without an authorizer: half a microsecond per request); a
  denial is left to :func:`produce`, which answers it.
- acks=0: no response.  acks=1 and acks=-1 (a single node is the whole ISR) are answered only
  after the fsync covering the batch (group commit across requests).  Other acks values →
  INVALID_REQUIRED_ACKS.  If the fsync fails the partition goes offline and the produce is
  answered KAFKA_STORAGE_ERROR (as Kafka does for a failed log directory).
"""
from __future__ import annotations

import weakref

import trio

from trireme.server.clock import now_ms
from trireme.server.deferred import Deferred
from trireme.server.dispatch import NOT_HANDLED, CloseConnection, Encoded, fast_path, handles, handles_legacy
from trireme.server.handlers import unauthorized
from trireme.server.routing import LeaderEndpoints, NotLeader, led_partition
from trireme.server.transactions import ask_coordinator, coordinator_here, verify_in_transaction
from trireme.state.acls import Operation, ResourceType
from trireme.wire import error_codes as E
from trireme.wire import records
from trireme.wire.codec import message as codec_message
from trireme.wire.primitives import ZERO_UUID, CodecError
from trireme.wire.small_produce import encode_small_produce_response, read_small_produce


IMPLICIT_ADD_SINCE = 12


@handles("Produce", 3, 13, advertised_min=0)
def produce(ctx, request):
    tid = request.transactional_id
    if any(records.first_batch_is_transactional(data.records or b"")
           for topic_data in request.topic_data for data in topic_data.partition_data):
        refusal = None
        if tid is None:
            refusal = "transactional records in a produce request without a transactional id"
        elif not ctx.authorize(Operation.WRITE, ResourceType.TRANSACTIONAL_ID, tid):
            refusal = "Transactional Id authorization failed."
        if refusal is not None:
            if request.acks == 0:       # as Kafka: an error answer to acks=0 is a closed connection
                raise CloseConnection(f"acks=0 produce refused: {refusal}")
            return _refuse_every_partition(ctx.response(), request, E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED.code,
                                           refusal)
    denied = _denied_topics(ctx, request)
    # What the transaction coordinator is asked before the append: the partitions to add (v12+), or, when it is
    # on another broker, those to verify (over the wire: the answer waits for it).
    adds = _implicit_adds(ctx, request, denied) if ctx.api_version >= IMPLICIT_ADD_SINCE or (
        tid is not None and not coordinator_here(ctx.broker)) else {}
    previous = _ORDER.get(ctx.connection) if ctx.connection is not None else None
    if not adds and (previous is None or previous.is_set()):
        return _produce_now(ctx, request, {}, denied)
    return _in_connection_order(ctx, request, adds, previous, denied)


def _topic_key(version: int, topic_data):
    """How a request's topic is told apart: its id from v13, else its name."""
    return topic_data.topic_id if version >= 13 else topic_data.name


def _denied_topics(ctx, request) -> set:
    """The keys (:func:`_topic_key`) of the request's topics the principal may not Write, each topic asked once.  A
    v13 topic id naming no topic is not among them: it is answered UNKNOWN_TOPIC_ID."""
    version = ctx.api_version
    if version < 13:
        return unauthorized(ctx, Operation.WRITE, ResourceType.TOPIC, (t.name for t in request.topic_data))
    names = {}
    for topic_data in request.topic_data:
        topic = ctx.broker.described_topic(None, topic_data.topic_id)
        if topic is not None:
            names[topic_data.topic_id] = topic.name
    refused = unauthorized(ctx, Operation.WRITE, ResourceType.TOPIC, names.values())
    return {topic_id for topic_id, name in names.items() if name in refused}


# connection → set once its last produce that had to wait (for an implicit add) has appended
_ORDER: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _in_connection_order(ctx, request, adds, previous, denied):
    """Transactions V2: after the produce requests before this one on the connection appended (and before those
    after it), add the partitions whose transaction is not open here yet to the producer's transaction, then
    append.  ``adds``: those found when it was read; asked again if requests before it were still to append: those
    that follow the transaction's first batch on a partition then find it open and ask nothing (a pipelining
    client's next 4 would otherwise each wait for the first's add to be durable, the coordinator's answer to a
    second add while the first is in flight).  Started at once (Connection.start_soon), not when the writer
    reaches this answer: run as a Deferred's wait, each append would wait for the answers before it, so a
    pipelining client (the Java producer's 5 in flight) would get one request per fsync."""
    appended = trio.Event()
    _ORDER[ctx.connection] = appended
    tid = request.transactional_id
    outcome: list = []                      # the append's result, or the exception that ended it

    async def add_then_append():
        try:
            pending = adds
            if previous is not None and not previous.is_set():
                await previous.wait()
                pending = _implicit_adds(ctx, request, denied)
            added = {}
            for (producer_id, producer_epoch), partitions in pending.items():
                errors = await ask_coordinator(ctx.broker, tid, producer_id, producer_epoch, partitions,
                                               verify_only=ctx.api_version < IMPLICIT_ADD_SINCE)
                added.update({(tp, producer_id, producer_epoch): error for tp, error in errors.items()})
            outcome.append(_produce_now(ctx, request, added, denied, close_on_acks0_error=False))
        except Exception as e:              # raised in the answer's wait: the connection logs it and closes
            outcome.append(e)
        finally:
            appended.set()

    async def answer():
        await appended.wait()
        if not outcome:
            raise RuntimeError("the add and append were cancelled")
        result = outcome[0]
        if isinstance(result, Exception):
            raise result
        return await result.wait() if isinstance(result, Deferred) else result
    ctx.connection.start_soon(add_then_append)
    return Deferred(answer)


def _implicit_adds(ctx, request, denied) -> dict[tuple[int, int], list[tuple[str, int]]]:
    """(producer id, epoch) → the partitions whose transactional batch would open a transaction here (none of the
    topics the principal may not write, ``denied``)."""
    if request.transactional_id is None:
        return {}
    broker = ctx.broker
    adds: dict[tuple[int, int], list[tuple[str, int]]] = {}
    for topic_data in request.topic_data:
        if _topic_key(ctx.api_version, topic_data) in denied:
            continue
        topic = broker.topics.by_id(topic_data.topic_id) if ctx.api_version >= 13 else broker.topics.get(topic_data.name)
        for data in topic_data.partition_data:
            partition = led_partition(broker, topic, data.index)
            if partition is None or type(partition) is NotLeader or not data.records:
                continue
            try:
                header = records.parse_batch_header(data.records)     # the first header only: _append validates
            except CodecError:
                continue                    # refused when it is appended
            if header.is_transactional and not header.is_control and not _open_here(partition, header):
                adds.setdefault((header.producer_id, header.producer_epoch), []).append(
                    (partition.topic.name, partition.index))
    return adds


def _open_here(partition, header) -> bool:
    entry = partition.producers.entry(header.producer_id)
    return entry is not None and entry.current_txn_first_offset is not None \
        and entry.producer_epoch == header.producer_epoch


def _produce_now(ctx, request, added, denied, *, close_on_acks0_error: bool = True):
    """Validate and append every partition's batch → the response (None for acks=0), or a Deferred waiting for
    durability.  ``added``: the coordinator's answers to implicit adds, by ((topic, partition), id, epoch);
    ``denied``: the topics the principal may not write (:func:`_denied_topics`)."""
    broker = ctx.broker
    version = ctx.api_version
    response = ctx.response()
    topic_cls = type(response).TopicProduceResponse
    partition_cls = topic_cls.PartitionProduceResponse
    acks = request.acks
    waits = []                              # (partition, last offset) to be durable before answering
    leaders = LeaderEndpoints(ctx)          # the current leaders of partitions led elsewhere (v10+)
    now = now_ms()
    for topic_data in request.topic_data:
        if version >= 13:
            topic = broker.topics.by_id(topic_data.topic_id)
            missing = E.UNKNOWN_TOPIC_ID.code
        else:
            topic = broker.topics.get(topic_data.name)
            missing = E.UNKNOWN_TOPIC_OR_PARTITION.code
        # The coordinators' internal topics are described to clients but written only by the coordinators.
        internal = None if topic is not None else broker.described_topic(
            topic_data.name if version < 13 else None, topic_data.topic_id)
        out = topic_cls(name=topic_data.name, topic_id=topic_data.topic_id)
        response.responses.append(out)
        refused = _topic_key(version, topic_data) in denied
        for data in topic_data.partition_data:
            result = partition_cls(index=data.index, base_offset=-1)
            out.partition_responses.append(result)
            if refused:
                result.error_code = E.TOPIC_AUTHORIZATION_FAILED.code
                continue
            if acks not in (0, 1, -1):
                result.error_code = E.INVALID_REQUIRED_ACKS.code
                continue
            if internal is not None:
                result.error_code = E.INVALID_TOPIC_EXCEPTION.code
                result.error_message = f"Cannot append to internal topic {internal.name}"
                continue
            partition = led_partition(broker, topic, data.index)
            if partition is None:
                result.error_code = missing if topic is None else E.UNKNOWN_TOPIC_OR_PARTITION.code
                continue
            if type(partition) is NotLeader:
                result.error_code = partition.error_code
                if version >= 10:           # KIP-951: where to send it instead
                    result.current_leader = leaders.current_leader(
                        partition_cls.LeaderIdAndEpoch, partition.leader_id, partition.leader_epoch)
                continue
            error, message = _append(broker, partition, data.records, request.transactional_id, now, result,
                                     waits, added)
            if error:
                _refuse(result, error, message, version)
            result.log_start_offset = partition.log.log_start_offset
    if leaders.nodes:
        response.node_endpoints = leaders.node_endpoints(type(response).NodeEndpoint)
    if acks == 0:
        failed = [(t.name, p.index, p.error_code) for t in response.responses for p in t.partition_responses
                  if p.error_code]
        if failed and close_on_acks0_error:
            # As Kafka: the only way to tell an acks=0 producer is to close, so it refreshes metadata.
            raise CloseConnection(f"acks=0 produce failed for {failed}")
        return None
    if not waits:
        return response

    async def wait_durable():
        for partition, offset, result in waits:
            if not await broker.wait_durable(partition, offset):
                _lost(result, partition)
        return response

    def durable() -> bool:
        return all(broker.durable_or_lost(partition, offset) for partition, offset, _ in waits)
    return Deferred(wait_durable, ready=durable)


def _refuse(result, error: int, message: str | None, version: int) -> None:
    """A partition's answer refusing its batch: the error, its message and (v8+) the batch's record error."""
    result.error_code = error
    result.error_message = message
    if version >= 8:
        result.record_errors = [type(result).BatchIndexAndErrorMessage(batch_index=0,
                                                                        batch_index_error_message=message)]


def _lost(result, partition) -> None:
    """A partition's answer for a batch that was appended but never became durable."""
    result.error_code = E.KAFKA_STORAGE_ERROR.code
    result.error_message = partition.storage_error or "the partition was deleted"
    result.base_offset = -1


@fast_path("Produce")
def produce_small(ctx, frame, body_start: int):
    """The fast path of the common small Produce: one partition of one topic that exists (not an internal one), no
    transactional id, acks 1 or -1, and no produce of this connection still waiting for an implicit add.  Its
    batch goes through :func:`_append` as any other; only reading the request and answering an accepted batch
    skip the message objects (wire/small_produce.py).  Anything else is NOT_HANDLED: decoded and handled by
    :func:`produce`."""
    small = read_small_produce(frame, body_start, ctx.api_version)
    if small is None or (small.acks != -1 and small.acks != 1):
        return NOT_HANDLED
    broker = ctx.broker
    topic = broker.topics.get(small.topic) if small.topic_id is None else broker.topics.by_id(small.topic_id)
    partition = led_partition(broker, topic, small.partition)
    if partition is None or type(partition) is NotLeader or records.first_batch_is_transactional(small.records):
        return NOT_HANDLED
    previous = _ORDER.get(ctx.connection) if ctx.connection is not None else None
    if previous is not None and not previous.is_set():
        return NOT_HANDLED
    if broker.security.authorizer_enabled and not ctx.authorize(Operation.WRITE, ResourceType.TOPIC, topic.name,
                                                                log_if_denied=False):
        return NOT_HANDLED                  # produce() asks again, counts the denial and answers it
    result = _SmallResult()
    waits: list = []
    version = ctx.api_version
    where = (small.topic, small.topic_id, small.partition)
    error, message = _append(broker, partition, small.records, None, now_ms(), result, waits, {})
    if error:
        return _small_answer(where, partition, result, lambda r: _refuse(r, error, message, version))
    [(_, offset, _)] = waits
    body = encode_small_produce_response(version, *where, result.base_offset, result.log_append_time_ms,
                                         partition.log.log_start_offset)
    if partition.log.high_watermark > offset:
        return Encoded(body)                # durable already: fsync off, Kafka's flush policy, a duplicate

    # Holds neither the request nor its context: the frame is freed now, as the general path's is.
    async def wait_durable():
        if partition.log.high_watermark > offset or await broker.wait_durable(partition, offset):
            return Encoded(body)            # durable already when the flush runs it: no wait to set up
        return _small_answer(where, partition, result, lambda r: _lost(r, partition))
    return Deferred(wait_durable, ready=lambda: broker.durable_or_lost(partition, offset))


class _SmallResult:
    """What :func:`_append` fills in for the fast path, in place of a partition's answer object."""

    __slots__ = ("base_offset", "log_append_time_ms")

    def __init__(self):
        self.base_offset = -1
        self.log_append_time_ms = -1


_RESPONSE = codec_message("ProduceResponse").cls


def _small_answer(where, partition, appended: _SmallResult, set_error):
    """The fast path's answer when it is not a plain acceptance: the response object, as :func:`produce` builds it.
    ``where``: the topic's name (v3-12) or id (v13) and the partition's index."""
    topic, topic_id, index = where
    topic_cls = _RESPONSE.TopicProduceResponse
    result = topic_cls.PartitionProduceResponse(index=index, base_offset=appended.base_offset,
                                                log_append_time_ms=appended.log_append_time_ms)
    set_error(result)
    result.log_start_offset = partition.log.log_start_offset
    return _RESPONSE(responses=[topic_cls(name=topic or "", topic_id=topic_id or ZERO_UUID,
                                          partition_responses=[result])])


@handles_legacy("Produce", "LegacyProduce", 0, 2)
def produce_legacy(ctx, request):
    return _refuse_every_partition(ctx.legacy_response(), request, E.UNSUPPORTED_VERSION.code)


def _refuse_every_partition(response, request, error_code: int, message: str | None = None):
    """``response`` answering every partition of ``request`` with ``error_code``, nothing stored (None for acks=0)."""
    topic_cls = type(response).TopicProduceResponse
    for topic_data in request.topic_data:
        out = topic_cls(name=topic_data.name)
        if hasattr(topic_data, "topic_id"):
            out.topic_id = topic_data.topic_id
        for p in topic_data.partition_data:
            result = topic_cls.PartitionProduceResponse(index=p.index, error_code=error_code, base_offset=-1)
            if message is not None:
                result.error_message = message
            out.partition_responses.append(result)
        response.responses.append(out)
    return None if request.acks == 0 else response


# What a failed verification answers a producer: the fenced epoch as produce names it, and the retriable
# error Kafka gives while the coordinator is busy with the producer's previous transaction.
_VERIFY_ERRORS = {
    E.PRODUCER_FENCED.code: E.INVALID_PRODUCER_EPOCH.code,
    E.CONCURRENT_TRANSACTIONS.code: E.NOT_ENOUGH_REPLICAS.code,
    # the coordinator moving or unreachable: retriable for every client, as Kafka's ReplicaManager answers
    E.NOT_COORDINATOR.code: E.NOT_ENOUGH_REPLICAS.code,
    E.COORDINATOR_NOT_AVAILABLE.code: E.NOT_ENOUGH_REPLICAS.code,
    E.COORDINATOR_LOAD_IN_PROGRESS.code: E.NOT_ENOUGH_REPLICAS.code,
}


def _verify_transaction(broker, partition, header, transactional_id, added) -> tuple[int, str] | None:
    """A transactional batch opens (or continues) a transaction here only if the coordinator has this partition
    in the producer's ongoing transaction (KIP-890 part 1; or added it, part 2); asked once per transaction and
    partition."""
    if _open_here(partition, header):
        return None       # its transaction is open here: verified when it began
    tp = (partition.topic.name, partition.index)
    error = added.get((tp, header.producer_id, header.producer_epoch))
    if error is None:
        error = verify_in_transaction(broker.local_peer, transactional_id, header.producer_id,
                                      header.producer_epoch, [tp])[tp]
    if error:
        return _VERIFY_ERRORS.get(error, error), (f"partition is not in the ongoing transaction of producer "
                                                  f"{header.producer_id} epoch {header.producer_epoch}: "
                                                  f"{E.for_code(error).name}")
    return None


def _append(broker, partition, data, transactional_id, now, result, waits, added) -> tuple[int, str | None]:
    """Validate and append one partition's batch; fills ``result``; returns (error code, message)."""
    if data is None or len(data) == 0:
        return E.INVALID_RECORD.code, "produce requests must carry one record batch per partition"
    if records.first_batch_magic(data) in (0, 1):
        return E.INVALID_RECORD.code, "produce requests v3+ carry only record batches of magic 2"
    try:
        batches = records.validate_batches(data)
    except CodecError as e:
        return E.CORRUPT_MESSAGE.code, f"malformed record batch: {e}"
    if len(batches) != 1:
        return E.INVALID_RECORD.code, f"produce requests v3+ carry exactly one record batch, got {len(batches)}"
    pos, header = batches[0]
    if not records.crc_ok(data, pos, header):
        return E.CORRUPT_MESSAGE.code, "record batch CRC does not match its contents"
    if header.is_control:
        return E.INVALID_RECORD.code, "clients may not write control batches"
    if header.records_count <= 0:
        return E.INVALID_RECORD.code, "record batch with no records"
    if header.last_offset_delta != header.records_count - 1:
        return E.INVALID_RECORD.code, (f"inconsistent batch offset range: last offset delta {header.last_offset_delta} "
                                f"for {header.records_count} records")
    if partition.storage_error:
        return E.KAFKA_STORAGE_ERROR.code, f"partition is offline after a storage error: {partition.storage_error}"
    config = partition.config
    if header.size > config.max_message_bytes:
        return E.MESSAGE_TOO_LARGE.code, (f"batch of {header.size} bytes is over max.message.bytes="
                                   f"{config.max_message_bytes}")
    if config.compacted:
        # The one check that needs record contents: Kafka refuses keyless records on compacted topics.
        try:
            keyless = any(r.key is None for r in records.decode_records(
                data, pos, max_uncompressed=config.max_message_bytes * 16))
        except CodecError as e:
            return E.CORRUPT_MESSAGE.code, f"malformed records: {e}"
        if keyless:
            return E.INVALID_RECORD.code, "compacted topic cannot accept message without key"
    append = partition.producers.begin()
    check = append.check(header.producer_id, header.producer_epoch, header.base_sequence,
                         header.last_offset_delta, header.is_transactional)
    if check.is_duplicate:
        result.base_offset = check.duplicate.first_offset
        waits.append((partition, check.duplicate.last_offset, result))
        return 0, None
    if not check.accepted:
        return check.error_code, check.message or None
    if header.is_transactional:
        error = _verify_transaction(broker, partition, header, transactional_id, added)
        if error:
            return error
    log_append_time = config.log_append_time
    records.set_partition_leader_epoch(data, pos, partition.leader_epoch)
    try:
        base_offset, last_offset, append_time = partition.log.append(data, batches, now,
                                                                     log_append_time=log_append_time)
    except OSError as e:
        broker.storage_failed(partition, e)
        return E.KAFKA_STORAGE_ERROR.code, f"write failed: {e!r}"
    append.commit(header.producer_id, header.producer_epoch, header.base_sequence, header.last_offset_delta,
                  base_offset, append_time if log_append_time else header.max_timestamp,
                  header.is_transactional)
    append.apply()
    broker.metrics.count_bytes_in(partition.topic.name, len(data))
    broker.appended(partition)
    result.base_offset = base_offset
    result.log_append_time_ms = append_time if log_append_time else -1
    waits.append((partition, last_offset, result))
    return 0, None
