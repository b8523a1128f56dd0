"""Store latency: a SummaryStore that reports how long each call of the store it wraps took."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from proxy.store.store import CompactedPrefix, SummaryStore

Observe = Callable[[str, float], None]  # (operation, seconds)


class TimedStore:
    """Times get, put, longest_match and ping (the calls a request waits on); everything else passes through,
    such as RedisStore's `status` for /readyz. Failures are timed too: a slow timeout is latency as well."""

    def __init__(self, store: SummaryStore, observe: Observe) -> None:
        self._store = store
        self._observe = observe

    async def get(self, namespace: str, prefix_hash: str) -> CompactedPrefix | None:
        started = time.perf_counter()
        try:
            return await self._store.get(namespace, prefix_hash)
        finally:
            self._observe("get", time.perf_counter() - started)

    async def put(self, namespace: str, record: CompactedPrefix) -> None:
        started = time.perf_counter()
        try:
            await self._store.put(namespace, record)
        finally:
            self._observe("put", time.perf_counter() - started)

    async def longest_match(self, namespace: str, chain: Sequence[str]) -> CompactedPrefix | None:
        started = time.perf_counter()
        try:
            return await self._store.longest_match(namespace, chain)
        finally:
            self._observe("longest_match", time.perf_counter() - started)

    async def ping(self) -> bool:
        started = time.perf_counter()
        try:
            return await self._store.ping()
        finally:
            self._observe("ping", time.perf_counter() - started)

    async def close(self) -> None:
        await self._store.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)
