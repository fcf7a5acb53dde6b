"""SASL authentication of a connection on a SASL_PLAINTEXT / SASL_SSL listener, as Kafka's SaslServerAuthenticator.

Each such connection has an :class:`Authenticator`; the connection's dispatch asks it (:meth:`Authenticator.gate`)
about every frame.  Before authentication only ApiVersions (first), SaslHandshake and SaslAuthenticate pass; any
other request closes the connection with one log line.  After SaslHandshake v0 the client's frames are raw SASL
tokens without a Kafka header, answered with raw tokens (the gate answers them itself).  A failed authentication
answers its error after ``connection.failed.authentication.delay.ms`` and closes the connection; failures are
counted per client address, and an address over ``trireme.sasl.failed.authentications.per.minute`` is refused
without its credentials being looked at.  Success sets ``conn.principal`` ("User:<name>").  KIP-368: a session has
a lifetime (``connections.max.reauth.ms`` and the credential's own expiry); the client re-authenticates on the same
connection with the same principal, and a request other than SaslHandshake after the session expired closes it.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import time

import trio

from trireme.wire import error_codes as E
from trireme.wire import headers
from trireme.wire.primitives import CodecError

from . import jaas, sasl_mechanisms
from .deferred import Deferred
from .dispatch import HANDLERS, CloseConnection
from .sasl_mechanisms import MECHANISMS, OAUTHBEARER, PLAIN, SaslFailure

log = logging.getLogger("trireme.authentication")

SASL_PROTOCOLS = ("SASL_PLAINTEXT", "SASL_SSL")
MAX_MECHANISM_CHARS = 64             # a requested mechanism name longer than this is refused as unsupported
MAX_ROUNDS = 16                      # SaslAuthenticate rounds of one authentication (SCRAM needs 2, the rest 1-2)
MIN_REAUTH_INTERVAL_S = 1.0          # Kafka: a re-authentication at most once a second
FAILURE_WINDOW_S = 60.0
MAX_TRACKED_ADDRESSES = 10_000       # failed-login history kept for at most this many client addresses
DEFAULT_MAX_RECEIVE = 524288         # sasl.server.max.receive.size's default
MAX_SESSION_LIFETIME_MS = 2**63 - 1   # SaslAuthenticate's session_lifetime_ms is an int64

# Gate verdicts besides None (dispatch the request as usual) and bytes (a raw token to send).
NO_ANSWER = object()

INITIAL, HANDSHAKE, AUTHENTICATE, COMPLETE, FAILED, REAUTH_BAD_MECHANISM = (
    "INITIAL", "HANDSHAKE", "AUTHENTICATE", "COMPLETE", "FAILED", "REAUTH_BAD_MECHANISM")

_API_VERSIONS = headers.API_VERSIONS_KEY
_SASL_HANDSHAKE = 17
_SASL_AUTHENTICATE = 36


class SaslConfigError(ValueError):
    """The SASL settings of a listener cannot work (one line for the log)."""


@dataclasses.dataclass(frozen=True)
class ListenerStandIn:
    """What ``conn.listener`` holds (the listener a connection came in on); PLAINTEXT when a connection has none."""
    name: str = "PLAINTEXT"
    security_protocol: str = "PLAINTEXT"


PLAINTEXT_LISTENER = ListenerStandIn()


def _int(value, name: str, low: int = 0) -> int:
    try:
        number = int(str(value).strip())
    except ValueError:
        raise SaslConfigError(f"{name} must be an integer, not {value!r}") from None
    if number < low:
        raise SaslConfigError(f"{name} must be at least {low}, not {number}")
    return number


class ListenerSasl:
    """A listener's SASL settings, from Kafka's properties with their per-listener overrides (Config.for_listener)."""

    def __init__(self, config, listener: str):
        self.listener = listener
        raw = config.for_listener(listener, "sasl.enabled.mechanisms") or ""
        self.mechanisms = list(dict.fromkeys(m.strip() for m in str(raw).split(",") if m.strip()))
        if not self.mechanisms:
            raise SaslConfigError(f"listener {listener}: sasl.enabled.mechanisms is empty")
        unsupported = [m for m in self.mechanisms if m not in MECHANISMS]
        if unsupported:
            raise SaslConfigError(f"listener {listener}: sasl.enabled.mechanisms: {', '.join(unsupported)} not "
                                  f"supported (Trireme has {', '.join(MECHANISMS)})")
        self.max_receive = _int(config.for_listener(listener, "sasl.server.max.receive.size"),
                                "sasl.server.max.receive.size", 1)
        self.max_reauth_ms = _int(config.for_listener(listener, "connections.max.reauth.ms"),
                                  "connections.max.reauth.ms")
        self.jaas: dict[str, jaas.LoginModule | None] = {}
        for mechanism in self.mechanisms:
            text = config.for_listener(listener, f"{mechanism.lower()}.sasl.jaas.config") or \
                config.for_listener(listener, "sasl.jaas.config")
            try:
                self.jaas[mechanism] = jaas.parse_one(text) if text else None
            except jaas.JaasError as e:
                raise SaslConfigError(f"listener {listener}: {mechanism.lower()}.sasl.jaas.config: {e}") from None
        self.plain_users = {k[len("user_"):]: v for k, v in (self.jaas.get(PLAIN).options if self.jaas.get(PLAIN)
                                                               else {}).items() if k.startswith("user_")}
        path = config.for_listener(listener, "trireme.sasl.plain.credentials.file")
        self.credentials_path = str(path) if path else None
        if PLAIN in self.mechanisms and not self.plain_users and not self.credentials_path:
            raise SaslConfigError(f"listener {listener}: PLAIN is enabled but has no users (user_NAME options in "
                                  f"plain.sasl.jaas.config, or trireme.sasl.plain.credentials.file)")
        self.oauth = {}
        if OAUTHBEARER in self.mechanisms:
            def prop(name):
                value = config.for_listener(listener, f"oauthbearer.{name}")
                return config.for_listener(listener, name) if value is None else value
            module = self.jaas.get(OAUTHBEARER)
            self.oauth = {
                "options": dict(module.options) if module else {},
                "jwks_url": str(prop("sasl.oauthbearer.jwks.endpoint.url") or ""),
                "refresh_ms": _int(prop("sasl.oauthbearer.jwks.endpoint.refresh.ms"),
                                   "sasl.oauthbearer.jwks.endpoint.refresh.ms", 1),
                "issuer": str(prop("sasl.oauthbearer.expected.issuer") or ""),
                "audience": [a.strip() for a in str(prop("sasl.oauthbearer.expected.audience") or "").split(",")
                             if a.strip()],
                "sub_claim": str(prop("sasl.oauthbearer.sub.claim.name") or "sub"),
                "skew": _int(prop("sasl.oauthbearer.clock.skew.seconds"), "sasl.oauthbearer.clock.skew.seconds"),
            }
            url = self.oauth["jwks_url"]
            if url and not url.startswith(("file://", "https://")):
                raise SaslConfigError(f"listener {listener}: sasl.oauthbearer.jwks.endpoint.url must be file:// "
                                      f"or https://")


class FailedLogins:
    """Failed authentications per client address in the last FAILURE_WINDOW_S: an address with ``limit`` of them is
    refused until the oldest leaves the window.  At most MAX_TRACKED_ADDRESSES addresses are remembered (the least
    recently failed forgotten first), each with at most ``limit`` times: memory is bounded whatever clients do.

    A round that may check a credential first reserves an attempt (:meth:`reserve`) and settles it once the check is
    done (:meth:`settle`: a failure is recorded, a success releases it).  Checks under way count against the limit,
    so guesses sent in parallel (a slow PBKDF2 in a worker thread, many SCRAM exchanges opened together) get at most
    ``limit`` checks a minute between them: a round finding the limit taken up by checks under way waits for one to
    settle (its address only), then is refused if that was a failure."""

    def __init__(self, limit: int, max_addresses: int = MAX_TRACKED_ADDRESSES):
        self.limit = limit
        self.max_addresses = max_addresses
        self._failures: collections.OrderedDict[str, collections.deque] = collections.OrderedDict()
        self._pending: dict[str, int] = {}              # checks under way per address (one at most a connection)
        self._settled: dict[str, trio.Event] = {}       # set when a check of that address settles

    def blocked(self, host: str, now: float) -> bool:
        times = self._failures.get(host)
        if not self.limit or times is None:
            return False
        while times and now - times[0] >= FAILURE_WINDOW_S:
            times.popleft()
        if not times:
            del self._failures[host]
            return False
        return len(times) >= self.limit

    async def reserve(self, host: str, clock=time.monotonic) -> bool:
        """Reserve an attempt for ``host`` → False (refused: ``limit`` failures in the last minute), or True once the
        failures and the checks under way leave room for one more; settle it with :meth:`settle`."""
        if not self.limit:
            return True
        while True:
            if self.blocked(host, clock()):
                return False
            failures = len(self._failures.get(host, ()))
            if failures + self._pending.get(host, 0) < self.limit:
                self._pending[host] = self._pending.get(host, 0) + 1
                return True
            event = self._settled.get(host)
            if event is None:
                event = self._settled[host] = trio.Event()
            await event.wait()

    def settle(self, host: str, failed: bool, now: float) -> None:
        """The check of a reserved attempt is done: ``failed`` records a failure, else the attempt is released."""
        if not self.limit:
            return
        pending = self._pending.get(host, 0) - 1
        if pending > 0:
            self._pending[host] = pending
        else:
            self._pending.pop(host, None)
        if failed:
            self.record(host, now)
        event = self._settled.pop(host, None)
        if event is not None:
            event.set()

    def record(self, host: str, now: float) -> None:
        if not self.limit:
            return
        times = self._failures.pop(host, None)
        if times is None:
            times = collections.deque(maxlen=self.limit)
        times.append(now)
        self._failures[host] = times
        while len(self._failures) > self.max_addresses:
            self._failures.popitem(last=False)


class SaslService:
    """The broker's SASL state shared by connections: listener settings, failed logins, JWKS caches."""

    def __init__(self, broker):
        self.broker = broker
        config = broker.config
        self.failed_logins = FailedLogins(int(config["trireme.sasl.failed.authentications.per.minute"]))
        self.delay_s = int(config["connection.failed.authentication.delay.ms"]) / 1000
        self._listeners: dict[str, ListenerSasl | SaslConfigError] = {}
        self._credentials: dict[str, object] = {}
        self._check_threads: trio.CapacityLimiter | None = None     # made in the broker's trio run, on first use
        self._validators: dict[str, object] = {}

    def listener(self, name: str) -> ListenerSasl:
        settings = self._listeners.get(name)
        if settings is None:
            try:
                settings = ListenerSasl(self.broker.config, name)
            except SaslConfigError as e:
                settings = e
                log.error("SASL on listener %s cannot work: %s", name, e)
            self._listeners[name] = settings
        if isinstance(settings, SaslConfigError):
            raise settings
        return settings

    def mechanism_server(self, settings: ListenerSasl, mechanism: str):
        if mechanism == PLAIN:
            credentials = None
            if settings.credentials_path:
                from .plain_credentials import CredentialsFile
                credentials = self._credentials.setdefault(settings.credentials_path,
                                                           CredentialsFile(settings.credentials_path))
            if credentials is not None and self._check_threads is None:
                self._check_threads = trio.CapacityLimiter(sasl_mechanisms.CHECK_THREADS)
            return sasl_mechanisms.PlainServer(settings.plain_users, credentials, self._check_threads)
        if mechanism == OAUTHBEARER:
            return sasl_mechanisms.OAuthBearerServer(self._validator(settings))
        return sasl_mechanisms.ScramServer(mechanism, self.broker.security)

    def _validator(self, settings: ListenerSasl):
        validator = self._validators.get(settings.listener)
        if validator is None:
            from . import oauthbearer
            o = settings.oauth
            if o["jwks_url"]:
                validator = oauthbearer.JwtValidator(oauthbearer.JwksCache(o["jwks_url"], o["refresh_ms"]),
                                                     issuer=o["issuer"], audience=o["audience"],
                                                     sub_claim=o["sub_claim"], skew_seconds=o["skew"])
            else:
                try:
                    validator = oauthbearer.UnsecuredValidator(o["options"])
                except ValueError as e:
                    raise SaslConfigError(f"listener {settings.listener}: oauthbearer.sasl.jaas.config: {e}") from None
            self._validators[settings.listener] = validator
        return validator


