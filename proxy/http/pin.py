"""The runtime a request is answered by: the one current when it arrived, pinned for its whole life."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextvars import ContextVar

from aiohttp import web
from aiohttp.typedefs import Middleware

from proxy.compaction.runtime import Runtime, RuntimeSlot

_PINNED: ContextVar[Runtime | None] = ContextVar("compaction_proxy_runtime", default=None)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def pinned(request: web.Request) -> Runtime:
    """The runtime `request` started on (set by `pin_runtime`, in the request's own context)."""
    runtime = _PINNED.get()
    if runtime is None:
        raise RuntimeError(f"no runtime pinned for {request.path}: pin_runtime is not in the middleware stack")
    return runtime


def pin_runtime(slot: RuntimeSlot) -> Middleware:
    """Each request is answered by the runtime current when it arrived, start to finish (its stream included),
    and is counted on it, so a reload never changes settings under a request nor closes what it uses."""

    @web.middleware
    async def pin(request: web.Request, handler: Handler) -> web.StreamResponse:
        runtime = slot.current
        token = _PINNED.set(runtime)
        runtime.enter()
        try:
            return await handler(request)
        finally:
            runtime.leave()
            _PINNED.reset(token)

    return pin
