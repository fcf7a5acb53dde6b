"""Fetch: serve stored batch bytes straight from the log files, long-polling until min_bytes or max_wait.

Behaviour / version notes:
- v4-18 (v13+ name topics by id; unknown ids → UNKNOWN_TOPIC_ID).
- Fetch sessions are not offered: every response has SessionId 0, which tells the client no
  session was created, so it keeps sending full fetches.  A request that names a session
  (SessionId != 0) gets FETCH_SESSION_ID_NOT_FOUND.  Every requested partition is listed in
  the response (the Java client drops a full response that leaves one out).
- Reads stop at the high watermark (data covered by an fsync) for read_uncommitted, and at the
  last stable offset for read_committed; LastStableOffset and LogStartOffset are filled.
  Control batches are returned like any other, so consumers move past transaction markers.
- read_committed: AbortedTransactions lists (producer id, first offset) of every aborted
  transaction whose marker is at or after the fetch offset and whose first offset is below the
  LSO, from the partition's aborted-transaction index (records are not decoded); the client drops
  those transactions' batches.  An empty read has an empty list; read_uncommitted has none (null).
- max_bytes bounds the response and partition_max_bytes each partition, except that the first
  batch of the first non-empty partition is returned whole even when larger (KIP-74).
- The broker-wide response budget (trireme.queued.max.response.bytes, ``Limits.responses``) is a
  hard cap on the record bytes of all answers not yet written, and a connection's records stop at
  its share (trireme.queued.max.response.bytes.per.connection), so one slow reader holds at most
  that: a response is cut to the room left, never below one batch.  When even its first batch
  does not fit, the fetch waits (a long poll woken as answers are written) until it does or
  max_wait passes, and then answers with what fits (often nothing, as for a partition with no new
  data).  The first batch may pass the share when the connection holds no other answer, and the
  whole budget when no answer holds any of it.  Records leave an eighth of the budget to other
  answers (``Limits.response_headroom``).  An answer whose listing alone (every partition named,
  estimated from the request) does not fit waits for room, past max_wait if need be.  Reads are
  synchronous (pread), so the room is read and taken in one step of the event loop.
- CurrentLeaderEpoch (v9+) newer than ours → UNKNOWN_LEADER_EPOCH, older → FENCED_LEADER_EPOCH, answered
  at once (a long poll does not wait), as Kafka answers a read error.
- LastFetchedEpoch (v12+; Kafka's Partition.readRecords checks it on every fetch that sends it, a follower's
  or not, though the Java client and librdkafka consumers send -1): its end offset from the leader-epoch cache
  (as OffsetsForLeaderEpoch) unknown, or a fetch offset below the log start → OFFSET_OUT_OF_RANGE; an epoch
  that ended before the fetch offset, or a smaller epoch found → DivergingEpoch (that epoch and its end
  offset) and no records.  Either is answered at once.
- A partition this broker does not lead (another broker does, none does at the moment, or it is
  not open here: server/routing.py over ``broker.cluster``) → NOT_LEADER_OR_FOLLOWER (offsets -1),
  as Kafka's ReplicaManager, and the fetch is answered at once (Kafka's errorReadingData).  From
  v16 (KIP-951), for NOT_LEADER_OR_FOLLOWER and FENCED_LEADER_EPOCH as Kafka, CurrentLeader is the
  leader's id and epoch (-1, -1 while none) and NodeEndpoints lists each such leader that is live,
  at its address on the request's listener, once, by node id.  With the local engine every
  partition is led here (only FENCED_LEADER_EPOCH names a leader: this broker).
- Offsets outside [log start, log end] → OFFSET_OUT_OF_RANGE with the current offsets.
- Records are never decoded here: the response carries the file bytes as read.
- A read that fails (out of file descriptors, a failing disk) → KAFKA_STORAGE_ERROR for that partition.
- A client with a consumer_byte_rate quota gets at most the bytes it allows in quota.window.num - 1
  windows (Kafka's getMaxValueInQuotaWindow); a throttled answer is sent empty (server/quotas.py).
- The long poll ends, unanswered, as soon as the client's connection ends (Deferred.poll).  A request
  naming no partition that exists and may be read is answered at once, as Kafka does.
- A partition answered with an error carries empty records, not null ones, as Kafka's
  (librdkafka refuses a null record set: the whole response is dropped and the error never seen).
- The internal topics Metadata lists (`__consumer_offsets`, `__transaction_state`) can be read,
  as on Kafka (their records are the coordinators' own, in Kafka's formats).
- Authorization (Kafka's KafkaApis.handleFetchRequest), asked once per topic and request, not at
  each wake-up of a long poll: a consumer needs Read on each topic, a topic without it answers
  TOPIC_AUTHORIZATION_FAILED in each of its partitions (before its existence is checked; v13+: an
  unknown topic id is UNKNOWN_TOPIC_ID first).  A follower's fetch (ReplicaId / ReplicaState's
  ReplicaId >= 0) needs ClusterAction on the cluster instead; without it every partition answers
  TOPIC_AUTHORIZATION_FAILED.  A refused partition is not read and its offsets are -1.
"""
from __future__ import annotations

