"""DescribeCluster: the live brokers, the cluster id and the controller id.

Behaviour / version notes:
- v0-2.  Brokers: the live brokers of ``broker.cluster`` (server/cluster.py), each at its
  advertised host and port on the listener the request came in on (one without that listener is
  left out, as Kafka does), with its rack; is_fenced false (v2: a broker whose lease lapsed is no
  longer live, so include_fenced_brokers changes nothing).  controller_id is the cluster's, as a
  KRaft broker reports a live broker.  With the local engine: this node alone, the controller.
- endpoint_type (v1+): 1 (brokers) is served; 2 (controllers) → MISMATCHED_ENDPOINT_TYPE (114),
  anything else → UNSUPPORTED_ENDPOINT_TYPE (115), each with Kafka's message and no other data.
  (v0 requests carry no endpoint type: always brokers.)
- cluster_authorized_operations: Kafka's "not requested" value -2147483648 unless asked for.
- ACLs (as Kafka's AuthHelper): none to describe the cluster.  When
  include_cluster_authorized_operations is set: Describe on the cluster (a denial is counted),
  then the bit set of the cluster operations the principal may do; without Describe, 0.
"""
from __future__ import annotations

from trireme.server.authorized_operations import authorized_operations
from trireme.server.dispatch import handles
from trireme.server.routing import listed_brokers
from trireme.state.acls import CLUSTER_NAME, Operation, ResourceType
from trireme.wire import error_codes as E

ENDPOINT_BROKERS = 1
ENDPOINT_NAMES = {1: "BROKER", 2: "CONTROLLER"}


@handles("DescribeCluster", 0, 2)
def describe_cluster(ctx, request):
    broker = ctx.broker
    response = ctx.response()
    requested = request.endpoint_type
    if requested != ENDPOINT_BROKERS:
        if requested in ENDPOINT_NAMES:
            response.error_code = E.MISMATCHED_ENDPOINT_TYPE.code
            response.error_message = (f"The request was sent to an endpoint of type BROKER, but we wanted an "
                                      f"endpoint of type {ENDPOINT_NAMES[requested]}")
        else:
            response.error_code = E.UNSUPPORTED_ENDPOINT_TYPE.code
            response.error_message = f"Unsupported endpoint type {requested}"
        return response
    response.endpoint_type = ENDPOINT_BROKERS
    response.cluster_id = broker.cluster_id
    response.controller_id = broker.cluster.controller_id
    response.brokers = [type(response).DescribeClusterBroker(broker_id=b.node_id, host=b.host, port=b.port,
                                                             rack=b.rack, is_fenced=False)
                        for b in listed_brokers(ctx)]      # at their addresses on the request's listener
    if request.include_cluster_authorized_operations:
        response.cluster_authorized_operations = (
            authorized_operations(ctx, ResourceType.CLUSTER, CLUSTER_NAME)
            if ctx.authorize(Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME) else 0)
    return response
