-- Become the controller when there is none or its broker's lease has lapsed.
UPDATE trireme_cluster c SET controller_id = %(node_id)s, controller_epoch = c.controller_epoch + 1
 WHERE c.controller_id IS DISTINCT FROM %(node_id)s
   AND NOT EXISTS (SELECT 1 FROM trireme_broker b
                    WHERE b.node_id = c.controller_id AND b.lease_expires_at > clock_timestamp())
RETURNING controller_epoch;