def check_listeners(config, listeners) -> None:
    """Start-up check: SaslConfigError (one line) for the first SASL listener of ``listeners`` (objects with ``name``
    and ``security_protocol``) whose SASL settings cannot work, so a broker refuses to start rather than close every
    connection of that listener."""
    for listener in listeners:
        if listener.security_protocol in SASL_PROTOCOLS:
            settings = ListenerSasl(config, listener.name)
            if OAUTHBEARER in settings.mechanisms and not settings.oauth["jwks_url"]:
                from .oauthbearer import UnsecuredValidator
                try:
                    UnsecuredValidator(settings.oauth["options"])
                except ValueError as e:
                    raise SaslConfigError(f"listener {listener.name}: oauthbearer.sasl.jaas.config: {e}") from None


def service(broker) -> SaslService:
    svc = getattr(broker, "_sasl_service", None)
    if svc is None:
        svc = broker._sasl_service = SaslService(broker)
    return svc


def for_connection(conn) -> "Authenticator | None":
    """The connection's authenticator: one on a SASL listener, None on any other (nothing to check)."""
    listener = getattr(conn, "listener", None) or PLAINTEXT_LISTENER
    if listener.security_protocol not in SASL_PROTOCOLS:
        return None
    return Authenticator(conn, service(conn.broker), listener)


