"""The Messages API compacts like chat: the official `anthropic` SDK's agent loop, 1 instruction and 60 rounds of 2
parallel tool_use blocks with signed thinking, through the proxy to a model that enforces its window, its
alternation and pairing rules and its thinking signatures — JSON and streams."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import pytest

from tests.conftest import ProxyFactory
from tests.fakes.messages_agent import INSTRUCTION, MAX_TOKENS, MODEL, SYSTEM, anthropic_client, file_text, run_agent
from tests.fakes.messages_model import MessagesModel
from tests.fakes.openai_upstream import FakeUpstream
from tests.fakes.windowed import WindowedModel

WINDOW = 16_000  # 60 rounds of ~900 tokens each (two tool results, thinking, calls): 3.4 windows
ROUNDS = 60


@pytest.fixture
def model(fake: FakeUpstream) -> MessagesModel:
    messages = MessagesModel(window=WINDOW)
    fake.messages_hook = messages
    fake.chat_hook = WindowedModel(window=32_768)  # the summariser's model, on chat completions
    return messages


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_an_agent_loop_runs_every_round_past_the_window(stream: bool, model: MessagesModel,
                                                              fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy({"models": {"default": {"context_window": WINDOW}}})
    outcomes = await run_agent(anthropic_client(proxy.url), ROUNDS, stream=stream)
    assert len(model.received) == ROUNDS and max(model.prompts) + MAX_TOKENS <= WINDOW
    # Every forwarded request is one a real server takes: roles alternate, each result answers the call before it,
    # the latest turn's thinking exactly as the model signed it (the fake refuses anything else with a 400).
    assert [model.problem(body) for body in model.received] == [None] * ROUNDS
    assert all(body["system"] == SYSTEM for body in model.received)
    assert all(INSTRUCTION in json.dumps(body["messages"][:4]) for body in model.received)
    summaries = len(fake.chat_hook.summarizer_calls)
    first = next(index for index, outcome in enumerate(outcomes) if outcome != "none")  # the first compacted round
    assert 0 < summaries <= 1 + (ROUNDS - first) // 4, (summaries, outcomes)
    assert "reused" in outcomes


async def test_forwarded_untouched_the_same_loop_dies_at_the_window(model: MessagesModel,
                                                                    make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy({"compaction": {"enabled": False}})
    with pytest.raises(anthropic.BadRequestError) as refused:
        await run_agent(anthropic_client(proxy.url), ROUNDS, stream=False)
    assert "prompt is too long" in str(refused.value)
    assert len(model.received) < ROUNDS


@pytest.mark.parametrize(("stream", "style", "sum_wording"), [
    (False, "json", False), (True, "json", False), (True, "error_event", False), (False, "json", True)])
async def test_an_overflow_the_proxy_did_not_foresee_is_compacted_and_retried_once(
        stream: bool, style: str, sum_wording: bool, model: MessagesModel, fake: FakeUpstream,
        make_proxy: ProxyFactory) -> None:
    """The proxy believes in a far larger window; the upstream refuses in Anthropic's words (a 400 saying "prompt is
    too long" or "input length and `max_tokens` exceed context limit", or an `error` event after `message_start`):
    compacted, retried once, the round answered."""
    model.overflow, model.sum_wording = style, sum_wording
    proxy = await make_proxy({"models": {"default": {"context_window": 200_000}}})
    outcomes = await run_agent(anthropic_client(proxy.url), 30, stream=stream)
    refused = [index for index, prompt in enumerate(model.prompts) if prompt + MAX_TOKENS > WINDOW]
    assert refused and "reactive" in outcomes
    assert all(model.prompts[index + 1] + MAX_TOKENS <= WINDOW for index in refused)  # each retry fit


async def test_the_proxys_own_errors_take_anthropics_shape(model: MessagesModel, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy()
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{proxy.url}/v1/messages", data=b"{not json") as response:
            assert response.status == 400
            body = await response.json()
        async with session.post(f"{proxy.url}/v1/messages", json={"model": MODEL, "max_tokens": 5, "messages": []},
                                headers={"x-compaction-mode": "sideways"}) as response:
            assert response.status == 400
            mode = await response.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert mode["type"] == "error" and "x-compaction-mode" in mode["error"]["message"]
    assert model.received == []


async def test_anthropics_own_context_management_is_left_to_an_upstream_that_runs_it(
        model: MessagesModel, fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy({"models": {"default": {"context_window": WINDOW}},
                              "dialects": {"messages": {"upstream_context_management": True}}})
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}],
                            "context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}}
    raw = json.dumps(body).encode()
    async with aiohttp.ClientSession() as session, session.post(f"{proxy.url}/v1/messages", data=raw) as response:
        assert response.headers["x-compaction"] == "not-applicable"
        assert response.headers["x-compaction-reason"] == "upstream_manages_context"
    assert [request.body for request in fake.requests if request.path == "/v1/messages"] == [raw]


async def test_a_proxy_key_in_x_api_key_is_not_forwarded(model: MessagesModel, fake: FakeUpstream,
                                                         make_proxy: ProxyFactory) -> None:
    """Claude Code sends its key as x-api-key: the proxy's key opens the proxy and goes no further; the upstream
    gets the configured key, and Anthropic's version and beta headers as the client sent them. (This SDK sends
    its api_key as a bearer token, so the header is set as Claude Code sets it.)"""
    proxy = await make_proxy({"server": {"api_keys": ["proxy-key-0123456789"]},
                              "upstream": {"api_key": "sk-upstream-key"}})
    client = anthropic_client(proxy.url, default_headers={"Authorization": anthropic.omit,
                                                          "x-api-key": "proxy-key-0123456789",
                                                          "anthropic-beta": "context-1m-2025-08-07"})
    await client.messages.create(model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "hi"}])
    received = [request for request in fake.requests if request.path == "/v1/messages"][-1]
    assert received.headers.get("x-api-key") is None or received.headers["x-api-key"] != "proxy-key-0123456789"
    sent = received.headers
    lowered = {name.lower(): value for name, value in sent.items()}
    assert "proxy-key-0123456789" not in json.dumps(dict(sent))
    assert lowered["authorization"] == "Bearer sk-upstream-key"
    assert lowered["anthropic-version"] and lowered["anthropic-beta"] == "context-1m-2025-08-07"


async def test_count_tokens_is_the_upstreams_where_it_has_one_and_the_proxys_where_not(
        model: MessagesModel, fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    """Claude Code counts before it sends. An upstream without the route answers 404: the proxy answers from its
    estimate instead, calibrated by the usage of the answers it has seen (the fake counts a tenth more than the
    proxy's tokenizer, as a real server's tokenizer differs); with the route, the upstream's own count."""
    proxy = await make_proxy()
    client = anthropic_client(proxy.url)
    request: dict[str, Any] = {"model": MODEL, "system": SYSTEM, "messages": [
        {"role": "user", "content": INSTRUCTION * 20}]}
    errors = []
    for turn in range(3):
        raw = await client.messages.with_raw_response.count_tokens(**request)
        assert raw.headers["x-compaction-counted-by"] == "proxy"
        truth = model.prompt_tokens({**request, "max_tokens": 1})
        errors.append(abs((await raw.parse()).input_tokens - truth) / truth)
        await client.messages.create(max_tokens=64, **request)  # its usage calibrates the estimate
        request["messages"] = [{"role": "user", "content": INSTRUCTION * (20 + 10 * turn)}]
    assert errors[0] < 0.15 and errors[-1] < 0.03, errors
    fake.count_tokens = True
    raw = await client.messages.with_raw_response.count_tokens(**request)
    assert (await raw.parse()).input_tokens == model.counted[-1] and "x-compaction-counted-by" not in raw.headers
    async with aiohttp.ClientSession() as session, session.get(f"{proxy.url}/metrics") as response:
        assert 'route="messages_count_tokens",status="200"} 4.0' in await response.text()


