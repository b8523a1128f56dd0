"""Copy an upstream response to the client as it arrives, never changing a status once it is sent."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

import aiohttp
from aiohttp import web

from proxy.upstream import response_headers, was_decoded

log = logging.getLogger(__name__)

ChunkFilter = Callable[[bytes], bytes]


def start_response(upstream: aiohttp.ClientResponse, extra_headers: Mapping[str, str] | None = None,
                   *, keep_length: bool = True) -> web.StreamResponse:
    headers = response_headers(upstream.headers, decoded=was_decoded(upstream) or not keep_length)
    headers.update(extra_headers or {})
    return web.StreamResponse(status=upstream.status, reason=upstream.reason, headers=headers)


async def relay(request: web.Request, upstream: aiohttp.ClientResponse, *, head: bytes = b"",
                extra_headers: Mapping[str, str] | None = None,
                chunk_filter: ChunkFilter | None = None,
                on_end: Callable[[], bytes] | None = None) -> web.StreamResponse:
    """Stream `head` then the rest of the upstream body. A filter may rewrite chunks (length then goes)."""
    response = start_response(upstream, extra_headers, keep_length=chunk_filter is None and not head)
    await response.prepare(request)
    if head:
        await response.write(head)
    try:
        async for chunk in upstream.content.iter_any():
            out = chunk_filter(chunk) if chunk_filter else chunk
            if out:
                await response.write(out)
    except (TimeoutError, aiohttp.ClientError) as error:
        # The status line is already out; cutting the connection is the only honest signal left.
        log.warning("upstream failed mid-response (%s); closing the client connection", type(error).__name__)
        if request.transport is not None:
            request.transport.close()
        return response
    if on_end is not None and (tail := on_end()):
        await response.write(tail)
    await response.write_eof()
    return response
