-- Tell every broker that leaders changed (they poll at once instead of at their next interval).
SELECT pg_notify('trireme_cluster', %(controller_epoch)s::text);
