"""Context windows: precedence, TTL, single flight and failure fallbacks; then the proxy planning with them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from proxy.app import RunningServer, start_server
from proxy.config import Settings, settings_from_mapping
from proxy.upstream.discovery import Discovered
from proxy.upstream.windows import RETRY_SECONDS, ContextWindows, UpstreamRole
from tests.conftest import deep_merge, serve_app
from tests.fakes.model_servers import ModelServer, Style
from tests.fakes.windowed import WindowedModel
from tests.sdk import async_client

DEFAULT = 128000


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class ScriptedSource:
    """Answers discovery with a scripted result, optionally held at a gate; counts what it was asked."""

    answer: Discovered | Exception
    gate: asyncio.Event | None = None
    calls: int = 0
    timeouts: list[float] = field(default_factory=list)
    headers: list[Mapping[str, str]] = field(default_factory=list)

    async def discover(self, headers: Mapping[str, str], *, timeout: float) -> Discovered:
        self.calls += 1
        self.timeouts.append(timeout)
        self.headers.append(headers)
        if self.gate is not None:
            await self.gate.wait()
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def settings(**tree: Any) -> Settings:
    return settings_from_mapping(tree, env={})


def windows(source: ScriptedSource | None = None, clock: Clock | None = None, *,
            summarizer: ScriptedSource | None = None, tree: dict[str, Any] | None = None,
            **sections: Any) -> ContextWindows:
    sources: dict[UpstreamRole, ScriptedSource] = {}
    if source is not None:
        sources["chat"] = source
    if summarizer is not None:
        sources["summarizer"] = summarizer
    return ContextWindows(settings(**(tree or {}), **sections), sources, clock=clock or Clock())


# --- precedence ------------------------------------------------------------------------------------------

LISTED = Discovered({"named": 4096, "learned": 32000, "listed": 50000})


@pytest.mark.parametrize(("model", "expected"), [
    ("named", 8192),        # a models: entry wins over what errors and discovery say
    ("learned", 16000),     # an overflow error's statement wins over discovery
    ("listed", 50000),      # discovery wins over the default
    ("unlisted", DEFAULT),
    (None, DEFAULT),
    ("default", DEFAULT),   # `default` is not an entry naming a model
])
async def test_precedence(model: str | None, expected: int) -> None:
    known = windows(ScriptedSource(LISTED), models={"named": {"context_window": 8192}})
    known.learn("learned", 16000)
    known.learn("named", 2000)
    assert await known.resolve(model, headers={}) == expected
    assert known.window(model) == expected


async def test_a_llama_cpp_server_window_applies_to_any_model_name() -> None:
    known = windows(ScriptedSource(Discovered({}, 4096)))
    assert await known.resolve("whatever-name", headers={}) == 4096


@pytest.mark.parametrize(("default", "learned", "expected"), [(128000, 8192, 8192), (8192, 32768, 32768)])
def test_an_error_statement_replaces_the_default(default: int, learned: int, expected: int) -> None:
    known = windows(models={"default": {"context_window": default}})
    assert known.learn("m", learned)
    assert known.window("m") == expected and known.window("other") == default


@pytest.mark.parametrize("limit", [None, 0, 100, 10**9])
def test_implausible_or_missing_limits_are_not_learned(limit: int | None) -> None:
    known = windows()
    assert not known.learn("m", limit)
    assert not known.learn(None, 8192)
    assert known.window("m") == DEFAULT


def test_learned_windows_are_bounded() -> None:
    known = ContextWindows(settings(), max_models=2)
    for name, limit in (("a", 1000), ("b", 2000), ("c", 3000)):
        known.learn(name, limit)
    assert [known.window(name) for name in "abc"] == [DEFAULT, 2000, 3000]


def test_window_does_no_io() -> None:
    source = ScriptedSource(LISTED)
    assert windows(source).window("listed") == DEFAULT and source.calls == 0


# --- the summariser's upstream ---------------------------------------------------------------------------

SEPARATE = {"compaction": {"summarizer": {"upstream": {"base_url": "http://summaries.invalid/v1"}}}}


async def test_a_separate_summariser_upstream_has_its_own_windows() -> None:
    chat, summaries = ScriptedSource(Discovered({"m": 4096})), ScriptedSource(Discovered({"m": 32768}))
    known = windows(chat, summarizer=summaries, tree=SEPARATE)
    known.learn("m", 2048)
    assert await known.resolve("m", headers={}, upstream="summarizer") == 32768
    assert known.window("m") == 2048 and known.window("m", "summarizer") == 32768
    assert (chat.calls, summaries.calls) == (0, 1)


async def test_a_shared_upstream_is_asked_once_for_both_roles() -> None:
    chat, summaries = ScriptedSource(Discovered({"m": 4096, "s": 32768})), ScriptedSource(Discovered())
    known = windows(chat, summarizer=summaries)
    assert list(await asyncio.gather(known.resolve("m", headers={}),
                                     known.resolve("s", headers={}, upstream="summarizer"))) == [4096, 32768]
    assert chat.calls + summaries.calls == 1


# --- when discovery asks ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("tree", "model"), [
    ({"upstream": {"discover_windows": False}}, "m"),
    ({"models": {"m": {"context_window": 8192}}}, "m"),
])
async def test_no_discovery_when_disabled_or_configured(tree: dict[str, Any], model: str) -> None:
    source = ScriptedSource(Discovered({"m": 4096}))
    await windows(source, tree=tree).resolve(model, headers={})
    assert source.calls == 0


async def test_no_discovery_for_a_learned_model_or_without_a_source() -> None:
    source = ScriptedSource(Discovered({"m": 4096}))
    known = windows(source)
    known.learn("m", 2048)
    assert await known.resolve("m", headers={}) == 2048 and source.calls == 0
    assert await ContextWindows(settings()).resolve("m", headers={}) == DEFAULT


async def test_the_timeout_and_headers_reach_the_source() -> None:
    source = ScriptedSource(Discovered({"m": 4096}))
    known = ContextWindows(settings(), {"chat": source}, timeout=0.5)
    await known.resolve("m", headers={"Authorization": "Bearer k"})
    assert source.timeouts == [0.5] and source.headers == [{"Authorization": "Bearer k"}]


# --- TTL -------------------------------------------------------------------------------------------------

async def resolved(known: ContextWindows, model: str = "m") -> int:
    """resolve(), then a few loop turns so a refresh it started in the background has landed."""
    window = await known.resolve(model, headers={})
    for _ in range(5):
        await asyncio.sleep(0)
    return window


async def test_discovered_windows_live_for_the_ttl() -> None:
    clock, source = Clock(), ScriptedSource(Discovered({"m": 4096}))
    known = windows(source, clock, upstream={"discovery_ttl_seconds": 600})
    for advance, calls in ((0, 1), (599, 1), (2, 2), (10, 2)):
        clock.now += advance
        assert await resolved(known) == 4096
        assert source.calls == calls


async def test_an_expired_window_keeps_serving_while_it_is_refreshed() -> None:
    clock, source = Clock(), ScriptedSource(Discovered({"m": 4096}))
    known = windows(source, clock, upstream={"discovery_ttl_seconds": 600})
    await resolved(known)
    source.answer, source.gate = Discovered({"m": 8192}), asyncio.Event()
    clock.now += 601
    assert await known.resolve("m", headers={}) == 4096            # not held up by the slow refresh
    await until(lambda: source.calls == 2)
    source.gate.set()
    await until(lambda: known.window("m") == 8192)


@pytest.mark.parametrize("answer", [Discovered(), RuntimeError("boom")])
async def test_a_miss_or_failure_is_retried_sooner(answer: Discovered | Exception) -> None:
    clock, source = Clock(), ScriptedSource(answer)
    known = windows(source, clock)
    for advance, calls in ((0, 1), (RETRY_SECONDS - 1, 1), (2, 2), (1, 2)):
        clock.now += advance
        assert await resolved(known) == DEFAULT
        assert source.calls == calls


async def test_a_failed_refresh_keeps_what_was_known() -> None:
    clock, source = Clock(), ScriptedSource(Discovered({"m": 4096}))
    known = windows(source, clock, upstream={"discovery_ttl_seconds": 600})
    await resolved(known)
    source.answer = TimeoutError()
    for advance, calls in ((601, 2), (RETRY_SECONDS - 1, 2), (2, 3)):
        clock.now += advance
        assert await resolved(known) == 4096
        assert source.calls == calls


# --- single flight ---------------------------------------------------------------------------------------

async def until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(5):
        while not condition():
            await asyncio.sleep(0.001)


async def test_concurrent_resolutions_share_one_discovery() -> None:
    source = ScriptedSource(Discovered({"m": 4096}), gate=asyncio.Event())
    known = windows(source)
    waiting = [asyncio.create_task(known.resolve("m", headers={})) for _ in range(20)]
    await until(lambda: source.calls == 1)
    await asyncio.sleep(0.01)
    source.gate.set()  # type: ignore[union-attr]
    assert await asyncio.gather(*waiting) == [4096] * 20
    assert source.calls == 1


async def test_a_cancelled_caller_leaves_the_shared_discovery_running() -> None:
    source = ScriptedSource(Discovered({"m": 4096}), gate=asyncio.Event())
    known = windows(source)
    first = asyncio.create_task(known.resolve("m", headers={}))
    await until(lambda: source.calls == 1)
    first.cancel()
    second = asyncio.create_task(known.resolve("m", headers={}))
    source.gate.set()  # type: ignore[union-attr]
    assert await second == 4096 and source.calls == 1
    with pytest.raises(asyncio.CancelledError):
        await first


async def test_close_cancels_a_discovery_in_flight() -> None:
    source = ScriptedSource(Discovered({"m": 4096}), gate=asyncio.Event())
    known = windows(source)
    waiting = asyncio.create_task(known.resolve("m", headers={}))
    await until(lambda: source.calls == 1)
    await known.close()
    assert await waiting == DEFAULT


# --- the proxy plans with discovered windows (real sockets, driven by the openai SDK) ---------------------

Served = Callable[..., Awaitable[ModelServer]]
Proxied = Callable[..., Awaitable[RunningServer]]
SMALL = 4096


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    runners: list[web.AppRunner] = []

    async def start(style: Style, windows: dict[str, int], model: WindowedModel) -> ModelServer:
        server = ModelServer(style, windows, chat=model)
        runner, server.url = await serve_app(server.build())
        runners.append(runner)
        return server

    yield start
    for runner in runners:
        await runner.cleanup()


@pytest.fixture
async def proxied() -> AsyncIterator[Proxied]:
    running: list[RunningServer] = []

    async def start(server: ModelServer, overrides: dict[str, Any] | None = None) -> RunningServer:
        tree = deep_merge({"upstream": {"base_url": f"{server.url}/v1"}}, overrides or {})
        proxy = await start_server(settings_from_mapping(tree, env={}), host="127.0.0.1", port=0)
        running.append(proxy)
        return proxy

    yield start
    for proxy in running:
        await proxy.stop()


def history(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You keep a list of facts."}]
    for index in range(turns):
        filler = " ".join(f"word{index}x{n}" for n in range(60))
        messages += [{"role": "user", "content": f"Remember FACT-{index}. {filler}"},
                     {"role": "assistant", "content": f"Noted FACT-{index}. " + "ok " * 60}]
    return [*messages, {"role": "user", "content": f"Remember FACT-{turns}."}]


async def ask(proxy: RunningServer, messages: list[Any], model: str = "fake-small") -> str:
    raw = await async_client(proxy.url).chat.completions.with_raw_response.create(model=model, messages=messages)
    return raw.headers["x-compaction"]


@pytest.mark.parametrize("style", ["vllm", "llamacpp", "openrouter", "litellm"])
async def test_the_proxy_compacts_within_a_discovered_window(style: Style, served: Served,
                                                             proxied: Proxied) -> None:
    model = WindowedModel(window=SMALL)
    server = await served(style, {"fake-small": SMALL}, model)
    proxy = await proxied(server)                      # models.default still says 128k
    await ask(proxy, history(1))
    model.received.clear()
    assert await ask(proxy, history(12)) == "proactive"
    assert len(model.chat_calls) == 1                  # no overflow reached the upstream
    assert all(received.prompt_tokens <= SMALL for received in model.received)
    assert 1 <= server.hits["/v1/models"] <= 2         # once per upstream, not per request


async def test_without_discovery_the_window_is_only_learned_from_an_overflow(served: Served,
                                                                             proxied: Proxied) -> None:
    model = WindowedModel(window=SMALL)
    server = await served("vllm", {"fake-small": SMALL}, model)
    proxy = await proxied(server, {"upstream": {"discover_windows": False}})
    assert await ask(proxy, history(12)) == "reactive"
    assert model.chat_calls[0].prompt_tokens > SMALL and server.discovery_requests == 0


@pytest.mark.parametrize(("discover", "one_call"), [(True, True), (False, False)])
async def test_the_summariser_models_window_is_discovered(discover: bool, one_call: bool, served: Served,
                                                          proxied: Proxied) -> None:
    chat, summaries = WindowedModel(window=8192), WindowedModel(window=32768)
    server = await served("vllm", {"fake-small": 8192}, chat)
    summariser = await served("vllm", {"summary-model": 32768}, summaries)
    proxy = await proxied(server, {
        "models": {"default": {"context_window": 3000}},
        "compaction": {"summarizer": {"model": "summary-model", "upstream": {
            "base_url": f"{summariser.url}/v1", "discover_windows": discover}}}})
    await ask(proxy, history(1))
    chat.received.clear()
    assert await ask(proxy, history(20)) == "proactive"
    assert chat.summarizer_calls == [] and len(chat.chat_calls) == 1
    assert (len(summaries.summarizer_calls) == 1) is one_call
