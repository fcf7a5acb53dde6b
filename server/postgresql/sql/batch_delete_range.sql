-- The rows of a range a cleaning rewrote (whole segments: rows never cross a segment boundary), replaced in the same
-- transaction by the cleaned batches.
DELETE FROM trireme_batch
 WHERE topic_id = %(topic_id)s AND partition = %(partition)s
   AND base_offset >= %(first_offset)s AND base_offset < %(end_offset)s;
