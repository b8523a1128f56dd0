"""Once a response has started, any failure ends it by closing the connection: never a late 500, never a hang."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web
from openai.types.chat import ChatCompletionMessageParam

from proxy.app import RunningServer
from proxy.config import Settings
from proxy.http.middleware import edge
from proxy.http.relay import deliver
from proxy.upstream.answer import Answer
from proxy.upstream.upstream import response_headers
from tests.fakes.openai_upstream import FakeUpstream, chunk, sse
from tests.fakes.serving import serve_app
from tests.sdk import async_client

ChunkFilter = Callable[[bytes], bytes]

# Seconds: a stream that ends by itself ends well within this (3.1 s was seen on a 2-core machine at load 6); a hang
# lasts until the client's timeout.
PROMPT = 10.0
CLIENT_TIMEOUT = 30.0
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello"}]

LATE_CHUNKS = {
    "choices is a number": b'data: {"choices": 5}\n\n',
    "choices is a string": b'data: {"choices": "abc"}\n\n',
    "choices holds a number": b'data: {"choices": [5]}\n\n',
    "choices is an object": b'data: {"choices": {"finish_reason": "stop"}}\n\n',
    "finish_reason is an object": b'data: {"choices": [{"finish_reason": {"a": [1]}}]}\n\n',
    "usage is a number": b'data: {"choices": [], "usage": 5}\n\n',
    "usage is a list": b'data: {"choices": [], "usage": [1, 2]}\n\n',
    "data nested 5000 deep": b"data: " + b"[" * 5000 + b"]" * 5000 + b"\n\n",
    "data is not JSON": b"data: {nope\n\n",
    "lone surrogate": b'data: {"choices": [{"delta": {"content": "\\ud800"}, "finish_reason": "\\udc00"}]}\n\n',
}


def malformed_after_first(late: bytes, delay: float = 0.05) -> Callable[
        [web.Request, dict[str, Any], FakeUpstream], Awaitable[web.StreamResponse | None]]:
    """An upstream stream whose first chunk is good and whose second is `late`; more good chunks follow.

    With a delay, the late chunk arrives after the proxy sent its 200 and the first chunk on; without, it
    arrives with the first one, while the proxy still holds the stream back.
    """

    async def hook(request: web.Request, body: dict[str, Any], state: FakeUpstream) -> web.StreamResponse | None:
        if not body.get("stream"):
            return None
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(sse(chunk(body, {"role": "assistant", "content": "Hello"})))
        await asyncio.sleep(delay)
        await response.write(late)
        await response.write(sse(chunk(body, {"content": " world"})))
        await response.write(sse(chunk(body, {}, "stop")))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    return hook


async def _raw_stream(session: aiohttp.ClientSession, url: str) -> tuple[int, bytes]:
    payload = {"model": "fake-small", "messages": MESSAGES, "stream": True}
    async with session.post(f"{url}/v1/chat/completions", json=payload) as response:
        return response.status, await response.read()


async def _serves_next_request(session: aiohttp.ClientSession, url: str) -> None:
    payload = {"model": "fake-small", "messages": MESSAGES}
    async with session.post(f"{url}/v1/chat/completions", json=payload) as response:
        assert response.status == 200
        assert (await response.json())["choices"][0]["message"]["content"] == "echo: hello"


@pytest.mark.parametrize("delay", [0.05, 0.0], ids=["after the start", "with the first chunk"])
@pytest.mark.parametrize("late", sorted(LATE_CHUNKS))
async def test_late_malformed_chunk_streams_on_raw_client(late: str, delay: float, fake: FakeUpstream,
                                                          proxy: RunningServer) -> None:
    fake.chat_hook = malformed_after_first(LATE_CHUNKS[late], delay)
    timeout = aiohttp.ClientTimeout(total=CLIENT_TIMEOUT)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        started = time.monotonic()
        status, body = await _raw_stream(session, proxy.url)
        assert time.monotonic() - started < PROMPT
        assert status == 200
        # Hostile chunks are data: relayed byte for byte, between the good ones.
        assert LATE_CHUNKS[late] in body and body.endswith(b"data: [DONE]\n\n")
        assert b"internal_error" not in body and b"500" not in body
        await _serves_next_request(session, proxy.url)


@pytest.mark.parametrize("late", ["choices is a number", "choices holds a number"])  # the SDK parses data itself
async def test_late_malformed_chunk_streams_on_openai_sdk(late: str, fake: FakeUpstream,
                                                          proxy: RunningServer) -> None:
    fake.chat_hook = malformed_after_first(LATE_CHUNKS[late])
    client = async_client(proxy.url, timeout=CLIENT_TIMEOUT)
    started = time.monotonic()
    stream = await client.chat.completions.create(model="fake-small", messages=MESSAGES, stream=True)
    texts = []
    async for event in stream:
        choices = event.choices if isinstance(event.choices, list) else []
        texts += [choice.delta.content or "" for choice in choices if hasattr(choice, "delta")]
    assert time.monotonic() - started < PROMPT
    assert "".join(texts) == "Hello world"
    answer = await client.chat.completions.create(model="fake-small", messages=MESSAGES)
    assert answer.choices[0].message.content == "echo: hello"


# --- relay itself, in a small app on a real socket, in front of the fake's real stream ---------------------

RelayHook = Callable[[web.Request, web.StreamResponse], Awaitable[None]]


async def _filtered(upstream: aiohttp.ClientResponse, chunk_filter: ChunkFilter | None,
                    on_end: Callable[[], bytes] | None) -> AsyncIterator[bytes]:
    """The upstream's chunks through a filter, then an end hook: the shape of a chat answer's own work."""
    async for data in upstream.content.iter_any():
        if out := (chunk_filter(data) if chunk_filter else data):
            yield out
    if on_end is not None and (tail := on_end()):
        yield tail


def relay_app(fake: FakeUpstream, *, chunk_filter: ChunkFilter | None = None,
              on_end: Callable[[], bytes] | None = None, after: RelayHook | None = None) -> web.Application:
    """POST /relay relays the fake's chat stream through `relay`; `after` runs once relay returned."""

    async def handler(request: web.Request) -> web.StreamResponse:
        payload = {"model": "fake-small", "messages": MESSAGES, "stream": True}
        async with aiohttp.ClientSession() as session, \
                session.post(f"{fake.url}/v1/chat/completions", json=payload) as upstream:
            answer = Answer(upstream.status, response_headers(upstream.headers, decoded=True),
                            chunks=_filtered(upstream, chunk_filter, on_end), reason=upstream.reason)
            response = await deliver(request, answer)
        if after is not None:
            await after(request, response)
        return response

    app = web.Application(middlewares=[edge(Settings())])
    app.router.add_post("/relay", handler)
    app.router.add_post("/v1/chat/completions", handler)
    app.router.add_get("/ok", ok)
    return app


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[web.Application], Awaitable[str]]]:
    runners: list[web.AppRunner] = []

    async def start(app: web.Application) -> str:
        runner, url = await serve_app(app)
        runners.append(runner)
        return url

    yield start
    for runner in runners:
        await runner.cleanup()


