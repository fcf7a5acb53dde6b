INSERT INTO trireme_batch (topic_id, partition, base_offset, last_offset, data)
VALUES (%(topic_id)s, %(partition)s, %(base_offset)s, %(last_offset)s, %(data)s);
