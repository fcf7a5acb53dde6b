-- A partition's batches from its log start, in offset order (the rows wholly below the start were deleted).
SELECT base_offset, data FROM trireme_batch
 WHERE topic_id = %(topic_id)s AND partition = %(partition)s AND last_offset >= %(from_offset)s
   AND base_offset < %(end_offset)s
 ORDER BY base_offset;
