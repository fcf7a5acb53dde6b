"""The broker's one small HTTP server, for its own pages (Prometheus metrics, the status page): one request per connection, routed by method and path.

A *site* is a set of routes served on one address.  ``trireme.metrics.listen`` and
``trireme.status.listen`` each name an address (a bare ``:PORT`` binds 127.0.0.1); the same
address named twice is one listener serving both.  On a loopback address, requests whose Host
header names anything but a loopback host are refused, so a web page cannot reach the broker's
pages through DNS rebinding.  Bodies are read only with a Content-Length, up to ``MAX_BODY``.
"""
from __future__ import annotations

import dataclasses
import inspect
import ipaddress
import logging
import urllib.parse
from typing import Awaitable, Callable

import trio

from .config import parse_host_port
from .startup import open_listeners

log = logging.getLogger("trireme.http")

MAX_HEAD = 16 * 1024
MAX_BODY = 64 * 1024
TIMEOUT_S = 10
DEFAULT_HOST = "127.0.0.1"

REASONS = {200: "OK", 303: "See Other", 400: "Bad Request", 403: "Forbidden", 404: "Not Found",
           405: "Method Not Allowed", 409: "Conflict", 413: "Content Too Large", 421: "Misdirected Request",
           500: "Internal Server Error"}


@dataclasses.dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]               # names in lower case
    body: bytes = b""

    def form(self) -> dict[str, str]:
        """The fields of an ``application/x-www-form-urlencoded`` body (anything else: none)."""
        if self.headers.get("content-type", "").split(";")[0].strip().lower() != "application/x-www-form-urlencoded":
            return {}
        return dict(urllib.parse.parse_qsl(self.body.decode("utf-8", "replace"), keep_blank_values=True))


@dataclasses.dataclass
class Response:
    status: int = 200
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: dict[str, str] = dataclasses.field(default_factory=dict)

    @classmethod
    def text(cls, status: int, text: str) -> "Response":
        return cls(status, text.encode())


Handler = Callable[[Request], "Response | Awaitable[Response]"]
Routes = dict[tuple[str, str], Handler]         # (method, path) → handler; GET routes answer HEAD too


def parse_address(text: str) -> tuple[str, int]:
    """HOST:PORT of a page listener; without a host (``:9644``) it is 127.0.0.1."""
    return parse_host_port(text, default_host=DEFAULT_HOST)


def sites(config, routes_by_property: dict[str, Routes]) -> dict[tuple[str, int], Routes]:
    """The listeners to open: the routes of every configured ``*.listen`` property, merged by address."""
    out: dict[tuple[str, int], Routes] = {}
    for name, routes in routes_by_property.items():
        if config[name]:
            out.setdefault(parse_address(config[name]), {}).update(routes)
    return out


def _is_loopback(host: str) -> bool:
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _host_of(authority: str) -> str:
    """The host part of a Host header or an origin's authority (``[::1]:80`` → ``::1``)."""
    if authority.startswith("["):
        return authority[1:].partition("]")[0]
    return authority.rpartition(":")[0] if authority.count(":") == 1 else authority


def _parse_head(head: bytes) -> Request | None:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        return None
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            return None
        headers[name.lower()] = value.strip()
    target = urllib.parse.urlsplit(parts[1])
    return Request(parts[0], target.path, dict(urllib.parse.parse_qsl(target.query)), headers)


async def _read_request(stream) -> Request | Response | None:
    data = b""
    while b"\r\n\r\n" not in data:
        if len(data) > MAX_HEAD:
            return Response.text(413, "request head too large\n")
        chunk = await stream.receive_some(4096)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    request = _parse_head(head)
    if request is None:
        return Response.text(400, "malformed request\n")
    if "transfer-encoding" in request.headers:
        return Response.text(400, "only Content-Length bodies\n")
    length = request.headers.get("content-length", "0")
    if not length.isdigit():
        return Response.text(400, "bad Content-Length\n")
    if int(length) > MAX_BODY:
        return Response.text(413, "request body too large\n")
    while len(body) < int(length):
        chunk = await stream.receive_some(4096)
        if not chunk:
            return None
        body += chunk
    request.body = body[:int(length)]
    return request


async def _answer(routes: Routes, request: Request, loopback: bool) -> Response:
    if loopback and "host" in request.headers and not _is_loopback(_host_of(request.headers["host"])):
        return Response.text(421, "this listener answers only requests addressed to a loopback host\n")
    method = "GET" if request.method == "HEAD" else request.method
    handler = routes.get((method, request.path))
    if handler is None:
        allowed = sorted(m for m, p in routes if p == request.path)
        if not allowed:
            return Response.text(404, "not found\n")
        return Response(405, b"method not allowed\n", headers={"Allow": ", ".join(allowed)})
    result = handler(request)
    return await result if inspect.isawaitable(result) else result


def _encode(response: Response, head_only: bool) -> bytes:
    lines = [f"HTTP/1.1 {response.status} {REASONS.get(response.status, 'Status')}",
             f"Content-Type: {response.content_type}", f"Content-Length: {len(response.body)}",
             "Connection: close", *(f"{k}: {v}" for k, v in response.headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (b"" if head_only else response.body)


async def serve(routes: Routes, host: str, port: int, what: str = "HTTP", *,
                task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve ``routes`` on HOST:PORT until cancelled; reports the bound port through ``task_status``.  ``what``: the
    setting(s) it serves, named if the address cannot be bound."""
    loopback = _is_loopback(host)

    async def handle(stream) -> None:
        try:
            with trio.move_on_after(TIMEOUT_S):
                request = await _read_request(stream)
                if request is None:
                    return
                head_only = False
                if isinstance(request, Request):
                    head_only = request.method == "HEAD"
                    try:
                        response = await _answer(routes, request, loopback)
                    except Exception:
                        log.exception("%s %s failed", request.method, request.path)
                        response = Response.text(500, "internal error (see the broker's log)\n")
                else:
                    response = request
                await stream.send_all(_encode(response, head_only))
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            await stream.aclose()

    listeners = await open_listeners(host, port, what)
    task_status.started(listeners[0].socket.getsockname()[1])
    await trio.serve_listeners(handle, listeners)
