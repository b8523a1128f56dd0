"""The Responses API in front of an upstream that speaks only chat completions (`dialects.responses.upstream_api:
chat`): the official SDK's agent loop runs against a chat model past its window, JSON and streamed."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from tests.conftest import ProxyFactory
from tests.fakes.agent import AgentModel
from tests.fakes.openai_upstream import FakeUpstream
from tests.fakes.responses_agent import INSTRUCTION, run_agent
from tests.sdk import async_client

WINDOW = 6000
ROUNDS = 40


@pytest.fixture
def model(fake: FakeUpstream) -> AgentModel:
    agent = AgentModel(window=WINDOW)
    fake.chat_hook = agent  # answers the agent's turns with two tool calls, and the summariser's requests
    return agent


def chat_problems(body: dict[str, Any]) -> list[str]:
    """What a chat server would refuse: a tool result that answers no call of the assistant message before it."""
    problems, open_calls = [], set()
    for message in body["messages"]:
        if message["role"] == "assistant":
            open_calls = {call["id"] for call in message.get("tool_calls") or []}
        elif message["role"] == "tool" and message["tool_call_id"] not in open_calls:
            problems.append(f"tool result {message['tool_call_id']} answers no call")
        elif message["role"] not in ("system", "user", "tool"):
            problems.append(f"role {message['role']}")
    return problems


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_responses_agent_runs_on_a_chat_only_upstream(stream: bool, model: AgentModel, fake: FakeUpstream,
                                                              make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy({"models": {"default": {"context_window": WINDOW}},
                              "dialects": {"responses": {"upstream_api": "chat"}}})
    outcomes = await run_agent(async_client(proxy.url), ROUNDS, stream=stream)
    assert len(outcomes) == ROUNDS and "failed" not in outcomes and "reused" in outcomes
    assert not [request for request in fake.requests if request.path == "/v1/responses"]
    agent_turns = [call.body for call in model.chat_calls]
    assert len(agent_turns) >= ROUNDS and max(call.prompt_tokens for call in model.chat_calls) <= WINDOW
    assert [problem for body in agent_turns for problem in chat_problems(body)] == []
    assert all({"role": "user", "content": INSTRUCTION} in body["messages"] for body in agent_turns)
    assert all(body.get("stream_options") == {"include_usage": True} for body in agent_turns if body.get("stream"))
    assert model.summarizer_calls


async def test_a_history_kept_upstream_is_refused_with_a_reason(model: AgentModel, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy({"dialects": {"responses": {"upstream_api": "chat"}}})
    with pytest.raises(openai.BadRequestError) as refused:
        await async_client(proxy.url).responses.create(model="m", input="hi", previous_response_id="resp_1")
    assert refused.value.status_code == 400 and "previous_response_id" in json.dumps(refused.value.body)
    assert model.received == []
