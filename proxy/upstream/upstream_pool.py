"""Upstream connection reuse that cannot cost a second copy of a request: dead pooled connections are never used."""

from __future__ import annotations

import select
import weakref
from typing import Any

import aiohttp
from aiohttp.client_proto import ResponseHandler
from aiohttp.client_reqrep import ClientRequest
from aiohttp.connector import Connection
from aiohttp.tracing import Trace

# Methods a server may receive twice without harm (RFC 9110 §9.2.1 safe methods): these may always be retried.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# Dead pooled connections discarded for one request before it settles for a new one.
MAX_DISCARDED = 16
# aiohttp's words when it finds the transport closing before it hands a write to it (http_writer.StreamWriter).
_UNWRITTEN = "Cannot write to closing transport"
_POLL_ANY = select.POLLIN | select.POLLPRI | select.POLLERR | select.POLLHUP if hasattr(select, "poll") else 0


def peer_has_spoken(connection: Connection) -> bool:
    """True when an idle connection has something to read: the server's FIN, a reset, or an unasked-for answer.

    An idle HTTP/1.1 connection is silent until it carries a request, so any of these means the server is done with
    it, provably before a byte of the next request is written. The event loop may not have noticed yet: it may have
    been busy since the bytes arrived.
    """
    transport = connection.transport
    if transport is None or transport.is_closing():
        return True
    sock = transport.get_extra_info("socket")
    if sock is None or not _POLL_ANY:
        return False
    poller = select.poll()  # not select.select: descriptors above 1024 are normal once the open-files limit is raised
    poller.register(sock.fileno(), _POLL_ANY)
    return bool(poller.poll(0))


def never_written(error: BaseException) -> bool:
    """True when the request failed because its connection was closing before its bytes were written.

    aiohttp writes a request with a bytes body (headers and body together) in one call, which raises before
    writing anything when the transport is already closing: such a request never left, and may be sent again.
    """
    seen: BaseException | None = error
    for _ in range(8):  # the cause chain is short; a cycle must not loop forever
        if seen is None:
            return False
        if isinstance(seen, aiohttp.ClientConnectionResetError) and str(seen) == _UNWRITTEN:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class ReuseCheckingConnector(aiohttp.TCPConnector):
    """A TCPConnector that checks a pooled connection is still quiet before handing it out again."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._handed_out: weakref.WeakSet[ResponseHandler] = weakref.WeakSet()

    async def connect(self, req: ClientRequest, traces: list[Trace], timeout: aiohttp.ClientTimeout) -> Connection:
        for _ in range(MAX_DISCARDED):
            connection = await super().connect(req, traces, timeout)
            protocol = connection.protocol
            if protocol is None or protocol not in self._handed_out:
                break  # a new connection: nothing to check
            if not peer_has_spoken(connection):
                return connection
            connection.close()
        else:
            connection = await super().connect(req, traces, timeout)
        if connection.protocol is not None:
            self._handed_out.add(connection.protocol)
        return connection


class UpstreamResponse(aiohttp.ClientResponse):
    """A response whose connection is not pooled after an empty chunked body.

    A stream that ends before its first byte is how a server reports a failure after it sent 200 (llama.cpp's
    python server on a prompt over its window), and such a server closes the connection 10-40 ms later: a request
    sent on it in that window is lost after it left, and could not be retried without risking a second copy.
    """

    _eof_at_start = False

    async def start(self, connection: Connection) -> aiohttp.ClientResponse:
        response = await super().start(connection)
        if self._eof_at_start:
            self._eof_at_start = False
            self._release_unless_empty_stream()
        return response

    def _response_eof(self) -> None:
        if self._headers is None:
            # The body was complete with the head, so aiohttp calls this before it has set the headers: wait for
            # start() to finish, which it does without yielding to the loop.
            self._eof_at_start = True
            return
        self._release_unless_empty_stream()

    def _release_unless_empty_stream(self) -> None:
        connection = self.connection
        chunked = "chunked" in self.headers.get(aiohttp.hdrs.TRANSFER_ENCODING, "").lower()
        if connection is not None and connection.protocol is not None and chunked \
                and self.content.total_bytes == 0:
            connection.protocol.force_close()
        super()._response_eof()
