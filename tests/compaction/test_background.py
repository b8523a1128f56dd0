"""Background summaries: a started flight is watched until it ends, a planning error or a failed summary is logged
and never raised, and close() cancels what is still running."""

from __future__ import annotations

import asyncio
import logging

import pytest

from proxy.compaction.background import BackgroundSummaries
from proxy.compaction.compactor import Flight


async def test_a_finished_summary_is_forgotten_and_a_failed_one_logged(caplog: pytest.LogCaptureFixture) -> None:
    background = BackgroundSummaries()
    gate = asyncio.Event()

    async def succeeds() -> None:
        await gate.wait()

    async def fails() -> None:
        await gate.wait()
        raise RuntimeError("summariser down")

    tasks = [asyncio.create_task(coroutine()) for coroutine in (succeeds, fails)]
    for task in tasks:
        background.start(lambda task=task: Flight(task, 3))
    assert len(background._tasks) == 2
    gate.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.sleep(0)  # the done callbacks run
    assert background._tasks == set()
    assert [record.getMessage() for record in caplog.records] == ["background summary failed: summariser down"]


@pytest.mark.parametrize("begun", ["backoff", None, 3])
async def test_what_is_no_flight_starts_nothing(begun: object) -> None:
    background = BackgroundSummaries()
    background.start(lambda: begun)
    assert background._tasks == set()


async def test_a_planning_error_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> object:
        raise ValueError("bad plan")

    background = BackgroundSummaries()
    with caplog.at_level(logging.WARNING, logger="proxy.pipeline"):
        background.start(broken)
    assert "could not plan a background summary" in caplog.text and "bad plan" in caplog.text


async def test_close_cancels_what_still_runs() -> None:
    background = BackgroundSummaries()
    running = asyncio.create_task(asyncio.sleep(60))
    background.start(lambda: Flight(running, 1))
    await background.close()
    assert running.cancelled()
    await background.close()  # twice is harmless
