"""``trireme cluster``: the brokers of a cluster, its controller, and who leads each partition at which leader epoch.

  trireme cluster --describe [--topic T ...] [--exclude-internal]

Kafka splits this over kafka-cluster.sh, kafka-broker-api-versions.sh and kafka-topics.sh; here one
command reads DescribeCluster (cluster id, controller, each broker's node id, address and rack) and
Metadata (each partition's leader and leader epoch).  A broker's lease is not in the Kafka protocol:
the status page shows it.
"""
from __future__ import annotations

import argparse

from .client import Client, check, request_class
from .output import Report, Table

HELP = "describe the cluster: brokers, controller, partition leaders and leader epochs"


def add_arguments(parser: argparse.ArgumentParser, _nested) -> None:
    parser.add_argument("--describe", action="store_const", dest="run", const=_describe, required=True,
                        help="the brokers, the controller and each partition's leader and leader epoch")
    parser.add_argument("--topic", action="append", default=[], help="only these topics (repeat for several)")
    parser.add_argument("--exclude-internal", action="store_true", help="skip internal topics")


def _describe(client: Client, args) -> Report:
    cls = request_class("DescribeCluster")
    cluster = client.call("DescribeCluster", cls(include_cluster_authorized_operations=False), (0, 1))
    check(cluster.error_code, "describing the cluster", cluster.error_message)
    brokers = [(b.broker_id, b.host, b.port, b.rack, b.broker_id == cluster.controller_id)
               for b in sorted(cluster.brokers, key=lambda b: b.broker_id)]
    metadata = client.metadata(args.topic or None)
    partitions = []
    for t in sorted(metadata.topics, key=lambda t: t.name):
        check(t.error_code, f"topic {t.name!r}")
        if args.exclude_internal and t.is_internal:
            continue
        partitions.extend((t.name, p.partition_index, p.leader_id, p.leader_epoch)
                          for p in sorted(t.partitions, key=lambda p: p.partition_index))
    data = {"cluster_id": cluster.cluster_id, "controller_id": cluster.controller_id,
            "brokers": [{"node_id": n, "host": h, "port": p, "rack": r, "controller": c} for n, h, p, r, c in brokers],
            "partitions": [{"topic": t, "partition": i, "leader": leader, "leader_epoch": epoch}
                           for t, i, leader, epoch in partitions]}
    return Report([Table(("NODE-ID", "HOST", "PORT", "RACK", "CONTROLLER"), brokers),
                   Table(("TOPIC", "PARTITION", "LEADER", "LEADER-EPOCH"), partitions)],
                  notes=[f"cluster {cluster.cluster_id}, controller node {cluster.controller_id}"], data=data)
