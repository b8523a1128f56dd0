"""Copy an upstream response to the client as it arrives, never changing a status once it is sent."""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable, Mapping
from contextvars import ContextVar

import aiohttp
from aiohttp import web

from proxy.upstream import response_headers, was_decoded

log = logging.getLogger(__name__)

ChunkFilter = Callable[[bytes], bytes]

# The response this request has started, if any. aiohttp buffers the status line until the first write, so the
# writer alone cannot tell the error middleware that an error response is no longer possible; this can.
_started: ContextVar[web.StreamResponse | None] = ContextVar("started_response", default=None)


def start_response(upstream: aiohttp.ClientResponse, extra_headers: Mapping[str, str] | None = None,
                   *, keep_length: bool = True) -> web.StreamResponse:
    headers = response_headers(upstream.headers, decoded=was_decoded(upstream) or not keep_length)
    headers.update(extra_headers or {})
    return web.StreamResponse(status=upstream.status, reason=upstream.reason, headers=headers)


async def relay(request: web.Request, upstream: aiohttp.ClientResponse, *, head: bytes = b"",
                extra_headers: Mapping[str, str] | None = None,
                chunk_filter: ChunkFilter | None = None,
                on_end: Callable[[], bytes] | None = None) -> web.StreamResponse:
    """Stream `head` then the rest of the upstream body. A filter may rewrite chunks (length then goes).

    Once the response is prepared nothing raises out of here but cancellation: a failure of the upstream, the
    filter, `on_end` or the client's socket ends the response by closing the connection.
    """
    response = start_response(upstream, extra_headers, keep_length=chunk_filter is None and not head)
    await response.prepare(request)
    _started.set(response)
    try:
        await _copy(response, upstream, head, chunk_filter, on_end)
    except Exception as error:  # noqa: BLE001  # anything at all: the status line is out, an error cannot follow
        abandon(request, error)
    return response


async def _copy(response: web.StreamResponse, upstream: aiohttp.ClientResponse, head: bytes,
                chunk_filter: ChunkFilter | None, on_end: Callable[[], bytes] | None) -> None:
    if head:
        await response.write(head)
    async for chunk in upstream.content.iter_any():
        out = chunk_filter(chunk) if chunk_filter else chunk
        if out:
            await response.write(out)
    if on_end is not None and (tail := on_end()):
        await response.write(tail)
    await response.write_eof()


def clear_started() -> None:
    """Forget any started response: called as a request enters the middleware stack."""
    _started.set(None)


def abandon_if_started(request: web.Request, error: BaseException) -> web.StreamResponse | None:
    """If a response is already under way, close the connection and return the response to hand back to aiohttp
    (which can no longer send anything); None when an error response can still be built."""
    response = _started.get()
    if response is None and request.writer.output_size > 0:  # a handler that streamed bytes itself
        response = web.StreamResponse()
    if response is not None:
        abandon(request, error)
    return response


def abandon(request: web.Request, error: BaseException) -> None:
    """End a started response the only honest way left: close the client's connection.

    Logged by type and place only: exception messages can quote message text, which never goes to logs.
    """
    log.warning("response failed after it started (%s at %s); closing the client connection",
                type(error).__name__, _where(error))
    if request.transport is not None:
        request.transport.close()


def _where(error: BaseException) -> str:
    frames = traceback.extract_tb(error.__traceback__)
    return f"{frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno}" if frames else "?"
