"""The server side of each SASL mechanism (PLAIN, SCRAM-SHA-256/512, OAUTHBEARER) as Kafka's SaslServers behave, and the client side of PLAIN and SCRAM.

``await evaluate(token) -> bytes`` takes one client token and returns the server's; after the last one ``complete`` is
true and ``user`` / ``lifetime_ms`` (the credential's expiry, ms since the epoch, or None) are set.  A refusal raises
SaslFailure: with ``client_message`` the client sees that text (Kafka's SaslAuthenticationException), without it the
standard "invalid credentials" text (Kafka's SaslException, whose detail stays on the server); ``reason`` is for the
log and never holds a secret.

:func:`client_tokens` is the client side (the admin command line's and a broker's to another broker): the tokens of
PLAIN / SCRAM-SHA-256/512 for a username and password, whoever carries them in SaslAuthenticate requests.
"""
from __future__ import annotations

import hmac
import re

import trio

from .clock import now_ms
from .oauthbearer import TokenInvalid

PLAIN, SCRAM_SHA_256, SCRAM_SHA_512, OAUTHBEARER = "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"
MECHANISMS = (PLAIN, SCRAM_SHA_256, SCRAM_SHA_512, OAUTHBEARER)
MAX_LOGGED_NAME = 128
# PBKDF2 checks of the PLAIN credentials file at once per broker (worker threads); the rest wait their turn.
CHECK_THREADS = 2


class SaslFailure(Exception):
    """An authentication refused: ``reason`` for the log, ``client_message`` (or None: the standard one) for the client."""

    def __init__(self, reason: str, client_message: str | None = None):
        super().__init__(reason)
        self.reason = reason
        self.client_message = client_message


class SaslClientError(Exception):
    """The client side of an exchange cannot go on: the server's message is not one the mechanism expects."""


CLIENT_MECHANISMS = (PLAIN, SCRAM_SHA_256, SCRAM_SHA_512)


def client_tokens(mechanism: str, username: str, password: str):
    """The client's tokens of one authentication as a generator: ``next()`` gives the first token; ``send(answer)``
    (the server's auth bytes) gives the next one, and ends the generator (StopIteration) when the client has
    nothing more to send; SaslClientError when the server's answer does not verify (SCRAM's signature)."""
    if mechanism == PLAIN:
        yield b"\0" + username.encode() + b"\0" + password.encode()
        return
    import scramp
    try:
        client = scramp.ScramClient([mechanism], username, password)
        server_first = yield client.get_client_first().encode()
        client.set_server_first(server_first.decode())
        server_final = yield client.get_client_final().encode()
        client.set_server_final(server_final.decode())
    except scramp.ScramException as e:
        raise SaslClientError(str(e)) from None
    except UnicodeDecodeError:
        raise SaslClientError("the broker's message is not UTF-8") from None


def printable(name: str | None) -> str:
    """A client-given name as it may appear in a log line: bounded, control characters escaped."""
    if name is None:
        return "-"
    shown = name[:MAX_LOGGED_NAME].encode("unicode_escape").decode("ascii")
    return shown + ("..." if len(name) > MAX_LOGGED_NAME else "")


