-- The cluster's id, chosen by the first broker that starts on an empty database.
INSERT INTO trireme_cluster (cluster_id, schema_version) VALUES (%(cluster_id)s, %(schema_version)s)
ON CONFLICT (singleton) DO NOTHING;
