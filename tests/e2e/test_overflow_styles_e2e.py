"""Every overflow style of the public corpus, served by the fake upstream: compacted and retried once;
every look-alike: passed through byte for byte with no summariser call."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from proxy.upstream.overflow import context_limit_from_error
from tests.conftest import ProxyFactory
from tests.e2e.test_compaction_e2e import WINDOW, big_history, compaction_config
from tests.fakes.openai_upstream import FakeUpstream
from tests.fakes.windowed import Overflow, WindowedModel

FIXTURES = Path(__file__).parents[1] / "fixtures"
CORPUS = [entry for name in ("overflow_public.json", "overflow_more.json")
          for entry in json.loads((FIXTURES / name).read_text())]
# Some name windows below 2,048 tokens (512, 1,024, 1,500), smaller than this harness's summariser prompt and
# compacted conversation: the proxy learns the window, cannot summarise within it in its call budget, and rightly
# hands back the upstream's answer. Their recognition is unit-tested.
HARNESS_MIN_WINDOW = 2048


def _too_small(entry: dict[str, Any]) -> bool:
    body = entry["body"] if isinstance(entry["body"], str) else json.dumps(entry["body"])
    limit = context_limit_from_error(body)
    return limit is not None and limit < HARNESS_MIN_WINDOW


TOO_SMALL_FOR_THE_HARNESS = {entry["id"] for entry in CORPUS if _too_small(entry)}
POSITIVES = [entry for entry in CORPUS if entry["is_context_overflow"] and entry["id"] not in TOO_SMALL_FOR_THE_HARNESS]
NEGATIVES = [entry for entry in CORPUS if not entry["is_context_overflow"]]


def served(entry: dict[str, Any]) -> Overflow:
    body = entry["body"] if isinstance(entry["body"], str) else json.dumps(entry["body"])
    content_type = entry["headers"].get("content-type", "application/json").split(";")[0]
    return Overflow(entry["status"], body, content_type)


async def post(url: str, messages: list[dict[str, Any]], stream: bool) -> tuple[int, Any, bytes]:
    body = {"model": "fake-small", "messages": messages, "stream": stream}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v1/chat/completions", json=body,
                                headers={"Authorization": "Bearer sk-test"}) as response:
            return response.status, response.headers, await response.read()


def streamed_text(raw: bytes) -> str:
    text = ""
    for line in raw.decode().splitlines():
        if line.startswith("data: {"):
            for choice in json.loads(line[6:]).get("choices", []):
                text += choice.get("delta", {}).get("content") or ""
    return text


@pytest.mark.parametrize("entry", POSITIVES, ids=[e["id"] for e in POSITIVES])
async def test_overflow_style_is_compacted_and_retried_once(entry: dict[str, Any], fake: FakeUpstream,
                                                            make_proxy: ProxyFactory) -> None:
    model = WindowedModel(window=WINDOW, overflow=served(entry))
    fake.chat_hook = model
    proxy = await make_proxy(compaction_config(threshold=0))
    history = big_history(30)
    status, headers, raw = await post(proxy.url, history, entry["stream"])
    assert status == 200, raw[:300]
    assert headers["x-compaction"] == "reactive"
    assert len(model.chat_calls) == 2
    assert model.chat_calls[0].prompt_tokens > WINDOW >= model.chat_calls[1].prompt_tokens
    answer = streamed_text(raw) if entry["stream"] else json.loads(raw)["choices"][0]["message"]["content"]
    assert answer.strip().startswith("Noted: Remember FACT-30")


@pytest.mark.parametrize("entry", NEGATIVES, ids=[e["id"] for e in NEGATIVES])
async def test_look_alike_passes_through_untouched(entry: dict[str, Any], fake: FakeUpstream,
                                                   make_proxy: ProxyFactory) -> None:
    model = WindowedModel(window=WINDOW, always_answer=served(entry))
    fake.chat_hook = model
    # Background summaries are off: `neg-llamacpp-finish-length` reports usage at the window's edge, which rightly
    # starts the next turn's summary; this test is about the overflow detector and the retry path only.
    proxy = await make_proxy(compaction_config(background=False))
    status, headers, raw = await post(proxy.url, big_history(2), entry["stream"])
    assert (status, raw) == (entry["status"], served(entry).body.encode())
    assert headers["x-compaction"] == "none"
    assert model.summarizer_calls == [] and len(model.chat_calls) == 1
