"""The coordinators move with their partitions: inactive ones answer NOT_COORDINATOR in each API's own error fields, deactivation answers what waits, activation replays the log and resumes prepared transactions."""
import psycopg
import trio
import trio.testing

from broker_runner import run_with_broker
from trireme.server import dispatch
from trireme.server.broker import Broker
from trireme.server.deferred import Deferred
from trireme.server.peers import PeerUnavailable, handler_for
from trireme.server.transactions import ask_coordinator
from trireme.server.config import Config
from trireme.wire import error_codes as E
from trireme.wire.codec import message

NOT_COORDINATOR = E.NOT_COORDINATOR.code


def _broker(tmp_path, **props) -> Broker:
    config = Config(data_dir=str(tmp_path))
    config.update({"group.initial.rebalance.delay.ms": 0, "group.min.session.timeout.ms": 100, **props})
    broker = Broker(config)
    broker.ensure_topic("t", 1)
    return broker


def _req(api):
    return message(f"{api}Request").cls


class _Connection:
    peer = "127.0.0.1:50000"


def _handle(b, api, version, **fields):
    """``api`` through the codec at ``version`` to this broker's handler, from a client's connection, now → an
    async function returning the decoded answer."""
    handler = handler_for(api, version)
    frame = bytearray(handler.request.encode_bytes(_req(api)(**fields), version))
    decoded, _ = handler.request.decode(frame, version)
    ctx = dispatch.RequestContext(b, handler.api_key, version, 1, "tests", "User:ANONYMOUS", _Connection(), frame)
    result = handler.fn(ctx, decoded)

    async def answer():
        done = await result.wait() if isinstance(result, Deferred) else result
        out, _ = handler.response.decode(handler.response.encode_bytes(done, version), version)
        return out
    return answer


async def _call(b, api, version, **fields):
    return await _handle(b, api, version, **fields)()


def _offsets_partition(b):
    return b.partitions[("__consumer_offsets", 0)]


def _txn_partition(b):
    return b.partitions[("__transaction_state", 0)]


async def _every_group_api(b) -> dict:
    """Each group coordinator API once → {name: the error codes it answered}."""
    found = {}
    join = _req("JoinGroup")
    r = await _call(b, "JoinGroup", 5, group_id="g", session_timeout_ms=10000, rebalance_timeout_ms=10000,
                    member_id="", protocol_type="consumer",
                    protocols=[join.JoinGroupRequestProtocol(name="range", metadata=b"")])
    found["JoinGroup"] = [r.error_code]
    r = await _call(b, "SyncGroup", 3, group_id="g", generation_id=1, member_id="m", assignments=[])
    found["SyncGroup"] = [r.error_code]
    r = await _call(b, "Heartbeat", 3, group_id="g", generation_id=1, member_id="m")
    found["Heartbeat"] = [r.error_code]
    leave = _req("LeaveGroup")
    r = await _call(b, "LeaveGroup", 3, group_id="g", members=[leave.MemberIdentity(member_id="m")])
    found["LeaveGroup"] = [r.error_code]
    commit = _req("OffsetCommit")
    topic = commit.OffsetCommitRequestTopic
    r = await _call(b, "OffsetCommit", 8, group_id="g", generation_id_or_member_epoch=-1, member_id="", topics=[
        topic(name="t", partitions=[topic.OffsetCommitRequestPartition(partition_index=0, committed_offset=3)])])
    found["OffsetCommit"] = [p.error_code for t in r.topics for p in t.partitions]
    fetch = _req("OffsetFetch")
    r = await _call(b, "OffsetFetch", 8, groups=[fetch.OffsetFetchRequestGroup(group_id="g", topics=None)])
    found["OffsetFetch"] = [g.error_code for g in r.groups]
    r = await _call(b, "OffsetFetch", 5, group_id="g", topics=None)
    found["OffsetFetch v5"] = [r.error_code]
    r = await _call(b, "DescribeGroups", 5, groups=["g"])
    found["DescribeGroups"] = [g.error_code for g in r.groups]
    r = await _call(b, "DeleteGroups", 2, groups_names=["g"])
    found["DeleteGroups"] = [g.error_code for g in r.results]
    delete = _req("OffsetDelete")
    r = await _call(b, "OffsetDelete", 0, group_id="g", topics=[
        delete.OffsetDeleteRequestTopic(name="t", partitions=[
            delete.OffsetDeleteRequestTopic.OffsetDeleteRequestPartition(partition_index=0)])])
    found["OffsetDelete"] = [r.error_code]
    txn = _req("TxnOffsetCommit")
    ttopic = txn.TxnOffsetCommitRequestTopic
    r = await _call(b, "TxnOffsetCommit", 3, transactional_id="x", group_id="g", producer_id=1, producer_epoch=0,
                    generation_id=-1, member_id="", topics=[ttopic(name="t", partitions=[
                        ttopic.TxnOffsetCommitRequestPartition(partition_index=0, committed_offset=3)])])
    found["TxnOffsetCommit"] = [p.error_code for t in r.topics for p in t.partitions]
    return found