def _api_name(api_key: int) -> str:
    handler = HANDLERS.get(api_key)
    return handler.name if handler is not None else f"API key {api_key}"


class Authenticator:
    """One connection's SASL state (Kafka's SaslServerAuthenticator states, re-authentication included)."""

    def __init__(self, conn, svc: SaslService, listener):
        self.conn = conn
        self.service = svc
        self.listener = listener
        self.state = INITIAL
        self.passes = False                 # authenticated for good (no session expiry): requests go straight on
        self.versions_seen = False
        self.headers = True                 # SaslAuthenticate frames (SaslHandshake v1+), else raw tokens (v0)
        self.mechanism: str | None = None
        self.server = None
        self.rounds = 0
        self.user: str | None = None        # the authenticated user (kept across re-authentications)
        self.reauthenticating = False
        self.reauth_started = -1e18
        self.expires_at: float | None = None        # time.monotonic() when the session ends (None: never)
        self.closing: str | None = None     # set when the connection ends once its queued answers are sent
        self.delay_in_reader = False        # a failure without an answer: the reader waits the delay itself
        self.reader = None

    # ---------------------------------------------------------------- the connection's hooks

    def limit_frames(self, reader) -> None:
        """Frames before authentication (and during a re-authentication) are held to sasl.server.max.receive.size, as
        Kafka's authenticator reads them; afterwards the reader's own limit applies again."""
        self.reader = reader
        self._request_limit = (reader.max_size, reader.limit_name)
        self._apply_limit()

    def _apply_limit(self) -> None:
        reader = self.reader
        if reader is None:
            return
        if self.state == COMPLETE:
            reader.max_size, reader.limit_name = self._request_limit
            return
        try:
            max_receive = self.service.listener(self.listener.name).max_receive
        except SaslConfigError:             # (the handshake closes the connection with the reason)
            max_receive = DEFAULT_MAX_RECEIVE
        reader.max_size = min(self._request_limit[0], max_receive)
        reader.limit_name = "sasl.server.max.receive.size"

    async def gate(self, frame: bytearray):
        """Whether ``frame`` may be dispatched (None), or the raw token answering it (bytes), or NO_ANSWER; raises
        CloseConnection for what closes the connection."""
        state = self.state
        if self.passes:                     # (the connection does not ask then; a direct caller may)
            return None
        if state == AUTHENTICATE and not self.headers:
            return await self._raw_token(bytes(frame))
        if state == REAUTH_BAD_MECHANISM:
            self._failed(SaslFailure(self._bad_mechanism), answer=None)
            return NO_ANSWER
        try:
            api_key, api_version = headers.peek_api(frame)
        except CodecError as e:
            if state == INITIAL:
                raise CloseConnection(f"invalid request before SASL authentication on listener {self.listener.name} "
                                      f"({e}): a client configured with the wrong security protocol, or not a "
                                      f"Kafka client") from None
            raise CloseConnection(str(e)) from None
        if state == COMPLETE:
            now = time.monotonic()
            if api_key == _SASL_HANDSHAKE and now - self.reauth_started >= MIN_REAUTH_INTERVAL_S:
                self.reauth_started = now
                self.reauthenticating = True
                self.state = HANDSHAKE
                self.passes = False
                self._apply_limit()
                return None
            if now >= self.expires_at:
                raise CloseConnection(f"SASL session of {self.conn.principal} expired "
                                      f"({_api_name(api_key)} without re-authentication)")
            return None
        if state == INITIAL and api_key == _API_VERSIONS and not self.versions_seen:
            handler = HANDLERS[_API_VERSIONS]
            if handler.min_version <= api_version <= handler.enabled_max(self.conn.unstable_api_versions):
                self.versions_seen = True
            return None
        if state in (INITIAL, HANDSHAKE) and api_key == _SASL_HANDSHAKE:
            return None
        if state == AUTHENTICATE and api_key in (_SASL_AUTHENTICATE, _SASL_HANDSHAKE):
            return None
        raise CloseConnection(f"{_api_name(api_key)} before SASL authentication completed on listener "
                              f"{self.listener.name} ({self.listener.security_protocol}, state {state})")

    async def finish(self) -> str:
        """The reader stops after a failure: wait the failure delay when no answer holds it, → the close reason."""
        if self.delay_in_reader and self.service.delay_s:
            await trio.sleep(self.service.delay_s)
        return self.closing

    # ---------------------------------------------------------------- the handlers

    def handshake(self, ctx, request):
        """SaslHandshake v0-1 (state HANDSHAKE/INITIAL, or AUTHENTICATE: out of order)."""
        if self.state == COMPLETE or self.state == FAILED:
            return ctx.response(error_code=E.ILLEGAL_SASL_STATE.code, mechanisms=[])
        if self.state == AUTHENTICATE:
            return self._failed(SaslFailure("Unexpected Kafka request of type SASL_HANDSHAKE during SASL "
                                            "authentication."),
                                ctx.response(error_code=E.ILLEGAL_SASL_STATE.code, mechanisms=[]))
        try:
            settings = self.service.listener(self.listener.name)
            if request.mechanism in settings.mechanisms:
                server = self.service.mechanism_server(settings, request.mechanism)
        except SaslConfigError as e:        # (a start-up check refuses this before; embedded use may skip it)
            raise CloseConnection(str(e)) from None
        requested = request.mechanism or ""
        if requested not in settings.mechanisms or len(requested) > MAX_MECHANISM_CHARS:
            return self._failed(SaslFailure(f"Unsupported SASL mechanism {sasl_mechanisms.printable(requested)}"),
                                ctx.response(error_code=E.UNSUPPORTED_SASL_MECHANISM.code,
                                             mechanisms=list(settings.mechanisms)), count=False)
        self.headers = ctx.api_version >= 1
        if self.reauthenticating and requested != self.mechanism:
            self._bad_mechanism = (f"SASL mechanism '{requested}' requested by client is not supported for "
                                   f"re-authentication of mechanism '{self.mechanism}'")
            self.state = REAUTH_BAD_MECHANISM
        else:
            self.mechanism = requested
            self.server = server
            self.rounds = 0
            self.state = AUTHENTICATE
        return ctx.response(error_code=E.NONE.code, mechanisms=list(settings.mechanisms))

    async def authenticate(self, ctx, request):
        """SaslAuthenticate v0-2 in state AUTHENTICATE (the gate lets it through in no other state but COMPLETE, where
        Kafka's request handler answers ILLEGAL_SASL_STATE)."""
        if self.state != AUTHENTICATE:
            return ctx.response(error_code=E.ILLEGAL_SASL_STATE.code, auth_bytes=b"", session_lifetime_ms=0,
                                error_message="SaslAuthenticate request received after successful authentication")
        try:
            token, lifetime = await self._evaluate(bytes(request.auth_bytes))
        except SaslFailure as e:
            message = e.client_message or (f"Authentication failed during "
                                           f"{'re-authentication' if self.reauthenticating else 'authentication'} "
                                           f"due to invalid credentials with SASL mechanism {self.mechanism}")
            return self._failed(e, ctx.response(error_code=E.SASL_AUTHENTICATION_FAILED.code, error_message=message,
                                                auth_bytes=b"", session_lifetime_ms=0))
        return ctx.response(error_code=E.NONE.code, auth_bytes=token, session_lifetime_ms=lifetime)

    # ---------------------------------------------------------------- the exchange

    async def _raw_token(self, token: bytes):
        try:
            answer, _ = await self._evaluate(token)
        except SaslFailure as e:
            self._failed(e, answer=None)
            return NO_ANSWER
        except Exception:           # a bug: logged as the handlers' are, and only this connection ends
            log.exception("SASL token evaluation failed peer=%s", getattr(self.conn, "peer", "?"))
            raise CloseConnection("internal error in SASL authentication") from None
        return answer

    async def _evaluate(self, token: bytes) -> tuple[bytes, int]:
        """One client token → (the server's token, the session lifetime in ms once complete, else 0)."""
        svc = self.service
        host = getattr(self.conn, "host", "") or ""
        self.rounds += 1
        if self.rounds > MAX_ROUNDS:
            raise SaslFailure(f"more than {MAX_ROUNDS} SaslAuthenticate rounds")
        server = self.server
        if not server.checks(token):        # (OAUTHBEARER's \x01 after a refused token: that refusal was counted)
            try:
                answer = await server.evaluate(token)
            except SaslFailure as e:
                e.counted = True
                raise
        else:
            answer = await self._checked(server, token, host)
        if not server.complete:
            return answer, 0
        principal = f"User:{self.server.user}"
        if self.reauthenticating and principal != self.conn.principal:
            raise SaslFailure("principal changed in re-authentication",
                              f"Cannot change principals during re-authentication from "
                              f"{self.conn.principal.replace(':', '.', 1)}: {principal.replace(':', '.', 1)}")
        lifetime = self._session_lifetime_ms()
        self.conn.principal = principal
        self.user = self.server.user
        self.state = COMPLETE
        self.passes = self.expires_at is None
        self._apply_limit()
        svc.broker.metrics.authentication(self.listener.name, self.mechanism, True)
        log.info("%s principal=%s mechanism=%s listener=%s peer=%s session_lifetime_ms=%d",
                 "re-authenticated" if self.reauthenticating else "authenticated",
                 sasl_mechanisms.printable(principal), self.mechanism, self.listener.name, self.conn.peer, lifetime)
        self.reauthenticating = False
        self.server = None
        return answer, lifetime

    async def _checked(self, server, token: bytes, host: str) -> bytes:
        """``server.evaluate(token)`` with an attempt reserved in the failed-login limit around it: every round that
        may complete a login asks the limit, and a check under way counts against it until it settles (a failure,
        a refused token or an abandoned check stays counted; a success or a round that checked nothing is released)."""
        logins = self.service.failed_logins
        if not await logins.reserve(host):
            failure = SaslFailure("too many failed authentications from this address",
                                  "Authentication failed: too many failed authentications from this address, "
                                  "try again later")
            failure.rate_limited = True
            raise failure
        failed = True
        try:
            answer = await server.evaluate(token)
            failed = getattr(server, "error", None) is not None        # OAUTHBEARER: a token refused with its JSON
        except SaslFailure as e:
            e.counted = True
            raise
        finally:
            logins.settle(host, failed, time.monotonic())
        return answer

    def _session_lifetime_ms(self) -> int:
        """Kafka's calcCompletionTimesAndReturnSessionLifetimeMs: min(credential lifetime, connections.max.reauth.ms),
        0 (no expiry) when neither applies; sets the session's end."""
        from .clock import now_ms
        settings = self.service.listener(self.listener.name)
        max_reauth = settings.max_reauth_ms
        credential_ms = self.server.lifetime_ms
        if credential_ms is None and max_reauth <= 0:
            self.expires_at = None
            return 0
        lifetimes = [max_reauth] if max_reauth > 0 else []
        if credential_ms is not None:
            lifetimes.append(max(0, credential_ms - now_ms()))
        lifetime = min(max(0, min(lifetimes)), MAX_SESSION_LIFETIME_MS)
        self.expires_at = time.monotonic() + lifetime / 1000
        return lifetime

    def _failed(self, failure: SaslFailure, answer, count: bool = True):
        """The authentication failed: log one line, count it, and answer ``answer`` after the delay (a Deferred), or
        nothing; the connection closes once that is sent (:meth:`finish`)."""
        svc = self.service
        self.state = FAILED
        self.passes = False
        self.closing = f"SASL authentication failed: {failure.reason}"
        self.server_user = getattr(self.server, "attempted_user", None)
        host = getattr(self.conn, "host", "") or ""
        if count and self.mechanism is not None:
            if not getattr(failure, "rate_limited", False) and not getattr(failure, "counted", False):
                svc.failed_logins.record(host, time.monotonic())
            svc.broker.metrics.authentication(self.listener.name, self.mechanism, False)
        log.warning("%s failed listener=%s mechanism=%s user=%s peer=%s: %s",
                    "re-authentication" if self.reauthenticating else "authentication", self.listener.name,
                    sasl_mechanisms.printable(self.mechanism), sasl_mechanisms.printable(self.server_user),
                    getattr(self.conn, "peer", host), failure.reason)
        self.server = None
        if answer is None:
            self.delay_in_reader = True
            return None
        delay = svc.delay_s

        async def delayed():
            if delay:
                await trio.sleep(delay)
            return answer
        return Deferred(delayed)
