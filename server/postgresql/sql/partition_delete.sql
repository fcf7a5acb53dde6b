-- A deleted topic's partition: its row and its batches.
WITH gone AS (DELETE FROM trireme_batch WHERE topic_id = %(topic_id)s AND partition = %(partition)s)
DELETE FROM trireme_partition WHERE topic_id = %(topic_id)s AND partition = %(partition)s;
