-- This broker becomes the partition's leader with a new leader epoch: a deposed leader's next commit, fenced by
-- the epoch it had, changes nothing.  A partition never committed gets its row here.
INSERT INTO trireme_partition AS p (topic_id, partition, leader_id, leader_epoch, log_start_offset, log_end_offset)
VALUES (%(topic_id)s, %(partition)s, %(node_id)s, 0, 0, 0)
ON CONFLICT (topic_id, partition) DO UPDATE SET leader_id = EXCLUDED.leader_id, leader_epoch = p.leader_epoch + 1
RETURNING leader_epoch, log_start_offset, log_end_offset;
