SELECT controller_id, controller_epoch FROM trireme_cluster;
