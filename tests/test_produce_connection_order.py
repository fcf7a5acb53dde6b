"""A transactional Produce that must first add its partition to the transaction (transactions V2's implicit add)
appends at once, in its connection's order, in a task of the connection (Connection.start_soon): not when the writer
reaches its answer, which would make every pipelined request wait for the answers before it."""
import trio
import trio.testing

from broker_runner import run_with_broker
from trireme.server.broker import Broker
from trireme.server.clock import now_ms
from trireme.server.config import Config
from trireme.server.deferred import Deferred
from trireme.server.dispatch import HANDLERS, RequestContext, load_handlers
from trireme.wire import records as rec
from trireme.wire.codec import message

load_handlers()
PRODUCE = HANDLERS[0]
REQUEST = message("ProduceRequest")
VERSION = 12                             # an implicit add (transactions V2)


class _Connection:
    """What the produce handler uses of its connection: its task group."""

    def __init__(self, nursery):
        self.start_soon = nursery.start_soon


def _request(pid: int, epoch: int, sequence: int):
    batch = rec.build_batch([(None, b"v", [], now_ms())], producer_id=pid, producer_epoch=epoch,
                            base_sequence=sequence, transactional=True)
    cls = REQUEST.cls
    tcls = cls.TopicProduceData
    request = cls(transactional_id="tx", acks=-1, timeout_ms=1000, topic_data=[tcls(
        name="t", partition_data=[tcls.PartitionProduceData(index=0, records=bytes(batch))])])
    frame = bytearray(REQUEST.encode_bytes(request, VERSION))
    return REQUEST.decode(memoryview(frame), VERSION, 0)[0], frame


def test_pipelined_transactional_produces_append_before_any_answer_is_waited_for(tmp_path):
    broker = Broker(Config(data_dir=str(tmp_path)))
    broker.ensure_topic("t", 1)

    async def body(b):
        outcome = await b.transactions.init_producer_id("tx", 60000)
        pid, epoch = outcome.producer_id, outcome.producer_epoch
        log = b.partition("t", 0).log
        async with trio.open_nursery() as nursery:
            connection = _Connection(nursery)
            results = []
            for sequence in (0, 1):
                request, frame = _request(pid, epoch, sequence)
                ctx = RequestContext(broker=b, api_key=0, api_version=VERSION, correlation_id=sequence,
                                     client_id="tests", principal="User:ANONYMOUS", connection=connection,
                                     frame=frame)
                results.append(PRODUCE.fn(ctx, request))
            assert all(type(r) is Deferred for r in results)
            with trio.fail_after(10):
                while log.log_end_offset < 2:
                    await trio.sleep(0.001)               # added, then appended in order, no answer awaited
            answers = [await r.wait() for r in results]
        offsets = [a.responses[0].partition_responses[0] for a in answers]
        assert [(p.error_code, p.base_offset) for p in offsets] == [(0, 0), (0, 1)]
    run_with_broker(broker, body)
    broker.close()
