-- A partition the controller found without a row: created with its first leader, at leader epoch -1 (not led yet):
-- that leader takes it with partition_open at epoch 0, as Kafka's first leader of a partition.
INSERT INTO trireme_partition (topic_id, partition, leader_id, leader_epoch, log_start_offset, log_end_offset)
VALUES (%(topic_id)s, %(partition)s, %(leader_id)s, -1, 0, 0)
ON CONFLICT (topic_id, partition) DO NOTHING;
