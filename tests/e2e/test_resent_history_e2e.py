"""A long history resent whole each turn by the official SDKs, through real sockets, in each API: the proxy reads
each body from where the last one grew (dialects.body_memo), and the upstream still gets every body as sent."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from proxy.http.appkeys import RUNTIME
from tests.conftest import ProxyFactory
from tests.fakes.messages_agent import anthropic_client
from tests.fakes.messages_model import MessagesModel
from tests.fakes.openai_upstream import FakeUpstream
from tests.fakes.responses_model import ResponsesModel

WINDOW = 400_000  # no compaction: every body is read whole, and forwarded as it came
TURNS = 4
CONFIG = {"models": {"default": {"context_window": WINDOW}}, "upstream": {"discover_windows": False},
          "compaction": {"background": False}}


def history(turns: int, words: int = 500) -> list[dict[str, Any]]:
    """~300 KB of alternating turns (over the glance's bound, so every body is read), then `turns` more."""
    said = [{"role": "user" if index % 2 == 0 else "assistant",
             "content": f"turn {index}: é ünïcode, \"quotes\", a tab\tand a line\n" + "words " * words}
            for index in range(100 + 2 * turns)]
    return said[:99 + 2 * turns]  # ends on a user turn


def memo_reused(proxy: Any) -> int:
    reused: int = proxy.app[RUNTIME].shared.bodies.reused
    return reused


async def test_chat_through_the_openai_sdk(fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(CONFIG)
    client = openai.AsyncOpenAI(api_key="sk-test", base_url=f"{proxy.url}/v1", max_retries=0)
    for turn in range(TURNS):
        messages = history(turn)
        answer = await client.chat.completions.create(model="fake-model", messages=messages)
        assert answer.choices[0].message.content
        assert json.loads(fake.requests[-1].body)["messages"] == messages
    assert memo_reused(proxy) == TURNS - 1


async def test_a_body_the_glance_reads_and_does_not_relay_is_read_once(fake: FakeUpstream,
                                                                     make_proxy: ProxyFactory) -> None:
    """~180 KB: under the glance's bound, and too near the threshold for it to relay unread. The glance reads it as
    the whole way does, and the whole way takes that reading: one reading per request, each from the last body."""
    proxy = await make_proxy(CONFIG)
    client = openai.AsyncOpenAI(api_key="sk-test", base_url=f"{proxy.url}/v1", max_retries=0)
    for turn in range(TURNS):
        messages = history(turn, words=300)
        assert 64 * 1024 < len(json.dumps(messages)) < 256 * 1024
        await client.chat.completions.create(model="fake-model", messages=messages)
        assert json.loads(fake.requests[-1].body)["messages"] == messages
    assert memo_reused(proxy) == TURNS - 1


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_messages_through_the_anthropic_sdk(stream: bool, fake: FakeUpstream,
                                                  make_proxy: ProxyFactory) -> None:
    model = MessagesModel(window=WINDOW, thinks=False)
    fake.messages_hook = model
    proxy = await make_proxy(CONFIG)
    client = anthropic_client(proxy.url)
    for turn in range(TURNS):
        messages = history(turn)
        if stream:
            async with client.messages.stream(model="fake-messages", max_tokens=256,
                                              messages=messages) as events:
                await events.get_final_message()
        else:
            await client.messages.create(model="fake-messages", max_tokens=256, messages=messages)
        assert model.received[-1]["messages"] == messages
    assert memo_reused(proxy) == TURNS - 1


async def test_responses_through_the_openai_sdk(fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    model = ResponsesModel(window=WINDOW)
    fake.responses_hook = model
    proxy = await make_proxy(CONFIG)
    client = openai.AsyncOpenAI(api_key="sk-test", base_url=f"{proxy.url}/v1", max_retries=0)
    for turn in range(TURNS):
        items = history(turn)
        await client.responses.create(model="fake-model", input=items)
        assert model.received[-1]["input"] == items
    assert memo_reused(proxy) == TURNS - 1
