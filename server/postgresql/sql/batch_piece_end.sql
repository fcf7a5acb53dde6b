-- Where a piece of a cleaned range [first_offset, end_offset) whose cleaned batches reach stop_offset may end, so
-- that no row crosses it: the last row start in (first_offset, stop_offset], else the first after stop_offset, else
-- end_offset (rows never cross a segment boundary, and a cleaned range ends at one).
SELECT coalesce(
    (SELECT max(base_offset) FROM trireme_batch
      WHERE topic_id = %(topic_id)s AND partition = %(partition)s
        AND base_offset > %(first_offset)s AND base_offset <= %(stop_offset)s),
    (SELECT min(base_offset) FROM trireme_batch
      WHERE topic_id = %(topic_id)s AND partition = %(partition)s
        AND base_offset > %(stop_offset)s AND base_offset < %(end_offset)s),
    %(end_offset)s);
