"""The Responses API in front of an upstream that speaks only chat completions (`dialects.responses.upstream_api:
chat`): the official SDK's agent loop runs against a chat model past its window, JSON and streamed."""

from __future__ import annotations

import json
import logging
from typing import Any

import openai
import pytest
from aiohttp import web
from multidict import CIMultiDict

from proxy.compaction.api_fallback import route_missing
from proxy.upstream.answer import Answer
from tests.conftest import ProxyFactory
from tests.fakes.agent import AgentModel
from tests.fakes.openai_upstream import FakeUpstream, error
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


async def test_auto_learns_a_chat_only_upstream_from_its_first_404(model: AgentModel, fake: FakeUpstream,
                                                                   make_proxy: ProxyFactory,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """The fake has no /v1/responses (404): the first request is answered through chat all the same, and from
    then on every request goes to chat directly; the upstream is asked /v1/responses once."""
    proxy = await make_proxy({"models": {"default": {"context_window": WINDOW}},
                              "dialects": {"responses": {"upstream_api": "auto"}}})
    with caplog.at_level(logging.WARNING, logger="proxy.pipeline"):
        outcomes = await run_agent(async_client(proxy.url), 6, stream=False)
    assert len(outcomes) == 6
    assert [request.path for request in fake.requests if request.method == "POST"].count("/v1/responses") == 1
    learned = [json.loads(r.getMessage()) for r in caplog.records if "upstream_api_learned" in r.getMessage()]
    assert [(event["upstream_api"], event["status"]) for event in learned] == [("chat", 404)]


async def test_auto_keeps_the_responses_api_when_only_the_model_is_missing(fake: FakeUpstream,
                                                                           make_proxy: ProxyFactory) -> None:
    async def no_such_model(request: web.Request) -> web.StreamResponse:
        return error(404, "The model `m` does not exist or you do not have access to it.", "model_not_found")

    fake.responses_hook = no_such_model
    proxy = await make_proxy({"dialects": {"responses": {"upstream_api": "auto"}}})
    client = async_client(proxy.url)
    for _ in range(2):
        with pytest.raises(openai.NotFoundError):
            await client.responses.create(model="m", input="hi")
    assert [request.path for request in fake.requests if request.method == "POST"] == ["/v1/responses"] * 2


@pytest.mark.parametrize(("status", "body", "missing"), [
    (404, b'{"error": {"message": "Unknown request URL: POST /v1/responses", "code": "unknown_url"}}', True),
    (404, b"404 page not found", True),
    (405, b"", True),
    (404, b'{"error": {"code": "model_not_found", "message": "The model does not exist"}}', False),
    (400, b'{"error": {"message": "bad"}}', False),
    (200, b"{}", False),
])
def test_what_counts_as_no_responses_route(status: int, body: bytes, missing: bool) -> None:
    assert route_missing(Answer(status, CIMultiDict(), body=body)) is missing
