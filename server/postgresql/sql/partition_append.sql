-- A commit of one partition's new batches: moves its log end (and log start), only while this broker still leads
-- it at the epoch it had and the row ends where this broker's last commit left it.  No row back: fenced.
UPDATE trireme_partition
   SET log_end_offset = %(end_offset)s, log_start_offset = GREATEST(log_start_offset, %(start_offset)s)
 WHERE topic_id = %(topic_id)s AND partition = %(partition)s AND leader_id = %(node_id)s
   AND leader_epoch = %(leader_epoch)s AND log_end_offset = %(from_offset)s
RETURNING log_end_offset;
