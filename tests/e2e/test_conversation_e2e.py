"""A 60-turn stateless conversation through the proxy into a 4k-token window: it never fails, never repeats work."""

from __future__ import annotations

import json
import re
from typing import Any

import aiohttp
import pytest

from proxy.core.plan import check_tool_pairing
from tests.conftest import ProxyFactory
from tests.fakes.conversation import SYSTEM, run_script
from tests.fakes.openai_upstream import FakeUpstream
from tests.fakes.summariser_requests import summarised_text
from tests.fakes.windowed import WindowedModel
from tests.sdk import async_client

WINDOW = 4096
TURNS = 60


def config(**compaction: Any) -> dict[str, Any]:
    return {"models": {"default": {"context_window": WINDOW}},
            "compaction": {"threshold": 0.8, "target": 0.5, "tail_budget": 0.25, **compaction}}


async def compactions_by_trigger(proxy_url: str) -> dict[str, int]:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{proxy_url}/metrics") as response:
            text = await response.text()
    return {trigger: int(float(count)) for trigger, count in
            re.findall(r'compaction_proxy_compactions_total\{trigger="(\w+)"\} ([\d.]+)', text)}


def assert_every_request_valid(model: WindowedModel, history: list[dict[str, Any]]) -> None:
    client_messages = {json.dumps(m, sort_keys=True) for m in history}
    for received in model.chat_calls:
        messages = received.body["messages"]
        assert received.prompt_tokens <= WINDOW, "a request over the window reached the upstream"
        assert check_tool_pairing(messages) == []
        assert json.dumps(messages[0]) == json.dumps(SYSTEM)
        assert json.dumps(messages[-1], sort_keys=True) in client_messages
        assert messages[-1]["role"] in ("user", "tool")


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_sixty_turns_never_fail_and_never_resummarise(stream: bool, fake: FakeUpstream,
                                                            make_proxy: ProxyFactory) -> None:
    model = WindowedModel(window=WINDOW)
    fake.chat_hook = model
    proxy = await make_proxy(config())
    result = await run_script(async_client(proxy.url), TURNS, stream=stream)

    assert result.requests == len(model.chat_calls) > TURNS
    assert_every_request_valid(model, result.history)
    assert model.chat_calls[-1].body["messages"][-1] == result.history[-2]
    by_trigger = await compactions_by_trigger(proxy.url)
    events = sum(by_trigger.values())
    assert len(model.summarizer_calls) == events == EXPECTED_SUMMARIES[stream]
    assert "failed" not in result.headers and "reactive" not in result.headers
    assert result.headers.count("reused") > TURNS // 2
    prefixes = [summarised_text(c.body["messages"]) for c in model.summarizer_calls]
    assert len(set(prefixes)) == len(prefixes), "the same history was summarised twice"


# Each summary covers a new stretch of the conversation; the exact count follows from the script, the window
# (4096), threshold 0.8, target 0.5 and tail budget 0.25. A streaming client rebuilds tool-call messages from
# deltas with slightly different fields, so its history (and where the cuts fall) differs a little. The fake's
# summaries are short; the evidence (proxy.evidence) fills them up to the summary's allotment, one more cycle in 60.
# The summary's floor at 15 % of the window (614 tokens here, 409 at 10 %) leaves each compacted prompt longer and
# the tail shorter: two more cycles in 60.
EXPECTED_SUMMARIES = {False: 11, True: 11}


async def test_overflow_as_sse_error_after_200_is_compacted(fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    from tests.fakes.windowed import Overflow
    vllm_style = ('data: {"error": {"object": "error", "message": "The decoder prompt (length 9999) is longer '
                  'than the maximum model length of 4096.", "type": "BadRequestError", "param": null, '
                  '"code": 400}}\n\ndata: [DONE]\n\n')
    model = WindowedModel(window=WINDOW, overflow=Overflow(200, vllm_style, "text/event-stream"))
    fake.chat_hook = model
    proxy = await make_proxy(config(threshold=0))
    result = await run_script(async_client(proxy.url), 30, stream=True)
    assert "reactive" in result.headers and "failed" not in result.headers
    overflowed = [r for r in model.chat_calls if r.prompt_tokens > WINDOW]
    assert overflowed, "the script never reached the window"
    assert len(model.chat_calls) == result.requests + len(overflowed)