CORPUS = [entry for name in ("overflow_public.json", "overflow_more.json")
          for entry in json.loads((Path(__file__).parents[1] / "fixtures" / name).read_text(encoding="utf-8"))
          if entry["api"] == "anthropic"]


def long_conversation(rounds: int = 20) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": INSTRUCTION}]
    for n in range(rounds):
        use = {"type": "tool_use", "id": f"toolu_h{n}", "name": "read_file", "input": {"path": f"{n}.py"}}
        result = {"type": "tool_result", "tool_use_id": use["id"], "content": file_text(use["id"])}
        messages += [{"role": "assistant", "content": [use]}, {"role": "user", "content": [result]}]
    return messages


@pytest.mark.parametrize("entry", CORPUS, ids=[entry["id"] for entry in CORPUS])
async def test_the_overflow_corpus_on_the_messages_route(entry: dict[str, Any], model: MessagesModel,
                                                         make_proxy: ProxyFactory) -> None:
    """Each Messages-shaped answer from the corpus, served by the upstream for a prompt past its window: an
    overflow is compacted and retried once; anything else reaches the client as the upstream sent it."""
    body = entry["body"] if isinstance(entry["body"], str) else json.dumps(entry["body"])
    model.window, model.thinks = 4000, False
    model.refusal = (entry["status"], body, entry["headers"]["content-type"].split(";")[0])
    proxy = await make_proxy({"models": {"default": {"context_window": 100_000}}})
    request = {"model": MODEL, "max_tokens": 256, "messages": long_conversation(), "stream": entry["stream"]}
    async with aiohttp.ClientSession() as session, session.post(f"{proxy.url}/v1/messages", json=request) as answer:
        status, outcome, raw = answer.status, answer.headers.get("x-compaction"), await answer.read()
    if entry["is_context_overflow"]:
        assert (status, outcome) == (200, "reactive"), raw[:300]
        assert len(model.received) == 2 and model.prompts[1] + 256 <= model.window
    else:
        assert (status, raw) == (entry["status"], body.encode()) and outcome == "none"
        assert len(model.received) == 1


async def test_shadow_mode_reports_and_forwards_byte_for_byte(model: MessagesModel, fake: FakeUpstream,
                                                              make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy({"models": {"default": {"context_window": 6000}}, "compaction": {"mode": "shadow"}})
    model.thinks = False
    raw = json.dumps({"model": MODEL, "max_tokens": 256, "messages": long_conversation(16)}).encode()
    async with aiohttp.ClientSession() as session, session.post(f"{proxy.url}/v1/messages", data=raw) as response:
        assert response.status == 200 and response.headers["x-compaction"] == "none"
        assert response.headers["x-compaction-shadow"] == "proactive"
        assert int(response.headers["x-compaction-shadow-tokens-after"]) < \
            int(response.headers["x-compaction-shadow-tokens-before"])
    assert [request.body for request in fake.requests if request.path == "/v1/messages"] == [raw]
    assert fake.chat_hook.summarizer_calls == []