import trio

from trireme.server.deferred import Deferred
from trireme.server.dispatch import handles
from trireme.server.handlers import unauthorized
from trireme.server.routing import LeaderEndpoints, NotLeader, current_leader, led_partition
from trireme.state.acls import CLUSTER_NAME, Operation, ResourceType
from trireme.state.log import OffsetOutOfRange
from trireme.wire import error_codes as E

READ_COMMITTED = 1
LISTED_PARTITION_BYTES = 48    # at least what one partition's entry in an answer takes, records apart (42 in v11)
LISTED_TOPIC_BYTES = 64        # the same for a topic, besides its name


@handles("Fetch", 4, 18)
def fetch(ctx, request):
    if ctx.api_version >= 7 and request.session_id != 0:
        return ctx.response(error_code=E.FETCH_SESSION_ID_NOT_FOUND.code)
    if ctx.broker.quotas.enabled:       # consumer_byte_rate: at most what the quota allows (server/quotas.py)
        request.max_bytes = ctx.broker.quotas.fetch_max_bytes(ctx.principal, ctx.client_id, request.max_bytes)
    denied = _denied_topics(ctx, request)
    listing = _listing_bytes(request)
    limits = ctx.broker.limits
    if limits.answer_fits(listing):
        return _answer(ctx, request, listing, denied)
    limits.count(limits.response_waits, "Fetch")

    async def wait_for_room():
        # An answer listing so many partitions that its size alone does not fit waits for room, past max_wait if
        # need be (it has to list every partition asked for): until no other answer holds budget, or the client
        # goes (a poll ends at the client's EOF).
        await limits.room_for_answer(listing)
        result = _answer(ctx, request, listing, denied)
        return await result.wait() if type(result) is Deferred else result
    return Deferred(wait_for_room, poll=True)


def _denied_topics(ctx, request) -> set:
    """The topics (names; ids from v13) this fetch may not read, each asked once: a follower's fetch without
    ClusterAction may read none, a consumer's may not read those without Read (a v13 topic id naming no topic is
    not among them: it is answered UNKNOWN_TOPIC_ID)."""
    by_id = ctx.api_version >= 13
    replica_id = request.replica_state.replica_id if ctx.api_version >= 15 else request.replica_id
    names = {}
    for t in request.topics:
        if not by_id:
            names[t.topic] = t.topic
        else:
            topic = ctx.broker.described_topic(None, t.topic_id)
            if topic is not None:
                names[t.topic_id] = topic.name
    if replica_id >= 0:         # a follower's fetch: all or nothing, unknown topic ids included
        if ctx.authorize(Operation.CLUSTER_ACTION, ResourceType.CLUSTER, CLUSTER_NAME):
            return set()
        return {t.topic_id if by_id else t.topic for t in request.topics}
    refused = unauthorized(ctx, Operation.READ, ResourceType.TOPIC, names.values())
    return {key for key, name in names.items() if name in refused}


def _listing_bytes(request) -> int:
    """About the bytes of a Fetch answer besides its records: every requested partition is listed."""
    return sum(LISTED_TOPIC_BYTES + len(t.topic or "") + LISTED_PARTITION_BYTES * len(t.partitions)
               for t in request.topics)