async def _every_transaction_api(b) -> dict:
    found = {}
    r = await _call(b, "InitProducerId", 4, transactional_id="x", transaction_timeout_ms=10000, producer_id=-1,
                    producer_epoch=-1)
    found["InitProducerId"] = [r.error_code]
    add = _req("AddPartitionsToTxn")
    r = await _call(b, "AddPartitionsToTxn", 3, v3_and_below_transactional_id="x", v3_and_below_producer_id=1,
                    v3_and_below_producer_epoch=0,
                    v3_and_below_topics=[add.AddPartitionsToTxnTopic(name="t", partitions=[0])])
    found["AddPartitionsToTxn"] = [p.partition_error_code for t in r.results_by_topic_v3_and_below
                                   for p in t.results_by_partition]
    r = await _call(b, "AddPartitionsToTxn", 5, transactions=[add.AddPartitionsToTxnTransaction(
        transactional_id="x", producer_id=1, producer_epoch=0, verify_only=True,
        topics=[add.AddPartitionsToTxnTopic(name="t", partitions=[0])])])
    found["AddPartitionsToTxn v5"] = [p.partition_error_code for x in r.results_by_transaction
                                      for t in x.topic_results for p in t.results_by_partition]
    r = await _call(b, "AddOffsetsToTxn", 3, transactional_id="x", producer_id=1, producer_epoch=0, group_id="g")
    found["AddOffsetsToTxn"] = [r.error_code]
    r = await _call(b, "EndTxn", 3, transactional_id="x", producer_id=1, producer_epoch=0, committed=True)
    found["EndTxn"] = [r.error_code]
    r = await _call(b, "DescribeTransactions", 0, transactional_ids=["x"])
    found["DescribeTransactions"] = [s.error_code for s in r.transaction_states]
    return found


def test_inactive_coordinators_answer_not_coordinator_in_every_api(tmp_path):
    broker = _broker(tmp_path)

    async def body(b):
        b.groups.deactivate("test")
        b.transactions.deactivate("test")
        found = {**await _every_group_api(b), **await _every_transaction_api(b)}
        assert found == {api: [NOT_COORDINATOR] * len(codes) for api, codes in found.items()} \
            and all(found.values())
        # The listings list only this broker's groups and transactions: none.
        r = await _call(b, "ListGroups", 4, states_filter=[])
        assert (r.error_code, r.groups) == (0, [])
        r = await _call(b, "ListTransactions", 1, state_filters=[], producer_id_filters=[], duration_filter=-1)
        assert (r.error_code, r.transaction_states) == (0, [])
        # Idempotent producers get ids from any broker.
        r = await _call(b, "InitProducerId", 4, transactional_id=None, transaction_timeout_ms=-1, producer_id=-1,
                        producer_epoch=-1)
        assert r.error_code == 0 and r.producer_id >= 0
    run_with_broker(broker, body)
    broker.close()


def test_a_coordinator_being_opened_answers_load_in_progress(tmp_path):
    broker = _broker(tmp_path)

    async def body(b):
        b.groups.deactivate("test")
        b.transactions.deactivate("test")
        b.groups.loading()
        b.transactions.loading()
        found = {**await _every_group_api(b), **await _every_transaction_api(b)}
        loading = E.COORDINATOR_LOAD_IN_PROGRESS.code
        assert found.pop("Heartbeat") == [0]               # Kafka answers a heartbeat blindly while loading
        assert found == {api: [loading] * len(codes) for api, codes in found.items()}
        r = await _call(b, "ListTransactions", 1, state_filters=[], producer_id_filters=[], duration_filter=-1)
        assert r.error_code == loading
    run_with_broker(broker, body)
    broker.close()


