"""Guards on aiohttp's server connections: a request-head deadline (it has none) and room under the open-files limit."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_server import Server

from proxy.http.appkeys import SETTINGS
from proxy.http.client_connections import ClientConnections, client_capacity, open_files_limit

log = logging.getLogger("proxy.server_timeouts")

# Seconds a refused request's unread body is still read and thrown away (never inflated) before its connection
# closes: a client still sending gets to read the refusal instead of a reset, a stalled one is let go. aiohttp
# lingers 10 s by default.
REFUSED_BODY_LINGER = 1.0


class HeadDeadlineHandler(RequestHandler):
    """aiohttp's connection handler, closing a connection whose request head is not complete in time.

    The clock starts when the connection is made (a client that never sends a byte is dropped too) and, on a
    kept-alive connection, at the first byte of the next request; idle time between requests is keep-alive's.
    """

    __slots__ = ("_armed_at_request", "_clients", "_head_timer", "_header_timeout")

    def __init__(self, manager: Server, *, header_timeout: float, clients: ClientConnections, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._header_timeout = header_timeout
        self._clients = clients
        self._head_timer: asyncio.TimerHandle | None = None
        self._armed_at_request = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm()
        self._clients.opened(self)

    def data_received(self, data: bytes) -> None:
        self._clients.active(self)
        starts_a_head = bool(data) and self._head_timer is None and self._awaiting_head()
        heads = self._request_count
        super().data_received(data)
        if starts_a_head and self._request_count == heads:
            self._arm()  # the head began and is not complete: its clock runs (a head read whole needs none)
        elif self._head_timer is not None and self._request_count != self._armed_at_request:
            self._disarm()  # the head is complete; the body has its own deadline

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm()
        self._clients.closed(self)
        super().connection_lost(exc)

    def is_idle(self) -> bool:
        """No request in progress nor queued: waiting for the next request head, or for the first one (the serving
        loop of a connection just accepted may not have run yet). ClientConnections sheds only these."""
        return not self._request_in_progress and not self._messages and \
            (self._awaiting_head() or self._request_count == 0)

    def shed(self) -> None:
        log.debug("closing an idle connection from %s to make room under the open files limit", self.peername)
        self.force_close()

    def _awaiting_head(self) -> bool:
        # aiohttp's own idle test (see _process_keepalive): the serving loop waits for the next message.
        waiter = self._waiter
        return waiter is not None and not waiter.done()

    def _arm(self) -> None:
        self._disarm()
        self._armed_at_request = self._request_count
        self._head_timer = self._loop.call_later(self._header_timeout, self._head_overdue)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_overdue(self) -> None:
        self._head_timer = None
        if self._request_count == self._armed_at_request and not self._request_in_progress:
            log.debug("closing a connection from %s: no complete request head within %gs", self.peername,
                      self._header_timeout)
            self.force_close()


class _HeadDeadlineServer(Server):
    """aiohttp's low-level server, making HeadDeadlineHandler connections (the kwargs carry header_timeout)."""

    def __call__(self) -> RequestHandler:
        return HeadDeadlineHandler(self, loop=self._loop, **self._kwargs)


class GuardedAppRunner(web.AppRunner):
    """web.AppRunner whose connections have a request-head deadline and stay within the open-files limit.

    aiohttp builds its Server by class name inside Application._make_handler, so the server it returns is
    re-classed to a subclass that only changes which handler each connection gets.
    """

    def __init__(self, app: web.Application, *, header_timeout: float, **kwargs: Any) -> None:
        # Read once: the soft limit is raised (proxy.cli) before the server starts, and the upstream pool,
        # whose size the reserve is for, is not rebuilt by a reload.
        limit = open_files_limit()
        capacity = None if limit is None else client_capacity(limit, app[SETTINGS].upstream.max_connections)
        clients = ClientConnections(capacity, limit=limit)
        super().__init__(app, header_timeout=header_timeout, clients=clients, **kwargs)

    async def _make_server(self) -> Server:
        server = await super()._make_server()
        server.__class__ = _HeadDeadlineServer
        return server
