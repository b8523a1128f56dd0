"""OpenAI's compaction contract served by the proxy in front of an upstream that has none: POST /responses/compact,
Codex's `compaction_trigger` turn (JSON and stream), and a `context_management` entry's `compact_threshold` — each
answered with one self-contained compaction item that the proxy opens again on the next request."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest

from proxy.core.envelope import PREFIX, opened
from proxy.upstream.streaming import SseDecoder
from tests.conftest import ProxyFactory
from tests.e2e.test_responses_e2e import WINDOW, long_input, model, pairing_problems
from tests.fakes.openai_upstream import FakeUpstream
from tests.fakes.responses_agent import INSTRUCTION, run_agent
from tests.fakes.responses_model import ResponsesModel
from tests.fakes.windowed import WindowedModel
from tests.sdk import async_client

__all__ = ["model"]  # the Responses model of the agent-loop tests (window WINDOW), this module's fixture too
TRIGGER = {"type": "compaction_trigger"}
CONFIG = {"models": {"default": {"context_window": WINDOW}}}


async def post(url: str, body: dict[str, Any]) -> tuple[int, Any, bytes]:
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as response:
        return response.status, response.headers, await response.read()


def events_of(raw: bytes) -> list[dict[str, Any]]:
    decoder = SseDecoder()
    return [event.json() for event in [*decoder.feed(raw), *decoder.flush()]]


def the_compaction(output: list[dict[str, Any]]) -> dict[str, Any]:
    items = [item for item in output if item.get("type") == "compaction"]
    assert len(items) == 1 and len(output) == 1, output  # exactly one output item, the compaction
    assert items[0]["id"].startswith("cmp_") and items[0]["encrypted_content"].startswith(PREFIX)
    return items[0]


def codex_follow_up(history: list[dict[str, Any]], item: dict[str, Any], text: str) -> list[dict[str, Any]]:
    """The next input as Codex builds it after a compaction: its user messages kept, then the compaction item,
    then its context again and the new message."""
    users = [entry for entry in history if entry.get("role") == "user"]
    return [*users, item, {"role": "developer", "content": "sandbox: workspace-write"},
            {"role": "user", "content": text}]


async def test_compact_answers_one_item_that_stands_for_the_whole_conversation(
        model: ResponsesModel, fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(CONFIG)
    history = long_input(30)
    status, headers, raw = await post(f"{proxy.url}/v1/responses/compact", {"model": "m", "input": history})
    answer = json.loads(raw)
    assert status == 200 and answer["object"] == "response.compaction", answer
    sealed = opened(the_compaction(answer["output"])["encrypted_content"])
    assert sealed is not None and "FACT-7" in (sealed.summary or "")
    assert list(sealed.after[-2:]) == history[-2:]  # the latest round, as the client sent it
    assert headers["x-compaction"] == "requested" and answer["usage"]["input_tokens"] > 0
    assert len(headers["x-compaction-id"]) == 24 and int(headers["x-compaction-id"], 16) >= 0  # the journal's event
    assert len(json.dumps(answer["output"])) < len(json.dumps(history)) / 2
    assert model.received == []  # nothing was sent to the model for it
    async with aiohttp.ClientSession() as session, session.get(f"{proxy.url}/metrics") as response:
        counted = await response.text()  # counted as what it was, not as "none"
    assert 'compaction_proxy_requests_total{compaction="requested",route="responses_compact",status="200"} 1.0' \
        in counted
    follow_up = [*answer["output"], {"role": "user", "content": "And now?"}]
    status, _, _ = await post(f"{proxy.url}/v1/responses", {"model": "m", "input": follow_up})
    assert status == 200
    sent = model.received[-1]["input"]
    assert not [item for item in sent if item.get("type") == "compaction"]
    assert sent[-3:] == [*history[-2:], {"role": "user", "content": "And now?"}]
    assert any("FACT-7" in json.dumps(item) for item in sent if item.get("role") == "user")
    assert pairing_problems(model.received[-1], model) == []


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
async def test_a_compaction_trigger_is_answered_with_exactly_one_compaction_item(
        stream: bool, model: ResponsesModel, fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    """Codex's remote compaction (v2): the proxy answers the turn itself, as a stream of the Responses events
    when asked; the next request, built as Codex builds it, reaches the upstream as summary and kept items, each
    user message once, every output after its call."""
    proxy = await make_proxy(CONFIG)
    history = long_input(30)
    status, headers, raw = await post(f"{proxy.url}/v1/responses", {
        "model": "m", "input": [*history, TRIGGER], "stream": stream, "store": False, "instructions": "be useful"})
    assert status == 200 and headers["x-compaction"] == "requested"
    if stream:
        assert headers["content-type"].startswith("text/event-stream")
        events = events_of(raw)
        assert [event["type"] for event in events] == [
            "response.created", "response.in_progress", "response.output_item.added", "response.output_item.done",
            "response.completed"]
        assert [event["sequence_number"] for event in events] == list(range(5))
        response = events[-1]["response"]
        assert events[3]["item"] == response["output"][0]
    else:
        response = json.loads(raw)
    assert response["object"] == "response" and response["status"] == "completed"
    item = the_compaction(response["output"])
    assert response["usage"]["input_tokens"] > response["usage"]["output_tokens"] > 0
    assert model.received == []  # the trigger never reaches an upstream that cannot read it
    follow_up = codex_follow_up(history, item, "Carry on.")
    status, _, _ = await post(f"{proxy.url}/v1/responses", {"model": "m", "input": follow_up})
    assert status == 200
    sent = model.received[-1]["input"]
    assert not [entry for entry in sent if entry.get("type") in ("compaction", "compaction_trigger")]
    assert [entry for entry in sent if entry.get("content") == INSTRUCTION] == [history[0]]  # once, not twice
    assert any("FACT-7" in json.dumps(entry) for entry in sent if entry.get("role") == "user")
    assert history[-2] in sent and history[-1] in sent and sent[-1] == {"role": "user", "content": "Carry on."}
    assert pairing_problems(model.received[-1], model) == []


@pytest.mark.parametrize(("config", "outcome"), [
    ({"compaction": {"enabled": False}}, "none"),
    ({"dialects": {"responses": {"upstream_compaction": True}}}, "not-applicable"),
])
async def test_a_trigger_the_proxy_may_not_answer_goes_to_the_upstream_untouched(
        config: dict[str, Any], outcome: str, model: ResponsesModel, fake: FakeUpstream,
        make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy({**CONFIG, **config})
    body = json.dumps({"model": "m", "input": [*long_input(3), TRIGGER]}).encode()
    async with aiohttp.ClientSession() as session, session.post(f"{proxy.url}/v1/responses", data=body) as response:
        await response.read()
        assert response.headers["x-compaction"] == outcome
    assert [request.body for request in fake.requests if request.path == "/v1/responses"] == [body]


async def test_compact_the_proxy_may_not_answer_goes_to_the_upstream(model: ResponsesModel, fake: FakeUpstream,
                                                                    make_proxy: ProxyFactory) -> None:
    """A history kept upstream, or an upstream that compacts by itself: the request is the upstream's to answer."""
    proxy = await make_proxy({"dialects": {"responses": {"upstream_compaction": True}}})
    body = {"model": "m", "input": long_input(3)}
    status, _, _ = await post(f"{proxy.url}/v1/responses/compact", body)
    assert [json.loads(request.body) for request in fake.requests if request.path == "/v1/responses/compact"] == \
        [body]
    assert status == 404  # the fake has no such route: its answer, not the proxy's
    proxy = await make_proxy()
    await post(f"{proxy.url}/v1/responses/compact", {**body, "previous_response_id": "resp_1"})
    assert len([request for request in fake.requests if request.path == "/v1/responses/compact"]) == 2


