"""The small tools before the sledgehammer, through the proxy: an agent's old tool results cleared in what is
forwarded (stage 1) keep a long tool loop under the threshold with far fewer whole-history summaries, the cut moves
in steps so consecutive requests share their prefix, and what was done is told in headers and metrics."""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

import aiohttp
import pytest

from tests.conftest import ProxyFactory
from tests.fakes.agent import TOOLS, AgentModel, run_agent
from tests.fakes.openai_upstream import FakeUpstream
from tests.sdk import async_client

WINDOW = 16_000
ROUNDS = 60
WORDS = 40  # two results of ~280 tokens a round: over two windows of history by the end


def config(clear: bool, *, ahead: bool = True, **rule: Any) -> dict[str, Any]:
    """`ahead` off: summaries on the path only (compaction.prepare_at null)."""
    return {"models": {"default": {"context_window": WINDOW}},
            "compaction": {**({} if ahead else {"prepare_at": None}),
                           "tool_results": {"clear": {"enabled": clear, "clear_at_least": 500, **rule},
                                            "summarize_pairs": {"enabled": False}}}}


@pytest.fixture
def model(fake: FakeUpstream) -> AgentModel:
    agent = AgentModel(window=WINDOW)
    fake.chat_hook = agent
    return agent


def shared_prefix(first: list[Any], second: list[Any]) -> int:
    """How many leading messages two requests share byte for byte."""
    same = 0
    for one, other in zip(first, second, strict=False):
        if json.dumps(one) != json.dumps(other):
            break
        same += 1
    return same


def prefix_kept(bodies: list[list[Any]]) -> float:
    """The mean share of each request's bytes that the next request starts with (a proxy for prompt-cache hits)."""
    shares = []
    for before, after in itertools.pairwise(bodies):
        kept = shared_prefix(before, after)
        shares.append(len(json.dumps(before[:kept])) / len(json.dumps(before)))
    return sum(shares) / len(shares)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_clearing_keeps_a_long_loop_going_with_fewer_summaries(stream: bool, model: AgentModel,
                                                                     fake: FakeUpstream,
                                                                     make_proxy: ProxyFactory) -> None:
    # Summaries counted are those made on the path: one prepared ahead for a threshold the run never reaches would
    # count as made (an agent loop's prepared summaries: test_prepared_e2e).
    proxy = await make_proxy(config(True, ahead=False))
    run = await run_agent(async_client(proxy.url), ROUNDS, stream=stream, words=WORDS)
    cleared = [int(headers["x-compaction-cleared"]) for headers in run.headers if "x-compaction-cleared" in headers]
    # Each clearing clears all but the last 8 results at once; the cut then stays until the prompt is back at the
    # trigger: it moves on few turns.
    # (a whole-history summary, if one comes, starts the count again)
    assert len(cleared) > ROUNDS // 2
    moves = sum(before != after for before, after in itertools.pairwise(cleared))
    assert moves <= len(cleared) // 4, cleared
    assert all(int(headers["x-compaction-cleared-tokens"]) > 0 for headers in run.headers
               if "x-compaction-cleared" in headers)
    turns = list(model.chat_calls)
    assert max(call.prompt_tokens for call in turns) <= WINDOW
    assert all(call.body["messages"][1]["role"] == "user" for call in turns)  # the instruction survives
    with_clearing, kept_with = len(model.summarizer_calls), prefix_kept([call.body["messages"] for call in turns])
    async with aiohttp.ClientSession() as session, session.get(f"{proxy.url}/metrics") as response:
        text = await response.text()
    assert 'compaction_proxy_tool_result_tokens_freed_total{stage="cleared"}' in text

    model.received.clear()
    plain = await make_proxy(config(False, ahead=False))
    await run_agent(async_client(plain.url), ROUNDS, stream=stream, words=WORDS)
    without_clearing = len(model.summarizer_calls)
    kept_without = prefix_kept([call.body["messages"] for call in model.chat_calls])
    assert without_clearing >= 3 * max(with_clearing, 1), (with_clearing, without_clearing)
    # A moved cut keeps everything up to the first result it newly clears, a summary only the instructions; but with
    # results this small a cut moves more often than a summary comes: the two come out about even (on a coding
    # agent's results, clearing keeps more: the figures of bench/agents.py).
    assert kept_with > kept_without - 0.05, (kept_with, kept_without)


