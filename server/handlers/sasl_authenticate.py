"""SaslAuthenticate: one SASL token of the exchange SaslHandshake v1 began (server/authentication.py).

Behaviour / version notes:
- v0-2.  The connection's Authenticator evaluates the token with the mechanism's server (PLAIN, SCRAM-SHA-256/512,
  OAUTHBEARER) and answers its token; the last answer of v1+ carries session_lifetime_ms (KIP-368).  A refusal is
  SASL_AUTHENTICATION_FAILED with Kafka's message, sent after connection.failed.authentication.delay.ms, and the
  connection closes.
- Where Kafka's request handler gets it (a PLAINTEXT/SSL listener, or after authentication) the answer is
  ILLEGAL_SASL_STATE with its message, "SaslAuthenticate request received after successful authentication".
"""
from __future__ import annotations

from trireme.server.dispatch import handles
from trireme.wire import error_codes as E


@handles("SaslAuthenticate", 0, 2)
def sasl_authenticate(ctx, request):
    authenticator = getattr(ctx.connection, "authentication", None)
    if authenticator is None:
        return ctx.response(error_code=E.ILLEGAL_SASL_STATE.code, auth_bytes=b"", session_lifetime_ms=0,
                            error_message="SaslAuthenticate request received after successful authentication")
    return authenticator.authenticate(ctx, request)
