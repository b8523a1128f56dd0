"""Window discovery: the four response shapes parsed (pure tables), then asked over real sockets of fake servers."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from proxy.config import UpstreamConfig
from proxy.upstream.discovery import (
    Discovered,
    WindowSource,
    api_root,
    combine,
    discover_windows,
    parse_model_info,
    parse_models,
    parse_props,
    plausible,
)
from proxy.upstream.upstream import Upstream, create_session
from tests.fakes.model_servers import Broken, ModelServer, Style
from tests.fakes.serving import serve_app


def body(tree: Any) -> bytes:
    return json.dumps(tree).encode()


def listing(*entries: Any) -> bytes:
    return body({"object": "list", "data": list(entries)})


# --- parsing ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "expected"), [
    (4096, 4096), (4096.0, 4096), (256, 256), (100_000_000, 100_000_000),
    (255, None), (100_000_001, None), (0, None), (-4096, None), (4096.5, None),
    (True, None), ("4096", None), (None, None), ([4096], None),
])
def test_plausible(value: Any, expected: int | None) -> None:
    assert plausible(value) == expected


@pytest.mark.parametrize(("raw", "expected"), [
    # vLLM's ModelCard
    (listing({"id": "qwen", "object": "model", "owned_by": "vllm", "max_model_len": 4096, "permission": []}),
     {"qwen": 4096}),
    # OpenRouter: the model's window and its top provider's; the smaller one is what a request may get
    (listing({"id": "meta/llama", "context_length": 131072, "top_provider": {"context_length": 32768}}),
     {"meta/llama": 32768}),
    (listing({"id": "a", "context_length": 8192}), {"a": 8192}),
    (listing({"id": "a", "context_length": None, "top_provider": {"context_length": 16384}}), {"a": 16384}),
    (listing({"id": "a", "context_length": 8192, "top_provider": {"context_length": None}}), {"a": 8192}),
    # vLLM's own number wins over anything else an entry carries
    (listing({"id": "a", "max_model_len": 2048, "context_length": 8192}), {"a": 2048}),
    # a name listed twice (a LoRA and its base, two providers): the smaller window
    (listing({"id": "a", "max_model_len": 8192}, {"id": "a", "max_model_len": 4096}), {"a": 4096}),
    # llama.cpp lists its model with the training context only: not the served window
    (listing({"id": "gguf", "owned_by": "llamacpp", "meta": {"n_ctx_train": 131072}}), {}),
    # OpenAI's own listing says nothing about windows
    (listing({"id": "gpt-4o", "object": "model", "owned_by": "system"}), {}),
    (listing({"id": "a", "max_model_len": 10}, {"id": "b", "max_model_len": 10**12}), {}),
    (listing({"id": "a", "max_model_len": "4096"}, {"id": "b", "max_model_len": True}), {}),
    (listing({"max_model_len": 4096}, {"id": 7, "max_model_len": 4096}, "not an entry"), {}),
    (listing({"id": "a", "top_provider": "x", "context_length": {}}), {}),
    (body({"data": {"id": "a", "max_model_len": 4096}}), {}),
    (body([{"id": "a", "max_model_len": 4096}]), {}),
    (b'{"data": [{"id": "a", "max_model_len": ', {}),
    (b"<html>not found</html>", {}),
    (b"\xff\xfe", {}),
    (b"[" * 100_000, {}),
    (b"", {}),
    (None, {}),
], ids=lambda value: "" if isinstance(value, bytes | dict) else None)
def test_parse_models(raw: bytes | None, expected: dict[str, int]) -> None:
    assert parse_models(raw) == expected


@pytest.mark.parametrize(("tree", "expected"), [
    ({"default_generation_settings": {"n_ctx": 4096, "params": {}}, "total_slots": 4}, 4096),
    ({"n_ctx": 8192}, 8192),                                            # older servers, and forks
    ({"default_generation_settings": {"n_ctx": 2048}, "n_ctx": 8192}, 2048),   # per slot is what one request gets
    ({"default_generation_settings": {"n_ctx": 0}, "n_ctx": 8192}, 8192),
    ({"default_generation_settings": {"n_ctx": 16}}, None),
    ({"default_generation_settings": "4096"}, None),
    ({"total_slots": 1}, None),
    ([4096], None),
    ("n_ctx", None),
])
def test_parse_props(tree: Any, expected: int | None) -> None:
    assert parse_props(body(tree)) == expected


@pytest.mark.parametrize("raw", [None, b"", b"{", b"<html></html>"])
def test_parse_props_garbage(raw: bytes | None) -> None:
    assert parse_props(raw) is None


def info(name: Any, model_info: Any) -> dict[str, Any]:
    return {"model_name": name, "litellm_params": {"model": "openai/x"}, "model_info": model_info}


@pytest.mark.parametrize(("entries", "expected"), [
    ([info("gpt-4o-mini", {"max_tokens": 16384, "max_input_tokens": 128000, "max_output_tokens": 16384})],
     {"gpt-4o-mini": 128000}),
    # the legacy field as a window only when it is not just the output limit
    ([info("local", {"max_tokens": 8192, "max_input_tokens": None})], {"local": 8192}),
    ([info("local", {"max_tokens": 4096, "max_output_tokens": 4096})], {}),
    ([info("local", {"max_tokens": 8192, "max_output_tokens": 1024})], {"local": 8192}),
    # two deployments behind one alias: either may serve the request
    ([info("alias", {"max_input_tokens": 32768}), info("alias", {"max_input_tokens": 8192})], {"alias": 8192}),
    ([info("fresh", {"id": "abc", "db_model": False})], {}),
    ([info("x", None), info(None, {"max_input_tokens": 8192}), {"model_info": {"max_input_tokens": 8192}}], {}),
    ([info("x", {"max_input_tokens": 100})], {}),
])
def test_parse_model_info(entries: list[Any], expected: dict[str, int]) -> None:
    assert parse_model_info(body({"data": entries})) == expected


def test_combine_takes_the_smaller_statement_and_keeps_the_server_window() -> None:
    found = combine(listing({"id": "a", "max_model_len": 8192}, {"id": "b", "max_model_len": 8192}),
                    body({"data": [info("a", {"max_input_tokens": 4096}), info("c", {"max_input_tokens": 2048})]}),
                    body({"default_generation_settings": {"n_ctx": 1024}}))
    assert found == Discovered({"a": 4096, "b": 8192, "c": 2048}, 1024)


@pytest.mark.parametrize(("found", "model", "expected"), [
    (Discovered({"a": 4096}), "a", 4096),
    (Discovered({"a": 4096}), "b", None),
    (Discovered({"a": 4096}, 2048), "b", 2048),     # llama.cpp answers to any model name
    (Discovered({}, 2048), None, 2048),
    (Discovered(), "a", None),
])
def test_discovered_window(found: Discovered, model: str | None, expected: int | None) -> None:
    assert found.window(model) == expected
    assert bool(found) is (found != Discovered())


@pytest.mark.parametrize(("base", "root"), [
    ("http://127.0.0.1:8080/v1", "http://127.0.0.1:8080"),
    ("https://openrouter.ai/api/v1", "https://openrouter.ai/api"),
    ("http://llama:8080", "http://llama:8080"),
    ("http://h/v1/", "http://h"),
    ("http://h/openai/v1beta", "http://h/openai/v1beta"),
])
def test_api_root(base: str, root: str) -> None:
    assert api_root(base) == root


# --- asking real sockets ---------------------------------------------------------------------------------

@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with create_session(config("http://unused")) as opened:
        yield opened


def config(base_url: str, **fields: Any) -> UpstreamConfig:
    return UpstreamConfig.model_validate({"base_url": base_url, **fields})


async def serve(server: ModelServer) -> aiohttp.web.AppRunner:
    runner, server.url = await serve_app(server.build())
    return runner


async def ask(session: aiohttp.ClientSession, server: ModelServer, *, api_key: str | None = None,
              headers: dict[str, str] | None = None, timeout: float = 3.0) -> Discovered:
    runner = await serve(server)
    try:
        upstream = Upstream(session, config(f"{server.url}/v1", api_key=api_key))
        return await discover_windows(WindowSource.of(session, upstream), headers or {}, timeout=timeout)
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(("style", "expected"), [
    ("vllm", Discovered({"qwen2.5-0.5b": 4096})),
    ("llamacpp", Discovered({}, 4096)),
    ("openrouter", Discovered({"qwen2.5-0.5b": 4096})),
    ("litellm", Discovered({"qwen2.5-0.5b": 4096})),
    ("openai", Discovered()),
])
async def test_discovers_each_server_style(style: Style, expected: Discovered,
                                           session: aiohttp.ClientSession) -> None:
    server = ModelServer(style, {"qwen2.5-0.5b": 4096})
    assert await ask(session, server) == expected
    assert set(server.hits) == {"/v1/models", "/v1/model/info", "/props"}


@pytest.mark.parametrize("broken", ["garbage", "html", "500", "401"])
async def test_a_broken_server_yields_nothing(broken: Broken, session: aiohttp.ClientSession) -> None:
    assert await ask(session, ModelServer("vllm", {"m": 4096}, broken=broken)) == Discovered()


async def test_a_silent_server_yields_nothing_within_the_timeout(session: aiohttp.ClientSession) -> None:
    server = ModelServer("vllm", {"m": 4096}, delay=1.5)
    runner = await serve(server)
    try:
        source = WindowSource.of(session, Upstream(session, config(f"{server.url}/v1")))
        started = time.monotonic()
        found = await discover_windows(source, {}, timeout=0.3)
        assert found == Discovered() and time.monotonic() - started < 1
    finally:
        await runner.cleanup()


async def test_an_unreachable_server_yields_nothing(session: aiohttp.ClientSession) -> None:
    upstream = Upstream(session, config("http://127.0.0.1:9/v1", connect_timeout=1))
    assert await discover_windows(WindowSource.of(session, upstream), {}) == Discovered()


async def test_sends_the_clients_credentials_only(session: aiohttp.ClientSession,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    server = ModelServer("vllm", {"m": 4096})
    headers = {"Authorization": "Bearer sk-client-secret", "OpenAI-Organization": "org-1",
               "Content-Type": "application/json", "X-Trace": "t-1", "Cookie": "session=1"}
    with caplog.at_level("DEBUG"):
        await ask(session, server, headers=headers)
    for seen in server.seen_headers:
        assert seen["Authorization"] == "Bearer sk-client-secret" and seen["OpenAI-Organization"] == "org-1"
        assert not {"Content-Type", "X-Trace", "Cookie"} & set(seen)
    assert "sk-client-secret" not in caplog.text


async def test_a_configured_key_replaces_the_clients(session: aiohttp.ClientSession,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    server = ModelServer("llamacpp", {"m": 4096})
    with caplog.at_level("DEBUG"):
        await ask(session, server, api_key="sk-upstream-secret", headers={"Authorization": "Bearer sk-client"})
    assert {seen["Authorization"] for seen in server.seen_headers} == {"Bearer sk-upstream-secret"}
    assert "sk-upstream-secret" not in caplog.text
