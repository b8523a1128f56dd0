"""The Anthropic Messages API in front of an upstream that speaks only chat completions (`dialects.messages.
upstream_api: chat`): the official `anthropic` SDK's agent loop (`messages.create` and `messages.stream`) runs round
after round of parallel tool calls past a chat model's window; `auto` learns the upstream from its first 404; the
client's key goes as a bearer token and a proxy key never leaves; errors come back in Anthropic's shape."""

from __future__ import annotations

import json
import logging
from typing import Any

import anthropic
import pytest
from aiohttp import web

from tests.conftest import ProxyFactory
from tests.e2e.test_responses_over_chat import chat_problems
from tests.fakes.agent import AgentModel
from tests.fakes.messages_agent import INSTRUCTION, MAX_TOKENS, MODEL, SYSTEM, TOOLS, anthropic_client, run_agent
from tests.fakes.openai_upstream import FakeUpstream, chunk, error, sse

WINDOW = 8000
ROUNDS = 30  # ~560 tokens a round (two results of 13 lines): ~2 windows of history by the end
CHAT = {"dialects": {"messages": {"upstream_api": "chat"}}}
PROXY_KEY = "proxy-key-5c1d9e7a30"


@pytest.fixture
def model(fake: FakeUpstream) -> AgentModel:
    agent = AgentModel(window=WINDOW)
    fake.chat_hook = agent  # answers each turn with two parallel tool calls, and the summariser's requests
    return agent


