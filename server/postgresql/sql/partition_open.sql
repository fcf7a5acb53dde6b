-- The broker the controller named takes the partition with a new leader epoch, which fences any earlier process
-- that led it under the same node id.  No row back: it was named another leader meanwhile.
UPDATE trireme_partition SET leader_epoch = leader_epoch + 1
 WHERE topic_id = %(topic_id)s AND partition = %(partition)s AND leader_id = %(node_id)s
RETURNING leader_epoch, log_start_offset, log_end_offset;
