"""docs/names.md against the proxy: every x-compaction header the code has is documented and nothing else, and
every header, access-log field and compaction-log field real answers carry is in its table, with one meaning: the
access log's tokens_before/tokens_after are the headers' whole-request figures."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from proxy import headers as h
from tests.conftest import ProxyFactory
from tests.e2e.test_compaction_e2e import big_history
from tests.fakes.agent import AgentModel, run_agent
from tests.fakes.openai_upstream import FakeUpstream
from tests.fakes.windowed import WindowedModel
from tests.sdk import async_client

DOC = Path(__file__).resolve().parents[1] / "docs" / "names.md"
_ROW = re.compile(r"^\| `([a-z_-]+)` \|", re.MULTILINE)


def table(title: str) -> set[str]:
    """The names in the first column of the table under `## title`."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split(f"## {title}", 1)[1].split("\n## ", 1)[0]
    return set(_ROW.findall(section))


def test_every_header_the_code_has_is_documented_and_no_other() -> None:
    code = {value for name, value in vars(h).items() if name.isupper() and isinstance(value, str)
            and value.startswith("x-compaction")}
    assert table("Response headers") == code


def test_the_access_log_documents_each_field_the_headers_give() -> None:
    assert set(h.COUNTS.values()) | {"compaction", "compaction_reason", "compaction_shadow"} <= \
        table("Access log fields")


def lines_of(caplog: pytest.LogCaptureFixture, logger: str, event: str) -> list[dict[str, Any]]:
    found = []
    for record in caplog.records:
        message = record.getMessage()
        if record.name == logger and message.startswith("{") and json.loads(message).get("event") == event:
            found.append(json.loads(message))
    return found


async def test_real_answers_and_lines_use_only_documented_names(
        fake: FakeUpstream, make_proxy: ProxyFactory, caplog: pytest.LogCaptureFixture) -> None:
    windowed = WindowedModel(window=4000)
    fake.chat_hook = windowed
    proxy = await make_proxy({"models": {"default": {"context_window": 4000}}})
    client = async_client(proxy.url)
    answers = []
    with caplog.at_level(logging.INFO, logger="proxy"):
        for history, mode in ((big_history(3), "force"), (big_history(8), "shadow"), (big_history(30), "auto")):
            raw = await client.chat.completions.with_raw_response.create(
                model="fake-small", messages=history, extra_headers={"x-compaction-mode": mode})
            answers.append(raw.headers)
        agent = AgentModel(window=16_000)
        fake.chat_hook = agent
        cleared = await make_proxy({"models": {"default": {"context_window": 16_000}}})
        answers += (await run_agent(async_client(cleared.url), 30, words=40)).headers
    told = {name for headers in answers for name in headers if name.lower().startswith("x-compaction")}
    assert {"x-compaction", "x-compaction-tokens-before", "x-compaction-shadow", "x-compaction-cleared"} <= told
    assert told <= table("Response headers")
    access = lines_of(caplog, "proxy.access", "request")
    assert access and set().union(*access) <= table("Access log fields")
    compactions = lines_of(caplog, "proxy.compaction", "compaction")
    assert compactions and set().union(*compactions) <= table("Compaction log fields")
    # One meaning: the access log's tokens_before/after are the answer's headers, the whole request's.
    by_id = {line["request_id"]: line for line in access}
    for headers in answers:
        line = by_id[headers["x-request-id"]]
        for header, field in ((h.TOKENS_BEFORE, "tokens_before"), (h.TOKENS_AFTER, "tokens_after")):
            assert line.get(field) == (int(headers[header]) if header in headers else None)


async def test_every_metric_served_is_documented_and_no_other(proxy: Any) -> None:
    async with aiohttp.ClientSession() as session, session.get(f"{proxy.url}/metrics") as response:
        exposition = await response.text()
    served = set()
    for kind_line in re.findall(r"^# TYPE (\S+) (\S+)$", exposition, re.MULTILINE):
        name, kind = kind_line
        if name.endswith("_created"):  # prometheus-client's creation time of each series, not a metric of ours
            continue
        served.add(f"{name}_total" if kind == "counter" and not name.endswith("_total") else name)
    assert served == table("Metrics")


async def test_journal_entries_use_only_documented_names(fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    fake.chat_hook = WindowedModel(window=4000)
    proxy = await make_proxy({"models": {"default": {"context_window": 4000}}})
    client = async_client(proxy.url, api_key="sk-names")
    raw = await client.chat.completions.with_raw_response.create(
        model="fake-small", messages=big_history(3), extra_headers={"x-compaction-mode": "force"})
    event_id = raw.headers["x-compaction-id"]
    auth = {"Authorization": "Bearer sk-names"}
    async with aiohttp.ClientSession(headers=auth) as session:
        for _ in range(100):
            async with session.get(f"{proxy.url}/_proxy/api/events/{event_id}") as response:
                if response.status == 200:
                    event = await response.json()
                    break
            await asyncio.sleep(0.02)
        async with session.get(f"{proxy.url}/_proxy/api/conversations/{event['conversation']}") as response:
            detail = await response.json()
    assert set(event) <= table("Journal event fields")
    assert set().union(*detail["events"]) <= table("Journal event fields")
    assert detail["points"] and set().union(*detail["points"]) <= table("Journal point fields")
    assert detail["points"][-1]["event_id"] == event_id