class PlainServer:
    """RFC 4616 ``[authzid] NUL authcid NUL passwd`` checked against the JAAS ``user_<name>`` options, then the hashed
    credentials file (Kafka's PlainSaslServer and PlainServerCallbackHandler, messages included)."""

    mechanism = PLAIN

    def __init__(self, jaas_users: dict[str, str], credentials_file, check_threads: trio.CapacityLimiter | None = None):
        self.jaas_users = jaas_users
        self.credentials_file = credentials_file
        self.check_threads = check_threads
        self.complete = False
        self.user: str | None = None
        self.attempted_user: str | None = None
        self.lifetime_ms = None

    def checks(self, token: bytes) -> bool:
        """Whether evaluating ``token`` may check a credential (the failed-login limit is asked then)."""
        return True

    async def evaluate(self, token: bytes) -> bytes:
        if self.complete:
            raise SaslFailure("token after PLAIN completed")
        text = token.decode("utf-8", "replace")
        fields = text.split("\0", 2) + ["", ""]         # Kafka: up to three fields, missing ones empty
        authzid, username, password = fields[0], fields[1], fields[2]
        self.attempted_user = username or None
        if not username:
            raise SaslFailure("Authentication failed: username not specified")
        if not password:
            raise SaslFailure("Authentication failed: password not specified")
        if not await self._check(username, password):
            raise SaslFailure("invalid username or password", "Authentication failed: Invalid username or password")
        if authzid and authzid != username:
            raise SaslFailure("authorization id differs from the user name", "Authentication failed: Client "
                              "requested an authorization id that is different from username")
        self.user = username
        self.complete = True
        return b""

    async def _check(self, username: str, password: str) -> bool:
        expected = self.jaas_users.get(username)
        if expected is not None:
            return hmac.compare_digest(expected.encode("utf-8"), password.encode("utf-8"))
        if self.credentials_file is None:
            return False
        from . import plain_credentials
        limiter = self.check_threads or trio.CapacityLimiter(CHECK_THREADS)
        try:        # reading the file again (when it changed) and PBKDF2 both in a worker thread
            return await trio.to_thread.run_sync(self._check_file, username, password, limiter=limiter)
        except (OSError, plain_credentials.CredentialsError) as e:
            raise SaslFailure(f"credentials file unreadable: {e}", "Authentication failed: credentials for user "
                              "could not be verified") from None

    def _check_file(self, username: str, password: str) -> bool:
        from . import plain_credentials
        stored = self.credentials_file.lookup(username)
        if stored is None:          # as long as a known user's check: the answer's time does not tell who exists
            plain_credentials.verify(self.credentials_file.decoy(), password)
            return False
        return plain_credentials.verify(stored, password)


class ScramServer:
    """RFC 5802/7677 with scramp against ``security.scram_credential(user, mechanism)``; as Kafka, only the "n,,"
    GS2 header, an authorization id only if it is the user name, and Kafka's tokenauth extension (delegation
    tokens) refused."""

    def __init__(self, mechanism: str, security):
        import scramp
        self.mechanism = mechanism
        self.security = security
        self._scramp = scramp
        self._server = scramp.ScramMechanism(mechanism).make_server(self._credential)
        self.complete = False
        self.first_done = False
        self.user: str | None = None
        self.attempted_user: str | None = None
        self.lifetime_ms = None

    def _credential(self, username: str):
        credential = self.security.scram_credential(username, self.mechanism)
        if credential is None:
            return None
        return (bytes(credential.salt), bytes(credential.stored_key), bytes(credential.server_key),
                int(credential.iterations))

    def checks(self, token: bytes) -> bool:
        """Every round (the client-final's proof is the check; the client-first's refuses an unknown user)."""
        return True

    async def evaluate(self, token: bytes) -> bytes:
        try:
            text = token.decode("utf-8")
        except UnicodeDecodeError:
            raise SaslFailure("SCRAM message is not UTF-8") from None
        if self.complete:
            raise SaslFailure("token after SCRAM completed")
        if not self.first_done:
            return self._client_first(text)
        try:
            self._server.set_client_final(text)
            final = self._server.get_server_final()
        except self._scramp.ScramException as e:
            raise SaslFailure(f"client final message refused: {e}") from None
        self.complete = True
        self.user = self.attempted_user
        return final.encode("utf-8")

    def _client_first(self, text: str) -> bytes:
        gs2_flag, sep, rest = text.partition(",")
        authzid, sep2, bare = rest.partition(",")
        if not sep or not sep2:
            raise SaslFailure("Invalid SCRAM client first message format")
        attributes = bare.split(",")
        name = next((a[2:] for a in attributes if a.startswith("n=")), None)
        self.attempted_user = None if name is None else name.replace("=2C", ",").replace("=3D", "=")
        if any(a.split("=", 1)[0] == "tokenauth" and a.split("=", 1)[-1].lower() == "true" for a in attributes):
            raise SaslFailure("delegation token authentication (tokenauth) is not supported")
        requested = authzid[2:].replace("=2C", ",").replace("=3D", "=") if authzid.startswith("a=") else ""
        if requested and requested != self.attempted_user:
            raise SaslFailure("authorization id differs from the user name", "Authentication failed: Client "
                              "requested an authorization id that is different from username")
        try:        # (scramp refuses any authorization id, even the user's own, which Kafka accepts)
            self._server.set_client_first(text)
            first = self._server.get_server_first()
        except self._scramp.ScramException as e:
            raise SaslFailure(f"client first message refused: {e}") from None
        self.first_done = True
        return first.encode("utf-8")


