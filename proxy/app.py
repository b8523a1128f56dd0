"""Composition root: build the aiohttp application from Settings and own every lifecycle."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

from aiohttp import web
from aiohttp.typedefs import Middleware

from proxy import handlers
from proxy.appkeys import METRICS, PIPELINE, SETTINGS, STORE, UPSTREAM
from proxy.calibration import Calibration
from proxy.compactor import Compactor
from proxy.config import Settings
from proxy.discovery import WindowSource
from proxy.flights import open_flights
from proxy.metrics import Metrics
from proxy.middleware import count_requests, openai_errors, require_proxy_key
from proxy.model_client import ModelClient
from proxy.paths import refuse_escaping_paths
from proxy.pipeline import ChatPipeline
from proxy.request_body import close_unread_bodies
from proxy.server_timeouts import REFUSED_BODY_LINGER, GuardedAppRunner
from proxy.store import open_store
from proxy.templates import Templates
from proxy.tokens import TokenCounter
from proxy.upstream import Upstream, create_session
from proxy.windows import ContextWindows

log = logging.getLogger(__name__)


def create_app(settings: Settings) -> web.Application:
    # Paths first: an escaping path is refused before anything (auth included) looks at the request.
    middlewares: list[Middleware] = [count_requests, refuse_escaping_paths, close_unread_bodies, openai_errors]
    if settings.server.api_keys:
        middlewares.append(require_proxy_key([key.get_secret_value() for key in settings.server.api_keys]))
    app = web.Application(client_max_size=settings.server.max_body_bytes, middlewares=middlewares)
    app[SETTINGS] = settings
    app[METRICS] = Metrics()
    app.cleanup_ctx.append(_upstream_and_pipeline)
    app.router.add_get("/healthz", handlers.healthz)
    app.router.add_get("/readyz", handlers.readyz)
    app.router.add_get("/metrics", handlers.metrics)
    app.router.add_post("/v1/chat/completions", handlers.chat_completions)
    app.router.add_route("*", "/v1/{tail:.*}", handlers.passthrough)
    return app


async def _upstream_and_pipeline(app: web.Application) -> AsyncIterator[None]:
    """The HTTP session, the summary store and the chat pipeline live and die with the app."""
    settings = app[SETTINGS]
    templates = Templates(settings.compaction.prompts_dir)
    templates.preload()
    counter = TokenCounter()
    count_store_error = app[METRICS].store_errors_counter()
    store = open_store(settings.store, on_error=count_store_error)
    # A waiter gives up on another replica's summary after the summariser's own deadline plus one lease expiry.
    flights = open_flights(store, on_error=count_store_error,
                           max_wait=settings.compaction.summarizer.timeout + settings.store.lock_ttl_seconds)
    async with create_session(settings.upstream) as session:
        count_error, timing = app[METRICS].upstream_errors_counter(), app[METRICS].upstream_latency()
        upstream = Upstream(session, settings.upstream, count_error, timing)
        summarizer_config = settings.compaction.summarizer
        summarizer_upstream = Upstream(session, summarizer_config.upstream, count_error, timing) \
            if summarizer_config.upstream \
            else upstream
        windows = ContextWindows(settings, {"chat": WindowSource.of(session, upstream),
                                            "summarizer": WindowSource.of(session, summarizer_upstream)})

        calibration = Calibration()

        def summarizer_model(name: str, headers: Mapping[str, str], max_tokens: int) -> ModelClient:
            return ModelClient(
                summarizer_upstream, name, headers, max_output_tokens=max_tokens,
                context_window=windows.window(name, "summarizer"), timeout=summarizer_config.timeout,
                output_field=summarizer_config.output_limit_field, temperature=summarizer_config.temperature,
                structured_output=summarizer_config.structured_output,
                estimate=lambda messages: calibration.adjust(name, counter.count_messages(messages)))

        compactor = Compactor(settings, store, counter, templates, app[METRICS], summarizer_model, calibration,
                              flights)
        pipeline = ChatPipeline(settings, upstream, compactor, counter, calibration, windows, app[METRICS])
        app[UPSTREAM], app[STORE], app[PIPELINE] = upstream, store, pipeline
        try:
            yield
        finally:
            await pipeline.close()
            await windows.close()
            await store.close()


@dataclass
class RunningServer:
    runner: web.AppRunner
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def stop(self) -> None:
        await self.runner.cleanup()


async def start_server(settings: Settings, *, host: str | None = None, port: int | None = None) -> RunningServer:
    """Serve `settings` on a TCP socket; port 0 picks a free one. Used by the CLI and the tests alike."""
    limits = settings.server
    runner = GuardedAppRunner(
        create_app(settings), handler_cancellation=True, access_log=None,
        header_timeout=limits.header_timeout, keepalive_timeout=limits.keepalive_timeout,
        # Bodies are inflated by proxy.request_body, bounded and in steps; aiohttp would inflate them on the loop,
        # whole, even after the request was refused.
        auto_decompress=False, lingering_time=REFUSED_BODY_LINGER)
    await runner.setup()
    bind_host = host if host is not None else settings.server.host
    site = web.TCPSite(runner, bind_host, settings.server.port if port is None else port)
    await site.start()
    bound_port = runner.addresses[0][1]
    return RunningServer(runner, bind_host, bound_port)
