"""OAUTHBEARER token validation as Kafka's broker does it: the unsecured JWS (alg none) validator Kafka uses by
default, and JWT validation against a JWKS (``sasl.oauthbearer.jwks.endpoint.url``, file:// or https://) with PyJWT.

A validator's ``validate(token, now_ms)`` returns (principal, expiry in ms since the epoch) or raises TokenInvalid
with the RFC 7628 status (and scope) the client is answered with; its reason goes only to the log.  Bounded: the
token's size, the JWKS document's size and key count.  A JWKS over https is fetched in a worker thread (never on the
event loop), one fetch at a time, and cached for ``sasl.oauthbearer.jwks.endpoint.refresh.ms``.
"""
from __future__ import annotations

import base64
import binascii
import json
import logging
import math
import time
import urllib.parse
import urllib.request

import trio

log = logging.getLogger("trireme.authentication")

MAX_TOKEN_BYTES = 64 * 1024
MAX_JWKS_BYTES = 1 << 20
MAX_JWKS_KEYS = 64
JWKS_FETCH_TIMEOUT_S = 10.0
JWKS_RETRY_S = 10.0                     # an unknown kid refreshes the set at most this often
SIGNED_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")


class TokenInvalid(Exception):
    """A token refused: ``status`` (and ``scope``) for the client's RFC 7628 JSON error, ``reason`` for the log."""

    def __init__(self, reason: str, status: str = "invalid_token", scope: str | None = None):
        super().__init__(reason)
        self.reason = reason
        self.status = status
        self.scope = scope

    def json_error(self) -> str:
        """Kafka's JSON error (OAuthBearerSaslServer): {"status":"..."} plus ", \"scope\":\"...\"" when given."""
        text = '{"status":"%s"' % self.status
        if self.scope is not None:
            text += ', "scope":"%s"' % self.scope
        return text + "}"


def _b64url_json(part: str, what: str) -> dict:
    try:
        raw = base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
        value = json.loads(raw.decode("utf-8"))
    except (ValueError, binascii.Error, UnicodeDecodeError, RecursionError):
        raise TokenInvalid(f"the {what} is not base64url-encoded JSON") from None
    if not isinstance(value, dict):
        raise TokenInvalid(f"the {what} is not a JSON object")
    return value


MAX_NUMERIC_DATE_MS = 2**63 - 1       # a NumericDate must be a finite number of seconds whose ms fit an int64 (Java)


def _number(claims: dict, name: str, required: bool) -> int | float | None:
    value = claims.get(name)
    if value is None:
        if required:
            raise TokenInvalid(f"required claim {name!r} missing")
        return None
    _epoch_ms(value, name)
    return value


