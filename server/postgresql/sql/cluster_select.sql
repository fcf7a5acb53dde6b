SELECT cluster_id, schema_version FROM trireme_cluster;