def fails_on_call(number: int) -> ChunkFilter:
    calls = 0

    def chunk_filter(data: bytes) -> bytes:
        nonlocal calls
        calls += 1
        if calls >= number:
            raise ValueError("a filter bug, with message text that must not be logged")
        return data

    return chunk_filter


def failing_on_end() -> bytes:
    raise KeyError("an on_end bug")


async def raw_exchange(url: str, path: str) -> tuple[bytes, float]:
    """Everything the server sends for one keep-alive request, until it closes the connection."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    started = time.monotonic()
    writer.write(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\n\r\n".encode())
    await writer.drain()
    try:
        data = await asyncio.wait_for(reader.read(-1), CLIENT_TIMEOUT)
    finally:
        writer.close()
    return data, time.monotonic() - started


async def assert_still_serving(url: str) -> None:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/ok") as response:
        assert response.status == 200 and await response.json() == {"ok": True}


@pytest.mark.parametrize("failing", ["filter", "on_end"])
async def test_failure_after_start_closes_the_connection(
        failing: str, fake: FakeUpstream, serve: Callable[[web.Application], Awaitable[str]],
        caplog: pytest.LogCaptureFixture) -> None:
    fake.stream_chunk_delay = 0.01  # the fake's chunks arrive one by one
    if failing == "filter":
        app = relay_app(fake, chunk_filter=fails_on_call(2))
    else:
        app = relay_app(fake, on_end=failing_on_end)
    url = await serve(app)
    data, elapsed = await raw_exchange(url, "/relay")
    assert elapsed < PROMPT
    assert data.startswith(b"HTTP/1.1 200 ")
    assert data.count(b"HTTP/1.1") == 1 and b"internal_error" not in data
    assert not data.endswith(b"0\r\n\r\n")  # no clean chunked end: the client can tell the stream was cut
    assert "message text" not in caplog.text and "an on_end bug" not in caplog.text
    assert any("closing the client connection" in record.getMessage() for record in caplog.records)
    await assert_still_serving(url)


async def test_failure_after_start_is_cut_off_for_aiohttp_client(
        fake: FakeUpstream, serve: Callable[[web.Application], Awaitable[str]]) -> None:
    url = await serve(relay_app(fake, chunk_filter=fails_on_call(2)))
    started = time.monotonic()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=CLIENT_TIMEOUT)) as session:
        with pytest.raises(aiohttp.ClientPayloadError):
            async with session.post(f"{url}/relay") as response:
                assert response.status == 200
                await response.read()
    assert time.monotonic() - started < PROMPT
    await assert_still_serving(url)


async def test_failure_after_start_is_cut_off_for_openai_sdk(
        fake: FakeUpstream, serve: Callable[[web.Application], Awaitable[str]]) -> None:
    fake.stream_chunk_delay = 0.05  # the fake's words arrive one by one
    url = await serve(relay_app(fake, chunk_filter=fails_on_call(2)))
    client = async_client(url, timeout=CLIENT_TIMEOUT)
    started = time.monotonic()
    texts = []
    with pytest.raises(Exception) as caught:  # the SDK's transport error for a cut body
        stream = await client.chat.completions.create(model="fake-small", messages=MESSAGES, stream=True)
        async for event in stream:
            texts += [choice.delta.content or "" for choice in event.choices]
    assert time.monotonic() - started < PROMPT
    assert not isinstance(caught.value, TimeoutError | openai.APITimeoutError)
    assert "hello" not in "".join(texts)  # the stream stopped at the failure
    await assert_still_serving(url)


async def test_failure_after_a_complete_relay_sends_nothing_more(
        fake: FakeUpstream, serve: Callable[[web.Application], Awaitable[str]]) -> None:
    async def after(request: web.Request, response: web.StreamResponse) -> None:
        raise RuntimeError("cleanup failed after the last byte went out")

    url = await serve(relay_app(fake, after=after))
    data, elapsed = await raw_exchange(url, "/relay")
    assert elapsed < PROMPT
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and data.count(b"HTTP/1.1") == 1
    assert body.endswith(b"0\r\n\r\n") and b"data: [DONE]" in body  # the whole stream, then nothing
    await assert_still_serving(url)


async def test_middleware_never_builds_an_error_after_bytes_went_out(
        serve: Callable[[web.Application], Awaitable[str]]) -> None:
    async def half_written(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: {}\n\n")
        raise RuntimeError("late bug")

    app = web.Application(middlewares=[edge(Settings())])
    app.router.add_post("/half", half_written)
    app.router.add_get("/ok", ok)
    url = await serve(app)
    data, elapsed = await raw_exchange(url, "/half")
    assert elapsed < PROMPT
    assert data.startswith(b"HTTP/1.1 200 ") and data.count(b"HTTP/1.1") == 1
    assert b"internal_error" not in data and b"data: {}" in data
    await assert_still_serving(url)


async def ok(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def test_error_before_start_is_still_openai_shaped(
        serve: Callable[[web.Application], Awaitable[str]]) -> None:
    async def broken(request: web.Request) -> web.StreamResponse:
        raise RuntimeError("early bug")

    app = web.Application(middlewares=[edge(Settings())])
    app.router.add_post("/broken", broken)
    url = await serve(app)
    async with aiohttp.ClientSession() as session, session.post(f"{url}/broken") as response:
        assert response.status == 500
        assert json.loads(await response.read())["error"]["code"] == "internal_error"
