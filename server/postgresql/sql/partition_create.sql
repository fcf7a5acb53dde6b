-- A partition the controller found without a row: created with its first leader.
INSERT INTO trireme_partition (topic_id, partition, leader_id, leader_epoch, log_start_offset, log_end_offset)
VALUES (%(topic_id)s, %(partition)s, %(leader_id)s, 0, 0, 0)
ON CONFLICT (topic_id, partition) DO NOTHING;
