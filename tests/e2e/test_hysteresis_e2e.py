"""A summary that lasts: after a compaction the next request, one turn longer, fits the target with its reserve."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from tests.conftest import ProxyFactory
from tests.fakes.conversation import run_script
from tests.fakes.openai_upstream import FakeUpstream
from tests.fakes.windowed import TOKENIZER_RATIO, WindowedModel
from tests.sdk import async_client

WINDOW = 3000
TURNS = 40


@pytest.fixture
def model(fake: FakeUpstream) -> WindowedModel:
    windowed = WindowedModel(window=WINDOW)
    fake.chat_hook = windowed
    return windowed


def compaction_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [json.loads(r.getMessage()) for r in caplog.records
            if r.name == "proxy.compaction" and r.getMessage().startswith('{"')
            and json.loads(r.getMessage()).get("event") == "compaction"]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_forty_turns_at_a_3000_token_window_with_the_default_reserve(
        stream: bool, model: WindowedModel, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy({"models": {"default": {"context_window": WINDOW}}})
    result = await run_script(async_client(proxy.url), TURNS, stream=stream)
    assert "failed" not in result.headers
    assert all(r.prompt_tokens + 1024 <= WINDOW for r in model.chat_calls)
    # At most one summary per two turns (the landed code needed 39 for 40 turns).
    assert 1 <= len(model.summarizer_calls) <= TURNS // 2


async def test_after_every_compaction_the_next_request_fits_the_target(
        model: WindowedModel, make_proxy: ProxyFactory, caplog: pytest.LogCaptureFixture) -> None:
    """With a reserve the target can hold, every summary is planned so the request that uses it, and the one
    after it, fit target x window including the reserve. (A summary prepared ahead is planned for the growth
    predicted turns before it is used: see the next test.)"""
    reserve = 256
    proxy = await make_proxy({"models": {"default": {"context_window": WINDOW}},
                              "compaction": {"prepare_at": None}})
    with caplog.at_level(logging.INFO, logger="proxy.compaction"):
        result = await run_script(async_client(proxy.url), TURNS, max_tokens=reserve)
    lines = compaction_lines(caplog)
    assert len(lines) >= 3 and all(line["attainable"] for line in lines)
    # The upstream counts 1.15x the proxy's own estimate; the proxy calibrates to it from reported usage.
    assert TOKENIZER_RATIO > 1 and result.requests == len(model.chat_calls)
    target = 0.5 * WINDOW
    summaries = [summary_of(call.body["messages"]) for call in model.chat_calls]
    checked = 0
    for index, summary in enumerate(summaries):
        if summary is None or (index and summaries[index - 1] == summary):
            continue
        # A new summary is in use from this request on. A background summary was planned for exactly this
        # request (one turn after the one it was built from); one made on the spot must also hold the next.
        last = index + (2 if result.headers[index] in ("proactive", "reactive") else 1)
        for following in range(index, min(last, len(summaries))):
            if summaries[following] == summary:
                prompt = model.chat_calls[following].prompt_tokens
                assert prompt + reserve <= target, (index, following, prompt)
                checked += 1
    assert checked >= len(lines)


async def test_a_prepared_summary_leaves_the_request_that_uses_it_under_the_threshold(
        model: WindowedModel, make_proxy: ProxyFactory) -> None:
    """Planned turns before it is used, for the growth predicted then, a prepared summary may leave the request
    that splices it in a little past the target; never past the threshold, so it is not compacted again at once."""
    reserve = 256
    proxy = await make_proxy({"models": {"default": {"context_window": WINDOW}}})
    result = await run_script(async_client(proxy.url), TURNS, max_tokens=reserve)
    prepared = [index for index, outcome in enumerate(result.headers) if outcome == "prepared"]
    assert prepared and "failed" not in result.headers
    for index in prepared:
        assert model.chat_calls[index].prompt_tokens + reserve <= 0.8 * WINDOW
        assert index + 1 == len(result.headers) or result.headers[index + 1] == "reused"
    assert len(model.summarizer_calls) <= TURNS // 4


def summary_of(messages: list[dict[str, Any]]) -> str | None:
    content = str(messages[1].get("content")) if len(messages) > 1 else ""
    return content if content.startswith("# Conversation Summary") else None


async def test_a_compaction_that_cannot_reach_its_target_says_why(
        model: WindowedModel, make_proxy: ProxyFactory, caplog: pytest.LogCaptureFixture) -> None:
    """With the default 1,024-token reserve a 3,000-token window's target cannot hold the verbatim part and the
    summary: the log line says so in words, not just `"attainable": false`."""
    proxy = await make_proxy({"models": {"default": {"context_window": WINDOW}}})
    with caplog.at_level(logging.INFO, logger="proxy.compaction"):
        await run_script(async_client(proxy.url), 12)
    lines = compaction_lines(caplog)
    short = [line for line in lines if not line["attainable"]]
    assert short, lines
    assert all("past the goal of" in line["not_attainable_because"] or "alone fill the target" in
               line["not_attainable_because"] for line in short)
    assert all("not_attainable_because" not in line for line in lines if line["attainable"])
