"""Typed application state keys, shared by the composition root and the handlers."""

from __future__ import annotations

from aiohttp import web

from proxy.compaction.runtime import RuntimeSlot
from proxy.config import Settings
from proxy.metrics import Metrics

# The settings the server started with. Only what cannot change live (listener, body limits, store) is read
# from here; everything that reloads is read from the request's runtime (proxy.runtime.pinned). The runtime
# slot also holds what outlives a reload: the session, the store, the flights.
SETTINGS = web.AppKey("settings", Settings)
RUNTIME = web.AppKey("runtime", RuntimeSlot)
METRICS = web.AppKey("metrics", Metrics)
