"""Send answers to the client as they arrive, never changing a status once it is sent."""

from __future__ import annotations

import logging
import traceback
from contextvars import ContextVar

from aiohttp import web

from proxy.answer import Answer
from proxy.appkeys import METRICS

log = logging.getLogger(__name__)

# The response this request has started, if any. aiohttp buffers the status line until the first write, so the
# writer alone cannot tell the error middleware that an error response is no longer possible; this can.
_started: ContextVar[web.StreamResponse | None] = ContextVar("started_response", default=None)


async def deliver(request: web.Request, answer: Answer) -> web.StreamResponse:
    """Send an answer: a whole body at once, or a stream chunk by chunk as it arrives.

    One rule for every route: once a stream is prepared nothing raises out of here but cancellation; a failure of
    the upstream, of the answer's own work, or of the client's socket ends it by closing the connection.
    """
    if answer.chunks is None:
        return web.Response(status=answer.status, body=answer.body, headers=answer.headers)
    response = web.StreamResponse(status=answer.status, reason=answer.reason, headers=answer.headers)
    await response.prepare(request)
    _started.set(response)
    metrics = request.app.get(METRICS)
    if metrics is not None:
        metrics.open_streams.inc()
    try:
        async for chunk in answer.chunks:
            if chunk:
                await response.write(chunk)
        await response.write_eof()
    except Exception as error:  # noqa: BLE001  # anything at all: the status line is out, an error cannot follow
        abandon(request, error)
    finally:
        if metrics is not None:
            metrics.open_streams.dec()
    return response


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
