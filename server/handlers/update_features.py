"""UpdateFeatures: change a finalized feature level (KIP-584), e.g. ``transaction.version`` for transactions V2.

Behaviour / version notes:
- v0-2, as a KRaft controller answers it: every update is checked first and nothing changes unless
  all are valid (FeatureLevelRecords made durable in __cluster_metadata, then the new levels and a raised
  finalized-features epoch show in ApiVersions).  v0's AllowDowngrade is upgrade type 2 (safe
  downgrade) when true; v1+ carry UpgradeType (1 upgrade, 2 safe, 3 unsafe downgrade) and
  ValidateOnly.  A level below 1 removes the feature (level 0).
- Errors: an unknown feature, a level outside what this node supports, or a lower level with upgrade
  type 1 → INVALID_UPDATE_VERSION as the top-level error with a message (v2 prefixes it with the
  feature's name, as Kafka).  On success v0-1 list each feature with NONE; v2 has no per-feature
  results.
- Changing transaction.version applies to transactions from then on: a Java 4.x producer switches
  protocol between transactions once a new connection's ApiVersions shows the level; a transaction
  in progress ends under the protocol it started with.
- ACLs (as Kafka's controller): Alter on the cluster, else top-level CLUSTER_AUTHORIZATION_FAILED
  "Cluster authorization failed." with no per-feature results, and nothing changes.
"""
from trireme.server.dispatch import handles
from trireme.server.cluster_metadata import MetadataUnavailable
from trireme.server.deferred import Deferred
from trireme.state.acls import CLUSTER_NAME, Operation, ResourceType
from trireme.wire import error_codes as E

from .elect_leaders import CLUSTER_AUTHORIZATION_MESSAGE
from trireme.state.features import SAFE_DOWNGRADE, TRANSACTION_VERSION, UPGRADE, FeatureUpdate

RESULTS_UNTIL = 1


@handles("UpdateFeatures", 0, 2)
def update_features(ctx, request):
    broker = ctx.broker
    version = ctx.api_version
    response = ctx.response(error_message=None)
    if not ctx.authorize(Operation.ALTER, ResourceType.CLUSTER, CLUSTER_NAME):
        response.error_code = E.CLUSTER_AUTHORIZATION_FAILED.code
        response.error_message = CLUSTER_AUTHORIZATION_MESSAGE
        response.results = []
        return response
    updates = [FeatureUpdate(u.feature, u.max_version_level,
                             u.upgrade_type if version >= 1 else (SAFE_DOWNGRADE if u.allow_downgrade else UPGRADE))
               for u in request.feature_updates]

    def decide():
        failed = [(feature, problem) for feature, problem in broker.features.validate(updates).items() if problem]
        if failed:
            return [], failed[0]
        if version >= 1 and request.validate_only:
            return [], None
        return broker.features.apply(updates)[0], None

    async def update():
        try:
            refused = await broker.cluster_metadata.update(decide)
        except MetadataUnavailable as e:
            response.error_code = E.KAFKA_STORAGE_ERROR.code
            response.error_message = f"feature levels not stored: {e}"
            return response
        if refused:
            feature, (code, message) = refused
            response.error_code = code
            response.error_message = f"{feature}:{message}" if version > RESULTS_UNTIL else message
            return response
        broker.transactions.set_transaction_version(broker.features.level(TRANSACTION_VERSION))
        if version <= RESULTS_UNTIL:
            cls = type(response).UpdatableFeatureResult
            response.results = [cls(feature=u.feature, error_code=0, error_message=None) for u in updates]
        return response
    return Deferred(update)
