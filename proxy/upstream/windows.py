"""Context windows per model: the config, then what an overflow error stated, then discovery, then the default."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

from proxy.config import Settings, UpstreamConfig
from proxy.upstream.discovery import DISCOVERY_TIMEOUT_SECONDS, PLAUSIBLE_WINDOW, Discovered

__all__ = ["PLAUSIBLE_WINDOW", "ContextWindows", "Discoverer", "UpstreamRole"]

log = logging.getLogger("proxy.windows")

# Which upstream a model is served by: the one requests go to, or the summariser's own (often the same).
UpstreamRole = Literal["chat", "summarizer"]
# An upstream that said nothing, or failed, is asked again after this long (or its TTL, if shorter).
RETRY_SECONDS = 60.0


class Discoverer(Protocol):
    """An upstream that can be asked for its windows (proxy.discovery.WindowSource; tests script one)."""

    async def discover(self, headers: Mapping[str, str], *, timeout: float) -> Discovered: ...


@dataclass(frozen=True)
class _Snapshot:
    discovered: Discovered
    expires: float


class ContextWindows:
    """The window the proxy plans with. `window` answers from what is known; `resolve` may ask the upstream first.

    Learned and discovered windows are kept per upstream base URL, so the summariser's upstream, when it is the
    same server, shares what the chat upstream revealed.
    """

    def __init__(self, settings: Settings, sources: Mapping[UpstreamRole, Discoverer] | None = None, *,
                 clock: Callable[[], float] = time.monotonic, timeout: float = DISCOVERY_TIMEOUT_SECONDS,
                 max_models: int = 4096) -> None:
        self._settings = settings
        self._sources = dict(sources or {})
        self._clock = clock
        self._timeout = timeout
        self._max_models = max_models
        self._learned: dict[tuple[str, str], int] = {}
        self._snapshots: dict[str, _Snapshot] = {}
        self._flights: dict[str, asyncio.Task[None]] = {}

    def window(self, model: str | None, upstream: UpstreamRole = "chat") -> int:
        """The best window known now, without I/O."""
        stated = self.stated(model, upstream)
        return stated if stated is not None else self._settings.models["default"].context_window

    def stated(self, model: str | None, upstream: UpstreamRole = "chat") -> int | None:
        """The window someone stated for `model`, the most authoritative first (its config entry, an overflow error,
        the upstream's list), or None when only the default's guess is known."""
        return next((window for window in self._statements(model, upstream) if window is not None), None)

    def smallest_stated(self, model: str | None, upstream: UpstreamRole = "chat") -> int | None:
        """The smallest window anyone stated for `model`, or None when only the default's guess is known: what a
        glance may judge a request by."""
        return min((window for window in self._statements(model, upstream) if window is not None), default=None)

    def _statements(self, model: str | None, upstream: UpstreamRole) -> tuple[int | None, int | None, int | None]:
        """What the config entry, an overflow error and the upstream's list say of `model`'s window, in that order
        of authority."""
        base = self._config(upstream).base_url
        snapshot = self._snapshots.get(base)
        # A stale snapshot still beats the default: windows rarely change, and resolve() refreshes it.
        return (self._configured(model), self._learned.get((base, model or "")),
                snapshot.discovered.window(model) if snapshot else None)

    async def resolve(self, model: str | None, *, headers: Mapping[str, str],
                      upstream: UpstreamRole = "chat") -> int:
        """The window of `model` on `upstream`, asking that upstream first when it was never asked.

        Once something is known, an expired answer is refreshed in the background while it keeps serving, so only
        the first request to an upstream waits (bounded by the timeout). Never fails: a discovery that times out
        or gets garbage leaves the default in place.
        """
        if self._needs_discovery(model, upstream):
            await self._refresh(upstream, headers)
        return self.window(model, upstream)

    async def prepare(self, model: str | None, summarizer_model: str | None, *, headers: Mapping[str, str]) -> None:
        """Discover at once what a compaction of this request may need: the model's and the summariser's window.

        Afterwards `window(model)` and `window(summarizer_model, "summarizer")` answer with what was found.
        """
        # Checked here first: on nearly every request both are known, and gathering two coroutines would cost
        # two tasks and a turn of the event loop for nothing.
        wanted: tuple[tuple[str | None, UpstreamRole], ...] = ((model, "chat"), (summarizer_model, "summarizer"))
        pending = [upstream for name, upstream in wanted if self._needs_discovery(name, upstream)]
        if len(pending) == 1:
            await self._refresh(pending[0], headers)
        elif pending:
            await asyncio.gather(*(self._refresh(upstream, headers) for upstream in pending))

    def learn(self, model: str | None, limit: int | None, upstream: UpstreamRole = "chat") -> bool:
        """Remember a limit an upstream error named; returns whether it was taken."""
        if not model or limit is None or limit not in PLAUSIBLE_WINDOW:
            return False
        key = (self._config(upstream).base_url, model)
        if self._learned.get(key) == limit:
            return True
        if key not in self._learned and len(self._learned) >= self._max_models:
            self._learned.pop(next(iter(self._learned)))
        self._learned[key] = limit
        log.info("learned context window of %s: %d tokens", model, limit)
        return True

    async def close(self) -> None:
        """Cancel discoveries still in flight (at shutdown)."""
        for task in list(self._flights.values()):
            task.cancel()
        await asyncio.gather(*self._flights.values(), return_exceptions=True)

    def _configured(self, model: str | None) -> int | None:
        # Only an entry naming the model is an operator's statement about it; `default` is a guess.
        entry = self._settings.models.get(model) if model and model != "default" else None
        return entry.context_window if entry is not None else None

    def _config(self, upstream: UpstreamRole) -> UpstreamConfig:
        own = self._settings.compaction.summarizer.upstream if upstream == "summarizer" else None
        return own or self._settings.upstream

    def _needs_discovery(self, model: str | None, upstream: UpstreamRole) -> bool:
        config = self._config(upstream)
        if not config.discover_windows or upstream not in self._sources or self._configured(model) is not None:
            return False
        if (config.base_url, model or "") in self._learned:
            return False  # an overflow error stated the limit: nothing discovery says would win over it
        snapshot = self._snapshots.get(config.base_url)
        return snapshot is None or snapshot.expires <= self._clock()

    async def _refresh(self, upstream: UpstreamRole, headers: Mapping[str, str]) -> None:
        base = self._config(upstream).base_url
        flight = self._flights.get(base)
        if flight is None:
            # One request per upstream however many callers arrive together; they share it.
            flight = asyncio.create_task(self._discover(upstream, headers), name=f"discover windows at {base}")
            self._flights[base] = flight
            flight.add_done_callback(lambda done: self._landed(base, done))
        if base not in self._snapshots:
            # wait() rather than await: a caller cancelled while waiting leaves the shared discovery running.
            await asyncio.wait([flight])

    def _landed(self, base: str, flight: asyncio.Task[None]) -> None:
        if self._flights.get(base) is flight:
            del self._flights[base]

    async def _discover(self, upstream: UpstreamRole, headers: Mapping[str, str]) -> None:
        config = self._config(upstream)
        try:
            found = await self._sources[upstream].discover(headers, timeout=self._timeout)
        except Exception:
            log.warning("window discovery at %s failed", config.base_url, exc_info=True)
            found = Discovered()
        self._store(config, found)

    def _store(self, config: UpstreamConfig, found: Discovered) -> None:
        previous = self._snapshots.get(config.base_url)
        ttl = config.discovery_ttl_seconds
        if not found:
            ttl = min(ttl, RETRY_SECONDS)
            if previous is not None:
                found = previous.discovered  # a failed refresh keeps what the upstream said before
        self._snapshots[config.base_url] = _Snapshot(found, self._clock() + ttl)
