"""Requests far below every limit, relayed unread through real sockets: as sent, and still compacted when the
upstream's window turns out smaller than stated. What goes the whole way (an image, a mode, an unknown window, a
Messages context edit) still does: the journal charts a request only when it went the whole way."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from proxy.compaction import glance
from proxy.headers import COMPACTION, MODE
from tests.conftest import ProxyFactory
from tests.e2e.test_compaction_e2e import WINDOW, big_history
from tests.fakes.openai_upstream import FakeUpstream
from tests.fakes.windowed import WindowedModel
from tests.sdk import async_client

KEY = "sk-glance-owner-0123456789"
STATED = 128_000  # the window the config states for the model
MODEL = "fake-small"


@pytest.fixture
def model(fake: FakeUpstream) -> WindowedModel:
    windowed = WindowedModel(window=WINDOW)  # what the upstream really enforces
    fake.chat_hook = windowed
    return windowed


def config(window: int = STATED, **compaction: Any) -> dict[str, Any]:
    return {"models": {MODEL: {"context_window": window}, "default": {"context_window": window}},
            "upstream": {"discover_windows": False},
            "compaction": {"background": False, **compaction}}


async def post(url: str, body: dict[str, Any] | bytes, path: str = "/v1/chat/completions",
               headers: dict[str, str] | None = None) -> tuple[int, Any, bytes]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    sent = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json", **(headers or {})}
    async with aiohttp.ClientSession() as session, session.post(f"{url}{path}", data=data,
                                                                 headers=sent) as response:
        return response.status, response.headers, await response.read()


async def charted_points(url: str, requests: int) -> int:
    """Points the journal holds for the caller, once `requests` whole-way requests' writes can have landed."""
    headers = {"Authorization": f"Bearer {KEY}"}
    async with aiohttp.ClientSession() as session:
        for _ in range(100):
            async with session.get(f"{url}/_proxy/api/conversations", headers=headers) as response:
                listed = (await response.json())["conversations"]
            points = 0
            for conversation in listed:
                async with session.get(f"{url}/_proxy/api/conversations/{conversation['id']}",
                                       headers=headers) as response:
                    points += len((await response.json())["points"])
            if points >= requests:
                return points
            await asyncio.sleep(0.02)
    return points