async def test_a_trigger_whose_summary_fails_says_so_and_changes_nothing(model: ResponsesModel, fake: FakeUpstream,
                                                                        make_proxy: ProxyFactory) -> None:
    fake.chat_hook = WindowedModel(window=32_768, summarizer_down=True)
    proxy = await make_proxy(CONFIG)
    status, _, raw = await post(f"{proxy.url}/v1/responses",
                                {"model": "m", "input": [*long_input(30), TRIGGER], "stream": True})
    assert status == 502 and json.loads(raw)["error"]["code"] == "compaction_failed"
    assert model.received == []


async def test_concurrent_triggers_for_one_conversation_share_one_summary(model: ResponsesModel, fake: FakeUpstream,
                                                                         make_proxy: ProxyFactory) -> None:
    summariser = WindowedModel(window=32_768, summary_delay=0.3)
    fake.chat_hook = summariser
    proxy = await make_proxy(CONFIG)
    body = {"model": "m", "input": [*long_input(30), TRIGGER], "stream": True}
    answers = await asyncio.gather(*(post(f"{proxy.url}/v1/responses", body) for _ in range(4)))
    items = [the_compaction(events_of(raw)[-1]["response"]["output"]) for status, _, raw in answers]
    assert all(status == 200 for status, _, _ in answers)
    summaries = {sealed.summary for sealed in (opened(item["encrypted_content"]) for item in items) if sealed}
    assert len(summaries) == 1 and None not in summaries
    assert len(summariser.summarizer_calls) == 1


