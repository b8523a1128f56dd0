"""A summary that cannot be made is not attempted on every turn: back off, then retry with a smaller ask."""

from __future__ import annotations

import json
import logging

import pytest

from tests.conftest import ProxyFactory
from tests.fakes.conversation import run_script
from tests.fakes.openai_upstream import FakeUpstream
from tests.fakes.windowed import WindowedModel
from tests.sdk import async_client

WINDOW = 8192


@pytest.fixture
def model(fake: FakeUpstream) -> WindowedModel:
    windowed = WindowedModel(window=WINDOW)
    fake.chat_hook = windowed
    return windowed


async def test_cut_off_summaries_back_off_and_retry_smaller(model: WindowedModel, make_proxy: ProxyFactory,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    # Asks above 300 tokens ramble past their limit; the proxy's first ask is larger than that.
    model.summary_cut_above = 300
    proxy = await make_proxy({"models": {"default": {"context_window": WINDOW}},
                              "compaction": {"background": False, "tail_budget": 0.05, "threshold": 0.6, "target": 0.4,
                                             "summarizer": {"max_output_tokens": 1200}}})
    with caplog.at_level(logging.INFO, logger="proxy.compaction"):
        result = await run_script(async_client(proxy.url), 24, max_tokens=200)
    asks = [call.body["max_tokens"] for call in model.summarizer_calls]
    events = [json.loads(r.getMessage()) for r in caplog.records
              if r.name == "proxy.compaction" and r.getMessage().startswith("{")]
    failed = [e for e in events if e["event"] == "compaction_failed"]
    skipped = [e for e in events if e["event"] == "compaction_skipped"]
    # The first ask is cut off; later asks shrink until one fits; turns in between are not spent on summaries.
    assert failed and failed[0]["error"] == "SummaryTruncated"
    assert asks[0] > 300 and asks[-1] <= 300 and asks == sorted(asks, reverse=True)
    assert skipped and all(e["reason"] == "backoff" for e in skipped)
    assert any(e["event"] == "compaction" for e in events), "the smaller ask never succeeded"
    over_threshold = [h for h in result.headers if h != "none"]
    assert len(model.summarizer_calls) < len(over_threshold)
    # Every turn was still answered: a failed summary returns the request as it was, which still fit.
    assert result.requests == len(model.chat_calls)
