"""A long history resent whole each turn by the official SDKs, through real sockets, in each API: the proxy reads
each body from where the last one grew (dialects.body_memo), and the upstream still gets every body as sent."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import openai
import orjson
import pytest

from proxy.http.appkeys import RUNTIME
from tests.conftest import ProxyFactory
from tests.fakes.messages_agent import anthropic_client
from tests.fakes.messages_model import MessagesModel
from tests.fakes.openai_upstream import FakeUpstream
from tests.fakes.responses_model import ResponsesModel
from tests.fakes.windowed import WindowedModel

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


def views_resumed(proxy: Any) -> int:
    """Views read on from the last request's (dialects.kept_reads), not from the first item."""
    resumed: int = proxy.app[RUNTIME].shared.bodies.resumed
    return resumed


async def test_chat_through_the_openai_sdk(fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(CONFIG)
    client = openai.AsyncOpenAI(api_key="sk-test", base_url=f"{proxy.url}/v1", max_retries=0)
    for turn in range(TURNS):
        messages = history(turn)
        answer = await client.chat.completions.create(model="fake-model", messages=messages)
        assert answer.choices[0].message.content
        assert json.loads(fake.requests[-1].body)["messages"] == messages
    assert memo_reused(proxy) == TURNS - 1
    assert views_resumed(proxy) == 0  # chat's view is the body's own list: nothing to read on from


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
    assert views_resumed(proxy) == TURNS - 1


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
    assert views_resumed(proxy) == TURNS - 1


async def test_a_reused_summary_goes_upstream_spliced_into_the_clients_bytes(fake: FakeUpstream,
                                                                             make_proxy: ProxyFactory) -> None:
    """Past the threshold the first turn is summarised; the next ones reuse the summary, and what the upstream gets
    is made of the client's own bytes after the summary's cut: byte for byte the compact JSON of the client's object
    with the summary's messages and its kept ones in place of its history, every other field where it was."""
    window = 65_536
    model = WindowedModel(window=window)
    fake.chat_hook = model
    proxy = await make_proxy({**CONFIG, "models": {"default": {"context_window": window}}})

    def body(messages: list[dict[str, Any]]) -> dict[str, Any]:
        return {"model": "fake-model", "temperature": 0.5, "messages": messages, "user": "someone"}

    messages = history(0)
    async with aiohttp.ClientSession() as client:
        async def turn(messages: list[dict[str, Any]]) -> str:
            async with client.post(f"{proxy.url}/v1/chat/completions", data=orjson.dumps(body(messages)),
                                   headers={"Content-Type": "application/json"}) as answer:
                assert answer.status == 200, await answer.text()
                return answer.headers["x-compaction"]

        assert await turn(messages) == "proactive"
        compacted = fake.requests[-1].json()["messages"]
        kept = next(len(messages) - index for index in range(len(messages))
                    if compacted[len(compacted) - (len(messages) - index):] == messages[index:])
        replacement = compacted[:len(compacted) - kept]
        cut = len(messages) - kept
        for number in range(1, 3):
            messages = [*messages, {"role": "assistant", "content": f"answer {number}"},
                        {"role": "user", "content": f"question {number}: é, \"quoted\""}]
            assert await turn(messages) == "reused"
            assert fake.requests[-1].body == orjson.dumps(body([*replacement, *messages[cut:]]))
    assert len(model.summarizer_calls) == 1
    assert memo_reused(proxy) == 2
