-- The controller names a partition's new leader; it takes the partition with partition_open (a new epoch).  The
-- old leader's next commit no longer matches leader_id: fenced.
UPDATE trireme_partition SET leader_id = %(leader_id)s
 WHERE topic_id = %(topic_id)s AND partition = %(partition)s AND leader_id = %(seen_leader_id)s
   AND leader_epoch = %(seen_leader_epoch)s;
