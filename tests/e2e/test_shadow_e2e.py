"""Shadow mode: compaction decides and reports, while every request reaches the upstream exactly as sent."""

from __future__ import annotations

import json
import re

import aiohttp
import pytest

from tests.conftest import ProxyFactory
from tests.e2e.test_compaction_e2e import big_history, compaction_config
from tests.fakes.openai_upstream import FakeUpstream
from tests.fakes.windowed import WindowedModel

WINDOW = 8192


async def post(url: str, body: bytes, **headers: str) -> tuple[int, dict[str, str], bytes]:
    async with aiohttp.ClientSession() as session, session.post(
            f"{url}/v1/chat/completions", data=body,
            headers={"Content-Type": "application/json", "Authorization": "Bearer sk-test", **headers}) as response:
        return response.status, dict(response.headers), await response.read()


async def metric(url: str, name: str) -> dict[str, float]:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/metrics") as response:
        text = await response.text()
    return {labels: float(value) for labels, value in re.findall(rf"^{name}(\S*) (\S+)$", text, re.M)}


@pytest.mark.parametrize("how", ["config", "header"])
async def test_over_threshold_requests_are_forwarded_byte_for_byte(how: str, fake: FakeUpstream,
                                                                   make_proxy: ProxyFactory) -> None:
    model = WindowedModel(window=100_000)  # the upstream would take it; the proxy's configured window would not
    fake.chat_hook = model
    config = compaction_config()
    if how == "config":
        config["compaction"]["mode"] = "shadow"
    proxy = await make_proxy(config)
    # Odd spacing and key order: any re-encoding would show.
    body = json.dumps({"messages": big_history(24), "model": "fake-small"}, indent=1).encode()
    extra = {"x-compaction-mode": "shadow"} if how == "header" else {}
    status, headers, _ = await post(proxy.url, body, **extra)
    assert status == 200
    assert headers["x-compaction"] == "none" and headers["x-compaction-shadow"] == "proactive"
    assert int(headers["x-compaction-shadow-tokens-after"]) < int(headers["x-compaction-shadow-tokens-before"])
    chats = [r for r in fake.requests if r.path.endswith("/chat/completions")]
    assert [r.body for r in chats] == [body]
    assert model.summarizer_calls == []
    assert (await metric(proxy.url, "compaction_proxy_shadow_decisions_total"))['{decision="proactive"}'] == 1
    assert (await metric(proxy.url, "compaction_proxy_shadow_saved_tokens_total"))[""] > 1000


async def test_an_overflow_in_shadow_mode_returns_the_upstreams_answer(fake: FakeUpstream,
                                                                       make_proxy: ProxyFactory) -> None:
    model = WindowedModel(window=WINDOW)
    fake.chat_hook = model
    proxy = await make_proxy(compaction_config(threshold=0, mode="shadow"))
    body = json.dumps({"model": "fake-small", "messages": big_history(30)}).encode()
    status, headers, answer = await post(proxy.url, body)
    assert status == 400 and json.loads(answer)["error"]["code"] == "context_length_exceeded"
    assert headers["x-compaction"] == "none" and headers["x-compaction-shadow"] == "reactive"
    assert len(model.chat_calls) == 1 and model.summarizer_calls == []


async def test_below_threshold_shadow_says_none(fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    fake.chat_hook = WindowedModel(window=WINDOW)
    proxy = await make_proxy(compaction_config(mode="shadow"))
    status, headers, _ = await post(proxy.url, json.dumps({"model": "fake-small",
                                                           "messages": big_history(1)}).encode())
    assert status == 200 and headers["x-compaction-shadow"] == "none"
    assert "x-compaction-shadow-tokens-before" not in headers
