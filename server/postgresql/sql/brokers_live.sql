SELECT node_id, endpoints, rack FROM trireme_broker WHERE lease_expires_at > clock_timestamp() ORDER BY node_id;
