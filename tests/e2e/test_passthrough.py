"""Pass-through: the openai SDK gets the same answers through the proxy as directly from the upstream."""

from __future__ import annotations

import asyncio
import gzip
import json
import time
from typing import Any

import aiohttp
import openai
import pytest
from yarl import URL

from proxy.app import RunningServer
from tests.conftest import ProxyFactory
from tests.fakes.openai_upstream import FakeUpstream
from tests.sdk import async_client, sync_client

MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hello there"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}}}}}]


async def _chat(client: openai.AsyncOpenAI, **kwargs: Any) -> Any:
    return (await client.chat.completions.create(model="fake-small", **kwargs)).model_dump()


async def _stream(client: openai.AsyncOpenAI, **kwargs: Any) -> list[Any]:
    stream = await client.chat.completions.create(model="fake-small", stream=True, **kwargs)
    return [event.model_dump() async for event in stream]


CALLS = {
    "plain": lambda c: _chat(c, messages=MESSAGES),
    "stream": lambda c: _stream(c, messages=MESSAGES),
    "tool_calls": lambda c: _chat(c, messages=[{"role": "user", "content": "weather in Paris?"}], tools=TOOLS),
    "n2": lambda c: _chat(c, messages=MESSAGES, n=2),
    "models": lambda c: c.models.list(),
    "embeddings": lambda c: c.embeddings.create(model="fake-embed", input=["one", "three"]),
}


async def _normalised(result: Any) -> Any:
    if hasattr(result, "model_dump"):
        return result.model_dump()
    if hasattr(result, "__aiter__"):
        return [item.model_dump() async for item in result]
    return result


@pytest.mark.parametrize("call", sorted(CALLS))
async def test_async_sdk_identical_through_proxy(call: str, fake: FakeUpstream, proxy: RunningServer) -> None:
    direct = await _normalised(await CALLS[call](async_client(fake.url)))
    proxied = await _normalised(await CALLS[call](async_client(proxy.url)))
    assert proxied == direct
    if call == "tool_calls":
        assert proxied["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    if call == "n2":
        assert len(proxied["choices"]) == 2


def _sync_calls(client: openai.OpenAI) -> dict[str, Any]:
    chat = client.chat.completions
    return {
        "plain": chat.create(model="fake-small", messages=MESSAGES).model_dump(),
        "stream": [e.model_dump() for e in chat.create(model="fake-small", messages=MESSAGES, stream=True)],
        "tool_calls": chat.create(model="fake-small", messages=[{"role": "user", "content": "weather in Paris?"}],
                                  tools=TOOLS).model_dump(),
        "n2": chat.create(model="fake-small", messages=MESSAGES, n=2).model_dump(),
        "models": [m.model_dump() for m in client.models.list()],
        "embeddings": client.embeddings.create(model="fake-embed", input="abc").model_dump(),
    }


async def test_sync_sdk_identical_through_proxy(fake: FakeUpstream, proxy: RunningServer) -> None:
    direct = await asyncio.to_thread(_sync_calls, sync_client(fake.url))
    proxied = await asyncio.to_thread(_sync_calls, sync_client(proxy.url))
    assert proxied == direct
    assert len(proxied["stream"]) > 3


@pytest.mark.parametrize("model,messages,status", [("fake-small", [], 400), ("missing-model", MESSAGES, 404)])
async def test_upstream_errors_pass_through_unchanged(model: str, messages: list[Any], status: int,
                                                      fake: FakeUpstream, proxy: RunningServer) -> None:
    outcomes = []
    for base in (fake.url, proxy.url):
        with pytest.raises(openai.APIStatusError) as caught:
            await async_client(base).chat.completions.create(model=model, messages=messages)
        outcomes.append((caught.value.status_code, caught.value.response.content))
    assert outcomes[0] == outcomes[1]
    assert outcomes[1][0] == status


async def test_stream_chunks_arrive_before_upstream_finishes(fake: FakeUpstream, proxy: RunningServer) -> None:
    fake.stream_gate = asyncio.Event()
    stream = await async_client(proxy.url).chat.completions.create(
        model="fake-small", messages=MESSAGES, stream=True)
    seen = []
    async for event in stream:
        seen.append(event)
        if event.choices and event.choices[0].delta.content:
            assert fake.last_chunk_sent_at is None, "first content chunk waited for the end of the stream"
            fake.stream_gate.set()
    assert fake.last_chunk_sent_at is not None
    assert "".join(e.choices[0].delta.content or "" for e in seen if e.choices).strip() == "echo: hello there"


async def test_five_mib_body_passes_byte_for_byte(fake: FakeUpstream, proxy: RunningServer) -> None:
    big = "x" * (5 * 1024 * 1024)
    body = json.dumps({"model": "fake-small", "messages": [{"role": "user", "content": big}],
                       "vendor_field": {"kept": True}}, separators=(", ", ": ")).encode()
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{proxy.url}/v1/chat/completions", data=body,
                                headers={"Content-Type": "application/json"}) as response:
            assert response.status == 200
            assert (await response.json())["choices"][0]["message"]["content"].startswith("echo: xxx")
    assert fake.requests[-1].body == body


