"""Decisions that stay decided, through the proxy and through `proxy.summarize` alike: a summariser that names a
replaced value as current and drops the user's fact-carrying turn is corrected the same way on both paths."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from aiohttp import web

import proxy
from proxy.summarizer.summarizer import Summary
from tests.conftest import ProxyFactory
from tests.fakes.openai_upstream import FakeUpstream
from tests.fakes.summariser_requests import is_summarizer_request
from tests.fakes.windowed import WindowedModel
from tests.sdk import async_client

WINDOW = 2600
KEY = "sk-current-state"
OLD, NEW = "snapfmt_old_1", "snapfmt_new_2"
FACTS = "The ledger team: Dana Reyes reviews ledger-sync, Dan Reyes writes ledger-sink; port 40213."
OVERRIDE = f"One change: use {NEW} instead of {OLD} for the snapshots."
# What a careless small model writes: the rejected format as the current one, the user's facts left out.
REPLY = json.dumps({"decisions": [{"topic": "snapshot format", "current": OLD}],
                    "user_intent": [f"Write the ledger snapshots in {OLD}", "Fix the reconcile tests"],
                    "current_work": f"Converting the snapshots to {OLD}. The reconcile tests pass.",
                    "next_step": f"Write the next snapshot in {OLD}."})


class CarelessSummariser(WindowedModel):
    """Answers every summary request with REPLY; chat turns as the windowed model does."""

    async def __call__(self, request: web.Request, body: dict[str, Any],
                       state: FakeUpstream) -> web.StreamResponse:
        if is_summarizer_request(body.get("messages") or []):
            message = {"role": "assistant", "content": f"```json\n{REPLY}\n```"}
            return web.json_response({"id": "cmpl", "object": "chat.completion", "model": body["model"],
                                      "choices": [{"index": 0, "finish_reason": "stop", "message": message}],
                                      "usage": {"prompt_tokens": 100, "completion_tokens": 60, "total_tokens": 160}})
        return await super().__call__(request, body, state)


class DirectModel:
    """A ChatModel for `proxy.summarize` that is answered exactly as the proxy's summariser is."""

    async def complete(self, system: str | None, messages: list[dict[str, Any]],
                       tools: Any = None) -> tuple[dict[str, Any], dict[str, Any]]:
        return {"role": "assistant", "content": f"```json\n{REPLY}\n```"}, {"prompt_tokens": 100,
                                                                             "completion_tokens": 60}


def history() -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You fix the ledger service."},
                                      {"role": "user", "content": "Fix the reconcile tests."},
                                      {"role": "assistant", "content": "Looking at the tests."},
                                      {"role": "user", "content": FACTS},
                                      {"role": "assistant", "content": "Noted the team and the port."},
                                      {"role": "user", "content": OVERRIDE},
                                      {"role": "assistant", "content": f"Switching the snapshots to {NEW}."}]
    for turn in range(6):
        messages += [{"role": "user", "content": "Next check: " + "shard ok " * (80 + turn)},
                     {"role": "assistant", "content": "Done. " + "all green " * 40}]
    return [*messages, {"role": "user", "content": "What next?"}]


@pytest.fixture
def careless(fake: FakeUpstream) -> CarelessSummariser:
    model = CarelessSummariser(window=WINDOW)
    fake.chat_hook = model
    return model


async def journaled_summary(url: str, event_id: str) -> str:
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {KEY}"}) as session:
        for _ in range(100):
            async with session.get(f"{url}/_proxy/api/events/{event_id}") as response:
                if response.status == 200:
                    return str((await response.json())["summary"])
            await asyncio.sleep(0.02)
    raise AssertionError("the summary never reached the journal")


def assert_current(summary: str) -> None:
    current = summary.split("## User Messages")[0]
    # The rejected format appears only where it is marked replaced; the current one is named.
    assert f"snapshot format: {NEW} (replaced, no longer current: {OLD})" in current
    assert current.count(OLD) == 1 and "## Current Work" in summary and "Next Step" not in summary
    assert "The reconcile tests pass." in summary
    assert FACTS in summary and OVERRIDE in summary  # the user's fact-carrying turns, verbatim


async def test_the_proxy_and_the_library_correct_a_careless_summary_the_same_way(
        careless: CarelessSummariser, make_proxy: ProxyFactory) -> None:
    served = await make_proxy({"models": {"default": {"context_window": WINDOW}}})
    client = async_client(served.url, api_key=KEY)
    raw = await client.chat.completions.with_raw_response.create(model="fake-small", messages=history())
    await client.close()
    assert raw.headers["x-compaction"] in ("proactive", "reactive")
    by_proxy = await journaled_summary(served.url, raw.headers["x-compaction-id"])
    assert_current(by_proxy)
    span = history()[1:-1]  # what the proxy summarised: all but the instructions and the latest turn
    by_library: Summary = await proxy.summarize(DirectModel(), span)
    assert_current(by_library.text)
    assert {correction.rule for correction in by_library.corrections} == {"decision_current", "replaced_value"}
    # The same checks gave the same current state; the evidence added differs only by the room each path gives it
    # (the proxy's plan budgets it, the library takes DEFAULT_EVIDENCE_ROOM).
    for heading in ("## Current Decisions", "## User Intent", "## Current Work"):
        assert section(by_library.text, heading) == section(by_proxy, heading), heading


def section(text: str, heading: str) -> str:
    return text.split(heading, 1)[1].split("\n## ", 1)[0].strip()


class WordySummariser(WindowedModel):
    """Answers every summary request with far more than it was asked for."""

    async def __call__(self, request: web.Request, body: dict[str, Any],
                       state: FakeUpstream) -> web.StreamResponse:
        if is_summarizer_request(body.get("messages") or []):
            details = " ".join(f"detail{n}" for n in range(500))
            wordy = json.dumps({"user_intent": [f"fix the ledger, keeping {details}"]})
            message = {"role": "assistant", "content": f"```json\n{wordy}\n```"}
            return web.json_response({"id": "cmpl", "object": "chat.completion", "model": body["model"],
                                      "choices": [{"index": 0, "finish_reason": "stop", "message": message}],
                                      "usage": {"prompt_tokens": 100, "completion_tokens": 900, "total_tokens": 1000}})
        return await super().__call__(request, body, state)


async def test_a_summary_longer_than_what_it_replaces_is_not_applied(fake: FakeUpstream,
                                                                     make_proxy: ProxyFactory) -> None:
    wordy = WordySummariser(window=8192)
    fake.chat_hook = wordy
    served = await make_proxy({"models": {"default": {"context_window": 8192}}, "compaction": {"background": False}})
    early = [{"role": "user" if n % 2 == 0 else "assistant", "content": f"Early note {n}: " + "fine " * 60}
             for n in range(6)]
    history = [{"role": "system", "content": "You fix the ledger."}, *early,
               {"role": "user", "content": "Now read this log: " + "line ok " * 2700}]
    client = async_client(served.url, api_key=KEY)
    raw = await client.chat.completions.with_raw_response.create(model="fake-small", messages=history)
    await client.close()
    # The summary came back longer than the six early messages: they are sent as they were, and the client is told.
    assert raw.headers["x-compaction"] == "failed"
    assert wordy.chat_calls[-1].body["messages"] == history