def test_deactivation_answers_a_waiting_join_not_coordinator_and_activation_replays_the_log(tmp_path):
    broker = _broker(tmp_path, **{"group.initial.rebalance.delay.ms": 60000})

    async def body(b):
        commit = _req("OffsetCommit")
        topic = commit.OffsetCommitRequestTopic
        r = await _call(b, "OffsetCommit", 8, group_id="done", generation_id_or_member_epoch=-1, member_id="",
                        topics=[topic(name="t", partitions=[
                            topic.OffsetCommitRequestPartition(partition_index=0, committed_offset=42)])])
        assert r.topics[0].partitions[0].error_code == 0
        join = _req("JoinGroup")
        answers = []

        async def joining():
            answers.append(await _call(b, "JoinGroup", 3, group_id="g", session_timeout_ms=10000,
                                       rebalance_timeout_ms=10000, member_id="", protocol_type="consumer",
                                       protocols=[join.JoinGroupRequestProtocol(name="range", metadata=b"")]))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(joining)
            await trio.testing.wait_all_tasks_blocked()
            assert not answers                                 # parked: the initial rebalance delay is a minute
            partition = _offsets_partition(b)
            b.groups.deactivate("moved")
        assert answers[0].error_code == NOT_COORDINATOR
        assert not b.groups.coordinator.groups and not b.groups.coordinator.offsets     # dropped
        b.groups.activate(partition)
        fetch = _req("OffsetFetch")
        r = await _call(b, "OffsetFetch", 8, groups=[fetch.OffsetFetchRequestGroup(group_id="done", topics=None)])
        assert r.groups[0].error_code == 0
        assert [(t.name, p.committed_offset) for t in r.groups[0].topics for p in t.partitions] == [("t", 42)]
        # Work started right after an activation, before its tasks run (an EndTxn's markers), runs with them.
        b.groups.deactivate("moved")
        b.groups.activate(partition)
        ran = trio.Event()

        async def work():
            ran.set()
        assert b.groups.start_soon(work)
        with trio.fail_after(5):
            await ran.wait()
    run_with_broker(broker, body)
    broker.close()


def test_activation_writes_the_markers_of_a_transaction_left_prepared(tmp_path):
    """A coordinator that lost its partition with a transaction prepared (markers not yet written): the next
    activation writes them and completes it, as Kafka's new coordinator does after loading."""
    broker = _broker(tmp_path, **{"trireme.debug.transaction.marker.delay.ms": 60000})

    async def body(b):
        r = await _call(b, "InitProducerId", 4, transactional_id="x", transaction_timeout_ms=60000, producer_id=-1,
                        producer_epoch=-1)
        pid, epoch = r.producer_id, r.producer_epoch
        add = _req("AddPartitionsToTxn")
        r = await _call(b, "AddPartitionsToTxn", 3, v3_and_below_transactional_id="x", v3_and_below_producer_id=pid,
                        v3_and_below_producer_epoch=epoch,
                        v3_and_below_topics=[add.AddPartitionsToTxnTopic(name="t", partitions=[0])])
        assert r.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code == 0
        r = await _call(b, "EndTxn", 3, transactional_id="x", producer_id=pid, producer_epoch=epoch, committed=True)
        assert r.error_code == 0
        assert b.transactions.coordinator.describe("x").state.kafka_name == "PrepareCommit"
        partition = _txn_partition(b)
        b.transactions.deactivate("moved")          # its marker task (waiting out the delay) is cancelled
        assert b.transactions.coordinator.describe("x") is None
        b.config.update({"trireme.debug.transaction.marker.delay.ms": 0})
        b.transactions.activate(partition)
        with trio.fail_after(10):
            while b.transactions.coordinator.describe("x").state.kafka_name != "CompleteCommit":
                await trio.sleep(0.01)
        data = b.partitions[("t", 0)]
        assert data.producers.entry(pid).current_txn_first_offset is None      # the commit marker is there
    run_with_broker(broker, body)
    broker.close()


async def _until(condition, timeout_s: float = 10) -> None:
    with trio.fail_after(timeout_s):
        while not condition():
            await trio.sleep(0.01)


async def _commit(b, group: str, offset: int) -> int:
    topic = _req("OffsetCommit").OffsetCommitRequestTopic
    r = await _call(b, "OffsetCommit", 8, group_id=group, generation_id_or_member_epoch=-1, member_id="", topics=[
        topic(name="t", partitions=[topic.OffsetCommitRequestPartition(partition_index=0, committed_offset=offset)])])
    return r.topics[0].partitions[0].error_code


