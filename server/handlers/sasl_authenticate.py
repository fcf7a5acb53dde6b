"""SaslAuthenticate: there is no SASL listener, so authentication is refused as Kafka's request handler refuses it.

Behaviour / version notes:
- v0-2.  ILLEGAL_SASL_STATE with a message, empty auth bytes, session lifetime 0 — what a Kafka
  broker's request handler answers, where SaslAuthenticate only arrives once no SASL exchange is
  going on.  Until SASL exists (the security issue).
"""
from __future__ import annotations

from trireme.server.dispatch import handles
from trireme.wire import error_codes as E


@handles("SaslAuthenticate", 0, 2)
def sasl_authenticate(ctx, request):
    return ctx.response(error_code=E.ILLEGAL_SASL_STATE.code, auth_bytes=b"", session_lifetime_ms=0,
                        error_message="SASL is not enabled on this listener (PLAINTEXT)")
