"""One module per Kafka API; each registers itself with the dispatcher."""
