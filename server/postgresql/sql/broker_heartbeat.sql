-- Renew this broker's lease; no row back: another process took the node id over (this one must stop serving).
UPDATE trireme_broker SET lease_expires_at = clock_timestamp() + %(session_ms)s * interval '1 millisecond'
 WHERE node_id = %(node_id)s AND incarnation = %(incarnation)s
RETURNING node_id;
