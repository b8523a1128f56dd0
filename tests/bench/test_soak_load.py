"""bench.soak_load: a failed request is counted with its words and the connection it went on, through real sockets."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from bench.soak_load import Load, Tally, chat, connection_trace


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, list[str]]]:
    """A chat endpoint that answers, or (asked with "reset") closes the connection without an answer."""
    asked: list[str] = []

    async def answer(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        asked.append(body["model"])
        if body["model"] == "reset":
            assert request.transport is not None
            request.transport.abort()
            await asyncio.sleep(0.1)
        return web.json_response({"choices": []})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield f"http://127.0.0.1:{port}", asked
    await runner.cleanup()


async def test_a_failed_request_is_told_with_its_error_and_its_pooled_or_new_connection(
        server: tuple[str, list[str]]) -> None:
    url, asked = server
    tally = Tally()
    async with aiohttp.ClientSession(trace_configs=[connection_trace()]) as session:
        load = Load(url, session, tally, time.monotonic() + 10, random.Random(1), b"")
        await chat(load, "chat-json", {"model": "m", "messages": []})  # a new connection, kept in the pool
        await chat(load, "reasoning", {"model": "reset", "messages": []})  # that connection, reset
        await chat(load, "reasoning", {"model": "reset", "messages": []})  # a new one, reset
    assert asked == ["m", "reset", "reset"]
    assert tally.outcomes[("chat-json", "200")] == 1
    failed = {outcome: count for (kind, outcome), count in tally.outcomes.items() if kind == "reasoning"}
    assert sum(failed.values()) == 2 and "200" not in failed
    told = sorted(tally.errors)
    assert len(told) == 2 and all(error.startswith("reasoning: ") for error in told)
    assert {error.rsplit(" (", 1)[1] for error in told} == {"a new connection)", "a pooled connection)"}


def test_an_error_with_no_connection_says_so() -> None:
    tally = Tally()
    outcome = tally.error("models", aiohttp.ClientConnectionError("refused"), "no")
    assert outcome == "ClientConnectionError"
    assert tally.errors == {"models: ClientConnectionError: refused (no connection)": 1}
