"""A Fetch partition's error reaches librdkafka: a partition answered with an error carries empty records, as Kafka's
FetchResponse.partitionResponse does, not null ones (librdkafka's parser refuses a null record set: the whole
response is dropped as malformed and the consumer never hears of the error)."""
from __future__ import annotations

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from compat_tests.test_bad_input import RawConn, create_topic, unique


def test_offset_out_of_range_reaches_the_consumer(module_server):
    topic = unique("oor")
    with RawConn(module_server.bootstrap) as conn:
        create_topic(conn, topic)
    producer = Producer({"bootstrap.servers": module_server.bootstrap})
    producer.produce(topic, b"v")
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": module_server.bootstrap, "group.id": unique("g"),
                         "auto.offset.reset": "error", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, 100)])         # past the end: OFFSET_OUT_OF_RANGE
        errors = []
        for _ in range(30):
            message = consumer.poll(1)
            if message is not None and message.error() is not None:
                errors.append(message.error().code())
                break
        assert errors == [KafkaError._AUTO_OFFSET_RESET]
    finally:
        consumer.close()
