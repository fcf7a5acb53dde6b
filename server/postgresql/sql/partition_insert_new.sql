-- A partition created while this broker runs: its row, led by this broker at epoch 0, unless it exists.  A row the
-- controller created meanwhile naming this broker, not led yet (epoch -1, partition_create), is this one: epoch 0.
INSERT INTO trireme_partition AS p (topic_id, partition, leader_id, leader_epoch, log_start_offset, log_end_offset)
VALUES (%(topic_id)s, %(partition)s, %(node_id)s, 0, 0, 0)
ON CONFLICT (topic_id, partition) DO UPDATE SET leader_epoch = 0
 WHERE p.leader_id = EXCLUDED.leader_id AND p.leader_epoch = -1;
