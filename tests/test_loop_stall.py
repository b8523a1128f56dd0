"""Compaction cannot be turned into a weapon: a huge history is parsed, hashed, counted and summarised off the loop."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator

import aiohttp
import pytest

from proxy.app import start_server
from proxy.config import settings_from_mapping
from tests.conftest import serve_app
from tests.fakes.openai_upstream import FakeUpstream, FakeUpstreamApp
from tests.fakes.windowed import WindowedModel

# Far above any stall that small work causes on a busy 2-core machine, far below the seconds a history of this size
# costs when counted on the event loop.
STALL_LIMIT = 0.5


@pytest.fixture
def upstream_in_a_thread() -> Iterator[tuple[str, WindowedModel]]:
    """The fake upstream on its own loop in its own thread, so its token counting cannot stall the proxy's loop."""
    model = WindowedModel(window=10_000_000)
    ready: dict[str, str] = {}
    started = threading.Event()
    stop: asyncio.Event | None = None
    loop = asyncio.new_event_loop()

    async def serve() -> None:
        nonlocal stop
        stop = asyncio.Event()
        state = FakeUpstream()
        state.chat_hook = model
        runner, url = await serve_app(FakeUpstreamApp(state).build())
        ready["url"] = url
        started.set()
        await stop.wait()
        await runner.cleanup()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    assert started.wait(10)
    yield ready["url"], model
    assert stop is not None
    loop.call_soon_threadsafe(stop.set)
    thread.join(10)


def huge_history(turns: int) -> list[dict[str, str]]:
    history = [{"role": "system", "content": "s"}]
    for turn in range(turns):
        history += [{"role": "user", "content": " ".join(f"w{turn}x{n}" for n in range(600))},
                    {"role": "assistant", "content": " ".join(f"a{turn}x{n}" for n in range(600))}]
    return [*history, {"role": "user", "content": "go on"}]


async def test_a_huge_history_does_not_stall_other_requests(upstream_in_a_thread: tuple[str, WindowedModel]) -> None:
    url, model = upstream_in_a_thread
    settings = settings_from_mapping({"upstream": {"base_url": f"{url}/v1"},
                                      "models": {"default": {"context_window": 2_000_000}}}, env={})
    proxy = await start_server(settings, host="127.0.0.1", port=0)
    body = json.dumps({"model": "m", "messages": huge_history(300)}).encode()  # ~3 MB, ~1M tokens
    latencies: list[float] = []
    finished = asyncio.Event()

    async def probe() -> None:
        async with aiohttp.ClientSession() as session:
            while not finished.is_set():
                started = time.perf_counter()
                async with session.get(f"{proxy.url}/healthz") as response:
                    await response.read()
                latencies.append(time.perf_counter() - started)
                await asyncio.sleep(0.01)

    prober = asyncio.create_task(probe())
    try:
        await asyncio.sleep(0.1)
        async with aiohttp.ClientSession() as session, session.post(
                f"{proxy.url}/v1/chat/completions", data=body,
                headers={"Content-Type": "application/json", "x-compaction-mode": "force"}) as response:
            assert response.status == 200
            assert response.headers["x-compaction"] == "proactive"
    finally:
        finished.set()
        await prober
        await proxy.stop()
    assert model.summarizer_calls, "the history was not summarised"
    assert len(latencies) > 10
    assert max(latencies) < STALL_LIMIT, f"/healthz waited {max(latencies):.2f}s behind the compaction"
