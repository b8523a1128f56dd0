"""A whole upstream answer judged once, by its dialect: overflow or not, and its usage, from one JSON decoding."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, cast

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.core.usage import Usage
from proxy.dialects.chat import CHAT
from proxy.upstream.attempt import OpenResponses, _judged
from proxy.upstream.overflow import detect_context_overflow

USAGE = {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}
READ = Usage(12, 3)  # USAGE as the chat dialect reads it


def answer(**fields: Any) -> bytes:
    return json.dumps({"id": "chatcmpl-1", "object": "chat.completion", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}], **fields}).encode()


OVERFLOW_ERROR = json.dumps({"error": {"message": "This model's maximum context length is 4096 tokens. However, "
                                                  "your messages resulted in 5000 tokens.",
                                       "type": "invalid_request_error", "code": "context_length_exceeded"}}).encode()


@pytest.mark.parametrize(("status", "body", "expected"), [
    pytest.param(200, answer(usage=USAGE), (False, READ), id="an answer with usage"),
    pytest.param(200, b"\n  " + answer(usage=USAGE), (False, READ), id="leading whitespace"),
    pytest.param(200, answer(), (False, None), id="no usage"),
    pytest.param(200, answer(usage={}), (False, None), id="empty usage"),
    pytest.param(200, answer(usage="lots"), (False, None), id="usage not an object"),
    pytest.param(200, OVERFLOW_ERROR, (True, None), id="an overflow error inside a 200"),
    pytest.param(200, json.dumps({"choices": [{"finish_reason": "model_context_window_exceeded"}],
                                  "usage": USAGE}).encode(), (True, None), id="an overflow finish reason"),
    pytest.param(400, OVERFLOW_ERROR, (True, None), id="an overflow error"),
    pytest.param(500, b"upstream exploded", (False, None), id="a plain-text error"),
    pytest.param(200, b'{"usage": {"prompt_tokens": NaN}}', (False, None), id="JSON orjson refuses"),
    pytest.param(200, b"[1, 2]", (False, None), id="not an object"),
    pytest.param(200, b"", (False, None), id="empty"),
])
def test_an_answer_is_judged_once(status: int, body: bytes, expected: tuple[bool, Any]) -> None:
    assert _judged(status, body, CHAT) == expected


@pytest.mark.parametrize("body", [answer(usage=USAGE), OVERFLOW_ERROR, b'{"error": "quota"}', b"not json", b"[]"])
@pytest.mark.parametrize("status", [200, 400, 429, 500])
def test_the_verdict_is_the_overflow_detectors(status: int, body: bytes) -> None:
    assert _judged(status, body, CHAT)[0] == detect_context_overflow(status, body)


class _Closing:
    """Stands in for a response: records its close, or fails it."""

    def __init__(self, name: str, closed: list[str], fails: bool = False) -> None:
        self.name, self.closed, self.fails = name, closed, fails

    def close(self) -> None:
        self.closed.append(self.name)
        if self.fails:
            raise RuntimeError(f"{self.name} failed to close")


def test_open_responses_close_the_last_first_and_each_once() -> None:
    closed: list[str] = []
    held = OpenResponses()
    for name in ("first", "retry"):
        held.hold(cast(aiohttp.ClientResponse, _Closing(name, closed)))
    held.close()
    held.close()
    assert closed == ["retry", "first"]


def test_a_close_that_fails_leaves_the_rest_for_the_next() -> None:
    closed: list[str] = []
    held = OpenResponses()
    held.hold(cast(aiohttp.ClientResponse, _Closing("first", closed)))
    held.hold(cast(aiohttp.ClientResponse, _Closing("retry", closed, fails=True)))
    with pytest.raises(RuntimeError):
        held.close()
    held.close()
    assert closed == ["retry", "first"]


async def test_a_live_stream_held_is_closed_when_the_block_is_left_even_by_an_error(
        aiohttp_server: Callable[[web.Application], Awaitable[TestServer]]) -> None:
    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: {}\n\n")
        await asyncio.sleep(30)  # never ends by itself
        return response

    app = web.Application()
    app.router.add_get("/stream", stream)
    server = await aiohttp_server(app)
    async with aiohttp.ClientSession() as session:
        response = await session.get(server.make_url("/stream"))
        with pytest.raises(LookupError):
            async with OpenResponses() as held:
                held.hold(response)
                assert await response.content.readline() == b"data: {}\n"
                raise LookupError("the answer's own work failed")
        assert response.closed and response.connection is None
