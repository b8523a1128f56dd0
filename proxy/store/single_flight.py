"""Single-flight: concurrent callers with the same key share one in-flight call instead of repeating it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


class SingleFlight:
    """Concurrent callers with the same key share one in-flight call instead of repeating it."""

    def __init__(self) -> None:
        self._flights: dict[str, asyncio.Task[Any]] = {}

    def in_flight(self, key: str) -> bool:
        return key in self._flights

    def running(self, key: str) -> asyncio.Task[Any] | None:
        """The key's call in progress, to join; None when there is none."""
        return self._flights.get(key)

    def __len__(self) -> int:
        """Calls in flight."""
        return len(self._flights)

    async def wait_for_any(self, keys: Sequence[str]) -> bool:
        """Wait for the first of `keys` (in order) that is in flight; True if there was one."""
        task = next((self._flights[key] for key in keys if key in self._flights), None)
        if task is None:
            return False
        await asyncio.wait([task])
        return True

    def start(self, key: str, factory: Callable[[], Awaitable[T]]) -> asyncio.Task[T]:
        """The key's shared call, started now with `factory` if none is running (synchronous, so a caller can
        claim the key before it yields to the event loop)."""
        task = self._flights.get(key)
        if task is None:
            task = asyncio.ensure_future(self._call(key, factory))
            self._flights[key] = task
        return task

    async def run(self, key: str, factory: Callable[[], Awaitable[T]]) -> T:
        """Await the key's shared call, starting it with `factory` if none is running.

        A waiter that is cancelled stops waiting; the shared call goes on for everyone else (and finishes even when
        every waiter has gone, so work that stores its own result is not wasted).
        """
        result: T = await asyncio.shield(self.start(key, factory))
        return result

    async def _call(self, key: str, factory: Callable[[], Awaitable[T]]) -> T:
        try:
            return await factory()
        finally:
            if self._flights.get(key) is asyncio.current_task():
                del self._flights[key]
