"""Agents in long tool loops through the proxy: one instruction, then rounds of parallel tool calls, small window."""

from __future__ import annotations

import itertools
import json
import logging

import pytest

from proxy.core.plan import check_tool_pairing
from tests.conftest import ProxyFactory
from tests.fakes.agent import INSTRUCTION, SYSTEM, AgentModel, markers_seen, run_agent
from tests.fakes.openai_upstream import FakeUpstream
from tests.sdk import async_client

WINDOW = 4000
ROUNDS = 60


def agent_config(**compaction: object) -> dict[str, object]:
    return {"models": {"default": {"context_window": WINDOW}}, "compaction": compaction}


@pytest.fixture
def model(fake: FakeUpstream) -> AgentModel:
    agent = AgentModel(window=WINDOW)
    fake.chat_hook = agent
    return agent


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_sixty_tool_rounds_at_a_small_window(stream: bool, model: AgentModel,
                                                   make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(agent_config())
    run = await run_agent(async_client(proxy.url), ROUNDS, stream=stream)
    # Every round answered (run_agent asserts a tool call came back each time) and none failed.
    assert len(run.headers) == ROUNDS + 1
    assert not [h for h in run.headers if h["x-compaction"] == "failed"]
    chats = model.chat_calls
    assert len(chats) == ROUNDS + 1, "a request was sent twice or a summary call was taken for a chat"
    for received in chats:
        messages = received.body["messages"]
        assert received.prompt_tokens <= WINDOW
        assert check_tool_pairing(messages) == []
        assert messages[0] == SYSTEM
        assert INSTRUCTION in messages, "the user's instruction was summarised away"
        roles = [m["role"] for m in messages]
        assert ("user", "user") not in itertools.pairwise(roles)
        assert messages[-1]["role"] == ("user" if len(messages) == 2 else "tool")
    compacted = sum(1 for h in run.headers if h["x-compaction"] != "none")
    assert compacted > ROUNDS // 2, "the proxy did not compact the loop"
    # About one summary per four rounds or fewer, and no tool result lost: each reached a summariser or is in
    # the request as sent.
    assert 1 <= len(model.summarizer_calls) <= ROUNDS // 4
    assert run.results <= markers_seen(model.summarizer_calls) | markers_seen(chats)


async def test_the_latest_tool_round_is_always_verbatim(model: AgentModel, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(agent_config())
    run = await run_agent(async_client(proxy.url), 20)
    assert any(h["x-compaction"] != "none" for h in run.headers)
    for index, received in enumerate(model.chat_calls[1:], start=1):
        sent = received.body["messages"]
        client_copy = run.history[: 2 + 3 * index]
        # The last three messages the client sent (the call and its two parallel results) are in the request.
        assert sent[-3:] == client_copy[-3:]


async def test_a_stored_summary_ending_mid_loop_is_reused(model: AgentModel, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(agent_config())
    run = await run_agent(async_client(proxy.url), 24)
    kinds = [h["x-compaction"] for h in run.headers]
    assert "reused" in kinds
    first_reuse = kinds.index("reused")
    # The summary it reuses was stored for a prefix that ends in the middle of the loop.
    sent = model.chat_calls[first_reuse].body["messages"]
    summary_at = next(i for i, m in enumerate(sent) if m["role"] == "user" and m is not sent[-1]
                      and "Conversation Summary" in str(m.get("content")))
    assert sent[summary_at + 1]["role"] == "assistant" and sent[summary_at + 2] == INSTRUCTION
    assert sent[summary_at + 3].get("tool_calls")


async def test_a_tool_result_larger_than_the_window_is_elided_visibly(model: AgentModel,
                                                                       make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(agent_config())
    run = await run_agent(async_client(proxy.url), 3, huge_round=2, huge_words=3000)
    last = model.chat_calls[-1].body["messages"]
    assert run.headers[-1]["x-compaction"] in ("proactive", "reactive")
    assert run.headers[-1]["x-compaction-elided"] == "1"
    huge = next(m for m in last if m["role"] == "tool" and m["content"].startswith("RESULT-2-0"))
    assert "left out here by the proxy" in huge["content"]
    assert huge["content"].endswith(run.history[-3]["content"][-40:])
    assert model.chat_calls[-1].prompt_tokens <= WINDOW
    # The client's own copy is untouched.
    assert "left out" not in json.dumps(run.history)


async def test_nothing_to_gain_means_no_summariser_call(model: AgentModel, make_proxy: ProxyFactory,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    """One round whose own results fill the window: a summary cannot make it smaller, so none is asked for."""
    model.always_answer = None
    proxy = await make_proxy(agent_config(threshold=0.3, target=0.2))
    with caplog.at_level(logging.INFO, logger="proxy.compaction"):
        run = await run_agent(async_client(proxy.url), 1, words=400)
    assert model.summarizer_calls == []
    assert run.headers[-1]["x-compaction-reason"] == "not_smaller"