def chat(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": messages, **extra}


async def test_a_small_request_is_relayed_byte_for_byte_and_not_charted(
        model: WindowedModel, fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(config())
    raw = json.dumps(chat(big_history(2)), indent=1).encode()  # the client's own formatting, kept
    status, headers, answer = await post(proxy.url, raw)
    assert status == 200, answer
    assert headers[COMPACTION] == "none"
    assert fake.requests[-1].body == raw
    # The same conversation with a mode header goes the whole way: only that request is charted.
    status, headers, _ = await post(proxy.url, raw, headers={MODE: "auto"})
    assert status == 200 and headers[COMPACTION] == "none"
    assert await charted_points(proxy.url, 1) == 1


async def test_with_compaction_off_a_large_body_is_relayed_byte_for_byte(
        fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    """Past the glance's size cap, compaction off: nothing reads the body whole, so nothing rewrites it (an integer
    past 64 bits stays exact, the client's formatting stays), nothing refuses what only the whole way's guards would
    (nesting deeper than the proxy reads: the upstream judges its own bodies) and nothing charts it."""
    proxy = await make_proxy(config(enabled=False))
    payload = chat([*big_history(1), {"role": "user", "content": "x " * glance.MAX_BYTES}],
                   metadata={"trace": 123456789012345678901234567890, "deep": json.loads("[" * 200 + "]" * 200)})
    raw = json.dumps(payload, indent=1).encode()
    assert len(raw) > glance.MAX_BYTES
    status, headers, answer = await post(proxy.url, raw)
    assert status == 200, answer
    assert headers[COMPACTION] == "none"
    assert fake.requests[-1].body == raw
    assert await charted_points(proxy.url, 0) == 0


async def test_with_compaction_off_a_large_body_is_logged_with_its_model_read_from_either_end(
        fake: FakeUpstream, make_proxy: ProxyFactory, caplog: pytest.LogCaptureFixture) -> None:
    """Off, only the model is read (proxy.core.top_members): first, as the OpenAI SDK sends it, or after the
    history, as the Anthropic SDK sends its messages before the model. Each body is relayed as it was sent, each
    access line names the model, and a model named inside a message is not taken for it."""
    caplog.set_level(logging.INFO)
    logged: list[dict[str, Any]] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            logged.append(json.loads(record.getMessage()))

    handler = Collect(logging.INFO)
    logging.getLogger("proxy.access").addHandler(handler)
    try:
        proxy = await make_proxy(config(enabled=False))
        history = [{"role": "user", "content": '{"model": "inside-a-message", "n": 1}'},
                   {"role": "user", "content": "x " * glance.WHOLE_BELOW}]
        async with async_client(proxy.url, KEY) as client:
            answer = await client.chat.completions.with_raw_response.create(model=MODEL, messages=history,
                                                                            temperature=0.5)
        assert answer.headers[COMPACTION] == "none"
        assert json.loads(fake.requests[-1].body) == {"model": MODEL, "messages": history, "temperature": 0.5}
        last_first = json.dumps({"max_tokens": 5, "messages": history, "model": MODEL, "stream": False}).encode()
        status, headers, _ = await post(proxy.url, last_first)
        assert status == 200 and headers[COMPACTION] == "none"
        assert fake.requests[-1].body == last_first and len(last_first) > glance.WHOLE_BELOW
        for _ in range(200):
            if len(logged) >= 2:
                break
            await asyncio.sleep(0.01)
        assert [line.get("model") for line in logged if line.get("route") == "chat"] == [MODEL, MODEL]
    finally:
        logging.getLogger("proxy.access").removeHandler(handler)


async def test_with_compaction_off_an_image_is_not_looked_for(fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    """Off, nothing is counted, so content whose tokens its bytes do not bound sends nothing the whole way: the body
    is relayed as it came, even what the whole way's guards would refuse (nesting deeper than the proxy reads)."""
    proxy = await make_proxy(config(enabled=False))
    messages = [{"role": "user", "content": [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": "https://example.invalid/a.png"}}]}]
    raw = json.dumps(chat(messages, metadata={"deep": json.loads("[" * 200 + "]" * 200)}), indent=1).encode()
    status, headers, answer = await post(proxy.url, raw)
    assert status == 200, answer
    assert headers[COMPACTION] == "none"
    assert fake.requests[-1].body == raw


@pytest.mark.parametrize("case", ["image", "unknown window", "mode header", "shadow mode", "glance off"])
async def test_what_a_byte_count_cannot_judge_goes_the_whole_way(case: str, model: WindowedModel,
                                                                 make_proxy: ProxyFactory) -> None:
    settings = config(mode="shadow") if case == "shadow mode" else config(glance=False) if case == "glance off" \
        else config()
    if case == "unknown window":
        settings["models"] = {"default": {"context_window": STATED}}  # a guess, not a statement
    proxy = await make_proxy(settings)
    messages = big_history(1)
    if case == "image":
        messages[-1] = {"role": "user", "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": "https://example.invalid/a.png"}}]}
    status, _, answer = await post(proxy.url, chat(messages), headers={MODE: "auto"} if case == "mode header" else {})
    assert status == 200, answer
    assert await charted_points(proxy.url, 1) == 1


async def test_an_overflow_of_a_glanced_request_is_compacted_and_retried_once(
        model: WindowedModel, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(config(threshold=0.8))
    history = big_history(30)
    body = json.dumps(chat(history)).encode()
    # The stated window makes the request look far below every limit: the upstream's real one is 8,192 tokens.
    assert glance.far_below(len(body), 1024, int(0.6 * STATED))
    status, headers, answer = await post(proxy.url, body)
    assert status == 200, answer
    assert headers[COMPACTION] == "reactive"
    chats = [call for call in model.received if not call.summarizer]
    assert len(chats) == 2 and chats[0].prompt_tokens > WINDOW >= chats[1].prompt_tokens
    assert json.loads(answer)["choices"][0]["message"]["content"].startswith("Noted: Remember FACT-30")
    # The overflow stated the window: the next request of that size is judged against it, goes the whole way and
    # reuses the summary, without a second refusal.
    status, headers, _ = await post(proxy.url, chat([*history, {"role": "assistant", "content": "ok"},
                                                     {"role": "user", "content": "and now?"}]))
    assert status == 200 and headers[COMPACTION] == "reused"
    assert len([call for call in model.received if not call.summarizer]) == 3


async def test_a_glanced_overflow_the_proxy_cannot_read_keeps_the_upstreams_answer(
        fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    """A body the upstream calls too long but the proxy will not read (nested deeper than it reads) is not lost."""
    refusal = {"error": {"message": "This model's maximum context length is 100 tokens. However, your messages "
                                    "resulted in 150 tokens.", "type": "invalid_request_error",
                         "code": "context_length_exceeded"}}

    async def overflowing(request: web.Request, body: dict[str, Any], state: FakeUpstream) -> web.Response:
        return web.json_response(refusal, status=400)

    fake.chat_hook = overflowing
    proxy = await make_proxy(config())
    raw = b'{"model": "fake-small", "messages": [{"role": "user", "content": "hi"}], "metadata": ' + \
        b"[" * 200 + b"]" * 200 + b"}"
    status, headers, answer = await post(proxy.url, raw)
    assert status == 400 and json.loads(answer) == refusal
    assert headers[COMPACTION] == "none"


async def test_a_glanced_stream_is_relayed_event_by_event(fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(config())
    direct_status, _, direct = await post(fake.url, chat(big_history(1), stream=True))
    status, headers, relayed = await post(proxy.url, chat(big_history(1), stream=True))
    assert status == direct_status == 200
    assert headers[COMPACTION] == "none" and headers["Content-Type"].startswith("text/event-stream")
    assert relayed == direct


async def test_concurrent_glanced_requests_each_get_their_own_answer(
        fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(config())
    bodies = [json.dumps(chat([{"role": "user", "content": f"question {index}"}])).encode() for index in range(24)]
    answers = await asyncio.gather(*(post(proxy.url, body) for body in bodies))
    for index, (status, headers, answer) in enumerate(answers):
        assert status == 200 and headers[COMPACTION] == "none"
        assert json.loads(answer)["choices"][0]["message"]["content"] == f"echo: question {index}"
    assert sorted(request.body for request in fake.requests) == sorted(bodies)


async def test_a_broken_body_is_refused_as_before(fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(config())
    status, _, answer = await post(proxy.url, b'{"model": "fake-small", "messages": [')
    assert status == 400 and json.loads(answer)["error"]["type"] == "invalid_request_error"
    assert fake.requests == []
