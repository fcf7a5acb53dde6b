"""AlterClientQuotas: set or remove client quotas (producer_byte_rate, consumer_byte_rate, request_percentage) of user / client-id entities.

Behaviour / version notes:
- v0-1.  Needs AlterConfigs on the cluster: without it every entry → CLUSTER_AUTHORIZATION_FAILED and
  nothing changes.
- One result per entry, in order, echoing its entity (an entity type named twice counts once, the last
  name winning, as Kafka reads the entity into a map).  Each entry is checked as Kafka's
  ClientQuotaControlManager checks it → INVALID_REQUEST with Kafka's message: an empty entity, an
  unknown entity type, an empty name, ip with user or client-id, an ip that is not an address literal,
  a quota key not among the three (controller_mutation_rate and the ip entity's
  connection_creation_rate are not enforced here, so they are unknown keys), a value not above 0, a
  fractional byte rate, the same key twice in one entry, the same entity twice in one request (the
  later one).  An entry that would give quotas to one more entity than
  trireme.max.client.quota.entities (100,000; Kafka has no bound) → POLICY_VIOLATION.  A refused entry
  changes nothing; the others are applied.
- ``remove`` drops a key (removing one that is not set is no error); a value equal to the one set
  writes nothing.  validate_only answers the same and changes nothing.
- The changes are records of the "client quotas" section of the security metadata
  (state/client_quotas.py), decided on the state every earlier change left, written and replayed
  (Security.update: appended to __cluster_metadata, made durable, replayed) before the answer; the
  quotas every connection's enforcement reads (server/quotas.py) are that state.  If the log cannot
  be written, every entry → KAFKA_STORAGE_ERROR and nothing changes.
"""
from __future__ import annotations

from trireme.server.cluster_metadata import MetadataUnavailable
from trireme.server.deferred import Deferred
from trireme.server.dispatch import handles
from trireme.state.acls import CLUSTER_NAME, Operation, ResourceType
from trireme.wire import error_codes as E


@handles("AlterClientQuotas", 0, 1)
def alter_client_quotas(ctx, request):
    response = ctx.response(throttle_time_ms=0)
    ecls = type(response).EntryData

    def entity_of(entry):
        return [ecls.EntityData(entity_type=e.entity_type, entity_name=e.entity_name) for e in entry.entity]

    if not ctx.authorize(Operation.ALTER_CONFIGS, ResourceType.CLUSTER, CLUSTER_NAME):
        error = E.CLUSTER_AUTHORIZATION_FAILED
        response.entries = [ecls(error_code=error.code, error_message="Cluster authorization failed.",
                                 entity=entity_of(entry)) for entry in request.entries]
        return response
    security = ctx.broker.security
    entries = [([(e.entity_type, e.entity_name) for e in entry.entity],
                [(op.key, op.value, op.remove) for op in entry.ops]) for entry in request.entries]

    def answer(results):
        response.entries = [ecls(error_code=0 if error is None else getattr(E, error).code, error_message=message,
                                 entity=entity_of(entry))
                            for entry, (error, message) in zip(request.entries, results)]
        return response

    if request.validate_only:
        return answer(security.client_quotas.alter(entries)[0])

    def decide():
        results, records = security.client_quotas.alter(entries)
        return records, results

    async def alter():
        try:
            return answer(await security.update(decide))
        except MetadataUnavailable as e:
            return answer([("KAFKA_STORAGE_ERROR", f"quotas not stored: {e}")] * len(request.entries))
    return Deferred(alter)