async def test_the_latest_results_and_excluded_tools_are_never_cleared(model: AgentModel,
                                                                       make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(config(True, keep=6, exclude_tools=["run_tests"], trigger=0.3))
    run = await run_agent(async_client(proxy.url), ROUNDS, words=WORDS)
    assert any("x-compaction-cleared" in headers for headers in run.headers)
    for call in model.chat_calls:
        messages = call.body["messages"]
        names = {tool["id"]: tool["function"]["name"] for message in messages for tool in message.get("tool_calls")
                 or ()}
        results = [message for message in messages if message["role"] == "tool"]
        assert not any(message["content"].startswith("[tool result cleared") for message in results[-6:])
        assert not any(message["content"].startswith("[tool result cleared") for message in results
                       if names.get(message["tool_call_id"]) == "run_tests")


async def test_with_clearing_off_nothing_is_cleared(model: AgentModel, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(config(False))
    run = await run_agent(async_client(proxy.url), 30, words=WORDS)
    assert not any("x-compaction-cleared" in headers for headers in run.headers)
    assert not any("[tool result cleared" in json.dumps(call.body) for call in model.chat_calls)


async def test_a_model_of_its_own_sets_its_own_stages(model: AgentModel, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy({**config(True), "models": {
        "default": {"context_window": WINDOW}, "agent": {"context_window": WINDOW, "tool_results": {
            "clear": {"enabled": False}}}}})
    await run_agent(async_client(proxy.url), 30, words=WORDS)  # the agent's model is named "agent"
    assert not any("[tool result cleared" in json.dumps(call.body) for call in model.chat_calls)


def pairs_config(**pairs: Any) -> dict[str, Any]:
    return {"models": {"default": {"context_window": WINDOW}},
            "compaction": {"tool_results": {"clear": {"enabled": False},
                                            "summarize_pairs": {"enabled": True, "keep_recent": 2, "cutoff": 0.05,
                                                                **pairs}}}}


async def settle(proxy_url: str) -> None:
    """Let the background batches the last answer started finish (they run off the request path)."""
    await asyncio.sleep(0.3)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_old_rounds_go_as_their_summaries_once_made(stream: bool, model: AgentModel,
                                                          make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(pairs_config())
    client = async_client(proxy.url)
    history = (await run_agent(client, 12, stream=stream, words=WORDS)).history
    await settle(proxy.url)
    assert model.pair_calls, "no tool round was summarised"
    sent = len(model.chat_calls)
    raw = await client.chat.completions.with_raw_response.create(model="agent", messages=history, tools=TOOLS)
    swapped = int(raw.headers["x-compaction-pair-summaries"])
    body = model.chat_calls[sent].body
    summaries = [message for message in body["messages"] if message["role"] == "tool"
                 and message["content"].startswith("[Summary of this round's tool results")]
    assert swapped >= 1 and len(summaries) == swapped
    # Every call still answered by its own result, in order; the latest rounds whole.
    results = [message for message in body["messages"] if message["role"] == "tool"]
    assert [message["tool_call_id"] for message in results] == [
        message["tool_call_id"] for message in history if message["role"] == "tool"]
    assert all(message["content"].startswith("RESULT-") for message in results[-4:])
    # A summary keeps what the round was about: its markers.
    assert all("RESULT-" in message["content"] for message in summaries)
    async with aiohttp.ClientSession() as session, session.get(f"{proxy.url}/metrics") as response:
        text = await response.text()
    assert 'compaction_proxy_pair_summaries_total{outcome="applied"}' in text


async def test_a_round_changed_by_one_byte_goes_whole(model: AgentModel, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(pairs_config())
    client = async_client(proxy.url)
    history = (await run_agent(client, 12, words=WORDS)).history
    await settle(proxy.url)
    first = next(index for index, message in enumerate(history) if message["role"] == "tool")
    changed = [*history[:first], {**history[first], "content": history[first]["content"] + "."}, *history[first + 1:]]
    sent = len(model.chat_calls)
    await client.chat.completions.create(model="agent", messages=changed, tools=TOOLS)
    forwarded = next(message for message in model.chat_calls[sent].body["messages"]
                     if message.get("tool_call_id") == history[first]["tool_call_id"])
    assert forwarded["content"] == changed[first]["content"]  # whole, byte for byte
    async with aiohttp.ClientSession() as session, session.get(f"{proxy.url}/metrics") as response:
        text = await response.text()
    assert 'compaction_proxy_pair_summaries_total{outcome="mismatch"}' in text


async def test_with_pair_summaries_off_no_round_is_summarised(model: AgentModel, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(pairs_config(enabled=False))
    await run_agent(async_client(proxy.url), 12, words=WORDS)
    await settle(proxy.url)
    assert model.pair_calls == []


def kind(message: dict[str, Any]) -> str:
    content = message["content"]
    return "placeholder" if content.startswith("[tool result cleared") else \
        "summary" if content.startswith("[Summary of this round") else "pointer" if content.startswith("[") else "whole"


async def test_with_both_stages_a_summary_stands_in_for_a_placeholder_and_the_prefix_moves_only_with_the_cut(
        model: AgentModel, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy({"models": {"default": {"context_window": WINDOW}},
                              "compaction": {"tool_results": {"clear": {"enabled": True},
                                                              "summarize_pairs": {"enabled": True, "cutoff": 0.05}}}})
    run = await run_agent(async_client(proxy.url), ROUNDS, words=WORDS)
    assert any("x-compaction-pair-summaries" in headers for headers in run.headers), "no summary was used"
    bodies = [call.body["messages"] for call in model.chat_calls]
    for messages in bodies:
        kinds = [kind(message) for message in messages if message["role"] == "tool"]
        # Summaries and placeholders only where the clearing reached: before every result still whole.
        first_whole = kinds.index("whole") if "whole" in kinds else len(kinds)
        assert set(kinds[first_whole:]) <= {"whole"}, kinds
    def reached(messages: list[Any]) -> set[str]:
        return {message["tool_call_id"] for message in messages if message["role"] == "tool"
                and kind(message) != "whole"}

    moved = same = 0
    for index in range(1, len(bodies)):
        now, then = run.headers[index], run.headers[index - 1]
        if now.get("x-compaction") in ("proactive", "reactive"):
            continue
        if reached(bodies[index]) != reached(bodies[index - 1]):
            moved += 1
        elif now.get("x-compaction-pair-summaries") == then.get("x-compaction-pair-summaries"):
            # The cut did not move and no summary came in (one made in the background while the cut passed its
            # round may): the request only appends.
            assert bodies[index][:len(bodies[index - 1])] == bodies[index - 1]
            same += 1
    assert moved >= 2 and same > 3 * moved, (moved, same)
