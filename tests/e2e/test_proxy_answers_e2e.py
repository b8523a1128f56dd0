"""Every answer the proxy makes itself says what compaction did: x-compaction (none, or failed for a compaction the
client asked for) and x-compaction-reason with the error's code, on each route and kind of refusal."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
from yarl import URL

from tests.conftest import ProxyFactory
from tests.fakes.openai_upstream import FakeUpstream
from tests.fakes.windowed import WindowedModel
from tests.ports import free_port

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


async def answer(url: str | URL, *, data: bytes | None = None, body: Any = None,
                 headers: dict[str, str] | None = None) -> tuple[int, dict[str, str]]:
    async with aiohttp.ClientSession() as session, session.post(
            url, data=data if data is not None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json", **(headers or {})}) as response:
        await response.read()
        return response.status, dict(response.headers)


@pytest.mark.parametrize(("path", "sent", "status", "reason"), [
    ("/v1/chat/completions", b"{not json", 400, "invalid_request_error"),
    ("/v1/responses", b"[1, 2]", 400, "invalid_request_error"),
    ("/v1/messages", b"{", 400, "invalid_request_error"),
], ids=["chat-json", "responses-list", "messages-json"])
async def test_a_bad_request_says_none_and_why(path: str, sent: bytes, status: int, reason: str,
                                               make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy()
    got, headers = await answer(f"{proxy.url}{path}", data=sent)
    assert got == status
    assert (headers["x-compaction"], headers["x-compaction-reason"]) == ("none", reason)


async def test_a_refused_key_says_none_and_invalid_api_key(make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy({"server": {"api_keys": ["answers-key-0123456789"]}})
    status, headers = await answer(f"{proxy.url}/v1/chat/completions", body=CHAT)
    assert status == 401 and (headers["x-compaction"], headers["x-compaction-reason"]) == ("none", "invalid_api_key")


async def test_an_unreachable_upstream_says_none_and_upstream_unreachable(make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy({"upstream": {"base_url": f"http://127.0.0.1:{free_port()}/v1"}})
    status, headers = await answer(f"{proxy.url}/v1/chat/completions", body=CHAT)
    assert status == 502
    assert (headers["x-compaction"], headers["x-compaction-reason"]) == ("none", "upstream_unreachable")


async def test_an_escaping_path_and_a_websocket_say_why(make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy()
    status, headers = await answer(URL(f"{proxy.url}/v1/%2e%2e/admin", encoded=True), body=CHAT)
    assert status == 400 and (headers["x-compaction"], headers["x-compaction-reason"]) == ("none", "invalid_path")
    async with aiohttp.ClientSession() as session, session.get(
            f"{proxy.url}/v1/responses", headers={"Connection": "Upgrade", "Upgrade": "websocket",
                                                  "Sec-WebSocket-Version": "13",
                                                  "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}) as response:
        assert response.status == 426
        assert (response.headers["x-compaction"], response.headers["x-compaction-reason"]) == \
            ("none", "websocket_not_supported")


async def test_a_compaction_asked_for_that_fails_says_failed(fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    fake.chat_hook = WindowedModel(window=32_768, summarizer_down=True)
    proxy = await make_proxy({"models": {"default": {"context_window": 32_768}}})
    items = [{"role": "user", "content": f"note {index}: " + "word " * 200} for index in range(10)]
    status, headers = await answer(f"{proxy.url}/v1/responses/compact", body={"model": "m", "input": items})
    assert status == 502
    assert (headers["x-compaction"], headers["x-compaction-reason"]) == ("failed", "compaction_failed")
