"""A consume-transform-produce worker (confluent-kafka) for the exactly-once test: input → output, offsets in the transaction.

Usage: python eos_worker.py BOOTSTRAP INPUT OUTPUT GROUP TRANSACTIONAL_ID PARTITIONS

It assigns itself every input partition, starts at the group's committed offsets (read with
RequireStable, so never from a transaction still in doubt), and for each polled batch runs one
transaction: the transformed records plus the consumer's positions (send_offsets_to_transaction).
On any error it exits non-zero; the test restarts it, and the same transactional id fences whatever
its predecessor left open.  Prints "done" and exits 0 when the input is consumed to its end.

A watchdog ends the process when one round takes longer than WATCHDOG_S: librdkafka 2.16 can stall
in send_offsets_to_transaction after a broker restart (seen here: AddOffsetsToTxn answered NO_ERROR,
every request it had sent was answered, and it never sent the TxnOffsetCommit or a FindCoordinator
for the group; its 60 s timeout did not fire either).  Restarting is what an application's supervisor
does; the same transactional id then fences the stalled transaction.
"""
import faulthandler
import sys

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

WATCHDOG_S = 15
RECONNECT = {"reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 500, "retry.backoff.ms": 50}


def main() -> int:
    bootstrap, source, sink, group, txn_id, partitions = sys.argv[1:7]
    parts = [TopicPartition(source, p) for p in range(int(partitions))]
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                         "isolation.level": "read_committed", "auto.offset.reset": "earliest", **RECONNECT})
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, "linger.ms": 5,
                         "transaction.timeout.ms": 10000, **RECONNECT})
    producer.init_transactions(60)
    consumer.assign(parts)
    ends = {tp.partition: consumer.get_watermark_offsets(tp, timeout=30)[1] for tp in parts}
    while True:
        faulthandler.dump_traceback_later(WATCHDOG_S, exit=True)
        batch = consumer.consume(500, timeout=0.5)
        records = [m for m in batch if not m.error()]
        if not records:
            # A partition this worker has consumed nothing from has no position (OFFSET_INVALID) yet: the group's
            # committed offset is where it stands (a predecessor may have committed the last transaction).
            positions = consumer.position(parts)
            if any(tp.offset < 0 for tp in positions):
                committed = {tp.partition: tp.offset for tp in consumer.committed(parts, timeout=30)}
                positions = [tp if tp.offset >= 0 else TopicPartition(tp.topic, tp.partition, committed[tp.partition])
                             for tp in positions]
            if all(tp.offset >= ends[tp.partition] for tp in positions):
                print("done", flush=True)
                return 0
            continue
        producer.begin_transaction()
        for m in records:
            producer.produce(sink, key=m.key(), value=b"out:" + m.value(), partition=m.partition())
        producer.send_offsets_to_transaction(consumer.position(parts), consumer.consumer_group_metadata(), 60)
        while True:
            try:
                producer.commit_transaction(60)
                break
            except KafkaException as e:
                if not e.args[0].retriable():
                    raise


if __name__ == "__main__":
    sys.exit(main())
