-- AlterPartitionReassignments: a partition's preferred leaders, in order; the controller leads it on the first live
-- one.  No row: the partition has no row yet (the controller creates it).
UPDATE trireme_partition SET assigned_replicas = %(replicas)s
 WHERE topic_id = %(topic_id)s AND partition = %(partition)s;
