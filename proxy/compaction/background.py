"""Summaries built in the background after an answer, for a later request: started, watched, cancelled at close."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from proxy.compaction.compactor import Flight

log = logging.getLogger("proxy.pipeline")


class BackgroundSummaries:
    """The summaries a pipeline started and nobody awaits: each logged if it fails, all cancelled at close."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def start(self, begin: Callable[[], object]) -> None:
        """Run `begin` (the compactor's: a Flight, or why none was started); a planning error is logged, never
        raised into the answer it follows."""
        try:
            begun = begin()
        except Exception:
            log.warning("could not plan a background summary", exc_info=True)
            return
        if isinstance(begun, Flight):
            self._tasks.add(begun.task)
            begun.task.add_done_callback(self._done)

    def prepare(self, exists: Callable[[], Awaitable[bool]], begin: Callable[[], object]) -> None:
        """Start `begin` unless `exists` finds the summary made or being made already (a summary prepared ahead
        is asked for on every turn past its mark: it is made once)."""
        async def unless_made() -> None:
            if not await exists():
                self.start(begin)
        task = asyncio.create_task(unless_made())
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("background summary failed: %s", task.exception())

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
