"""Typed application state keys, shared by the composition root and the handlers."""

from __future__ import annotations

from aiohttp import web

from proxy.config import Settings
from proxy.metrics import Metrics
from proxy.pipeline import ChatPipeline
from proxy.store import SummaryStore
from proxy.upstream import Upstream

SETTINGS = web.AppKey("settings", Settings)
UPSTREAM = web.AppKey("upstream", Upstream)
PIPELINE = web.AppKey("pipeline", ChatPipeline)
STORE = web.AppKey("store", SummaryStore)
METRICS = web.AppKey("metrics", Metrics)
