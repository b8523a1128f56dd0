"""Compaction cannot be turned into a weapon: a huge history is parsed, hashed, counted and summarised off the loop."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import aiohttp
import pytest

from proxy.app import start_server
from proxy.config import settings_from_mapping
from proxy.summarizer.model_client import reply_bound
from tests.fakes.hostile_summariser import HostileSummariser, filled_body, filling, words
from tests.fakes.openai_upstream import ChatHook, FakeUpstream, FakeUpstreamApp
from tests.fakes.serving import serve_app
from tests.fakes.windowed import WindowedModel

# Far above any stall that small work causes on a busy 2-core machine, far below the seconds a history of this size
# costs when counted on the event loop.
STALL_LIMIT = 0.5
# A stall the proxy causes comes back every time; one the machine's scheduler causes (two test suites on two cores)
# does not: a measurement past the limit is taken once more, and the test fails when every one is past it.
ATTEMPTS = 2
PROBE_TIMEOUT = 10.0


@contextmanager
def served_in_a_thread(hook: ChatHook) -> Iterator[str]:
    """A fake upstream answering chat with `hook`, on its own loop in its own thread, so its work (counting tokens,
    writing big answers) cannot stall the proxy's loop; yields its URL."""
    ready: dict[str, str] = {}
    started = threading.Event()
    stop: asyncio.Event | None = None
    loop = asyncio.new_event_loop()

    async def serve() -> None:
        nonlocal stop
        stop = asyncio.Event()
        state = FakeUpstream()
        state.chat_hook = hook
        runner, url = await serve_app(FakeUpstreamApp(state).build())
        ready["url"] = url
        started.set()
        await stop.wait()
        await runner.cleanup()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    assert started.wait(10)
    yield ready["url"]
    assert stop is not None
    loop.call_soon_threadsafe(stop.set)
    thread.join(10)


@pytest.fixture
def upstream_in_a_thread() -> Iterator[tuple[str, WindowedModel]]:
    model = WindowedModel(window=10_000_000)
    with served_in_a_thread(model) as url:
        yield url, model


@asynccontextmanager
async def probing(url: str) -> AsyncIterator[list[float]]:
    """/healthz probed every 10 ms from a thread of its own (another client, not a task on the proxy's loop, which a
    stalled loop would hold back unmeasured); yields the probes' latencies, complete once the block is left."""
    latencies: list[float] = []
    failures: list[str] = []
    finished = threading.Event()

    async def probe() -> None:
        # A probe that gets no answer at all counts as one that waited its whole timeout.
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT)) as session:
            while not finished.is_set():
                started = time.perf_counter()
                try:
                    async with session.get(f"{url}/healthz") as response:
                        await response.read()
                except (aiohttp.ClientError, TimeoutError) as error:
                    failures.append(f"{type(error).__name__} after {time.perf_counter() - started:.2f}s")
                latencies.append(time.perf_counter() - started)
                await asyncio.sleep(0.01)

    thread = threading.Thread(target=asyncio.run, args=(probe(),), daemon=True)
    thread.start()
    try:
        yield latencies
    finally:
        finished.set()
        # Joined off the loop: a probe in flight is answered by the proxy on this very loop, which a blocking join
        # would hold until the probe timed out.
        await asyncio.to_thread(thread.join, 2 * PROBE_TIMEOUT)
    assert not thread.is_alive(), "a /healthz probe never ended"
    assert not failures, f"/healthz probes got no answer: {failures}"


def huge_history(turns: int) -> list[dict[str, str]]:
    history = [{"role": "system", "content": "s"}]
    for turn in range(turns):
        history += [{"role": "user", "content": " ".join(f"w{turn}x{n}" for n in range(600))},
                    {"role": "assistant", "content": " ".join(f"a{turn}x{n}" for n in range(600))}]
    return [*history, {"role": "user", "content": "go on"}]


async def forced_compaction_while_probing(upstream: str, window: int,
                                         messages: list[Any]) -> tuple[int, str, list[float]]:
    """One request forced to compact, through a proxy in front of `upstream`, while /healthz is probed: its status,
    x-compaction, and the probes' latencies."""
    settings = settings_from_mapping({"upstream": {"base_url": f"{upstream}/v1"},
                                      "models": {"default": {"context_window": window}}}, env={})
    proxy = await start_server(settings, host="127.0.0.1", port=0)
    body = json.dumps({"model": "m", "messages": messages}).encode()
    try:
        async with probing(proxy.url) as latencies:
            await asyncio.sleep(0.1)
            async with aiohttp.ClientSession() as session, session.post(
                    f"{proxy.url}/v1/chat/completions", data=body,
                    headers={"Content-Type": "application/json", "x-compaction-mode": "force"}) as response:
                return response.status, response.headers["x-compaction"], latencies
    finally:
        await proxy.stop()


async def test_a_huge_history_does_not_stall_other_requests(upstream_in_a_thread: tuple[str, WindowedModel]) -> None:
    url, model = upstream_in_a_thread
    longest = []
    for _ in range(ATTEMPTS):  # ~3 MB, ~1M tokens
        status, outcome, latencies = await forced_compaction_while_probing(url, 2_000_000, huge_history(300))
        assert (status, outcome) == (200, "forced")
        assert model.summarizer_calls, "the history was not summarised"
        assert len(latencies) > 10
        longest.append(max(latencies))
        if longest[-1] < STALL_LIMIT:
            break
    assert min(longest) < STALL_LIMIT, f"/healthz waited {longest}s behind the compaction"


def short_history(turns: int) -> list[dict[str, str]]:
    history = [{"role": "system", "content": "s"}]
    for turn in range(turns):
        history += [{"role": "user", "content": f"Remember FACT-{turn}: " + " ".join(words(600, seed=turn))},
                    {"role": "assistant", "content": f"Noted FACT-{turn}."}]
    return [*history, {"role": "user", "content": "go on"}]


# The largest answer the proxy reads for the output it asks for, less the envelope: every byte of it is content.
AT_THE_BOUND = 0
TEN_MB = 10 * 1024 * 1024


@pytest.mark.parametrize("size", [AT_THE_BOUND, TEN_MB], ids=["at-the-bound", "10MB"])
@pytest.mark.parametrize("kind", ["prose", "json-list", "fences", "extra-keys"])
async def test_no_summariser_reply_stalls_other_requests(kind: str, size: int) -> None:
    def sized(asked: int) -> int:
        return size or reply_bound(asked)

    summariser = HostileSummariser(WindowedModel(window=10_000_000), filling(kind, sized))
    if size:
        filled_body(kind, size)  # made before measuring: the fake shares the proxy's interpreter
    longest = []
    for _ in range(ATTEMPTS):
        with served_in_a_thread(summariser) as url:
            status, outcome, latencies = await forced_compaction_while_probing(url, 32_000, short_history(30))
        assert status == 200, "a summary or not, the request is answered"
        assert summariser.model.summarizer_calls, "no summary was asked for"
        assert outcome in ("forced", "failed")
        assert len(latencies) > 3
        longest.append(max(latencies))
        if longest[-1] < STALL_LIMIT:
            break
    assert min(longest) < STALL_LIMIT, f"/healthz waited {longest}s behind a {kind} reply ({outcome})"
