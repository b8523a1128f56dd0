"""docs/names.md against the proxy: every x-compaction header the code has is documented and nothing else, and
every header, access-log field and compaction-log field real answers carry is in its table, with one meaning: the
access log's tokens_before/tokens_after are the headers' whole-request figures."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

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
