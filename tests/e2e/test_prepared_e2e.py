"""Summaries prepared ahead (compaction.prepare_at): made in the background past the mark, kept aside until a request
passes the threshold, then spliced in without a wait; the on-path summary stays the fallback."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import openai
import pytest

from tests.conftest import ProxyFactory, RunningServer
from tests.e2e.test_compaction_e2e import SYSTEM, user_turn
from tests.fakes.agent import AgentModel, markers_seen, run_agent
from tests.fakes.openai_upstream import FakeUpstream
from tests.fakes.windowed import WindowedModel
from tests.sdk import async_client

SUMMARY_SECONDS = 1.0
# Turns of ~450 tokens: from the mark (0.6 of the window) to the threshold (0.8) is about 14 of them.
WINDOW = 32_768
AGENT_WINDOW = 16_000  # 60-word tool results: about 900 tokens a round, a summary every 30 to 40 rounds


def compaction_config(**compaction: Any) -> dict[str, Any]:
    return {"models": {"default": {"context_window": WINDOW}},
            "compaction": {"threshold": 0.8, "target": 0.5, "tail_budget": 0.25, **compaction}}


@pytest.fixture
def model(fake: FakeUpstream) -> WindowedModel:
    windowed = WindowedModel(window=WINDOW, summary_delay=SUMMARY_SECONDS)
    fake.chat_hook = windowed
    return windowed


async def turn(client: openai.AsyncOpenAI, history: list[dict[str, Any]]) -> tuple[str, float]:
    """One request for `history`, the answer appended; its x-compaction and its seconds."""
    started = time.monotonic()
    raw = await client.chat.completions.with_raw_response.create(model="fake-small", messages=history)
    history.append(raw.parse().choices[0].message.model_dump(exclude_none=True))
    return raw.headers["x-compaction"], time.monotonic() - started


async def until_prepared(client: openai.AsyncOpenAI, model: WindowedModel,
                         history: list[dict[str, Any]]) -> None:
    """Turns until the proxy asks for a summary (past the mark); none of them is compacted or waits for it."""
    for index in range(100):
        history.append(user_turn(index))
        outcome, _ = await turn(client, history)
        assert outcome == "none", "a request below the threshold is forwarded as it came"
        await asyncio.sleep(0.05)  # the background task is started after the answer
        if model.summarizer_calls:
            return
    raise AssertionError("usage never passed the mark")


async def counted(proxy_url: str, line: str) -> bool:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{proxy_url}/metrics") as response:
            return line in await response.text()


async def wait_for_metric(proxy_url: str, line: str) -> None:
    for _ in range(500):
        if await counted(proxy_url, line):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never counted: {line}")


PREPARED = 'compaction_proxy_compactions_total{trigger="prepared"} 1.0'


async def prepared_conversation(model: WindowedModel, make_proxy: ProxyFactory, *,
                                made: bool) -> tuple[RunningServer, openai.AsyncOpenAI, list[dict[str, Any]]]:
    """A proxy and a conversation driven past the mark: its summary asked for, and with `made`, made and stored."""
    proxy = await make_proxy(compaction_config())
    client = async_client(proxy.url)
    history: list[dict[str, Any]] = [SYSTEM]
    await until_prepared(client, model, history)
    if made:
        await wait_for_metric(proxy.url, PREPARED)
    return proxy, client, history


async def test_a_prepared_summary_is_spliced_at_the_threshold_without_a_wait(
        model: WindowedModel, make_proxy: ProxyFactory) -> None:
    proxy, client, history = await prepared_conversation(model, make_proxy, made=True)
    # Below the threshold the prepared summary stays aside: every request goes out as the client sent it.
    outcomes = []
    for index in range(100, 160):
        history.append(user_turn(index))
        outcome, seconds = await turn(client, history)
        outcomes.append((outcome, seconds))
        if outcome != "none":
            break
        assert model.chat_calls[-1].body["messages"] == history[:-1]
    outcome, seconds = outcomes[-1]
    assert outcome == "prepared" and seconds < SUMMARY_SECONDS, outcomes
    assert len(model.summarizer_calls) == 1
    forwarded = model.chat_calls[-1].body["messages"]
    assert len(forwarded) < len(history) - 1 and "FACT-0" in forwarded[1]["content"]
    # Later turns splice the same summary (stored where every request finds it), with no new summary.
    history.append(user_turn(200))
    assert (await turn(client, history))[0] == "reused"
    assert len(model.summarizer_calls) == 1
    assert await counted(proxy.url, 'compaction_proxy_reuse_lookups_total{result="prepared"} 1.0')


async def test_a_request_past_the_threshold_waits_only_for_what_is_left_of_it(
        model: WindowedModel, make_proxy: ProxyFactory) -> None:
    _, client, history = await prepared_conversation(model, make_proxy, made=False)
    asked = model.summarizer_calls[0].at
    for index in range(100, 160):  # far past the threshold at once, while the summary is being made
        history.append(user_turn(index))
    raw = await client.chat.completions.with_raw_response.create(model="fake-small", messages=history)
    assert raw.headers["x-compaction"] in ("prepared", "proactive")
    assert len(model.summarizer_calls) <= 2
    if raw.headers["x-compaction"] == "prepared":
        assert len(model.summarizer_calls) == 1
    assert model.chat_calls[-1].at - asked >= SUMMARY_SECONDS * 0.9, "it was spliced once made, not before"
    assert model.chat_calls[-1].prompt_tokens <= WINDOW


async def test_a_history_no_longer_starting_with_what_was_summarised_is_compacted_on_the_path(
        model: WindowedModel, make_proxy: ProxyFactory) -> None:
    proxy, client, history = await prepared_conversation(model, make_proxy, made=True)
    history[1] = {"role": "user", "content": "An edited first instruction, FACT-999."}  # the client rewrote it
    history += [user_turn(index) for index in range(100, 140)]  # and went past the threshold in one request
    outcome, _ = await turn(client, history)
    assert outcome == "proactive"
    assert await counted(proxy.url, 'compaction_proxy_compactions_total{trigger="proactive"} 1.0')
    assert "FACT-999" in model.chat_calls[-1].body["messages"][1]["content"]


async def test_concurrent_requests_past_the_threshold_share_one_prepared_summary(
        model: WindowedModel, make_proxy: ProxyFactory) -> None:
    _, client, history = await prepared_conversation(model, make_proxy, made=False)
    for index in range(100, 140):
        history.append(user_turn(index))
    started = time.monotonic()
    answers = await asyncio.gather(*(client.chat.completions.with_raw_response.create(
        model="fake-small", messages=history) for _ in range(4)))  # while the summary is still being made
    assert [raw.headers["x-compaction"] for raw in answers].count("prepared") >= 1
    assert {raw.headers["x-compaction"] for raw in answers} <= {"prepared", "reused"}
    assert len([call for call in model.summarizer_calls if call.at < started]) == 1
    spliced = {call.body["messages"][1]["content"] for call in model.chat_calls[-4:]}
    assert len(spliced) == 1 and "FACT-0" in spliced.pop(), "one summary, spliced into all four"


async def test_every_turn_past_the_mark_prepares_one_summary_only(model: WindowedModel,
                                                                  make_proxy: ProxyFactory) -> None:
    proxy, client, history = await prepared_conversation(model, make_proxy, made=False)
    for index in range(100, 104):  # more turns past the mark while it is made, then after it is stored
        history.append(user_turn(index))
        assert (await turn(client, history))[0] == "none"
        if index == 101:
            await wait_for_metric(proxy.url, PREPARED)
    await asyncio.sleep(0.2)
    assert len(model.summarizer_calls) == 1


async def test_an_agent_loop_with_clearing_on_has_every_summary_prepared(fake: FakeUpstream,
                                                                        make_proxy: ProxyFactory) -> None:
    """Old tool results cleared (stage 1, on by default) keep the threshold off for a few more turns each time; the
    summary is prepared past the mark all the same, so no compaction of the loop is made on a request's path, and
    none leaves a request past the window."""
    agent = AgentModel(window=AGENT_WINDOW, summary_delay=0.05)
    fake.chat_hook = agent
    proxy = await make_proxy({"models": {"default": {"context_window": AGENT_WINDOW}}})
    run = await run_agent(async_client(proxy.url), 150, words=60)
    outcomes = [headers["x-compaction"] for headers in run.headers]
    spliced = [outcome for outcome in outcomes if outcome not in ("none", "reused")]
    assert len(spliced) >= 3, outcomes
    assert set(spliced) == {"prepared"}, outcomes
    assert len(agent.summarizer_calls) <= len(spliced) + 1  # at most the one still prepared for the next
    assert all(received.prompt_tokens <= AGENT_WINDOW for received in agent.chat_calls)
    # Made turns before it is used, a summary may leave its request past the target, never past the threshold.
    for index, outcome in enumerate(outcomes):
        if outcome == "prepared":
            assert agent.chat_calls[index].prompt_tokens <= 0.8 * AGENT_WINDOW, index
    assert run.results <= markers_seen(agent.summarizer_calls) | markers_seen(agent.chat_calls)
