"""The Kafka wire protocol, sans-IO: primitives, headers, message codecs, record batches."""
