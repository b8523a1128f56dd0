"""Metrics count what really happened: failed summaries keep their cost, upstream failures are counted."""

from __future__ import annotations

import re

import aiohttp
import openai
import pytest

from tests.conftest import ProxyFactory
from tests.e2e.test_compaction_e2e import big_history, compaction_config
from tests.fakes.openai_upstream import FakeUpstream
from tests.fakes.windowed import WindowedModel
from tests.sdk import async_client


async def scrape(url: str) -> dict[str, float]:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/metrics") as response:
        text = await response.text()
    return {name: float(value) for name, value in re.findall(r"^(compaction_proxy_\S+) ([\d.e+]+)$", text, re.M)}


async def test_a_failed_summary_keeps_its_calls_and_tokens(fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    model = WindowedModel(window=8192, summary_cut_above=0)  # every summary is cut off by its limit
    fake.chat_hook = model
    proxy = await make_proxy(compaction_config(threshold=0))
    with pytest.raises(openai.BadRequestError) as caught:
        await async_client(proxy.url).chat.completions.create(model="fake-small", messages=big_history(30))
    assert caught.value.response.headers["x-compaction"] == "failed"
    metrics = await scrape(proxy.url)
    # Every call is counted, those the proxy refused to send for lack of room included.
    assert metrics['compaction_proxy_summarizer_calls_total{result="error"}'] >= len(model.summarizer_calls) >= 1
    # The cut-off reply was billed: its prompt tokens are counted although no summary came of it.
    assert metrics['compaction_proxy_summarizer_tokens_total{kind="prompt"}'] >= \
        min(r.prompt_tokens for r in model.summarizer_calls) > 0
    assert metrics['compaction_proxy_compaction_failures_total{error="SummaryTruncated",trigger="reactive"}'] == 1


async def test_upstream_failures_are_counted(make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy({"upstream": {"base_url": "http://127.0.0.1:9/v1", "connect_timeout": 1}})
    client = async_client(proxy.url)
    for _ in range(2):
        with pytest.raises(openai.InternalServerError):
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.InternalServerError):
        await client.models.list()
    metrics = await scrape(proxy.url)
    assert metrics['compaction_proxy_upstream_errors_total{kind="unreachable"}'] == 3


async def test_metrics_parse_and_match_what_happened(fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    model = WindowedModel(window=8192)
    fake.chat_hook = model
    proxy = await make_proxy(compaction_config(background=False))
    client = async_client(proxy.url)
    await client.chat.completions.create(model="fake-small", messages=big_history(1))
    compacted = await client.chat.completions.with_raw_response.create(model="fake-small", messages=big_history(30))
    assert compacted.headers["x-compaction"] == "proactive"
    reused = await client.chat.completions.with_raw_response.create(model="fake-small", messages=big_history(30))
    assert reused.headers["x-compaction"] == "reused"
    stream = await client.chat.completions.create(model="fake-small", messages=big_history(1), stream=True)
    async for _ in stream:
        pass
    await client.models.list()
    async with aiohttp.ClientSession() as session, session.get(f"{proxy.url}/metrics") as response:
        text = await response.text()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}

    def value(name: str, **labels: str) -> float:
        return samples.get((name, tuple(sorted(labels.items()))), 0.0)

    assert value("compaction_proxy_requests_total", route="chat", status="200", compaction="none") == 2
    assert value("compaction_proxy_requests_total", route="chat", status="200", compaction="proactive") == 1
    assert value("compaction_proxy_requests_total", route="chat", status="200", compaction="reused") == 1
    assert value("compaction_proxy_requests_total", route="passthrough", status="200", compaction="none") == 1
    assert value("compaction_proxy_open_streams") == 0
    assert value("compaction_proxy_compactions_total", trigger="proactive") == 1
    assert value("compaction_proxy_reuse_lookups_total", result="hit") == 1
    assert value("compaction_proxy_reuse_lookups_total", result="miss") == 3
    upstream_calls = len(model.received) + 1  # every chat and summariser call, and the models listing
    assert value("compaction_proxy_upstream_response_seconds_count") == upstream_calls
    assert value("compaction_proxy_compaction_tokens_count", stage="before") == 1
    # Every chat request looks its prefix up once (4), and the one summary built was stored once.
    assert value("compaction_proxy_store_seconds_count", operation="longest_match") == 4
    assert value("compaction_proxy_store_seconds_count", operation="put") == 1
    assert value("compaction_proxy_overhead_seconds_count") == 4  # the four compactable chat requests
    assert 0 < value("compaction_proxy_overhead_seconds_sum") < 4 * 1.0
