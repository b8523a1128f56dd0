"""The OpenAI Agents SDK (its default Responses model) runs an agent with a large-output tool for 30 rounds through
the proxy at a 4,000-token window: every round is answered (forwarded untouched, it dies near round 5)."""

from __future__ import annotations

import json

import pytest
from agents import Agent, OpenAIResponsesModel, RunConfig, Runner, function_tool, set_tracing_disabled

from tests.conftest import ProxyFactory
from tests.fakes.openai_upstream import FakeUpstream
from tests.fakes.responses_model import ResponsesModel
from tests.fakes.windowed import WindowedModel
from tests.sdk import async_client

WINDOW = 4000
ROUNDS = 30
INSTRUCTION = "Read the files one at a time and say what they define."


@function_tool
def read_file(path: str) -> str:
    """Read a file of the project."""
    return "\n".join(f"{path}:{line}: def handler_{line}(request): return respond(request, {line})"
                     for line in range(40))


@pytest.fixture
def model(fake: FakeUpstream) -> ResponsesModel:
    responses = ResponsesModel(window=WINDOW, parallel_calls=1, finish_after=ROUNDS)
    fake.responses_hook = responses
    fake.chat_hook = WindowedModel(window=32_768)  # the summariser's model, on chat completions
    return responses


async def test_an_agent_with_a_large_output_tool_runs_30_rounds_at_a_small_window(
        model: ResponsesModel, make_proxy: ProxyFactory) -> None:
    set_tracing_disabled(True)  # nothing leaves the machine
    proxy = await make_proxy({"models": {"default": {"context_window": WINDOW}}})
    agent = Agent(name="reader", instructions="You read code.", tools=[read_file],
                  model=OpenAIResponsesModel(model="fake-responses", openai_client=async_client(proxy.url)))
    result = await Runner.run(agent, INSTRUCTION, max_turns=ROUNDS + 5, run_config=RunConfig(tracing_disabled=True))
    assert result.final_output == f"Done after {ROUNDS} rounds."
    assert len(model.received) >= ROUNDS + 1 and max(model.prompts) <= WINDOW
    assert all(INSTRUCTION in json.dumps(body["input"]) for body in model.received)
    assert len(read_file_outputs(model)) >= ROUNDS  # every round's tool ran and its output reached the model


def read_file_outputs(model: ResponsesModel) -> set[str]:
    return {item["call_id"] for body in model.received for item in body["input"]
            if isinstance(item, dict) and item.get("type") == "function_call_output"}