async def test_body_over_limit_gets_openai_shaped_413(fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy({"server": {"max_body_bytes": 1024 * 1024}})
    with pytest.raises(openai.APIStatusError) as caught:
        await async_client(proxy.url).chat.completions.create(
            model="fake-small", messages=[{"role": "user", "content": "y" * (2 * 1024 * 1024)}])
    assert caught.value.status_code == 413
    error = caught.value.response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and "1048576" in error["message"]
    assert fake.requests == []


async def test_upstream_down_is_openai_shaped_502(make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy({"upstream": {"base_url": "http://127.0.0.1:9/v1", "connect_timeout": 2}})
    with pytest.raises(openai.APIStatusError) as caught:
        await async_client(proxy.url).chat.completions.create(model="fake-small", messages=MESSAGES)
    assert caught.value.status_code == 502
    assert caught.value.response.json()["error"]["code"] == "upstream_unreachable"


async def test_silent_upstream_is_openai_shaped_504(fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy({"upstream": {"idle_timeout": 0.3}})
    fake.silent_seconds = 1.2
    started = time.monotonic()
    with pytest.raises(openai.APIStatusError) as caught:
        await async_client(proxy.url).chat.completions.create(model="fake-small", messages=MESSAGES)
    assert caught.value.status_code == 504
    assert caught.value.response.json()["error"]["code"] == "upstream_timeout"
    assert time.monotonic() - started < 2


async def test_identifying_headers_reach_the_client(proxy: RunningServer) -> None:
    raw = await async_client(proxy.url).chat.completions.with_raw_response.create(
        model="fake-small", messages=MESSAGES)
    # x-request-id is the proxy's (the client's own when it sent one); the upstream's id is kept beside it.
    assert raw.headers["x-upstream-request-id"] == "req_123" and raw.headers["x-request-id"] != "req_123"
    assert raw.headers["x-ratelimit-remaining-requests"] == "99"
    assert raw.headers["openai-processing-ms"] == "7"


async def test_hop_by_hop_headers_dropped_both_ways(fake: FakeUpstream, proxy: RunningServer) -> None:
    sent = {"Authorization": "Bearer sk-client", "Connection": "keep-alive, X-Private-Hop", "X-Private-Hop": "1",
            "Keep-Alive": "timeout=9", "TE": "trailers", "Proxy-Authorization": "Basic c2VjcmV0",
            "X-Trace": "abc", "anthropic-version": "2023-06-01"}
    async with aiohttp.ClientSession() as session:
        async with session.post(URL(f"{proxy.url}/v1/echo/path%20x?a=1&b=%2Fc&a=2", encoded=True), data=b"\x00\xffraw",
                                headers=sent) as response:
            echoed = await response.json()
            relayed = response.headers
    upstream_headers = {k.lower(): v for k, v in echoed["headers"].items()}
    assert upstream_headers["authorization"] == "Bearer sk-client"
    assert upstream_headers["x-trace"] == "abc" and upstream_headers["anthropic-version"] == "2023-06-01"
    for name in ("x-private-hop", "keep-alive", "te", "proxy-authorization"):
        assert name not in upstream_headers
    assert upstream_headers["host"] == fake.url.removeprefix("http://")
    assert echoed["query"] == "a=1&b=%2Fc&a=2" and echoed["path"] == "/v1/echo/path%20x"
    assert echoed["body_length"] == 5 and fake.requests[-1].body == b"\x00\xffraw"
    assert "X-Custom-Upstream" not in relayed and "Keep-Alive" not in relayed


async def test_configured_api_key_replaces_client_key(fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy({"upstream": {"api_key": "sk-upstream"}})
    await async_client(proxy.url).chat.completions.create(model="fake-small", messages=MESSAGES)
    assert fake.requests[-1].headers["Authorization"] == "Bearer sk-upstream"


@pytest.mark.parametrize("path", ["/v1/models", "/v1/chat/completions"])
async def test_gzip_upstream_bodies_are_decoded_with_fresh_headers(path: str, fake: FakeUpstream,
                                                                   proxy: RunningServer) -> None:
    fake.gzip = True
    body = {"model": "fake-small", "messages": MESSAGES}
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        direct = await session.request("POST" if "chat" in path else "GET", f"{fake.url}{path}", json=body,
                                       headers={"Accept-Encoding": "gzip"})
        assert direct.headers["Content-Encoding"] == "gzip"
        expected = json.loads(gzip.decompress(await direct.read()))
        proxied = await session.request("POST" if "chat" in path else "GET", f"{proxy.url}{path}", json=body,
                                        headers={"Accept-Encoding": "gzip"})
        raw = await proxied.read()
    assert "Content-Encoding" not in proxied.headers
    assert proxied.headers.get("Content-Length", str(len(raw))) == str(len(raw))
    assert json.loads(raw) == expected


async def test_gzip_stream_is_relayed_decoded(fake: FakeUpstream, proxy: RunningServer) -> None:
    fake.gzip = True
    events = await _stream(async_client(proxy.url), messages=MESSAGES)
    assert "".join(e["choices"][0]["delta"]["content"] or "" for e in events if e["choices"]).strip() \
        == "echo: hello there"


async def test_client_disconnect_closes_upstream_stream(fake: FakeUpstream, proxy: RunningServer) -> None:
    async with aiohttp.ClientSession() as session:
        response = await session.get(f"{proxy.url}/v1/endless")
        await response.content.readline()
        await response.content.readline()
        left_at = time.monotonic()
        response.close()
    for _ in range(100):
        if fake.stream_closed_at is not None:
            break
        await asyncio.sleep(0.02)
    assert fake.stream_closed_at is not None
    assert fake.stream_closed_at - left_at < 1.0


async def test_health_and_readiness(proxy: RunningServer) -> None:
    async with aiohttp.ClientSession() as session:
        for path in ("/healthz", "/readyz"):
            async with session.get(f"{proxy.url}{path}") as response:
                assert response.status == 200
                assert (await response.json())["status"] in ("ok", "ready")


async def test_unknown_path_is_openai_shaped_404(proxy: RunningServer) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{proxy.url}/not-api") as response:
            assert response.status == 404
            assert set((await response.json())["error"]) == {"message", "type", "param", "code"}


async def test_proxy_keys_guard_the_api_but_not_probes(fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy({"server": {"api_keys": ["proxy-key"]}, "upstream": {"api_key": "sk-up"}})
    with pytest.raises(openai.AuthenticationError):
        await async_client(proxy.url).models.list()
    allowed = async_client(proxy.url, api_key="proxy-key")
    assert [m.id for m in (await allowed.models.list()).data] == ["fake-small", "fake-large"]
    assert fake.requests[-1].headers["Authorization"] == "Bearer sk-up"
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{proxy.url}/healthz") as response:
            assert response.status == 200


async def test_concurrent_streams_all_complete(proxy: RunningServer) -> None:
    client = async_client(proxy.url)
    results = await asyncio.gather(*(_stream(client, messages=[{"role": "user", "content": f"n{i}"}])
                                     for i in range(50)))
    for index, events in enumerate(results):
        text = "".join(e["choices"][0]["delta"]["content"] or "" for e in events if e["choices"])
        assert text.strip() == f"echo: n{index}"


async def test_stale_pooled_connection_is_retried_once(make_proxy: ProxyFactory) -> None:
    """A server that answers one request per connection and drops the next one unanswered, like a server that
    closes a kept-alive connection just as the proxy reuses it. An idempotent GET is retried on a new connection;
    a POST the server may have read never is (tests/e2e/test_no_second_copy.py)."""
    answered = 0

    async def one_answer_per_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal answered
        for request_index in range(2):
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(next((line.split(b":")[1] for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length")), b"0"))
            await reader.readexactly(length)
            if request_index == 1:
                break
            answered += 1
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 15\r\n\r\n"
                         b'{"object":"ok"}')
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(one_answer_per_connection, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        proxy = await make_proxy({"upstream": {"base_url": f"http://127.0.0.1:{port}/v1"}})
        async with aiohttp.ClientSession() as session:
            for _ in range(3):
                async with session.get(f"{proxy.url}/v1/things") as response:
                    assert (response.status, await response.read()) == (200, b'{"object":"ok"}')
    finally:
        server.close()
    assert answered == 3
