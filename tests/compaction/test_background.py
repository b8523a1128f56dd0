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


@pytest.mark.parametrize(("made", "started"), [(True, 0), (False, 1)])
async def test_a_summary_prepared_ahead_is_begun_only_when_none_is_made(made: bool, started: int) -> None:
    background = BackgroundSummaries()
    begun: list[int] = []

    async def exists() -> bool:
        await asyncio.sleep(0)  # the store is asked across an await
        return made

    background.prepare(exists, lambda: begun.append(1))
    await asyncio.sleep(0.01)
    assert len(begun) == started and background._tasks == set()


async def test_a_broken_check_is_logged_and_begins_nothing(caplog: pytest.LogCaptureFixture) -> None:
    background = BackgroundSummaries()

    async def exists() -> bool:
        raise ConnectionError("store down")

    background.prepare(exists, lambda: pytest.fail("begun after a failed check"))
    await asyncio.sleep(0.01)
    assert [record.getMessage() for record in caplog.records] == ["background summary failed: store down"]


async def test_close_cancels_a_preparation_waiting_on_its_check() -> None:
    background = BackgroundSummaries()
    waiting = asyncio.Event()

    async def exists() -> bool:
        await waiting.wait()
        return False

    background.prepare(exists, lambda: pytest.fail("begun after close"))
    await asyncio.sleep(0)
    await background.close()
    assert background._tasks == set() or all(task.done() for task in background._tasks)
