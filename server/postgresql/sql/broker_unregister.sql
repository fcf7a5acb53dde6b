-- A broker stopping: its lease ends now, so the controller moves what it still leads at once.
UPDATE trireme_broker SET lease_expires_at = clock_timestamp()
 WHERE node_id = %(node_id)s AND incarnation = %(incarnation)s;