def posted(fake: FakeUpstream) -> list[str]:
    return [request.path for request in fake.requests if request.method == "POST"]


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
async def test_an_anthropic_agent_runs_every_round_on_a_chat_only_upstream(stream: bool, model: AgentModel,
                                                                           fake: FakeUpstream,
                                                                           make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy({"models": {"default": {"context_window": WINDOW}}, **CHAT})
    outcomes = await run_agent(anthropic_client(proxy.url), ROUNDS, stream=stream)
    assert len(outcomes) == ROUNDS and "failed" not in outcomes and {"proactive", "reused"} & set(outcomes)
    assert "/v1/messages" not in posted(fake)
    turns = [call.body for call in model.chat_calls]
    assert len(turns) == ROUNDS and max(call.prompt_tokens for call in model.chat_calls) + MAX_TOKENS <= WINDOW
    assert [problem for body in turns for problem in chat_problems(body)] == []  # every result answers its call
    # Both parallel calls of a round came back as tool_use blocks, and their results went on as two tool messages.
    assert all([message["role"] for message in body["messages"][-2:]] == ["tool", "tool"] for body in turns[1:])
    assert all(body["messages"][0] == {"role": "system", "content": SYSTEM} for body in turns)
    assert all(INSTRUCTION in json.dumps(body["messages"][:4]) for body in turns)  # the task survives compaction
    assert all(body["max_tokens"] == MAX_TOKENS and body["tools"][0]["function"]["name"] == TOOLS[0]["name"]
               for body in turns)
    assert all(body.get("stream_options") == {"include_usage": True} for body in turns if stream)
    assert model.summarizer_calls


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
async def test_an_overflow_the_proxy_did_not_foresee_is_compacted_and_retried(stream: bool, model: AgentModel,
                                                                              make_proxy: ProxyFactory) -> None:
    """The proxy believes in a far larger window; the chat server refuses in OpenAI's words: read through the
    bridge as the overflow it is, compacted and retried once, every round answered."""
    proxy = await make_proxy({"models": {"default": {"context_window": 200_000}}, **CHAT})
    outcomes = await run_agent(anthropic_client(proxy.url), ROUNDS, stream=stream)
    refused = [index for index, call in enumerate(model.chat_calls) if call.prompt_tokens + MAX_TOKENS > WINDOW]
    assert refused and "reactive" in outcomes and "failed" not in outcomes
    assert all(model.chat_calls[index + 1].prompt_tokens + MAX_TOKENS <= WINDOW for index in refused)


async def test_auto_learns_a_chat_only_upstream_from_its_first_404(model: AgentModel, fake: FakeUpstream,
                                                                   make_proxy: ProxyFactory,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """The fake has no /v1/messages (404): the first request is answered through chat all the same, and every later
    one goes to chat directly."""
    proxy = await make_proxy({"models": {"default": {"context_window": WINDOW}},
                              "dialects": {"messages": {"upstream_api": "auto"}}})
    with caplog.at_level(logging.WARNING, logger="proxy.pipeline"):
        outcomes = await run_agent(anthropic_client(proxy.url), 4, stream=False)
    assert len(outcomes) == 4 and posted(fake).count("/v1/messages") == 1
    learned = [json.loads(r.getMessage()) for r in caplog.records if "upstream_api_learned" in r.getMessage()]
    assert [(event["route"], event["upstream_api"], event["status"]) for event in learned] == [
        ("messages", "chat", 404)]


async def test_the_request_auto_learns_from_keeps_its_context_edits(model: AgentModel, fake: FakeUpstream,
                                                                    make_proxy: ProxyFactory) -> None:
    """The first request goes to /v1/messages, gets a 404 and is read again for chat: the edits it asked for, taken
    off its body by the first reading, still apply to it, and the answer still reports them."""
    proxy = await make_proxy({"dialects": {"messages": {"upstream_api": "auto"}}})
    messages: list[Any] = [{"role": "user", "content": INSTRUCTION}]
    for turn in range(3):
        messages += [{"role": "assistant", "content": [{"type": "tool_use", "id": f"toolu_{turn}", "name": "read_file",
                                                        "input": {"path": f"f{turn}.py"}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{turn}",
                                                   "content": "x = 1\n" * 50}]}]
    edit = {"type": "clear_tool_uses_20250919", "trigger": {"type": "tool_uses", "value": 1},
            "keep": {"type": "tool_uses", "value": 1}}
    message = await anthropic_client(proxy.url).beta.messages.create(
        model=MODEL, max_tokens=MAX_TOKENS, tools=TOOLS, messages=messages, context_management={"edits": [edit]},
        betas=["context-management-2025-06-27"])
    assert posted(fake).count("/v1/messages") == 1
    assert message.context_management is not None
    [applied] = message.context_management.applied_edits
    assert applied.model_dump()["cleared_tool_uses"] == 2
    results = [entry["content"] for entry in model.chat_calls[-1].body["messages"] if entry["role"] == "tool"]
    assert [text.startswith("[cleared") for text in results] == [True, True, False]


async def test_auto_keeps_the_messages_api_when_only_the_model_is_missing(fake: FakeUpstream,
                                                                          make_proxy: ProxyFactory) -> None:
    """A 404 in Anthropic's own envelope is about the model: the server has the Messages API."""
    async def no_such_model(request: web.Request) -> web.StreamResponse:
        return web.json_response({"type": "error", "error": {"type": "not_found_error", "message": f"model: {MODEL}"}},
                                 status=404)

    fake.messages_hook = no_such_model
    proxy = await make_proxy({"dialects": {"messages": {"upstream_api": "auto"}}})
    client = anthropic_client(proxy.url)
    for _ in range(2):
        with pytest.raises(anthropic.NotFoundError):
            await client.messages.create(model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "hi"}])
    assert posted(fake) == ["/v1/messages"] * 2


def keyed_by_x_api_key(base: str, key: str, **headers: str) -> anthropic.AsyncAnthropic:
    """A client that sends its key as x-api-key, as Claude Code does (this SDK sends a bearer token itself)."""
    return anthropic_client(base, default_headers={"Authorization": anthropic.omit, "x-api-key": key, **headers})