def test_with_postgresql_a_coordinator_follows_its_partitions_leadership(tmp_path, postgres_database):
    """The controller assigns ``__consumer_offsets``' partition; the broker it names opens it (a new leader epoch)
    and activates the coordinator; fenced (another leader epoch in the database), the coordinator answers
    NOT_COORDINATOR, and once the broker is named again it replays what was committed."""
    config = Config(data_dir=str(tmp_path))
    config.update({"trireme.storage": "postgresql", "trireme.storage.postgresql.dsn": postgres_database,
                   "trireme.cluster.metadata.poll.ms": 50})
    broker = Broker(config)
    broker.ensure_topic("t", 1)

    async def body(b):
        await _until(lambda: b.groups.active and b.transactions.active)
        first_epoch = _offsets_partition(b).leader_epoch
        assert await _commit(b, "g", 42) == 0
        with psycopg.connect(postgres_database) as conn:      # another leader took it meanwhile
            conn.execute("UPDATE trireme_partition SET leader_epoch = leader_epoch + 1 WHERE topic_id = %s",
                         (b.groups.TOPIC.topic_id,))
        assert await _commit(b, "g", 43) == NOT_COORDINATOR   # the commit is fenced: the coordinator moves
        await _until(lambda: b.groups.active)                 # named leader again: opened at a new epoch
        assert _offsets_partition(b).leader_epoch > first_epoch + 1
        fetch = _req("OffsetFetch")
        r = await _call(b, "OffsetFetch", 8, groups=[fetch.OffsetFetchRequestGroup(group_id="g", topics=None)])
        assert [p.committed_offset for t in r.groups[0].topics for p in t.partitions] == [42]
    run_with_broker(broker, body)
    broker.close()


class _Unreachable:
    async def call(self, api, version, request):
        raise PeerUnavailable(2, "connection refused")


class _Refusing:
    async def call(self, api, version, request):
        return message("AddPartitionsToTxnResponse").cls(error_code=E.CLUSTER_AUTHORIZATION_FAILED.code)


class _ElsewhereBroker:
    """What ask_coordinator uses of a broker whose transaction coordinator is node ``leader`` (-1: none)."""

    node_id = 1

    def __init__(self, leader, peer):
        self.leader, self._peer = leader, peer

    def partition_leader(self, topic, index):
        return self.leader

    def peer(self, node):
        assert node == self.leader
        return self._peer


def test_asking_a_coordinator_elsewhere_maps_what_goes_wrong_as_kafkas_add_partitions_to_txn_manager():
    partitions = [("t", 0), ("t", 1)]

    def ask(broker):
        return trio.run(lambda: ask_coordinator(broker, "x", 1, 0, partitions, verify_only=True))
    assert ask(_ElsewhereBroker(2, _Unreachable())) == {tp: E.NETWORK_EXCEPTION.code for tp in partitions}
    assert ask(_ElsewhereBroker(-1, None)) == {tp: E.COORDINATOR_NOT_AVAILABLE.code for tp in partitions}
    assert ask(_ElsewhereBroker(2, _Refusing())) == {tp: E.INVALID_TXN_STATE.code for tp in partitions}


def test_markers_from_a_connection_are_a_brokers_only_where_the_coordinator_is_another_broker(tmp_path):
    """Without an authorizer any principal is a broker, but on the coordinator's own broker (here: every broker of
    the local engine) a marker from a connection is a client's and checked against the coordinator."""
    broker = _broker(tmp_path)
    markers = _req("WriteTxnMarkers")

    async def marker_error(b) -> int:
        answer = await _call(b, "WriteTxnMarkers", 1, markers=[markers.WritableTxnMarker(
            producer_id=999_999, producer_epoch=0, transaction_result=False, coordinator_epoch=0,
            topics=[markers.WritableTxnMarker.WritableTxnMarkerTopic(name="t", partition_indexes=[0])])])
        return answer.markers[0].topics[0].partitions[0].error_code

    async def body(b):
        assert await marker_error(b) == E.UNKNOWN_PRODUCER_ID.code      # a producer id no coordinator handed out
        here = b.partition_leader
        b.partition_leader = lambda topic, index: 2 if topic == "__transaction_state" else here(topic, index)
        assert await marker_error(b) == 0                                # another broker's coordinator's marker
    run_with_broker(broker, body)
    broker.close()
