-- The live brokers, and how long each one's lease still runs (milliseconds).
SELECT node_id, endpoints, rack, (extract(epoch FROM lease_expires_at - clock_timestamp()) * 1000)::bigint
  FROM trireme_broker WHERE lease_expires_at > clock_timestamp() ORDER BY node_id;