async def test_the_clients_key_goes_as_a_bearer_token_and_a_proxy_key_never_leaves(
        model: AgentModel, fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy({"server": {"api_keys": [PROXY_KEY]}, **CHAT})
    clients = [keyed_by_x_api_key(proxy.url, "sk-client-own-key", **{"x-proxy-api-key": PROXY_KEY,
                                                                       "anthropic-beta": "context-1m-2025-08-07"}),
               keyed_by_x_api_key(proxy.url, PROXY_KEY),  # Claude Code's way in: the proxy key as its x-api-key
               anthropic_client(proxy.url, api_key="sk-sdk-bearer", default_headers={"x-proxy-api-key": PROXY_KEY})]
    for client in clients:
        await client.messages.create(model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "hi"}])
    own, proxy_key, bearer = ({name.lower(): value for name, value in request.headers.items()}
                              for request in fake.requests if request.path == "/v1/chat/completions")
    assert own["authorization"] == "Bearer sk-client-own-key" and bearer["authorization"] == "Bearer sk-sdk-bearer"
    assert not {"x-api-key", "anthropic-version", "anthropic-beta", "x-proxy-api-key"} & {*own, *bearer}
    assert "authorization" not in proxy_key and "x-api-key" not in proxy_key  # withheld in whichever header
    assert PROXY_KEY not in json.dumps([request.headers for request in fake.requests])
    with pytest.raises(anthropic.AuthenticationError) as refused:
        await keyed_by_x_api_key(proxy.url, "sk-not-a-proxy-key").messages.create(
            model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "hi"}])
    assert refused.value.body["type"] == "error"  # type: ignore[index]


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
async def test_an_upstream_error_reaches_the_client_in_anthropics_shape(stream: bool, fake: FakeUpstream,
                                                                        make_proxy: ProxyFactory) -> None:
    async def limited(request: web.Request, body: dict[str, Any], state: FakeUpstream) -> web.StreamResponse:
        return error(429, "Rate limit reached for requests", "rate_limit_exceeded", "requests")

    fake.chat_hook = limited
    proxy = await make_proxy(CHAT)
    request: dict[str, Any] = {"model": MODEL, "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(anthropic.RateLimitError) as refused:
        if stream:
            async with anthropic_client(proxy.url).messages.stream(**request) as events:
                await events.get_final_message()
        else:
            await anthropic_client(proxy.url).messages.create(**request)
    assert refused.value.body == {"type": "error", "error": {
        "type": "rate_limit_error", "message": "Rate limit reached for requests (rate_limit_exceeded)"}}


async def test_an_error_in_the_middle_of_a_stream_is_anthropics_error_event(fake: FakeUpstream,
                                                                            make_proxy: ProxyFactory) -> None:
    async def fails_midway(request: web.Request, body: dict[str, Any], state: FakeUpstream) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(sse(chunk(body, {"role": "assistant", "content": "Half an ans"})))
        await response.write(sse({"error": {"message": "the model crashed", "type": "server_error", "code": 500}}))
        await response.write_eof()
        return response

    fake.chat_hook = fails_midway
    proxy = await make_proxy(CHAT)
    text = ""
    with pytest.raises(anthropic.APIStatusError, match="the model crashed"):
        async with anthropic_client(proxy.url).messages.stream(
                model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "hi"}]) as events:
            async for piece in events.text_stream:
                text += piece
    assert text == "Half an ans"


async def test_what_a_chat_server_cannot_do_is_refused_before_it_is_asked(model: AgentModel, fake: FakeUpstream,
                                                                          make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(CHAT)
    with pytest.raises(anthropic.BadRequestError) as refused:
        await anthropic_client(proxy.url).messages.create(
            model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "what is new?"}],
            tools=[{"type": "web_search_20250305", "name": "web_search", "max_uses": 2}])
    assert refused.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert "web_search_20250305" in refused.value.body["error"]["message"]  # type: ignore[index]
    assert fake.requests == []


async def test_count_tokens_is_the_proxys_without_asking_a_chat_server(model: AgentModel, fake: FakeUpstream,
                                                                       make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(CHAT)
    raw = await anthropic_client(proxy.url).messages.with_raw_response.count_tokens(
        model=MODEL, system=SYSTEM, messages=[{"role": "user", "content": INSTRUCTION}])
    assert raw.headers["x-compaction-counted-by"] == "proxy" and (await raw.parse()).input_tokens > 20
    assert fake.requests == []