async def test_a_compact_threshold_below_the_proxys_own_is_honoured(model: ResponsesModel, fake: FakeUpstream,
                                                                   make_proxy: ProxyFactory) -> None:
    """`context_management: [{type: compaction, compact_threshold}]` asks for compaction past that many tokens;
    an upstream without it never sees the entry. Below the threshold the conversation goes on whole."""
    proxy = await make_proxy({"models": {"default": {"context_window": 100_000}}})
    managed = {"context_management": [{"type": "compaction", "compact_threshold": 3000}]}
    short = long_input(1)
    status, headers, _ = await post(f"{proxy.url}/v1/responses", {"model": "m", "input": short, **managed})
    assert status == 200 and headers["x-compaction"] == "none"
    assert model.received[-1] == {"model": "m", "input": short}
    history = long_input(30)
    status, headers, _ = await post(f"{proxy.url}/v1/responses", {"model": "m", "input": history, **managed})
    assert status == 200 and headers["x-compaction"] == "proactive"
    assert int(headers["x-compaction-tokens-after"]) < 3000 < int(headers["x-compaction-tokens-before"])
    assert "context_management" not in model.received[-1] and model.prompts[-1] < 3000


def outputs_answered(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The model's output items as the client resends them, each function call with its result after it."""
    items = [item for item in output if item.get("type") != "compaction"]
    return [*items, *({"type": "function_call_output", "call_id": item["call_id"], "output": "ok"}
                      for item in items if item.get("type") == "function_call")]


async def response_of(raw: bytes, stream: bool) -> dict[str, Any]:
    if not stream:
        answer: dict[str, Any] = json.loads(raw)
        return answer
    events = events_of(raw)
    numbers = [event["sequence_number"] for event in events]
    assert numbers == sorted(set(numbers)), numbers  # still one count, in order
    done = [event for event in events if event["type"] == "response.output_item.done"]
    last: dict[str, Any] = events[-1]["response"]
    assert [event["item"] for event in done] == last["output"]  # the events and the closing response agree
    assert [event["output_index"] for event in done] == list(range(len(done)))
    return last


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_client_asking_for_context_management_hears_of_each_compaction(
        stream: bool, model: ResponsesModel, fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    """As with OpenAI's own: the compacted turn's output opens with a compaction item, and the client may drop
    everything before it; its next request, so dropped, reaches the upstream as summary and kept items."""
    proxy = await make_proxy({"models": {"default": {"context_window": 100_000}}})
    managed = {"context_management": [{"type": "compaction", "compact_threshold": 3000}], "stream": stream}
    history = long_input(30)
    status, headers, raw = await post(f"{proxy.url}/v1/responses", {"model": "m", "input": history, **managed})
    assert status == 200 and headers["x-compaction"] == "proactive"
    response = await response_of(raw, stream)
    item = response["output"][0]
    assert item["type"] == "compaction" and [entry["type"] for entry in response["output"][1:]] == \
        ["reasoning", "function_call", "function_call"]  # the model's own output, whole, after it
    follow_up = [item, *outputs_answered(response["output"])]
    status, headers, raw = await post(f"{proxy.url}/v1/responses", {"model": "m", "input": follow_up, **managed})
    assert status == 200 and headers["x-compaction"] in ("none", "reused")
    sent = model.received[-1]["input"]
    assert not [entry for entry in sent if entry.get("type") == "compaction"]
    assert any("FACT-7" in json.dumps(entry) for entry in sent if entry.get("role") == "user")
    assert sent[-len(follow_up) + 1:] == follow_up[1:] and pairing_problems(model.received[-1], model) == []
    assert model.prompts[-1] < 3000


async def test_without_the_entry_or_without_a_compaction_nothing_is_announced(
        model: ResponsesModel, fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    # (tool results not cleared: the point is a whole-history summary that nobody asked to hear of)
    proxy = await make_proxy({**CONFIG, "compaction": {"tool_results": {"clear": {"enabled": False}}}})
    status, headers, raw = await post(f"{proxy.url}/v1/responses", {"model": "m", "input": long_input(30)})
    assert status == 200 and headers["x-compaction"] == "proactive"
    assert [entry["type"] for entry in json.loads(raw)["output"]] == ["reasoning", "function_call", "function_call"]
    managed = {"context_management": [{"type": "compaction", "compact_threshold": 7000}]}
    status, headers, raw = await post(f"{proxy.url}/v1/responses", {"model": "m", "input": long_input(2), **managed})
    assert headers["x-compaction"] == "none" and "compaction" not in [e["type"] for e in json.loads(raw)["output"]]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_chat_only_upstream_announces_the_same_way(stream: bool, fake: FakeUpstream,
                                                           make_proxy: ProxyFactory) -> None:
    """Through the chat bridge (upstream_api: chat) the compaction item comes first in the translated output."""
    windowed = WindowedModel(window=32_768)
    fake.chat_hook = windowed
    proxy = await make_proxy({"models": {"default": {"context_window": 100_000}},
                              "dialects": {"responses": {"upstream_api": "chat"}}})
    managed = {"context_management": [{"type": "compaction", "compact_threshold": 3000}], "stream": stream}
    status, headers, raw = await post(f"{proxy.url}/v1/responses", {"model": "m", "input": long_input(30), **managed})
    assert status == 200 and headers["x-compaction"] == "proactive", raw[:500]
    response = await response_of(raw, stream)
    assert response["output"][0]["type"] == "compaction" and len(response["output"]) >= 2
    assert "context_management" not in windowed.chat_calls[-1].body


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_an_sdk_agent_that_drops_what_each_compaction_item_stands_for_runs_every_round(
        stream: bool, model: ResponsesModel, fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    """The official SDK's agent loop, 60 rounds, asking for compaction past 4,000 tokens and keeping only the latest
    compaction item and what came after it: every round answered, every forwarded history whole and paired, and the
    client's own requests stay short instead of growing by three items a round."""
    proxy = await make_proxy(CONFIG)
    sent: list[int] = []
    outcomes = await run_agent(async_client(proxy.url), 60, stream=stream, compact_threshold=4000, sent=sent)
    assert len(outcomes) == 60 and len(model.received) == 60 and max(model.prompts) <= WINDOW
    assert [problem for body in model.received for problem in pairing_problems(body, model)] == []
    assert all(INSTRUCTION in json.dumps(body["input"][:4]) for body in model.received)  # verbatim, up front
    assert "proactive" in outcomes and max(sent) < 60 and sent[-1] < 3 * 60 / 4, sent
    # The client's threshold held on the prompts (the fake counts for itself), at one summary per 4 rounds or fewer.
    assert max(model.prompts) <= 4000 and len(fake.chat_hook.summarizer_calls) <= 60 // 4, model.prompts
    assert all("context_management" not in body for body in model.received)


async def test_a_trigger_in_front_of_a_chat_only_upstream_is_answered_the_same_way(fake: FakeUpstream,
                                                                                   make_proxy: ProxyFactory) -> None:
    windowed = WindowedModel(window=32_768)
    fake.chat_hook = windowed
    proxy = await make_proxy({**CONFIG, "dialects": {"responses": {"upstream_api": "chat"}}})
    history = long_input(30)
    status, headers, raw = await post(f"{proxy.url}/v1/responses", {"model": "m", "input": [*history, TRIGGER],
                                                                    "stream": True})
    assert status == 200 and headers["x-compaction"] == "requested"
    item = the_compaction(events_of(raw)[-1]["response"]["output"])
    assert windowed.chat_calls == [] and len(windowed.summarizer_calls) == 1
    status, _, raw = await post(f"{proxy.url}/v1/responses", {"model": "m", "input": codex_follow_up(
        history, item, "Carry on.")})
    assert status == 200 and json.loads(raw)["object"] == "response"
    messages = windowed.chat_calls[-1].body["messages"]
    assert any("FACT-7" in json.dumps(message) for message in messages if message["role"] == "user")
    assert messages[-1] == {"role": "user", "content": "Carry on."}