# Kafka's OAuthBearerClientInitialResponse: gs2 header with an optional authzid, then \x01-separated key=value pairs.
_SASLNAME = r"(?:[\x01-\x2b\x2d-\x3c\x3e-\x7f]|=2C|=3D)+"
_CLIENT_INITIAL_RESPONSE = re.compile(
    r"n,(?:a=(?P<authzid>%s))?,\x01(?P<kvpairs>(?:[A-Za-z]+=[\x21-\x7e \t\r\n]+\x01)*)\x01" % _SASLNAME)
_AUTH = re.compile(r"(?P<scheme>\w+) +(?P<token>[-_.a-zA-Z0-9]+)")


class OAuthBearerServer:
    """RFC 7628 initial response validated by the listener's validator; a refused token is answered with the JSON
    error, and the client's ``\\x01`` reply to it ends the exchange with SASL_AUTHENTICATION_FAILED carrying that JSON
    (Kafka's OAuthBearerSaslServer)."""

    mechanism = OAUTHBEARER

    def __init__(self, validator):
        self.validator = validator
        self.complete = False
        self.user: str | None = None
        self.attempted_user: str | None = None
        self.lifetime_ms: int | None = None
        self.error: str | None = None
        self.error_reason: str | None = None

    def checks(self, token: bytes) -> bool:
        """Every token but the client's ``\x01`` acknowledging a refused one (that refusal was the check)."""
        return not (token == b"\x01" and self.error is not None)

    async def evaluate(self, token: bytes) -> bytes:
        if token == b"\x01" and self.error is not None:
            raise SaslFailure(f"token refused: {self.error_reason}", self.error)
        self.error = None
        if self.complete:
            raise SaslFailure("token after OAUTHBEARER completed")
        try:
            text = token.decode("utf-8")
        except UnicodeDecodeError:
            raise SaslFailure("Invalid OAUTHBEARER client first message") from None
        match = _CLIENT_INITIAL_RESPONSE.fullmatch(text)
        if match is None:
            raise SaslFailure("Invalid OAUTHBEARER client first message")
        pairs = dict(p.split("=", 1) for p in match.group("kvpairs").split("\x01") if p)
        auth = pairs.get("auth")
        if auth is None:
            raise SaslFailure("Invalid OAUTHBEARER client first message: 'auth' not specified")
        auth_match = _AUTH.fullmatch(auth)
        if auth_match is None:
            raise SaslFailure("Invalid OAUTHBEARER client first message: invalid 'auth' format")
        if auth_match.group("scheme").lower() != "bearer":
            raise SaslFailure(f"Invalid scheme in OAUTHBEARER client first message: {auth_match.group('scheme')[:32]}")
        try:
            principal, expiry_ms = await self.validator.validate(auth_match.group("token"), now_ms())
        except TokenInvalid as e:
            self.error = e.json_error()
            self.error_reason = e.reason
            return self.error.encode("utf-8")
        self.attempted_user = principal
        authzid = match.group("authzid")
        if authzid:
            authzid = authzid.replace("=2C", ",").replace("=3D", "=")
            if authzid != principal:
                raise SaslFailure("authorization id differs from the token's principal", "Authentication failed: "
                                  f"Client requested an authorization id ({authzid}) that is different from the "
                                  f"token's principal name ({principal})")
        self.user = principal
        self.lifetime_ms = expiry_ms
        self.complete = True
        return b""
