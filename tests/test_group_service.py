"""The server's group service: records become durable before answers, timers fire, the offsets log is compacted on load."""
import trio

from broker_runner import run_with_broker
from trireme.server.broker import Broker
from trireme.server.clock import now_ms
from trireme.server.config import Config


def _broker(tmp_path, **props) -> Broker:
    config = Config(data_dir=str(tmp_path))
    config.update({"group.initial.rebalance.delay.ms": 0, "group.min.session.timeout.ms": 100, **props})
    return Broker(config)


async def _commit(broker, group, offsets):
    results, effects = broker.groups.coordinator.commit_offsets(group, -1, "", None, offsets, now_ms())
    assert all(r.error == 0 for r in results)
    assert await broker.groups.complete(broker.groups.stage(effects))


def _fetched(broker, group):
    error, fetched = broker.groups.coordinator.fetch_offsets(group, None)
    assert error == 0
    return {(f.topic, f.partition): f.offset for f in fetched}


def test_commit_is_visible_once_answered_and_survives_restart(tmp_path):
    broker = _broker(tmp_path)
    broker.ensure_topic("t", 2)

    async def body(b):
        await _commit(b, "g", [("t", 0, 5, -1, "m"), ("t", 1, 7, -1, None)])
        assert _fetched(b, "g") == {("t", 0): 5, ("t", 1): 7}
        assert b.groups.partition.log.high_watermark > 0      # durable before the answer
    run_with_broker(broker, body)
    broker.close()
    again = _broker(tmp_path)
    assert _fetched(again, "g") == {("t", 0): 5, ("t", 1): 7}
    again.close()


def test_the_coordinators_batches_carry_the_partitions_leader_epoch(tmp_path):
    """As every leader append in Kafka, the coordinator's batches are stamped with the partition's leader epoch."""
    broker = _broker(tmp_path)
    broker.ensure_topic("t", 1)

    async def body(b):
        await _commit(b, "g", [("t", 0, 5, -1, "m")])
    run_with_broker(broker, body)
    partition = broker.groups.partition
    epochs = [h.partition_leader_epoch for h in partition.log.iter_batch_headers()]
    assert epochs and epochs == [partition.leader_epoch] * len(epochs)
    broker.close()


def test_offsets_log_is_compacted_on_load(tmp_path):
    broker = _broker(tmp_path)
    broker.ensure_topic("t", 3)

    async def body(b):
        for i in range(700):
            await _commit(b, "g", [("t", p, i * 10 + p, -1, None) for p in range(3)])
    run_with_broker(broker, body)
    end = broker.groups.partition.log.log_end_offset
    assert end == 2100
    broker.close()

    reopened = _broker(tmp_path)
    log = reopened.groups.partition.log
    assert log.log_start_offset == end                     # everything before the snapshot is gone
    assert log.log_end_offset == end + 3                   # one record per live key
    assert _fetched(reopened, "g") == {("t", p): 6990 + p for p in range(3)}
    reopened.close()

    third = _broker(tmp_path)
    assert third.groups.partition.log.log_start_offset == end
    assert _fetched(third, "g") == {("t", p): 6990 + p for p in range(3)}
    third.close()


def test_session_timer_expires_a_silent_member(tmp_path):
    broker = _broker(tmp_path)
    broker.ensure_topic("t", 1)

    async def body(b):
        groups = b.groups
        join = groups.coordinator.join_group
        first = await groups.call(join, "g", "", None, "consumer", [("range", b"")], 300, 300, now_ms(),
                                  require_known_member_id=True, if_moved=None)()
        assert first.error == 79                           # MEMBER_ID_REQUIRED
        joined = await groups.call(join, "g", first.member_id, None, "consumer", [("range", b"")], 300, 300,
                                   now_ms(), require_known_member_id=True, if_moved=None)()
        assert joined.error == 0 and joined.leader == first.member_id
        synced = await groups.call(groups.coordinator.sync_group, "g", joined.generation_id, first.member_id,
                                   None, "consumer", "range", [(first.member_id, b"assignment")], now_ms(),
                                   if_moved=None)()
        assert (synced.error, synced.assignment) == (0, b"assignment")
        [described] = groups.coordinator.describe_groups(["g"])
        assert described.state == "Stable"
        await trio.sleep(0.8)                              # no heartbeats: the 300 ms session expires
        [described] = groups.coordinator.describe_groups(["g"])
        assert described.state == "Empty" and not described.members
    run_with_broker(broker, body)
    broker.close()
