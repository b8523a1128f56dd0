"""The runtime: everything built from one Settings, swapped whole when the config is reloaded."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from pydantic import SecretStr

from proxy.compaction.api_fallback import NativeOrChat
from proxy.compaction.compactor import Compactor
from proxy.compaction.journey import Serving
from proxy.compaction.pair_summaries import PairSummaries
from proxy.compaction.pipeline import Pipeline
from proxy.compaction.recorder import Recorder
from proxy.compaction.tool_stages import ToolStages, pair_policy
from proxy.config import Settings
from proxy.core.calibration import Calibration
from proxy.core.fingerprint import HASH_ERRORS
from proxy.core.history_index import HistoryIndex
from proxy.core.stored_replacements import StoredReplacements
from proxy.core.tokens import TokenCounter
from proxy.dialects.body_memo import BodyMemo
from proxy.dialects.catalog import DIALECTS, fallback, serving
from proxy.dialects.chat import CHAT
from proxy.dialects.dialect import Dialect
from proxy.metrics import Metrics
from proxy.store.flights import Build, Flights
from proxy.store.store import CompactedPrefix, SummaryStore
from proxy.summarizer.model_client import ModelClient
from proxy.summarizer.structured_output import Mode
from proxy.summarizer.templates import Templates
from proxy.upstream.discovery import WindowSource
from proxy.upstream.upstream import Upstream
from proxy.upstream.windows import ContextWindows

log = logging.getLogger("proxy.runtime")

# The runtime the request being handled started with. A context variable, not request storage: aiohttp has
# typed request keys only since 3.14, and handler code (and the tasks it starts) runs in the request's context.


class TrackedFlights:
    """The process's flights, remembering every summary task started through them, so shutdown can cancel the
    background summaries of every runtime, retired ones included."""

    def __init__(self, inner: Flights) -> None:
        self._inner = inner
        self._tasks: set[asyncio.Task[CompactedPrefix]] = set()

    def running(self, namespace: str, prefix_hash: str) -> asyncio.Task[CompactedPrefix] | None:
        return self._inner.running(namespace, prefix_hash)

    def start(self, namespace: str, prefix_hash: str, build: Build) -> asyncio.Task[CompactedPrefix]:
        task = self._inner.start(namespace, prefix_hash, build)
        if task not in self._tasks:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return task

    async def wait_for_any(self, namespace: str, chain: Sequence[str]) -> bool:
        return await self._inner.wait_for_any(namespace, chain)

    def running_any(self, namespace: str, chain: Sequence[str]) -> bool:
        return self._inner.running_any(namespace, chain)

    async def cancel_all(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


@dataclass(frozen=True)
class Shared:
    """What outlives a reload: the upstream session and pool, the store and its flights, the metrics, the token
    counter, what calibration learned about each model's tokenizer, the index of messages seen lately, the large
    bodies read lately, the compaction journal's recorder, and what stored summaries' replacements count and
    encode to."""

    session: aiohttp.ClientSession
    store: SummaryStore
    flights: TrackedFlights
    metrics: Metrics
    counter: TokenCounter
    calibration: Calibration
    history: HistoryIndex
    recorder: Recorder = field(default_factory=lambda: Recorder(None))
    bodies: BodyMemo = field(default_factory=BodyMemo)
    replacements: StoredReplacements = field(default_factory=StoredReplacements)


class Runtime:
    """One Settings made into objects: upstream clients, windows, templates, compactor, pipeline, proxy keys.

    Counts the requests that started on it, so a retired runtime is closed only once they have finished.
    """

    def __init__(self, settings: Settings, upstream: Upstream, windows: ContextWindows,
                 pipelines: Mapping[str, Serving], stages: ToolStages | None = None) -> None:
        self.settings = settings
        self.upstream = upstream
        self.windows = windows
        self.pipelines = pipelines  # by dialect name
        self.stages = stages
        self.proxy_keys = self.keys_of(settings)
        # Operator keys (server.admin_keys): /readyz's details and every tenant's journal. Not proxy keys.
        self.admin_keys = _encoded(settings.server.admin_keys)
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @staticmethod
    def keys_of(settings: Settings) -> tuple[bytes, ...]:
        """The proxy keys (server.api_keys) as a request's credentials are compared with them."""
        return _encoded(settings.server.api_keys)

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def enter(self) -> None:
        self._in_flight += 1
        self._idle.clear()

    def leave(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0:
            self._idle.set()

    async def drained(self) -> None:
        """Return once no request that started on this runtime is still being answered."""
        await self._idle.wait()

    async def close(self) -> None:
        for pipeline in self.pipelines.values():
            await pipeline.close()
        if self.stages is not None:
            await self.stages.close()
        await self.windows.close()


def _encoded(keys: tuple[SecretStr, ...]) -> tuple[bytes, ...]:
    """Configured keys as a request's credentials are compared with them."""
    return tuple(key.get_secret_value().encode("utf-8", HASH_ERRORS) for key in keys)


def load_templates(settings: Settings) -> Templates:
    """The prompt templates, compiled (tens of milliseconds: a reload does it off the event loop); raises when
    one does not load."""
    templates = Templates(settings.compaction.prompts_dir)
    templates.preload()
    return templates


def build_runtime(settings: Settings, shared: Shared, templates: Templates) -> Runtime:
    """The per-Settings objects over the long-lived ones."""
    metrics, counter, calibration = shared.metrics, shared.counter, shared.calibration
    count_error, timing = metrics.upstream_errors_counter(), metrics.upstream_latency()
    upstream = Upstream(shared.session, settings.upstream, count_error, timing)
    summarizer_config = settings.compaction.summarizer
    summarizer_upstream = Upstream(shared.session, summarizer_config.upstream, count_error, timing) \
        if summarizer_config.upstream \
        else upstream
    windows = ContextWindows(settings, {"chat": WindowSource.of(shared.session, upstream),
                                        "summarizer": WindowSource.of(shared.session, summarizer_upstream)})

    def model_clients(structured_output: Mode) -> Callable[[str, Mapping[str, str], int, int], ModelClient]:
        def model(name: str, headers: Mapping[str, str], max_tokens: int, whole_tokens: int) -> ModelClient:
            return ModelClient(
                summarizer_upstream, name, headers, max_output_tokens=max_tokens, whole_output_tokens=whole_tokens,
                context_window=windows.window(name, "summarizer"), timeout=summarizer_config.timeout,
                output_field=summarizer_config.output_limit_field, temperature=summarizer_config.temperature,
                structured_output=structured_output,
                estimate=lambda messages: calibration.adjust(name, counter.count_messages(messages)))
        return model

    summarizer_model = model_clients(summarizer_config.structured_output)
    compactor = Compactor(settings, shared.store, counter, templates, metrics, summarizer_model, calibration,
                          shared.flights, shared.recorder, shared.replacements)

    # Pair summaries are a list of short texts, never the whole-history summary's schema: plain requests.
    pair_model = model_clients("off")
    pairs = PairSummaries(shared.store, pair_model, templates, counter, metrics, pair_policy(settings))
    stages = ToolStages(settings, counter, calibration, pairs)

    def chat_requests(outcome: str) -> None:
        metrics.labelled(metrics.chat_requests, outcome).inc()

    def pipeline(dialect: Dialect[Any]) -> Pipeline[Any]:
        # The older counter is chat completions' own; every route is counted by requests_total.
        return Pipeline(dialect, settings, upstream, compactor, counter, calibration, windows, metrics,
                        shared.history, count=chat_requests if dialect is CHAT else None, stages=stages,
                        recorder=shared.recorder, bodies=shared.bodies)

    def served(dialect: Dialect[Any]) -> Serving:
        native, bridge = pipeline(serving(dialect, settings)), fallback(dialect, settings)
        return native if bridge is None else NativeOrChat(dialect.name, native, pipeline(bridge))

    pipelines = {dialect.name: served(dialect) for dialect in DIALECTS}
    return Runtime(settings, upstream, windows, pipelines, stages)


class RuntimeSlot:
    """The runtime new requests get. A swap is one assignment on the event loop, so every request sees either
    the old runtime or the new one whole; the old one is closed once its requests have finished."""

    def __init__(self) -> None:
        self._current: Runtime | None = None
        self._shared: Shared | None = None
        self._retiring: dict[asyncio.Task[None], Runtime] = {}

    @property
    def current(self) -> Runtime:
        if self._current is None:
            raise RuntimeError("the application has not started: no runtime yet")
        return self._current

    @property
    def shared(self) -> Shared:
        if self._shared is None:
            raise RuntimeError("the application has not started: no shared resources yet")
        return self._shared

    def install(self, shared: Shared, first: Runtime) -> None:
        self._shared, self._current = shared, first

    def swap(self, new: Runtime) -> Runtime:
        """Make `new` current; returns the runtime it replaced, which retires in the background."""
        old = self.current
        self._current = new
        task = asyncio.create_task(self._retire(old), name="retire runtime")
        self._retiring[task] = old
        task.add_done_callback(lambda done: self._retiring.pop(done, None))
        return old

    @property
    def in_flight(self) -> int:
        """Requests being answered, by the current runtime and by those retiring."""
        return sum(runtime.in_flight for runtime in [*self._retiring.values(), self.current])

    async def _retire(self, old: Runtime) -> None:
        await old.drained()
        # Only discovery is closed: the old pipeline's background summaries are shared flights that requests on
        # the new runtime may be waiting for, so they run to their own deadline (or are cancelled at shutdown).
        await old.windows.close()

    async def close(self) -> None:
        """At shutdown, after the server stopped answering: cancel every background summary, close runtimes."""
        for task in list(self._retiring):
            task.cancel()
        retired = list(self._retiring.values())
        await asyncio.gather(*self._retiring, return_exceptions=True)
        if self._shared is not None:
            await self._shared.flights.cancel_all()
        for runtime in [*retired, *([self._current] if self._current is not None else [])]:
            await runtime.close()
