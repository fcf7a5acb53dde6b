"""ApiVersions: which APIs and versions this broker serves, built from what the handlers declare.

Behaviour / version notes:
- v0-4.  The response header is always v0 (no tagged fields), even for v3+.
- A version we don't know is answered in v0 layout with UNSUPPORTED_VERSION and, as Kafka, only
  ApiVersions' own range (see server/connection.py), so the client retries at a version we have.
- A version Kafka's definition marks unstable (InitProducerId v6) is listed, and served, only with
  ``unstable.api.versions.enable`` (Kafka's internal property of that name); without it a request at
  that version closes the connection, as Kafka does with a version that is not enabled.
- v3+ carries the client's software name and version; they must match Kafka's pattern, else
  INVALID_REQUEST; they are remembered on the connection for the logs.
- v3+ list the features this node supports (``transaction.version`` 0-2) and the finalized levels
  above 0 with their epoch (state/features.py).  As Kafka since KAFKA-17492, a supported feature
  whose minimum is 0 is left out below v4 (older clients refuse a range starting at 0).  The Java
  4.x client runs transactions V2 once it sees transaction.version >= 2 finalized; a level change
  raises the epoch, which it notices on its next ApiVersions (a new connection).
"""
import re

from trireme.server.connection import api_version_entries
from trireme.server.dispatch import handles
from trireme.state.features import SUPPORTED
from trireme.wire import error_codes as E

ZERO_MIN_FEATURES_SINCE = 4

_SOFTWARE = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?")


@handles("ApiVersions", 0, 4)
def api_versions(ctx, request):
    response = ctx.response()
    if ctx.api_version >= 3:
        conn = ctx.connection
        conn.client_software_name = request.client_software_name
        conn.client_software_version = request.client_software_version
        if not (_SOFTWARE.fullmatch(request.client_software_name or "")
                and _SOFTWARE.fullmatch(request.client_software_version or "")):
            response.error_code = E.INVALID_REQUEST.code
            return response
    response.api_keys = api_version_entries(type(response).ApiVersion, ctx.connection.unstable_api_versions)
    if ctx.api_version >= 3:
        cls = type(response)
        response.supported_features = [
            cls.SupportedFeatureKey(name=name, min_version=low, max_version=high)
            for name, (low, high) in SUPPORTED.items() if low > 0 or ctx.api_version >= ZERO_MIN_FEATURES_SINCE]
        features = ctx.broker.features
        response.finalized_features_epoch = features.epoch
        response.finalized_features = [cls.FinalizedFeatureKey(name=name, max_version_level=level,
                                                                min_version_level=level)
                                       for name, level in features.finalized().items()]
    return response
