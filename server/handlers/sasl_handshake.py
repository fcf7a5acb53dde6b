"""SaslHandshake: there is no SASL listener, so the handshake is refused as Kafka's request handler refuses it.

Behaviour / version notes:
- v0-1.  On a Kafka broker a SASL listener completes the handshake before requests reach the request
  handler; one that gets there (a PLAINTEXT listener, the only kind here) is answered
  ILLEGAL_SASL_STATE with no mechanisms.  Clients configured for SASL fail with an authentication
  error instead of a closed connection.  Until SASL exists (the security issue).
"""
from __future__ import annotations

from trireme.server.dispatch import handles
from trireme.wire import error_codes as E


@handles("SaslHandshake", 0, 1)
def sasl_handshake(ctx, request):
    return ctx.response(error_code=E.ILLEGAL_SASL_STATE.code, mechanisms=[])
