-- Who holds a node id, and for how much longer (milliseconds).
SELECT directory_id, endpoints, (extract(epoch FROM lease_expires_at - clock_timestamp()) * 1000)::bigint
  FROM trireme_broker WHERE node_id = %(node_id)s;
