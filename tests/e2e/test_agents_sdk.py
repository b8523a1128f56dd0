"""The OpenAI Agents SDK (its default Responses model) runs an agent with a large-output tool for 30 rounds through
the proxy at a 4,000-token window: every round is answered (forwarded untouched, it dies near round 5); its compaction
session has POST /responses/compact answered by the proxy for an upstream without it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import aiohttp
import pytest
from agents import (
    Agent,
    OpenAIResponsesCompactionSession,
    OpenAIResponsesModel,
    RunConfig,
    Runner,
    SQLiteSession,
    function_tool,
    set_tracing_disabled,
)

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


async def test_a_compaction_session_compacts_through_the_proxy_for_any_upstream(
        model: ResponsesModel, fake: FakeUpstream, make_proxy: ProxyFactory, tmp_path: Path) -> None:
    """The SDK's `OpenAIResponsesCompactionSession` calls `responses.compact` once a session holds 10 items and keeps
    only its output: the proxy answers it (the upstream has no such route), and opens the compaction item into the
    summary on every later run. Twelve runs of one large tool call each fit a 4,000-token window."""
    set_tracing_disabled(True)
    model.finish_after, model.parallel_calls, model.answer_results = None, 1, True
    proxy = await make_proxy({"models": {"default": {"context_window": WINDOW}}})
    client = async_client(proxy.url)
    agent = Agent(name="reader", instructions="You read code.", tools=[read_file],
                  model=OpenAIResponsesModel(model="fake-responses", openai_client=client))
    session = OpenAIResponsesCompactionSession("reader", SQLiteSession("reader", str(tmp_path / "session.db")),
                                               client=client, model="gpt-4.1", compaction_mode="input")
    finals = []
    for run in range(12):
        result = await Runner.run(agent, f"Read file {run} and say what it defines.", session=session,
                                  max_turns=4, run_config=RunConfig(tracing_disabled=True))
        finals.append(result.final_output)
    assert all(str(final).startswith("Done after") for final in finals)
    held = await session.get_items()
    assert [item for item in held if item.get("type") == "compaction"], held  # the session keeps the proxy's item
    assert not [request for request in fake.requests if request.path == "/v1/responses/compact"]
    assert not [item for body in model.received for item in body["input"]
                if isinstance(item, dict) and item.get("type") == "compaction"]
    assert any("recording facts" in json.dumps(body["input"]) for body in model.received)  # the summary, opened
    assert max(model.prompts) <= WINDOW
    async with aiohttp.ClientSession() as http, http.get(f"{proxy.url}/metrics") as response:
        requested = re.search(r'compactions_total\{trigger="requested"\} (\d+)', await response.text())
    assert requested is not None and int(requested.group(1)) >= 2  # the session compacted more than once
