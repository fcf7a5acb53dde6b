"""ApiVersions: which APIs and versions this broker serves, built from what the handlers declare.

Behaviour / version notes:
- v0-4.  The response header is always v0 (no tagged fields), even for v3+.
- A version we don't know is answered in v0 layout with UNSUPPORTED_VERSION and our ranges
  (see server/connection.py), so the client retries at a version we have.
- v3+ carries the client's software name and version; they must match Kafka's pattern, else
  INVALID_REQUEST; they are remembered on the connection for the logs.
- No SupportedFeatures/FinalizedFeatures are listed: we advertise no feature levels, so Java
  4.x clients stay on transactions V1 (KIP-890 part 2 is not offered).
"""
import re

from trireme.server.connection import api_version_entries
from trireme.server.dispatch import handles
from trireme.wire import error_codes as E

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
    response.api_keys = api_version_entries(type(response).ApiVersion)
    return response
