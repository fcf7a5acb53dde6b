"""The trio TCP listeners: an accept loop per listener (Kafka's listener names) that admits connections within the broker's limits, and shutdown with a grace deadline.

Each configured listener is an :class:`EndPoint` (its name, security protocol, advertised address
and, on SSL/SASL_SSL, its TLS); a connection knows the one it came in on (``conn.listener``).
``serve`` reports the first listener's bound port through ``task_status`` (so port 0 works), accepts until
``shutdown`` is set, then stops reading new requests on every connection, lets in-flight ones
finish for up to ``trireme.shutdown.grace.ms``, and cancels whatever is left.

Accepting is paced to ``max.connection.creation.rate``; a connection over ``max.connections``
or ``max.connections.per.ip`` is closed at once.  When accept fails for want of descriptors, the
loop closes a spare descriptor it keeps for this, accepts the waiting connection and closes it
(the client sees a closed connection instead of a hang), takes the spare back and sleeps a
little: it never spins, and it serves again by itself once descriptors are free.
"""
from __future__ import annotations

import errno
import logging
import os
import socket

import trio

from .connection import Connection, TlsConnection
from .limits import out_of_descriptors

log = logging.getLogger("trireme.listener")

BACKOFF = 0.1       # seconds the accept loop sleeps after running out of descriptors
WILDCARD_HOSTS = ("", "0.0.0.0", "::")


class EndPoint:
    """One listener as a connection sees it (``conn.listener``): Kafka's listener name and security protocol, the
    address it is bound to and the one it advertises (Metadata, FindCoordinator, DescribeCluster answer with it),
    and its TLS (server.tls.ListenerTls; None on PLAINTEXT and SASL_PLAINTEXT)."""

    def __init__(self, spec, sockets: list[trio.SocketListener], tls=None):
        self.name = spec.name
        self.security_protocol = spec.security_protocol
        self.host = spec.host
        self.port = sockets[0].socket.getsockname()[1] if sockets else spec.port    # the bound one (port 0 too)
        # as Kafka: a listener bound to every interface advertises the machine's canonical host name
        self.advertised_host = spec.advertised_host or (socket.getfqdn() if spec.host in WILDCARD_HOSTS else spec.host)
        self.advertised_port = spec.advertised_port or self.port
        self.tls = tls
        self.sockets = sockets

    def __repr__(self) -> str:
        return f"<EndPoint {self.name} {self.security_protocol} {self.host}:{self.port}>"


class Listener:
    def __init__(self, broker, endpoints: list[EndPoint]):
        """``endpoints``: already bound (server/startup.open_listeners, before the logs load); the first is the one
        ``serve`` reports."""
        self.broker = broker
        self.endpoints = endpoints
        self.host = endpoints[0].host
        self.port = endpoints[0].port
        self.connections: set[Connection] = set()
        self.shutdown = trio.Event()
        self._spare: int | None = None

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started(self.endpoints[0].port)
        for endpoint in self.endpoints:
            log.info("listening host=%s port=%d listener=%s security_protocol=%s", endpoint.host, endpoint.port,
                     endpoint.name, endpoint.security_protocol)
        self._take_spare()
        async with trio.open_nursery() as connection_nursery:
            async with trio.open_nursery() as accept_nursery:
                for endpoint in self.endpoints:
                    for listener in endpoint.sockets:
                        accept_nursery.start_soon(self._accept_loop, listener.socket, connection_nursery, endpoint)
                await self.shutdown.wait()
                accept_nursery.cancel_scope.cancel()
            for endpoint in self.endpoints:
                for listener in endpoint.sockets:
                    await listener.aclose()
            for conn in list(self.connections):
                conn.stop_reading()
            grace = self.broker.config["trireme.shutdown.grace.ms"] / 1000
            with trio.move_on_after(grace):
                while self.connections:
                    await trio.sleep(0.01)
            connection_nursery.cancel_scope.cancel()
        if self._spare is not None:
            os.close(self._spare)
            self._spare = None

    def _take_spare(self) -> None:
        if self._spare is None:
            try:
                self._spare = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                pass        # still out of descriptors; the next shortage retries

    async def _accept_loop(self, listen_sock, nursery, endpoint: EndPoint) -> None:
        admission = self.broker.limits.admission
        while True:
            await admission.pace()
            try:
                sock, address = await listen_sock.accept()
            except OSError as e:
                if e.errno in (errno.ECONNABORTED, errno.EPROTO, errno.EPERM):
                    continue        # the client gave up before we took it
                if not out_of_descriptors(e):
                    raise
                await self._shed(listen_sock, e)
                continue
            ip = address[0] if isinstance(address, tuple) else "?"
            refusal = admission.refusal(ip)
            if refusal is not None:
                self.broker.limits.count(self.broker.limits.refused, refusal)
                log.warning("refusing connection from %s: %s reached", ip, refusal)
                sock.close()
                continue
            admission.opened(ip)
            nursery.start_soon(self._handle, trio.SocketStream(sock), ip, endpoint)

    async def _shed(self, listen_sock, error: OSError) -> None:
        """Out of descriptors: refuse the waiting connection with the spare descriptor, then back off."""
        limits = self.broker.limits
        limits.count(limits.refused, "out of descriptors")
        log.warning("accept failed, out of descriptors: %r", error)
        if self._spare is not None:
            os.close(self._spare)
            self._spare = None
            try:
                with trio.move_on_after(BACKOFF):
                    sock, _ = await listen_sock.accept()
                    sock.close()
            except OSError:
                pass
            self._take_spare()
        await trio.sleep(BACKOFF)

    async def _handle(self, stream: trio.SocketStream, ip: str, endpoint: EndPoint) -> None:
        admission = self.broker.limits.admission
        try:
            try:
                peer = "%s:%d" % stream.socket.getpeername()[:2]
            except OSError:
                peer = "?"
            conn = (Connection if endpoint.tls is None else TlsConnection)(stream, self.broker, peer, endpoint)
            self.connections.add(conn)
            try:
                await conn.run()
            except Exception:
                log.exception("connection task failed conn=%d", conn.id)
            finally:
                self.connections.discard(conn)
        finally:
            admission.closed(ip)


def advertised_address(ctx) -> tuple[str, int]:
    """HOST, PORT a request's answer names for this broker: the advertised address of the listener the request came
    in on (Kafka answers Metadata, FindCoordinator and DescribeCluster per listener), the first listener's for the
    broker's own requests."""
    endpoint = getattr(ctx.connection, "listener", None)
    if endpoint is None:
        return ctx.broker.advertised_host, ctx.broker.advertised_port
    return endpoint.advertised_host, endpoint.advertised_port


def listener_name(ctx) -> str:
    """The name of the listener a request came in on (the first listener's for the broker's own requests)."""
    endpoint = getattr(ctx.connection, "listener", None)
    if endpoint is None:
        endpoints = getattr(ctx.broker, "endpoints", None)
        return next(iter(endpoints)) if endpoints else "PLAINTEXT"
    return endpoint.name
