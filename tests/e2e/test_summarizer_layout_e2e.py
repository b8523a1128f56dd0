"""The summariser request's layout through the proxy: the conversation's own prefix, or a transcript."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.summarizer.templates import Templates
from tests.conftest import ProxyFactory
from tests.e2e.test_compaction_e2e import TOOLS, big_history, calibrated, compaction_config
from tests.fakes.openai_upstream import FakeUpstream
from tests.fakes.summariser_requests import layout_of
from tests.fakes.windowed import WindowedModel
from tests.sdk import async_client

# A history past the proactive trigger by a round or two, where an agent's loop meets it: the prefix then fits
# the summariser's window with the ask beside it. (At 20 rounds, 94 % of the window, it does not, and the
# summariser falls back to transcript chunks; the fallback from a prefix that does not fit has its own test below.)
ROUNDS = 17


@pytest.fixture
def model(fake: FakeUpstream) -> WindowedModel:
    windowed = WindowedModel(window=8192)
    fake.chat_hook = windowed
    return windowed


async def compact_once(proxy_url: str, model: WindowedModel, **extra: Any) -> list[dict[str, Any]]:
    client = async_client(proxy_url)
    await calibrated(client, model)
    raw = await client.chat.completions.with_raw_response.create(model="fake-small", messages=big_history(ROUNDS),
                                                                 **extra)
    assert raw.headers["x-compaction"] == "proactive"
    return [call.body for call in model.summarizer_calls]


async def test_by_default_the_summariser_request_is_the_conversations_own_prefix(
        model: WindowedModel, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(compaction_config(background=False))
    [request] = await compact_once(proxy.url, model, tools=TOOLS)
    history = big_history(ROUNDS)
    messages = request["messages"]
    assert layout_of(messages) == "prefix"
    cut = len(messages) - 1
    if messages[cut - 1]["content"] == Templates().acknowledgement():
        cut -= 1  # the filler between the span's last user message and the instruction
        assert messages[cut - 1]["role"] == "user"
    assert 2 < cut < len(history)
    assert json.dumps(messages[:cut]) == json.dumps(history[:cut]), "the history as the client sent it, unchanged"
    assert messages[-1]["role"] == "user"
    assert request["tools"] == TOOLS and request["tool_choice"] == "none"


async def test_without_tools_the_prefix_request_names_none(model: WindowedModel, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(compaction_config(background=False))
    [request] = await compact_once(proxy.url, model)
    assert layout_of(request["messages"]) == "prefix"
    assert "tools" not in request and "tool_choice" not in request


@pytest.mark.parametrize(("summarizer", "expected"), [
    ({"layout": "transcript"}, "transcript"),
    ({"model": "another-model"}, "transcript"),          # a separate summariser model has no use for the prefix
    ({"model": "another-model", "layout": "prefix"}, "prefix"),
    ({"model": "fake-small"}, "prefix"),                 # naming the conversation's own model changes nothing
])
async def test_the_layout_follows_the_config(summarizer: dict[str, Any], expected: str, model: WindowedModel,
                                             make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(compaction_config(background=False, summarizer=summarizer))
    [request] = await compact_once(proxy.url, model, tools=TOOLS)
    assert layout_of(request["messages"]) == expected
    assert ("tools" in request) == (expected == "prefix")


async def test_a_prefix_the_server_refuses_as_too_long_falls_back_to_the_transcript(
        model: WindowedModel, fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(compaction_config(background=False))
    client = async_client(proxy.url)
    await calibrated(client, model)

    async def small_summariser_window(request: Any, body: dict[str, Any], state: FakeUpstream) -> Any:
        # The conversation's window fits the prefix; this summariser's server holds less than the history.
        model.window = 3000 if layout_of(body.get("messages") or []) else 8192
        return await WindowedModel.__call__(model, request, body, state)

    fake.chat_hook = small_summariser_window
    raw = await client.chat.completions.with_raw_response.create(model="fake-small", messages=big_history(20))
    layouts = [layout_of(call.body["messages"]) for call in model.summarizer_calls]
    assert raw.headers["x-compaction"] == "proactive"
    assert layouts[0] == "prefix" and set(layouts[1:]) == {"transcript"}
