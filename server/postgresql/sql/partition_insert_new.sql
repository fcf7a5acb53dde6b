-- A partition created while this broker runs: its row, led by this broker at epoch 0, unless it exists.
INSERT INTO trireme_partition (topic_id, partition, leader_id, leader_epoch, log_start_offset, log_end_offset)
VALUES (%(topic_id)s, %(partition)s, %(node_id)s, 0, 0, 0)
ON CONFLICT (topic_id, partition) DO NOTHING;
