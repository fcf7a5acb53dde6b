-- The tables of the PostgreSQL storage engine (server/postgresql/engine.py); every statement is idempotent.
CREATE TABLE IF NOT EXISTS trireme_cluster (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    cluster_id text NOT NULL,
    schema_version integer NOT NULL,
    controller_id integer,                          -- the broker that assigns partition leaders
    controller_epoch integer NOT NULL DEFAULT 0     -- rises with every new controller
);

-- The registered brokers: a broker is live while its lease has not expired (on the database's clock).
CREATE TABLE IF NOT EXISTS trireme_broker (
    node_id integer PRIMARY KEY,
    directory_id text NOT NULL,                     -- its data directory's (meta.properties)
    incarnation uuid NOT NULL,                      -- one per process start
    endpoints jsonb NOT NULL,                       -- {"LISTENER": ["host", port], ...}
    rack text,
    lease_expires_at timestamptz NOT NULL
);

-- One row per partition: who leads it, with which leader epoch, and the offsets its batches span.
CREATE TABLE IF NOT EXISTS trireme_partition (
    topic_id uuid NOT NULL,
    partition integer NOT NULL,
    leader_id integer NOT NULL,
    leader_epoch integer NOT NULL,
    log_start_offset bigint NOT NULL,
    log_end_offset bigint NOT NULL,
    PRIMARY KEY (topic_id, partition)
);
-- A reassignment's replica list (AlterPartitionReassignments): the brokers that should lead the partition, in order
-- of preference; NULL: rendezvous order over the live brokers.  Added to tables created before it existed.
ALTER TABLE trireme_partition ADD COLUMN IF NOT EXISTS assigned_replicas integer[];

-- Record batches as produced (never decoded): each row holds whole batches from base_offset to last_offset.
CREATE TABLE IF NOT EXISTS trireme_batch (
    topic_id uuid NOT NULL,
    partition integer NOT NULL,
    base_offset bigint NOT NULL,
    last_offset bigint NOT NULL,
    data bytea NOT NULL,
    PRIMARY KEY (topic_id, partition, base_offset)
);
ALTER TABLE trireme_batch ALTER COLUMN data SET STORAGE EXTERNAL;
