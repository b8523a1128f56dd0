"""proxy.store.single_flight: one run per key for concurrent callers, its bookkeeping, and wait_for_any."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from proxy.store.single_flight import SingleFlight


class Call:
    """A factory that records each run and returns `value` once released."""

    def __init__(self, value: Any, runs: list[Any], release: asyncio.Event) -> None:
        self.value, self.runs, self.release = value, runs, release

    async def __call__(self) -> Any:
        self.runs.append(self.value)
        await self.release.wait()
        return self.value


async def settle() -> None:
    """Let every ready task take its next steps (a task started by a task starts a step later)."""
    for _ in range(5):
        await asyncio.sleep(0)


async def test_callers_asking_at_once_get_the_first_callers_run() -> None:
    flights, runs, release = SingleFlight(), list[Any](), asyncio.Event()
    shared = ["result"]
    waiters = [asyncio.create_task(flights.run("k", Call(shared if i == 0 else [i], runs, release))) for i in range(8)]
    await settle()
    assert runs == [shared] and len(flights) == 1
    release.set()
    results = await asyncio.gather(*waiters)
    assert all(result is shared for result in results) and runs == [shared]
    assert len(flights) == 0 and flights.running("k") is None


async def test_start_claims_the_key_before_yielding() -> None:
    flights, runs, release = SingleFlight(), list[Any](), asyncio.Event()
    first = flights.start("a", Call("a1", runs, release))
    assert flights.start("a", Call("a2", runs, release)) is first
    other = flights.start("b", Call("b", runs, release))
    assert other is not first and runs == []  # nothing ran yet: start does not yield
    assert (flights.in_flight("a"), flights.in_flight("b"), flights.in_flight("c")) == (True, True, False)
    assert flights.running("a") is first and flights.running("c") is None and len(flights) == 2
    release.set()
    assert list(await asyncio.gather(first, other)) == ["a1", "b"] and runs == ["a1", "b"]
    assert len(flights) == 0 and not flights.in_flight("a")


def raises_at_once() -> Awaitable[str]:
    raise ValueError("factory broke")


def not_awaitable() -> Awaitable[str]:
    return 5  # type: ignore[return-value]


@pytest.mark.parametrize(("factory", "error"), [(raises_at_once, ValueError), (not_awaitable, TypeError)])
async def test_a_broken_factory_fails_its_callers_and_frees_the_key(factory: Callable[[], Awaitable[str]],
                                                                    error: type[Exception]) -> None:
    flights = SingleFlight()
    results = await asyncio.gather(*(flights.run("k", factory) for _ in range(3)), return_exceptions=True)
    assert [type(result) for result in results] == [error] * 3 and results[0] is results[2]
    assert not flights.in_flight("k") and len(flights) == 0

    async def ok() -> str:
        return "ok"

    assert await flights.run("k", ok) == "ok"


async def test_cancelling_the_shared_call_cancels_every_waiter_and_frees_the_key() -> None:
    flights, runs, release = SingleFlight(), list[Any](), asyncio.Event()
    waiters = [asyncio.create_task(flights.run("k", Call("v", runs, release))) for _ in range(3)]
    await settle()
    assert runs == ["v"]
    task = flights.running("k")
    assert task is not None
    task.cancel()
    results = await asyncio.gather(*waiters, return_exceptions=True)
    assert all(isinstance(result, asyncio.CancelledError) for result in results)
    assert not flights.in_flight("k") and runs == ["v"]


async def test_wait_for_any_without_a_flight() -> None:
    flights = SingleFlight()
    assert await flights.wait_for_any([]) is False
    assert await flights.wait_for_any(["a", "b", "\ud800", "x" * 100_000]) is False


async def test_wait_for_any_waits_for_the_first_key_in_flight() -> None:
    flights, runs = SingleFlight(), list[Any]()
    release_a, release_b = asyncio.Event(), asyncio.Event()
    task_a = flights.start("a", Call("a", runs, release_a))
    task_b = flights.start("b", Call("b", runs, release_b))
    waiter = asyncio.create_task(flights.wait_for_any(["missing", "b", "a"]))
    release_a.set()
    await task_a
    await asyncio.sleep(0)
    assert not waiter.done()  # "a" finished, but "b" comes first in the order asked
    release_b.set()
    assert await asyncio.wait_for(waiter, 1) is True and task_b.result() == "b"


async def test_wait_for_any_neither_raises_the_flights_error_nor_cancels_it() -> None:
    flights, release = SingleFlight(), asyncio.Event()

    async def fail() -> str:
        await release.wait()
        raise RuntimeError("summariser down")

    task = flights.start("k", fail)
    first = asyncio.create_task(flights.wait_for_any(["k"]))
    await asyncio.sleep(0)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert not task.cancelled() and flights.in_flight("k")
    release.set()
    assert await flights.wait_for_any(["k"]) is True
    with pytest.raises(RuntimeError, match="summariser down"):
        task.result()
    assert not flights.in_flight("k")
