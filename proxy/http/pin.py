"""The runtime a request is answered by: the one current when it arrived, pinned for its whole life."""

from __future__ import annotations

from contextvars import ContextVar, Token

from aiohttp import web

from proxy.compaction.runtime import Runtime, RuntimeSlot

_PINNED: ContextVar[Runtime | None] = ContextVar("compaction_proxy_runtime", default=None)


def pinned(request: web.Request) -> Runtime:
    """The runtime `request` started on (pinned by the middleware's `edge`, in the request's own context)."""
    runtime = _PINNED.get()
    if runtime is None:
        raise RuntimeError(f"no runtime pinned for {request.path}: the app's middleware pins none")
    return runtime


def pin(slot: RuntimeSlot) -> tuple[Runtime, Token[Runtime | None]]:
    """Pin the runtime current now to the request running in this context, start to finish (its stream included),
    and count the request on it, so a reload never changes settings under a request nor closes what it uses.
    Release it with `unpin`, in the same context."""
    runtime = slot.current
    token = _PINNED.set(runtime)
    runtime.enter()
    return runtime, token


def unpin(runtime: Runtime, token: Token[Runtime | None]) -> None:
    runtime.leave()
    _PINNED.reset(token)
