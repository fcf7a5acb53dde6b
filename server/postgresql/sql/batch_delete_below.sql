-- Rows wholly below a partition's log start (retention, DeleteRecords).
DELETE FROM trireme_batch
 WHERE topic_id = %(topic_id)s AND partition = %(partition)s AND last_offset < %(start_offset)s;
