SELECT topic_id, partition, leader_id, leader_epoch FROM trireme_partition;
