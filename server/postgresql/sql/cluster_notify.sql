-- Tell every broker that the cluster changed (a broker joined or left, leaders moved): they poll at once instead
-- of at their next interval.
SELECT pg_notify('trireme_cluster', %(controller_epoch)s::text);
