-- Register this broker with a lease, unless its node id is held by another live broker (a broker restarted on the
-- same data directory takes its own lease over: the data directory's lock proves the old process is gone).
INSERT INTO trireme_broker AS b (node_id, directory_id, incarnation, endpoints, rack, lease_expires_at)
VALUES (%(node_id)s, %(directory_id)s, %(incarnation)s, %(endpoints)s, %(rack)s,
        clock_timestamp() + %(session_ms)s * interval '1 millisecond')
ON CONFLICT (node_id) DO UPDATE
   SET directory_id = EXCLUDED.directory_id, incarnation = EXCLUDED.incarnation, endpoints = EXCLUDED.endpoints,
       rack = EXCLUDED.rack, lease_expires_at = EXCLUDED.lease_expires_at
 WHERE b.lease_expires_at < clock_timestamp() OR b.directory_id = EXCLUDED.directory_id
RETURNING node_id;
