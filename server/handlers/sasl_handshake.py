"""SaslHandshake: the first step of SASL authentication on a SASL listener (server/authentication.py).

Behaviour / version notes:
- v0-1.  On a SASL_PLAINTEXT/SASL_SSL listener the connection's Authenticator answers: the mechanism if enabled
  (with the enabled list), else UNSUPPORTED_SASL_MECHANISM with that list and the connection closed after
  connection.failed.authentication.delay.ms, as Kafka's SaslServerAuthenticator.  v0 means the SASL tokens that
  follow come raw, without Kafka headers; v1 in SaslAuthenticate requests.
- Where Kafka's request handler gets it (a PLAINTEXT/SSL listener, or after authentication without a
  re-authentication due) the answer is ILLEGAL_SASL_STATE with no mechanisms.
"""
from __future__ import annotations

from trireme.server.dispatch import handles
from trireme.wire import error_codes as E


@handles("SaslHandshake", 0, 1)
def sasl_handshake(ctx, request):
    authenticator = getattr(ctx.connection, "authentication", None)
    if authenticator is None:
        return ctx.response(error_code=E.ILLEGAL_SASL_STATE.code, mechanisms=[])
    return authenticator.handshake(ctx, request)
