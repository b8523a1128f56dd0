"""proxy.offload: work runs on the loop's thread up to its limit and in a worker thread past it."""

from __future__ import annotations

import asyncio
import threading

import pytest

from proxy.offload import LARGE, LARGE_JSON, off_loop_above, off_loop_if_large


def where(tag: str, *, suffix: str = "") -> tuple[int, str]:
    return threading.get_ident(), tag + suffix


@pytest.mark.parametrize(("limit", "size", "in_thread"), [
    (10, 0, False), (10, 10, False), (10, 11, True),
    (LARGE_JSON, LARGE_JSON, False), (LARGE_JSON, LARGE_JSON + 1, True),
])
async def test_work_leaves_the_loop_only_past_its_limit(limit: int, size: int, in_thread: bool) -> None:
    thread, value = await off_loop_above(limit, size, where, "x", suffix="!")
    assert value == "x!", "arguments and keywords reach the work"
    assert (thread != threading.get_ident()) is in_thread


@pytest.mark.parametrize(("size", "in_thread"), [(LARGE, False), (LARGE + 1, True)])
async def test_text_work_uses_the_text_limit(size: int, in_thread: bool) -> None:
    thread, _ = await off_loop_if_large(size, where, "y")
    assert (thread != threading.get_ident()) is in_thread


@pytest.mark.parametrize("size", [1, LARGE + 1])
async def test_an_error_in_the_work_reaches_the_caller(size: int) -> None:
    def fails() -> None:
        raise ValueError("bad body")

    with pytest.raises(ValueError, match="bad body"):
        await off_loop_if_large(size, fails)


async def test_the_loop_runs_while_large_work_does() -> None:
    release = threading.Event()
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while not release.is_set():
            ticks += 1
            await asyncio.sleep(0.001)

    ticker = asyncio.create_task(tick())
    result = await off_loop_if_large(LARGE + 1, lambda: release.wait(0.2) or "waited")
    release.set()
    await ticker
    assert result == "waited" and ticks > 5
