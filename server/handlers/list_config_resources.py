"""ListConfigResources (v0: ListClientMetricsResources): the resources DescribeConfigs can be asked about.

Behaviour / version notes:
- v0-1.  v0 lists client-metrics subscriptions only: there are none.
- v1 (KIP-1142): ResourceTypes empty means every type Kafka supports here: TOPIC (2), BROKER
  (4), BROKER_LOGGER (8), CLIENT_METRICS (16), GROUP (32).  Any other type fails the whole
  request with UNSUPPORTED_VERSION and no resources, as Kafka does.
- Listed, in Kafka's order: GROUP — groups with dynamic configs (none: group configs cannot be
  set here); CLIENT_METRICS — none; BROKER_LOGGER and BROKER — this node's id; TOPIC — every
  topic, the internal ones included, sorted by name.
- ACLs (as Kafka's KafkaApis): DescribeConfigs on the cluster before anything else, else
  CLUSTER_AUTHORIZATION_FAILED and no resources.
"""
from __future__ import annotations

from trireme.server.dispatch import handles
from trireme.state.acls import CLUSTER_NAME, Operation, ResourceType
from trireme.wire import error_codes as E

TOPIC, BROKER, BROKER_LOGGER, CLIENT_METRICS, GROUP = 2, 4, 8, 16, 32
SUPPORTED = (TOPIC, BROKER, BROKER_LOGGER, CLIENT_METRICS, GROUP)


@handles("ListConfigResources", 0, 1)
def list_config_resources(ctx, request):
    broker = ctx.broker
    response = ctx.response(error_code=0, config_resources=[])
    if not ctx.authorize(Operation.DESCRIBE_CONFIGS, ResourceType.CLUSTER, CLUSTER_NAME):
        response.error_code = E.CLUSTER_AUTHORIZATION_FAILED.code
        return response
    if ctx.api_version == 0:
        return response                      # client-metrics subscriptions: none
    wanted = set(request.resource_types) or set(SUPPORTED)
    if not wanted <= set(SUPPORTED):
        response.error_code = E.UNSUPPORTED_VERSION.code
        return response
    rcls = type(response).ConfigResource
    node = str(broker.node_id)
    names = {
        GROUP: [], CLIENT_METRICS: [], BROKER_LOGGER: [node], BROKER: [node],
        TOPIC: sorted(t.name for t in broker.described_topics()),
    }
    for resource_type in (GROUP, CLIENT_METRICS, BROKER_LOGGER, BROKER, TOPIC):
        if resource_type in wanted:
            response.config_resources.extend(rcls(resource_name=n, resource_type=resource_type)
                                             for n in names[resource_type])
    return response
