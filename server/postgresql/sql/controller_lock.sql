-- The controller's assignments run while it is still the controller at its epoch, one at a time.
SELECT 1 FROM trireme_cluster WHERE controller_id = %(node_id)s AND controller_epoch = %(controller_epoch)s
   FOR UPDATE;
