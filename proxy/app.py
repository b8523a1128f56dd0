"""Composition root: build the aiohttp application from Settings and own every lifecycle."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from aiohttp import web

from proxy.compaction.recorder import Recorder
from proxy.compaction.runtime import (
    RuntimeSlot,
    Shared,
    TrackedFlights,
    build_runtime,
    load_templates,
)
from proxy.config import Settings
from proxy.core.calibration import Calibration
from proxy.core.history_index import HistoryIndex
from proxy.core.tokens import TokenCounter
from proxy.dialects.catalog import ROUTES
from proxy.http import handlers, journal_api
from proxy.http.appkeys import METRICS, RUNTIME, SETTINGS
from proxy.http.middleware import edge
from proxy.http.request_log import on_response_prepare
from proxy.http.routes import COMPACT_PATH, COUNT_TOKENS_PATH
from proxy.http.server_timeouts import REFUSED_BODY_LINGER, GuardedAppRunner
from proxy.metrics import Metrics
from proxy.store.flights import open_flights
from proxy.store.journals import open_journal
from proxy.store.store_timing import TimedStore
from proxy.store.stores import open_store
from proxy.upstream.upstream import create_session

log = logging.getLogger(__name__)


def create_app(settings: Settings) -> web.Application:
    slot = RuntimeSlot()
    app = web.Application(client_max_size=settings.server.max_body_bytes, middlewares=[edge(settings, slot)])
    app.on_response_prepare.append(on_response_prepare)  # the id on every response, streams included
    app[SETTINGS] = settings
    app[METRICS] = Metrics()
    app[RUNTIME] = slot
    app.cleanup_ctx.append(_shared_and_runtime)
    app.router.add_get("/healthz", handlers.healthz)
    app.router.add_get("/readyz", handlers.readyz)
    app.router.add_get("/metrics", handlers.metrics)
    journal_api.add_routes(app)
    for path, dialect in ROUTES.items():
        app.router.add_post(path, handlers.compacting(dialect))
    app.router.add_post(COMPACT_PATH, handlers.responses_compact)
    app.router.add_post(COUNT_TOKENS_PATH, handlers.messages_count_tokens)
    app.router.add_route("*", "/v1/{tail:.*}", handlers.passthrough)
    return app


async def _shared_and_runtime(app: web.Application) -> AsyncIterator[None]:
    """The HTTP session, the summary store and its flights live and die with the app; the runtime built over
    them is replaced on reload (proxy.reload) and closed here with any runtime still retiring."""
    settings, metrics = app[SETTINGS], app[METRICS]
    count_store_error = metrics.store_errors_counter()
    # Timed where requests wait on it; Redis's lease calls pass through (and count as a LeaseStore still).
    store = TimedStore(open_store(settings.store, on_error=count_store_error), metrics.store_latency())
    # A waiter gives up on another replica's summary after the summariser's own deadline plus one lease expiry.
    flights = open_flights(store, on_error=count_store_error,
                           max_wait=settings.compaction.summarizer.timeout + settings.store.lock_ttl_seconds)
    journal = open_journal(settings.store, settings.journal, on_error=count_store_error) \
        if settings.journal.enabled else None
    recorder = Recorder(journal, on_error=count_store_error)
    async with create_session(settings.upstream) as session:
        counter = TokenCounter()
        shared = Shared(session, store, TrackedFlights(flights), metrics, counter, Calibration(), HistoryIndex(counter),
                        recorder)
        app[RUNTIME].install(shared, build_runtime(settings, shared, load_templates(settings)))
        try:
            yield
        finally:
            await app[RUNTIME].close()
            await recorder.drain()
            if journal is not None:
                await journal.close()
            await store.close()


@dataclass
class RunningServer:
    runner: web.AppRunner
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def app(self) -> web.Application:
        return self.runner.app

    async def stop(self) -> None:
        """Stop listening, let requests and streams in progress finish within server.shutdown_grace_seconds
        (then cancel them), then close what the app owns: background summaries are cancelled, the store closed."""
        await self.runner.cleanup()


async def start_server(settings: Settings, *, host: str | None = None, port: int | None = None,
                       reuse_port: bool = False) -> RunningServer:
    """Serve `settings` on a TCP socket; port 0 picks a free one. Used by the CLI and the tests alike.

    `reuse_port` lets worker processes listen on one port, the kernel spreading connections over them.
    """
    limits = settings.server
    runner = GuardedAppRunner(
        create_app(settings), handler_cancellation=True, access_log=None,
        header_timeout=limits.header_timeout, keepalive_timeout=limits.keepalive_timeout,
        # Bodies are inflated by proxy.request_body, bounded and in steps; aiohttp would inflate them on the loop,
        # whole, even after the request was refused.
        auto_decompress=False, lingering_time=REFUSED_BODY_LINGER,
        # At cleanup aiohttp (>= 3.9) waits this long for handlers in progress, fails the bodies still being read,
        # waits as long again, then cancels: a streaming handler gets both waits, so each is half the grace.
        shutdown_timeout=limits.shutdown_grace_seconds / 2)
    await runner.setup()
    bind_host = host if host is not None else settings.server.host
    site = web.TCPSite(runner, bind_host, settings.server.port if port is None else port, reuse_port=reuse_port or None)
    await site.start()
    bound_port = runner.addresses[0][1]
    return RunningServer(runner, bind_host, bound_port)
