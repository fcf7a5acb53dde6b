-- A broker stopping (controlled shutdown) names the next leader of a partition it leads; fenced by its own node id
-- and leader epoch, so a partition the controller moved meanwhile stays where it is.  The new leader takes it with
-- partition_open (a new epoch).
UPDATE trireme_partition SET leader_id = %(leader_id)s
 WHERE topic_id = %(topic_id)s AND partition = %(partition)s AND leader_id = %(node_id)s
   AND leader_epoch = %(leader_epoch)s;
