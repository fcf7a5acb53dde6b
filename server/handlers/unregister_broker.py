"""UnregisterBroker: remove a broker's registration (`kafka-cluster.sh unregister`); this node is the only broker and is running.

Behaviour / version notes:
- v0, as a Kafka 4 broker lists it (forwarded to the controller there).
- Another broker id → BROKER_ID_NOT_REGISTERED "Broker ID <id> is not currently registered", Kafka's
  answer for an id it does not know.
- This node's id → INVALID_REQUEST with a message: Kafka would drop the registration of a live broker
  (meant for brokers gone for good); on one node that would leave every partition without a leader,
  so it is refused and nothing changes.
- ACLs (as Kafka's controller): Alter on the cluster first, else CLUSTER_AUTHORIZATION_FAILED
  with a null message.
"""
from __future__ import annotations

from trireme.server.dispatch import handles
from trireme.state.acls import CLUSTER_NAME, Operation, ResourceType
from trireme.wire import error_codes as E


@handles("UnregisterBroker", 0, 0)
def unregister_broker(ctx, request):
    broker_id = request.broker_id
    if not ctx.authorize(Operation.ALTER, ResourceType.CLUSTER, CLUSTER_NAME):
        return ctx.response(error_code=E.CLUSTER_AUTHORIZATION_FAILED.code, error_message=None)
    if broker_id == ctx.broker.node_id:
        return ctx.response(error_code=E.INVALID_REQUEST.code,
                            error_message=f"Broker {broker_id} is this node, the cluster's only broker, and it is "
                                          f"running: it cannot be unregistered.")
    return ctx.response(error_code=E.BROKER_ID_NOT_REGISTERED.code,
                        error_message=f"Broker ID {broker_id} is not currently registered")
