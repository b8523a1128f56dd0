"""proxy.request_context: entering and leaving a request's notes, annotating them, and tasks inheriting them."""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

import pytest

from proxy.request_context import MAX_MODEL, Notes, annotate, current_request_id, enter, leave


def isolated(function: Any) -> Any:
    """Run `function` in a fresh context, so nothing it enters outlives it."""
    return contextvars.Context().run(function)


def test_outside_a_request() -> None:
    def check() -> str | None:
        annotate(model="m", upstream_status=200)  # nothing to annotate, and no error
        return current_request_id()

    assert isolated(check) is None


def test_enter_and_leave_nest() -> None:
    def check() -> list[str | None]:
        seen = [current_request_id()]
        outer = enter(Notes("outer"))
        seen.append(current_request_id())
        inner = enter(Notes("inner"))
        seen.append(current_request_id())
        leave(inner)
        seen.append(current_request_id())
        leave(outer)
        seen.append(current_request_id())
        return seen

    assert isolated(check) == [None, "outer", "inner", "outer", None]


@pytest.mark.parametrize(("calls", "expected"), [
    ([{}], Notes("r")),
    ([{"model": "gpt-4o"}], Notes("r", model="gpt-4o")),
    ([{"upstream_status": 502}], Notes("r", upstream_status=502)),
    ([{"model": "a", "upstream_status": 200}, {"model": "b"}], Notes("r", model="b", upstream_status=200)),
    ([{"model": "a", "upstream_status": 200}, {"model": None, "upstream_status": None}],
     Notes("r", model="a", upstream_status=200)),
    ([{"model": ""}], Notes("r", model="")),
    ([{"upstream_status": 0}], Notes("r", upstream_status=0)),
    ([{"model": "m" * MAX_MODEL}], Notes("r", model="m" * MAX_MODEL)),
    ([{"model": "m" * (MAX_MODEL + 1)}], Notes("r", model="m" * MAX_MODEL)),
    ([{"model": "\ud800" * 1_000_000}], Notes("r", model="\ud800" * MAX_MODEL)),
    ([{"model": "é" * 200}], Notes("r", model="é" * 128)),
])
def test_annotate(calls: list[dict[str, Any]], expected: Notes) -> None:
    notes = Notes("r")

    def check() -> None:
        token = enter(notes)
        for call in calls:
            annotate(**call)
        leave(token)

    isolated(check)
    assert notes == expected


def test_closed_notes_take_no_more_annotations() -> None:
    notes = Notes("r", model="kept", closed=True)

    def check() -> None:
        enter(notes)
        annotate(model="late", upstream_status=500)

    isolated(check)
    assert notes == Notes("r", model="kept", closed=True)


def test_a_token_is_left_once_and_only_in_its_context() -> None:
    def check() -> None:
        token = enter(Notes("r"))
        leave(token)
        with pytest.raises(RuntimeError):
            leave(token)

    isolated(check)
    token = isolated(lambda: enter(Notes("elsewhere")))
    with pytest.raises(ValueError):
        leave(token)
    assert current_request_id() is None


def test_annotate_refuses_a_model_that_cannot_be_sliced() -> None:
    def check() -> None:
        enter(Notes("r"))
        annotate(model=5)  # type: ignore[arg-type]

    with pytest.raises(TypeError):
        isolated(check)


async def test_tasks_started_in_a_request_keep_its_notes() -> None:
    notes = Notes("req-1")
    token = enter(notes)
    release = asyncio.Event()

    async def background() -> str | None:
        await release.wait()
        annotate(model="from-task", upstream_status=201)
        return current_request_id()

    try:
        task = asyncio.create_task(background())
    finally:
        leave(token)
    assert current_request_id() is None
    release.set()
    assert await task == "req-1"
    assert notes == Notes("req-1", model="from-task", upstream_status=201)


async def test_concurrent_requests_keep_their_own_ids() -> None:
    async def serve(request_id: str) -> list[str | None]:
        token = enter(Notes(request_id))
        seen = []
        for _ in range(3):
            await asyncio.sleep(0)
            seen.append(current_request_id())
        leave(token)
        return seen

    assert list(await asyncio.gather(serve("a"), serve("b"))) == [["a"] * 3, ["b"] * 3]