def _epoch_ms(value, name: str) -> int:
    """A NumericDate claim (RFC 7519: seconds since the epoch) in ms; TokenInvalid for anything but a finite number
    whose ms fit Kafka's long (JSON's 1e400 parses as infinity, and Python's json takes NaN)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TokenInvalid(f"claim {name!r} is not a number")
    if isinstance(value, float) and not math.isfinite(value):
        raise TokenInvalid(f"claim {name!r} is not a finite number")
    ms = int(value * 1000)
    if not -MAX_NUMERIC_DATE_MS - 1 <= ms <= MAX_NUMERIC_DATE_MS:
        raise TokenInvalid(f"claim {name!r} is out of range")
    return ms


def _scopes(value) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [s for s in value.split(" ") if s]
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return value
    raise TokenInvalid("the scope claim is neither a string nor a list of strings")


class UnsecuredValidator:
    """Kafka's OAuthBearerUnsecuredValidatorCallbackHandler: a JWS with alg "none" and an empty signature, a
    principal claim (``unsecuredValidatorPrincipalClaimName``, default sub), a numeric exp in the future and an iat
    not in the future (within ``unsecuredValidatorAllowableClockSkewMs``), exp after iat, and every scope of
    ``unsecuredValidatorRequiredScope`` in the scope claim (``unsecuredValidatorScopeClaimName``)."""

    def __init__(self, options: dict[str, str]):
        self.principal_claim = options.get("unsecuredValidatorPrincipalClaimName", "").strip() or "sub"
        self.scope_claim = options.get("unsecuredValidatorScopeClaimName", "").strip() or "scope"
        self.required_scope = [s for s in options.get("unsecuredValidatorRequiredScope", "").replace(",", " ").split()]
        skew = options.get("unsecuredValidatorAllowableClockSkewMs", "").strip() or "0"
        try:
            self.skew_ms = int(skew)
        except ValueError:
            raise ValueError(f"unsecuredValidatorAllowableClockSkewMs must be an integer, not {skew!r}") from None
        if self.skew_ms < 0:
            raise ValueError("unsecuredValidatorAllowableClockSkewMs must not be negative")

    async def validate(self, token: str, now_ms: int) -> tuple[str, int]:
        if len(token) > MAX_TOKEN_BYTES:
            raise TokenInvalid(f"token longer than {MAX_TOKEN_BYTES} bytes")
        parts = token.split(".")
        if len(parts) != 3:
            raise TokenInvalid("not a compact JWS of three parts")
        header = _b64url_json(parts[0], "JOSE header")
        if header.get("alg") != "none":
            raise TokenInvalid("an unsecured token must have alg none")
        if parts[2]:
            raise TokenInvalid("an unsecured token must have an empty signature")
        claims = _b64url_json(parts[1], "claims")
        exp = _number(claims, "exp", True)
        iat = _number(claims, "iat", False)
        principal = claims.get(self.principal_claim)
        if not isinstance(principal, str) or not principal.strip():
            raise TokenInvalid(f"required principal claim {self.principal_claim!r} missing or not a string")
        if iat is not None and now_ms + self.skew_ms < iat * 1000:
            raise TokenInvalid("issued in the future")
        if now_ms - self.skew_ms >= exp * 1000:
            raise TokenInvalid("expired")
        if iat is not None and exp <= iat:
            raise TokenInvalid("expires before it was issued")
        scopes = _scopes(claims.get(self.scope_claim))
        missing = [s for s in self.required_scope if s not in scopes]
        if missing:
            raise TokenInvalid(f"scope {missing} missing", "insufficient_scope", " ".join(self.required_scope))
        return principal, _epoch_ms(exp, "exp")


def _read_limited(url: str) -> bytes:
    """The JWKS document at ``url`` (file:// or https://), at most MAX_JWKS_BYTES; runs in a worker thread."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme == "file":
        with open(urllib.request.url2pathname(parsed.path), "rb") as f:
            data = f.read(MAX_JWKS_BYTES + 1)
    elif parsed.scheme == "https":
        with urllib.request.urlopen(url, timeout=JWKS_FETCH_TIMEOUT_S) as response:
            data = response.read(MAX_JWKS_BYTES + 1)
    else:
        raise ValueError(f"sasl.oauthbearer.jwks.endpoint.url must be file:// or https://, not {parsed.scheme}://")
    if len(data) > MAX_JWKS_BYTES:
        raise ValueError(f"JWKS larger than {MAX_JWKS_BYTES} bytes")
    return data


def parse_jwks(data: bytes) -> list:
    import jwt
    document = json.loads(data.decode("utf-8"))
    if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
        raise ValueError("a JWKS is a JSON object with a keys list")
    if len(document["keys"]) > MAX_JWKS_KEYS:
        raise ValueError(f"JWKS with more than {MAX_JWKS_KEYS} keys")
    keys = []
    for entry in document["keys"]:
        try:
            key = jwt.PyJWK.from_dict(entry)
        except (jwt.PyJWTError, ValueError, TypeError, KeyError) as e:
            log.warning("JWKS key skipped (%s): kid=%r", type(e).__name__,
                        entry.get("kid") if isinstance(entry, dict) else None)
            continue
        if key.public_key_use in (None, "sig"):
            keys.append(key)
    if not keys:
        raise ValueError("JWKS holds no usable signing key")
    return keys


class JwksCache:
    """The keys of one JWKS URL: fetched in a worker thread on first use and again when older than ``refresh_ms``
    (an unknown kid refreshes it sooner, at most every JWKS_RETRY_S); a failed fetch keeps the keys there were."""

    def __init__(self, url: str, refresh_ms: int, fetch=_read_limited):
        self.url = url
        self.refresh_s = refresh_ms / 1000
        self._fetch = fetch
        self._keys: list | None = None
        self._fetched = -1e18
        self._lock = trio.Lock()

    def _due(self, unknown_kid: bool) -> bool:
        age = time.monotonic() - self._fetched
        return age >= self.refresh_s or ((unknown_kid or self._keys is None) and age >= JWKS_RETRY_S)

    async def keys(self, unknown_kid: bool = False) -> list:
        if self._due(unknown_kid):
            async with self._lock:
                if self._due(unknown_kid):          # (not fetched meanwhile by the login that held the lock)
                    try:
                        data = await trio.to_thread.run_sync(self._fetch, self.url, abandon_on_cancel=True)
                        self._keys = parse_jwks(data)
                        log.info("JWKS loaded from %s: %d keys", self.url, len(self._keys))
                    except Exception as e:      # the URL, a file, the network: keep what there was
                        log.warning("JWKS from %s not loaded: %s", self.url, e)
                    self._fetched = time.monotonic()
        if self._keys is None:
            raise TokenInvalid("no JWKS keys available")
        return self._keys


class JwtValidator:
    """Kafka's broker-side JWT validation (OAuthBearerValidatorCallbackHandler): a signature by a key of the JWKS
    (alg none refused), exp and iat required, ``sasl.oauthbearer.expected.issuer`` / ``.expected.audience`` when
    set, within ``sasl.oauthbearer.clock.skew.seconds``; the principal is ``sasl.oauthbearer.sub.claim.name``."""

    def __init__(self, jwks: JwksCache, *, issuer: str | None, audience: list[str], sub_claim: str,
                 skew_seconds: int):
        self.jwks = jwks
        self.issuer = issuer or None
        self.audience = audience
        self.sub_claim = sub_claim or "sub"
        self.skew = skew_seconds

    async def validate(self, token: str, now_ms: int) -> tuple[str, int]:
        import jwt
        if len(token) > MAX_TOKEN_BYTES:
            raise TokenInvalid(f"token longer than {MAX_TOKEN_BYTES} bytes")
        try:
            header = jwt.get_unverified_header(token)
        except (jwt.PyJWTError, ValueError, RecursionError) as e:
            raise TokenInvalid(f"bad JOSE header: {e}") from None
        alg = header.get("alg")
        if alg not in SIGNED_ALGORITHMS:
            raise TokenInvalid(f"algorithm {str(alg)[:20]!r} not accepted")
        kid = header.get("kid")
        keys = await self.jwks.keys()
        candidates = [k for k in keys if kid is None or k.key_id == kid]
        if not candidates:
            keys = await self.jwks.keys(unknown_kid=True)
            candidates = [k for k in keys if k.key_id == kid]
        if not candidates:
            raise TokenInvalid(f"no JWKS key with kid {str(kid)[:64]!r}")
        last = None
        for key in candidates:
            try:
                claims = jwt.decode(token, key.key, algorithms=[alg], issuer=self.issuer,
                                    audience=self.audience or None, leeway=self.skew,
                                    options={"require": ["exp", "iat"], "verify_aud": bool(self.audience)})
                break
            except (jwt.InvalidSignatureError, jwt.InvalidKeyError, TypeError) as e:
                last = e         # not this key's signature, or a key of another type: try the next
            except (jwt.PyJWTError, ValueError, OverflowError, RecursionError) as e:      # (int(inf): overflow)
                raise TokenInvalid(f"{type(e).__name__}: {e}") from None
        else:
            raise TokenInvalid(f"signature not verified by any key ({last})")
        principal = claims.get(self.sub_claim)
        if not isinstance(principal, str) or not principal.strip():
            raise TokenInvalid(f"required claim {self.sub_claim!r} missing or not a string")
        return principal, _epoch_ms(claims.get("exp"), "exp")
