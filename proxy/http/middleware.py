"""The thin middleware stack's guard (paths, proxy keys, every proxy-made error in its route's API shape, unread
bodies), and the count of every answer."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

from aiohttp import web
from aiohttp.typedefs import Middleware

from proxy.core.credentials import presents_one_of
from proxy.dialects.catalog import error_body
from proxy.errors import PayloadTooLarge, ProxyError, Unauthorized
from proxy.headers import outcome_of
from proxy.http.appkeys import METRICS
from proxy.http.paths import refused_path
from proxy.http.relay import abandon_if_started, clear_started
from proxy.http.request_body import close_if_unread
from proxy.http.routes import OPEN_PATHS, OWN_PREFIX

log = logging.getLogger("proxy.middleware")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_response(error: ProxyError, path: str = "") -> web.Response:
    """The error as its route's API shapes errors (OpenAI's on every route but another dialect's own)."""
    return web.json_response(error_body(path, error), status=error.status, headers=error.headers())


def count_request(request: web.Request, route: str, response: web.StreamResponse | None) -> None:
    """Every answer counted by route, status and what compaction did, by the outermost layer (request_log), so
    refusals count too; a request that raised past every layer (None) as a 500."""
    metrics = request.app.get(METRICS)
    if metrics is None:
        return
    if response is None:
        metrics.labelled(metrics.requests, route, "500", "none").inc()
    else:
        metrics.labelled(metrics.requests, route, str(response.status), outcome_of(response.headers)).inc()


def guard(accepted: Callable[[web.Request], Sequence[bytes]]) -> Middleware:
    """Four layers of the stack as one, in their order (a layer of awaits costs every request a few microseconds):

    1. a path that could leave the upstream's base URL is refused before anything looks at the request (auth
       included: proxy.http.paths);
    2. only clients holding one of the keys `accepted` gives for the request get further (require_proxy_key);
    3. ProxyError, aiohttp's own HTTP errors and crashes all become JSON in the route's API shape (OpenAI's, but
       on another dialect's route), never a traceback; only before the response started: after it, an error
       response cannot be sent, so the connection is closed;
    4. a request answered before its body was read ends its connection (proxy.http.request_body).
    """

    @web.middleware
    async def guarded(request: web.Request, handler: Handler) -> web.StreamResponse:
        refused = refused_path(request)
        if refused is not None:
            return refused
        clear_started()
        try:
            require_proxy_key(request, accepted(request))
            response = await handler(request)
        except Exception as error:  # noqa: BLE001  # every failure is answered (or, once started, cut) here
            started = abandon_if_started(request, error)
            response = started if started is not None else \
                error_response(_as_proxy_error(request, error), request.path)
        close_if_unread(request, response)
        return response

    return guarded


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