def _answer(ctx, request, listing: int, denied: set):
    """The answer now (records there, or no wait), or a long poll (a Deferred) until min_bytes or max_wait.
    ``denied``: the topics the principal may not read (:func:`_denied_topics`)."""
    broker = ctx.broker
    response = ctx.response()
    moved = broker.data_event()          # taken before reading, so no flush in between is missed
    held_back = False
    at_once = request.max_wait_ms <= 0 or not _may_wait(ctx, request, denied)
    if at_once or request.min_bytes <= 0 or _readable(ctx, request, denied):
        size, by_topic, held_back = _fill(ctx, request, response, listing, denied)
        if held_back:
            broker.limits.count(broker.limits.response_waits, "Fetch")
        if size >= request.min_bytes or at_once:
            broker.metrics.count_bytes_out(by_topic)
            return response
    deadline = trio.current_time() + request.max_wait_ms / 1000
    budget = broker.limits.responses
    used_then = budget.used

    async def long_poll():
        nonlocal response, moved, held_back, used_then
        while True:
            if held_back:                   # records are there, the response budget had no room: wait for room
                if budget.used >= used_then:    # (none freed since, e.g. by this connection's earlier answers)
                    with trio.move_on_at(deadline):
                        await budget.wait_release()
            else:
                await broker.wait_for_data(deadline, moved)
            moved = broker.data_event()
            expired = trio.current_time() >= deadline
            if not expired and not held_back and not _readable(ctx, request, denied):
                continue                    # a high watermark moved, but none of these partitions'
            await broker.limits.room_for_answer(listing)
            response = ctx.response()
            got, by_topic, held_back = _fill(ctx, request, response, listing, denied)
            used_then = budget.used
            if got >= request.min_bytes or expired:
                broker.metrics.count_bytes_out(by_topic)
                return response
    return Deferred(long_poll, poll=True)


def _may_wait(ctx, request, denied: set) -> bool:
    """Whether the fetch may wait for data: it names a partition led here that may be read, and none led elsewhere.
    When no partition can be read there is nothing to wait for, and the errors are answered at once, as Kafka does;
    a partition led by another broker is answered at once too (Kafka's errorReadingData), so the client moves on."""
    broker = ctx.broker
    by_id = ctx.api_version >= 13
    readable = False
    for fetch_topic in request.topics:
        if (fetch_topic.topic_id if by_id else fetch_topic.topic) in denied:
            continue
        topic = broker.described_topic(None if by_id else fetch_topic.topic, fetch_topic.topic_id)
        for fp in fetch_topic.partitions:
            partition = led_partition(broker, topic, fp.partition)
            if type(partition) is NotLeader:
                return False
            if partition is not None and (partition.leader_epoch_error(fp.current_leader_epoch) or (
                    fp.last_fetched_epoch >= 0 and _last_fetched_epoch_check(partition, fp) != (0, None))):
                return False
            readable = readable or partition is not None
    return readable


def _last_fetched_epoch_check(partition, fp) -> tuple[int, tuple[int, int] | None]:
    """Kafka's check of a fetch's LastFetchedEpoch (Partition.readRecords) → (error, None) or (0, the diverging
    epoch and its end offset, or None when the log has not diverged)."""
    epoch, end_offset = partition.end_offset_for(fp.last_fetched_epoch)
    if end_offset < 0 or fp.fetch_offset < partition.log.log_start_offset:
        return E.OFFSET_OUT_OF_RANGE.code, None
    if epoch < fp.last_fetched_epoch or end_offset < fp.fetch_offset:
        return 0, (epoch, end_offset)
    return 0, None


def _readable(ctx, request, denied: set) -> bool:
    """Whether a fill could find records: some requested partition has a fetch offset in [log start, read bound)
    and no epoch error.  Checked before filling, so a long poll woken by another partition's flush, or one with
    nothing to read yet, builds no response (False means a fill would gather 0 bytes)."""
    broker = ctx.broker
    by_id = ctx.api_version >= 13
    read_committed = request.isolation_level == READ_COMMITTED
    for fetch_topic in request.topics:
        topic = broker.topics.by_id(fetch_topic.topic_id) if by_id else broker.topics.get(fetch_topic.topic)
        if topic is None or (fetch_topic.topic_id if by_id else fetch_topic.topic) in denied:
            continue
        for fp in fetch_topic.partitions:
            partition = led_partition(broker, topic, fp.partition)
            if partition is None or type(partition) is NotLeader or fp.partition_max_bytes <= 0:
                continue
            plog = partition.log
            bound = partition.last_stable_offset() if read_committed else plog.high_watermark
            if plog.log_start_offset <= fp.fetch_offset < bound \
                    and not partition.leader_epoch_error(fp.current_leader_epoch):
                return True
    return False


