SELECT topic_id, partition, leader_id, leader_epoch, assigned_replicas FROM trireme_partition;
