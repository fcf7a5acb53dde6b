SELECT leader_id, leader_epoch, log_start_offset, log_end_offset FROM trireme_partition
 WHERE topic_id = %(topic_id)s AND partition = %(partition)s;
