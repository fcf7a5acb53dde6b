"""AllocateProducerIds: the controller reserves a block of producer ids for a broker that asks (KIP-730), so that no two brokers ever hand out the same id.

Behaviour / version notes:
- v0, as Kafka's controllers serve it; not listed by ApiVersions (Kafka's brokers do not list it to clients).
- Brokers of a cluster on the PostgreSQL engine send it to the controller (server/broker.py,
  Broker.producer_ids_ready) when their own blocks run low; the controller writes the reservation (a
  ProducerIdsRecord naming the broker) to ``__cluster_metadata`` and answers once it is durable with the
  block: ProducerIdStart and ProducerIdLen.  The asking broker hands out ids from it at once; its copy of the
  metadata log replays the same reservation later, which changes nothing.
- Errors: a principal without ClusterAction on the cluster → CLUSTER_AUTHORIZATION_FAILED (as Kafka: only
  brokers may ask); a broker that is not the controller → NOT_CONTROLLER, and a BrokerId that is not a live
  broker of the cluster → BROKER_ID_NOT_REGISTERED, both retriable for the asking broker; the metadata log
  not writable → NOT_CONTROLLER too (the asker tries again); the id space exhausted → UNKNOWN_SERVER_ERROR.
"""
from __future__ import annotations

from trireme.server.cluster_metadata import MetadataUnavailable
from trireme.server.deferred import Deferred
from trireme.server.dispatch import handles
from trireme.state.acls import CLUSTER_NAME, Operation, ResourceType
from trireme.state.producer_ids import ProducerIdError
from trireme.wire import error_codes as E


@handles("AllocateProducerIds", 0, 0, advertised=False)
def allocate_producer_ids(ctx, request):
    broker = ctx.broker

    def refused(code: int):
        return ctx.response(error_code=code, producer_id_start=-1, producer_id_len=0)
    if not ctx.authorize(Operation.CLUSTER_ACTION, ResourceType.CLUSTER, CLUSTER_NAME):
        return refused(E.CLUSTER_AUTHORIZATION_FAILED.code)
    if broker.cluster.controller_id != broker.node_id:
        return refused(E.NOT_CONTROLLER.code)
    if broker.cluster.broker(request.broker_id) is None:
        broker.poll_cluster_soon()          # a broker registered since the last poll, most likely
        return refused(E.BROKER_ID_NOT_REGISTERED.code)
    ids = broker.producer_ids

    async def allocate():
        try:
            start = await broker.cluster_metadata.update(lambda: ids.reserve_for(request.broker_id))
        except MetadataUnavailable:
            return refused(E.NOT_CONTROLLER.code)
        except ProducerIdError:
            return refused(E.UNKNOWN_SERVER_ERROR.code)
        return ctx.response(error_code=0, producer_id_start=start, producer_id_len=ids.block_size)
    return Deferred(allocate)
