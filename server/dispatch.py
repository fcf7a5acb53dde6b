"""Routes a decoded request to the handler module for its API, and builds ApiVersions from what handlers declare.

A handler is declared with ``@handles("Produce", 3, 11)``: the API name (as in Kafka's message
definitions) and the version range it serves.  It is called with a :class:`RequestContext` and the
decoded request object and returns the response object, ``None`` (no response, as for acks=0),
or a :class:`~trireme.server.deferred.Deferred` whose coroutine produces the response later (acks=all waiting for the
fsync, a long-polling fetch) while the connection goes on reading requests.
"""
from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from typing import Any, Callable

from trireme.wire.codec import MessageCodec, message
from trireme.wire.schema import api_names

from .clock import now_ms

API_KEYS: dict[str, int] = {name: key for key, name in api_names().items()}


class CloseConnection(Exception):
    """The client sent something that ends its connection (raised by the connection, a handler or authentication);
    the message goes to the log."""


@dataclasses.dataclass(slots=True)
class Handler:
    api_key: int
    name: str
    min_version: int
    max_version: int
    fn: Callable
    request: MessageCodec
    response: MessageCodec
    advertised_min: int                   # may be below min_version (Produce 0-2, see produce.py)
    fast: Callable | None = None          # see fast_path
    unstable_max: bool = False            # max_version is Kafka's "latestVersionUnstable" last version
    advertised: bool = True               # listed by ApiVersions (not so broker-to-broker APIs)

    def enabled_max(self, unstable_enabled: bool) -> int:
        """The highest version served and advertised: as Kafka, a definition's unstable last version only
        with ``unstable.api.versions.enable``."""
        return self.max_version - 1 if self.unstable_max and not unstable_enabled else self.max_version


@dataclasses.dataclass(slots=True)
class RequestContext:
    """What a handler knows about the request besides its body."""

    broker: Any                          # server.broker.Broker
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    principal: str
    connection: Any                      # server.connection.Connection (client software, address)
    frame: bytearray                     # the request frame: record data in the request views it
    # Kafka's ClusterAction (broker-to-broker requests such as the coordinator's WriteTxnMarkers): only requests
    # this broker sends itself through server/local_peer.py; nothing a network client sends can set it.
    cluster_action: bool = False
    # The client's IP address when it is not the connection's: a request forwarded in an Envelope (KIP-590).
    client_host: str | None = None

    @property
    def host(self) -> str:
        """The client's IP address (Kafka's ACL host)."""
        if self.client_host is not None:
            return self.client_host
        return getattr(self.connection, "host", "") or ""

    def authorize(self, operation, resource_type, name: str, *, log_if_denied: bool = True) -> bool:
        """Whether this request's principal may do ``operation`` (state.acls.Operation) on the resource
        (state.acls.ResourceType, name); requests this broker sends itself (cluster_action) always may.  A denial
        is counted (metrics.request_denied) unless ``log_if_denied`` is false (Kafka's logIfDenied: a Metadata
        request leaving out topics it may not describe is no denial worth reporting)."""
        if self.cluster_action:
            return True
        allowed = self.broker.security.authorize(self.principal, self.host, operation, resource_type, name)
        if not allowed and log_if_denied:
            self.broker.metrics.request_denied(self.principal, HANDLERS[self.api_key].name, resource_type.name, name)
        return allowed

    def response(self, **fields):
        """A fresh response object of this API, with fields set."""
        return HANDLERS[self.api_key].response.cls(**fields)

    now_ms = staticmethod(now_ms)

    def legacy_response(self, **fields):
        """A fresh response object in the layout of a version below Kafka's definition."""
        return LEGACY[self.api_key].response.cls(**fields)


class Encoded:
    """A response a handler encoded itself (a fast path's answer): the body's bytes, after the response header."""

    __slots__ = ("body",)

    def __init__(self, body: bytes):
        self.body = body


NOT_HANDLED = object()       # what a fast path returns for a request it leaves to the decoder and the handler

HANDLERS: dict[int, Handler] = {}
LEGACY: dict[int, Handler] = {}


def handles(name: str, min_version: int, max_version: int, *, advertised_min: int | None = None,
            advertised: bool = True):
    """Register the decorated function as the handler for API ``name`` at these versions; ``advertised=False``: a
    broker-to-broker API that ApiVersions does not list to clients (Kafka's brokers do not list them either)."""
    def register(fn):
        key = API_KEYS[name]
        request = message(name + "Request")
        response = message(name + "Response")
        if min_version < request.min_version or max_version > request.max_version:
            raise ValueError(f"{name} {min_version}-{max_version} is outside its definition "
                             f"{request.min_version}-{request.max_version}")
        HANDLERS[key] = Handler(key, name, min_version, max_version, fn, request, response,
                                min_version if advertised_min is None else advertised_min,
                                unstable_max=request.spec.latest_version_unstable
                                and max_version == request.max_version, advertised=advertised)
        return fn
    return register


def fast_path(name: str):
    """Register the decorated function as the fast path of API ``name`` (registered already): called as
    ``fn(ctx, frame, body_start)`` before the body is decoded, it returns what a handler returns (or an
    :class:`Encoded` answer, or a Deferred of one), or NOT_HANDLED to have the body decoded and the handler
    called.  For a request shape common enough to be worth reading without message objects; the codec still
    defines the bytes (the fast path's tests compare both)."""
    def register(fn):
        HANDLERS[API_KEYS[name]].fast = fn
        return fn
    return register


def handles_legacy(name: str, definition: str, min_version: int, max_version: int):
    """Register a handler for versions below Kafka's definition, read with our own ``definition``
    under wire/definitions (only Produce 0-2, which Kafka 4 still advertises but refuses)."""
    def register(fn):
        key = API_KEYS[name]
        LEGACY[key] = Handler(key, name, min_version, max_version, fn, message(definition + "Request"),
                              message(definition + "Response"), min_version)
        return fn
    return register


def load_handlers() -> None:
    """Import every module in server/handlers so each registers itself."""
    import trireme.server.handlers as package
    for info in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"trireme.server.handlers.{info.name}")


def advertised_versions(unstable_enabled: bool = False) -> dict[int, tuple[int, int]]:
    """API key → (min, max) as ApiVersions reports them (with ``unstable.api.versions.enable`` as given)."""
    load_handlers()
    return {key: (h.advertised_min, h.enabled_max(unstable_enabled)) for key, h in sorted(HANDLERS.items())
            if h.advertised}


def implemented_versions() -> dict[int, tuple[int, int]]:
    """API key → (min, max) actually served (advertised ranges may start lower, see Produce)."""
    load_handlers()
    return {key: (h.min_version, h.max_version) for key, h in sorted(HANDLERS.items())}