def _fill(ctx, request, response, listing: int, denied: set) -> tuple[int, dict[str, int], bool]:
    """Read every requested partition into ``response`` → the record bytes gathered, in all and per topic, and
    whether records were held back because the response budget had no room for them (``listing``: the answer's
    bytes besides records)."""
    broker = ctx.broker
    # Room in the response budget (the answer is encoded and counted in the same step as these reads): records stop
    # at the room left broker-wide, less the headroom and this answer's listing, and in this connection's share.
    # The first batch may pass the share when the connection holds no answer, and the whole budget when no answer
    # holds any (first_max None).
    limits = broker.limits
    responses = limits.responses
    held = ctx.connection.response_bytes if ctx.connection is not None else 0
    room = min(responses.limit - limits.response_headroom, responses.limit - listing) - responses.used
    cut_at = min(room, limits.response_share - held - listing)
    first_max = None if responses.used == 0 else room if held == 0 else cut_at
    held_back = False
    by_id = ctx.api_version >= 13
    cls = type(response).FetchableTopicResponse
    pcls = cls.PartitionData
    acls = pcls.AbortedTransaction
    # Every partition answered shares one instance of each tagged struct left at its default: read-only here, and
    # a hundred-partition long poll would otherwise build three objects per partition per answer.
    unset = {"diverging_epoch": pcls.EpochEndOffset(), "current_leader": pcls.LeaderIdAndEpoch(),
             "snapshot_id": pcls.SnapshotId()}
    budget = request.max_bytes if ctx.api_version >= 3 else 0x7FFFFFFF
    budget = min(budget, broker.config["fetch.max.bytes"])
    gathered = 0
    by_topic: dict[str, int] = {}
    read_committed = request.isolation_level == READ_COMMITTED
    kip951 = ctx.api_version >= 16
    leaders = LeaderEndpoints(ctx)          # the current leaders named (v16+: NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH)
    for fetch_topic in request.topics:
        topic = broker.described_topic(None if by_id else fetch_topic.topic, fetch_topic.topic_id)
        out = cls(topic=fetch_topic.topic, topic_id=fetch_topic.topic_id)
        response.responses.append(out)
        before = gathered
        refused = (fetch_topic.topic_id if by_id else fetch_topic.topic) in denied
        for fp in fetch_topic.partitions:
            result = pcls(partition_index=fp.partition, high_watermark=-1, last_stable_offset=-1,
                          log_start_offset=-1, records=b"", **unset)
            out.partitions.append(result)
            if refused:
                result.error_code = E.TOPIC_AUTHORIZATION_FAILED.code
                continue
            partition = led_partition(broker, topic, fp.partition)
            if partition is None:
                result.error_code = (E.UNKNOWN_TOPIC_ID.code if by_id and topic is None else E.UNKNOWN_TOPIC_OR_PARTITION.code)
                continue
            if type(partition) is NotLeader:
                result.error_code = partition.error_code
                if kip951:
                    result.current_leader = leaders.current_leader(pcls.LeaderIdAndEpoch, partition.leader_id,
                                                                   partition.leader_epoch)
                continue
            plog = partition.log
            hw = plog.high_watermark
            lso = partition.last_stable_offset()
            result.high_watermark = hw
            result.last_stable_offset = lso
            result.log_start_offset = plog.log_start_offset
            result.error_code = partition.leader_epoch_error(fp.current_leader_epoch)
            if result.error_code:
                if kip951 and result.error_code == E.FENCED_LEADER_EPOCH.code:     # as Kafka: the current leader
                    result.current_leader = leaders.current_leader(
                        pcls.LeaderIdAndEpoch, *current_leader(broker, topic, fp.partition))
                continue
            if fp.last_fetched_epoch >= 0:
                result.error_code, diverging = _last_fetched_epoch_check(partition, fp)
                if result.error_code or diverging is not None:
                    if diverging is not None:
                        result.diverging_epoch = pcls.EpochEndOffset(epoch=diverging[0], end_offset=diverging[1])
                    continue
            limit = min(fp.partition_max_bytes, budget - gathered)
            if limit <= 0:
                result.records = b""
                continue
            bound = lso if read_committed else hw
            try:
                data = plog.read(fp.fetch_offset, min(limit, cut_at - gathered), bound,
                                 min_one_batch=gathered == 0, first_batch_max=first_max)
            except OffsetOutOfRange:
                result.error_code = E.OFFSET_OUT_OF_RANGE.code
                continue
            except OSError:         # no descriptor to reopen the segment with, or a failing disk: retriable
                result.error_code = E.KAFKA_STORAGE_ERROR.code
                continue
            if not data and gathered == 0 and first_max is not None and fp.fetch_offset < bound:
                held_back = True    # a first batch was there: only the budget kept it out
            result.records = data
            gathered += len(data)
            if read_committed:
                # Up to the LSO, which bounds what was read: the index, not the records, says what was aborted.
                result.aborted_transactions = [
                    acls(producer_id=a.producer_id, first_offset=a.first_offset)
                    for a in plog.aborted_txns(fp.fetch_offset, lso)] if data else []
        if gathered > before:
            by_topic[topic.name] = by_topic.get(topic.name, 0) + gathered - before
    if leaders.nodes:
        response.node_endpoints = leaders.node_endpoints(type(response).NodeEndpoint)
    return gathered, by_topic, held_back
