"""The trio TCP listener: one nursery accepts, another holds the connections, and shutdown has a grace deadline.

``serve`` reports the bound port through ``task_status`` (so port 0 works), accepts until
``shutdown`` is set, then stops reading new requests on every connection, lets in-flight ones
finish for up to ``trireme.shutdown.grace.ms``, and cancels whatever is left.
"""
from __future__ import annotations

import functools
import logging

import trio

from .connection import Connection

log = logging.getLogger("trireme.listener")


class Listener:
    def __init__(self, broker, host: str, port: int):
        self.broker = broker
        self.host = host
        self.port = port
        self.connections: set[Connection] = set()
        self.shutdown = trio.Event()

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(self.port, host=self.host)
        bound = listeners[0].socket.getsockname()
        task_status.started(bound[1])
        log.info("listening host=%s port=%d", self.host, bound[1])
        async with trio.open_nursery() as connection_nursery:
            async with trio.open_nursery() as accept_nursery:
                accept_nursery.start_soon(functools.partial(
                    trio.serve_listeners, self._handle, listeners, handler_nursery=connection_nursery))
                await self.shutdown.wait()
                accept_nursery.cancel_scope.cancel()
            for listener in listeners:
                await listener.aclose()
            for conn in list(self.connections):
                conn.reader_scope.cancel()
            grace = self.broker.config["trireme.shutdown.grace.ms"] / 1000
            with trio.move_on_after(grace):
                while self.connections:
                    await trio.sleep(0.01)
            connection_nursery.cancel_scope.cancel()

    async def _handle(self, stream: trio.SocketStream) -> None:
        try:
            peer = "%s:%d" % stream.socket.getpeername()[:2]
        except OSError:
            peer = "?"
        conn = Connection(stream, self.broker, peer)
        self.connections.add(conn)
        self.broker.metrics.connections += 1
        try:
            await conn.run()
        except Exception:
            log.exception("connection task failed conn=%d", conn.id)
        finally:
            self.connections.discard(conn)
            self.broker.metrics.connections -= 1
