"""The middleware stack, one layer: the request's id and log line, its path checked, its runtime pinned, its proxy key
checked, every proxy-made error in its route's API shape, unread bodies."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

from aiohttp import web
from aiohttp.typedefs import Middleware

from proxy.compaction.runtime import Runtime, RuntimeSlot
from proxy.config import Settings
from proxy.core.credentials import presents_one_of
from proxy.dialects.catalog import error_body
from proxy.errors import PayloadTooLarge, ProxyError, Unauthorized
from proxy.http.paths import refused_path
from proxy.http.pin import pin, unpin
from proxy.http.relay import abandon_if_started, clear_started
from proxy.http.request_body import close_if_unread
from proxy.http.request_log import RequestLog
from proxy.http.routes import OPEN_PATHS, OWN_PREFIX

log = logging.getLogger("proxy.middleware")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_response(error: ProxyError, path: str = "") -> web.Response:
    """The error as its route's API shapes errors (OpenAI's on every route but another dialect's own)."""
    return web.json_response(error_body(path, error), status=error.status, headers=error.headers())


def edge(settings: Settings, runtimes: RuntimeSlot | None = None) -> Middleware:
    """The whole middleware stack as one layer, its steps in this order (a layer of awaits costs every request a
    few microseconds: a request's task passes through every frame of its await chain each time it resumes):

    1. the request's id and, once its answer is out, its count and access log line (proxy.http.request_log), so
       refusals have both;
    2. a path that could leave the upstream's base URL is refused before anything looks at the request (auth
       included: proxy.http.paths);
    3. the runtime current on arrival answers the request, start to finish (proxy.http.pin; an app without
       `runtimes` pins none and takes the keys of `settings`);
    4. only clients holding one of its proxy keys get further (require_proxy_key);
    5. ProxyError, aiohttp's own HTTP errors and crashes all become JSON in the route's API shape (OpenAI's, but
       on another dialect's route), never a traceback; only before the response started: after it, an error
       response cannot be sent, so the connection is closed;
    6. a request answered before its body was read ends its connection (proxy.http.request_body).
    """
    request_log = RequestLog(settings)
    static_keys = Runtime.keys_of(settings)

    @web.middleware
    async def edged(request: web.Request, handler: Handler) -> web.StreamResponse:
        begun = request_log.begin(request)
        response: web.StreamResponse | None = None
        error: BaseException | None = None
        try:
            if (response := refused_path(request)) is None:
                clear_started()
                pinning = pin(runtimes) if runtimes is not None else None
                try:
                    require_proxy_key(request, pinning[0].proxy_keys if pinning is not None else static_keys)
                    response = await handler(request)
                except Exception as failure:  # noqa: BLE001  # every failure is answered (or, once started, cut)
                    response = _answer_to(request, failure)
                finally:
                    if pinning is not None:
                        unpin(*pinning)
                close_if_unread(request, response)
            return response
        except BaseException as caught:  # cancellation: the client left
            error = caught
            raise
        finally:
            request_log.end(request, begun, response, error)

    return edged


def _answer_to(request: web.Request, failure: Exception) -> web.StreamResponse:
    """A failure's answer: the started response, cut (proxy.http.relay.abandon_if_started), or an error response."""
    started = abandon_if_started(request, failure)
    return started if started is not None else error_response(_as_proxy_error(request, failure), request.path)


def _as_proxy_error(request: web.Request, error: Exception) -> ProxyError:
    if isinstance(error, ProxyError):
        return error
    if isinstance(error, web.HTTPRequestEntityTooLarge):
        return PayloadTooLarge(f"request body exceeds the proxy's limit of {request.client_max_size} bytes")
    if isinstance(error, web.HTTPException):
        if error.status < 400:
            raise error  # a redirect is an answer, not an error
        refused = ProxyError(error.reason, code=str(error.status))
        refused.status, refused.error_type = error.status, "invalid_request_error"
        return refused
    log.error("unhandled error on %s %s", request.method, request.path, exc_info=error)
    return ProxyError("the proxy failed to handle this request", code="internal_error")


def require_proxy_key(request: web.Request, keys: Sequence[bytes]) -> None:
    """Only clients holding one of `keys` may use the proxy; none = open.

    The keys are looked up per request, so a reload that changes them applies from the next request on.
    Probes stay open, and the proxy's own prefix (the journal's API and dashboard) checks keys itself: an
    operator's key is not a proxy key, and the dashboard's files hold no data.
    """
    if keys and request.path not in OPEN_PATHS and not request.path.startswith(OWN_PREFIX) \
            and not presents_one_of(request.headers, keys):
        raise Unauthorized("a valid proxy API key is required")
