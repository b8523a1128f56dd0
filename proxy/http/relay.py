"""Send answers to the client as they arrive, never changing a status once it is sent."""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections.abc import AsyncIterator, Awaitable
from contextvars import ContextVar

from aiohttp import web

from proxy.config import ServerConfig
from proxy.http.appkeys import METRICS
from proxy.http.pin import pinned
from proxy.store.store_health import LogThrottle
from proxy.upstream.answer import Answer

log = logging.getLogger("proxy.relay")
# One line per interval for clients cut as too slow, however many there are (the metric counts every one).
_slow_log = LogThrottle(time.monotonic)

# The response this request has started, if any. aiohttp buffers the status line until the first write, so the
# writer alone cannot tell the error middleware that an error response is no longer possible; this can.
_started: ContextVar[web.StreamResponse | None] = ContextVar("started_response", default=None)


async def deliver(request: web.Request, answer: Answer) -> web.StreamResponse:
    """Send an answer: a whole body at once, or a stream chunk by chunk as it arrives.

    One rule for every route: once a stream is prepared nothing raises out of here but cancellation; a failure of
    the upstream, of the answer's own work, or of the client's socket ends it by closing the connection, and a
    client that leaves one write's bytes untaken for server.write_timeout is cut (its connection aborted).
    """
    if answer.chunks is None:
        return web.Response(status=answer.status, body=answer.body, headers=answer.headers)
    response = web.StreamResponse(status=answer.status, reason=answer.reason, headers=answer.headers)
    await response.prepare(request)
    _started.set(response)
    metrics = request.app.get(METRICS)
    if metrics is not None:
        metrics.open_streams.inc()
    seconds = _write_timeout(request)
    try:
        async for chunk in answer.chunks:
            if chunk:
                await _within(seconds, response.write(chunk))
        await _within(seconds, response.write_eof())
    except _SlowReader:
        _cut(request, seconds)
    except Exception as error:  # noqa: BLE001  # anything at all: the status line is out, an error cannot follow
        abandon(request, error)
    finally:
        if metrics is not None:
            metrics.open_streams.dec()
        await _close(answer.chunks)
    return response


class _SlowReader(Exception):
    """The client did not take a write's bytes within server.write_timeout."""


def _write_timeout(request: web.Request) -> float:
    """The live setting (a reload applies to the next stream); the default for an app without runtimes."""
    try:
        return pinned(request).settings.server.write_timeout
    except RuntimeError:
        return float(ServerConfig.model_fields["write_timeout"].default)


async def _within(seconds: float, write: Awaitable[None]) -> None:
    # A write waits only while the socket's buffers are full: a client reading at a byte a second would hold
    # this stream, and the upstream connection behind it, for as long as it liked.
    try:
        async with asyncio.timeout(seconds):
            await write
    except TimeoutError:
        raise _SlowReader from None


def _cut(request: web.Request, seconds: float) -> None:
    """Abort (not close: a close waits to flush to the very client that does not read) and count the client."""
    metrics = request.app.get(METRICS)
    if metrics is not None:
        metrics.slow_readers_cut.inc()
    suppressed = _slow_log.allow("slow")
    if suppressed is not None:
        log.warning("a client left its stream's bytes untaken for %gs (server.write_timeout): cutting it and "
                    "releasing its upstream connection%s", seconds,
                    f" ({suppressed} more since the last report)" if suppressed else "")
    if request.transport is not None:
        request.transport.abort()


async def _close(chunks: AsyncIterator[bytes]) -> None:
    """Close the answer's chunks (an async generator), so the upstream response behind them is let go now."""
    close = getattr(chunks, "aclose", None)
    if close is None:
        return
    try:
        await close()
    except Exception as error:  # noqa: BLE001  # the stream is over either way; nothing may raise past deliver
        log.warning("closing a stream's source failed (%s)", type(error).__name__)


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
