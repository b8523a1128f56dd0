"""Automatic compaction on the proxy path, driven by the openai SDK against a fake with an enforced window."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web

from proxy.core.plan import check_tool_pairing
from tests.conftest import ProxyFactory
from tests.fakes.openai_upstream import FakeUpstream, completion
from tests.fakes.summariser_requests import is_summarizer_request, summarised_text
from tests.fakes.windowed import FACT, Overflow, Received, WindowedModel
from tests.sdk import async_client

SYSTEM = {"role": "system", "content": "You keep a list of facts. Answer briefly."}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}}}}}]
WINDOW = 8192


def compaction_config(**compaction: Any) -> dict[str, Any]:
    return {"models": {"default": {"context_window": WINDOW}},
            "compaction": {"threshold": 0.8, "target": 0.5, "tail_budget": 0.25, **compaction}}


def user_turn(index: int) -> dict[str, Any]:
    filler = " ".join(f"word{index}x{n}" for n in range(60))
    return {"role": "user", "content": f"Remember FACT-{index}. {filler}"}


def big_history(turns: int) -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = [SYSTEM]
    for index in range(turns):
        history += [user_turn(index), {"role": "assistant", "content": f"Noted FACT-{index}. " + "ok " * 60}]
    return [*history, user_turn(turns)]


@pytest.fixture
def model(fake: FakeUpstream) -> WindowedModel:
    windowed = WindowedModel(window=WINDOW)
    fake.chat_hook = windowed
    return windowed


async def calibrated(client: openai.AsyncOpenAI, model: WindowedModel, api_key: str = "") -> None:
    """One small turn first, as every conversation has, so the proxy learns how the upstream counts tokens."""
    await client.chat.completions.create(model="fake-small", messages=big_history(1))
    model.received.clear()


def assert_fits_and_valid(model: WindowedModel, last_message: dict[str, Any]) -> None:
    for received in model.chat_calls:
        assert received.prompt_tokens <= model.window
        messages = received.body["messages"]
        assert check_tool_pairing(messages) == []
        assert json.dumps(messages[0]) == json.dumps(SYSTEM)
    assert model.chat_calls[-1].body["messages"][-1] == last_message


async def test_proactive_compaction_fits_the_window(model: WindowedModel, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(compaction_config())
    client = async_client(proxy.url)
    await calibrated(client, model)
    history = big_history(20)
    raw = await client.chat.completions.with_raw_response.create(model="fake-small", messages=history)
    assert raw.headers["x-compaction"] == "proactive"
    assert int(raw.headers["x-compaction-tokens-after"]) < int(raw.headers["x-compaction-tokens-before"])
    assert len(model.summarizer_calls) == 1 and len(model.chat_calls) == 1
    assert_fits_and_valid(model, history[-1])
    forwarded = model.chat_calls[0].body["messages"]
    assert forwarded[1]["role"] == "user" and "FACT-0" in forwarded[1]["content"]
    assert forwarded[2]["role"] == "assistant"
    assert raw.parse().choices[0].message.content.startswith("Noted: Remember FACT-20")


async def test_small_conversation_is_untouched(model: WindowedModel, fake: FakeUpstream,
                                               make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(compaction_config())
    body = json.dumps({"model": "fake-small", "messages": big_history(1), "unknown_field": [1, 2]}).encode()
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{proxy.url}/v1/chat/completions", data=body,
                                headers={"Content-Type": "application/json"}) as response:
            assert response.headers["x-compaction"] == "none"
    assert fake.requests[-1].body == body
    assert model.summarizer_calls == []


async def test_reactive_compaction_on_openai_overflow(model: WindowedModel, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(compaction_config(threshold=0))
    history = big_history(30)
    raw = await async_client(proxy.url).chat.completions.with_raw_response.create(
        model="fake-small", messages=history)
    assert raw.headers["x-compaction"] == "reactive"
    assert len(model.chat_calls) == 2 and len(model.summarizer_calls) >= 1
    assert model.chat_calls[0].prompt_tokens > WINDOW >= model.chat_calls[1].prompt_tokens
    summary = model.chat_calls[1].body["messages"][1]["content"]
    tail_facts = facts_in(json.dumps(model.chat_calls[1].body["messages"][3:]))
    assert facts_in(summary) | tail_facts == {f"FACT-{i}" for i in range(31)}


async def test_retry_that_still_overflows_returns_the_original_error(model: WindowedModel,
                                                                     make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(compaction_config(threshold=0))
    history = big_history(3)
    history[-1] = {"role": "user", "content": "FACT-x " + "huge " * 9000}
    direct_error = None
    with pytest.raises(openai.BadRequestError) as caught:
        await async_client(proxy.url).chat.completions.create(model="fake-small", messages=history)
    direct_error = caught.value
    assert direct_error.response.headers["x-compaction"] == "failed"
    assert direct_error.response.json()["error"]["code"] == "context_length_exceeded"
    assert "maximum context length is 8192" in direct_error.response.json()["error"]["message"]


async def test_summariser_down_returns_the_original_error(model: WindowedModel, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(compaction_config(threshold=0))
    model.summarizer_down = True
    with pytest.raises(openai.BadRequestError) as caught:
        await async_client(proxy.url).chat.completions.create(model="fake-small", messages=big_history(30))
    assert caught.value.status_code == 400
    assert caught.value.response.headers["x-compaction"] == "failed"
    assert caught.value.response.json()["error"]["code"] == "context_length_exceeded"
    assert len(model.chat_calls) == 1


async def test_concurrent_requests_share_one_summary(model: WindowedModel, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(compaction_config())
    model.summary_delay = 0.3
    client = async_client(proxy.url)
    await calibrated(client, model)
    history = big_history(20)
    results = await asyncio.gather(*(client.chat.completions.with_raw_response.create(
        model="fake-small", messages=history) for _ in range(20)))
    assert len(model.summarizer_calls) == 1
    assert {r.headers["x-compaction"] for r in results} <= {"proactive", "reused"}
    assert len(model.chat_calls) == 20


async def test_stored_summary_is_reused_by_the_next_turn(model: WindowedModel, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(compaction_config(background=False))
    client = async_client(proxy.url)
    await calibrated(client, model)
    history = big_history(20)
    first = await client.chat.completions.with_raw_response.create(model="fake-small", messages=history)
    assert first.headers["x-compaction"] == "proactive"
    history += [first.parse().choices[0].message.model_dump(exclude_none=True), user_turn(21)]
    second = await client.chat.completions.with_raw_response.create(model="fake-small", messages=history)
    assert second.headers["x-compaction"] == "reused"
    assert len(model.summarizer_calls) == 1
    assert_fits_and_valid(model, history[-1])


async def test_tenants_never_share_summaries(model: WindowedModel, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(compaction_config(background=False))
    history = big_history(20)
    await calibrated(async_client(proxy.url), model)
    for key in ("sk-tenant-a", "sk-tenant-b", "sk-tenant-a"):
        await async_client(proxy.url, api_key=key).chat.completions.create(model="fake-small", messages=history)
    assert len(model.summarizer_calls) == 2
    assert all("FACT-0" in summarised_text(c.body["messages"]) for c in model.summarizer_calls)


async def test_mode_header_off_and_force(model: WindowedModel, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(compaction_config())
    client = async_client(proxy.url)
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(model="fake-small", messages=big_history(30),
                                             extra_headers={"x-compaction-mode": "off"})
    assert caught.value.response.headers["x-compaction"] == "none"
    forced = await client.chat.completions.with_raw_response.create(
        model="fake-small", messages=big_history(3), extra_headers={"x-compaction-mode": "force"})
    assert forced.headers["x-compaction"] == "forced"
    with pytest.raises(openai.BadRequestError) as bad:
        await client.chat.completions.create(model="fake-small", messages=big_history(1),
                                             extra_headers={"x-compaction-mode": "sometimes"})
    assert bad.value.response.json()["error"]["param"] == "x-compaction-mode"


async def test_malformed_json_is_openai_shaped_400(model: WindowedModel, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(compaction_config())
    async with aiohttp.ClientSession() as session:
        for body in (b"{not json", b"\xff\xfe", b"[1, 2]"):
            async with session.post(f"{proxy.url}/v1/chat/completions", data=body) as response:
                assert response.status == 400
                assert set((await response.json())["error"]) == {"message", "type", "param", "code"}
    assert model.received == []


def facts_in(text: str) -> set[str]:
    return set(FACT.findall(text))


async def test_sqlite_store_reuses_a_summary_after_restart(model: WindowedModel, make_proxy: ProxyFactory,
                                                           tmp_path: Any) -> None:
    overrides = {**compaction_config(background=False),
                 "store": {"kind": "sqlite", "path": str(tmp_path / "summaries.db")}}
    first_proxy = await make_proxy(overrides)
    client = async_client(first_proxy.url)
    await calibrated(client, model)
    history = big_history(20)
    first = await client.chat.completions.with_raw_response.create(model="fake-small", messages=history)
    assert first.headers["x-compaction"] == "proactive"
    await first_proxy.stop()

    second_proxy = await make_proxy(overrides)
    history += [first.parse().choices[0].message.model_dump(exclude_none=True), user_turn(21)]
    second = await async_client(second_proxy.url).chat.completions.with_raw_response.create(
        model="fake-small", messages=history)
    assert second.headers["x-compaction"] == "reused"
    assert len(model.summarizer_calls) == 1


async def test_background_summary_is_ready_before_the_next_turn(model: WindowedModel,
                                                                make_proxy: ProxyFactory) -> None:
    """Without a mark to prepare at, the summary is started one turn before the threshold (summaries prepared
    ahead, the default, are tests/e2e/test_prepared_e2e.py's)."""
    proxy = await make_proxy(compaction_config(prepare_at=None))
    client = async_client(proxy.url)
    history = [SYSTEM]
    for turn in range(40):
        history.append(user_turn(turn))
        raw = await client.chat.completions.with_raw_response.create(model="fake-small", messages=history)
        history.append(raw.parse().choices[0].message.model_dump(exclude_none=True))
        assert raw.headers["x-compaction"] in ("none", "reused")
        if model.summarizer_calls:
            break
    assert model.summarizer_calls, "usage never passed the threshold"
    for _ in range(200):
        if await background_done(proxy.url):
            break
        await asyncio.sleep(0.01)
    history.append(user_turn(99))
    following = await client.chat.completions.with_raw_response.create(model="fake-small", messages=history)
    assert following.headers["x-compaction"] == "reused"
    assert len(model.summarizer_calls) == 1
    assert model.summarizer_calls[0].at < model.chat_calls[-1].at
    assert_fits_and_valid(model, history[-1])


async def background_done(proxy_url: str) -> bool:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{proxy_url}/metrics") as response:
            return 'compaction_proxy_compactions_total{trigger="background"} 1.0' in await response.text()


async def test_empty_stream_near_the_window_is_compacted_and_retried(model: WindowedModel,
                                                                     make_proxy: ProxyFactory) -> None:
    model.overflow = Overflow(200, "", "text/event-stream")
    proxy = await make_proxy(compaction_config(threshold=0))
    history = big_history(30)
    async with async_client(proxy.url).chat.completions.with_streaming_response.create(
            model="fake-small", messages=history, stream=True) as response:
        assert response.headers["x-compaction"] == "reactive"
        text = "".join([c.choices[0].delta.content or "" async for c in await response.parse() if c.choices])
    assert text.startswith("Noted: Remember FACT-30")
    assert len(model.chat_calls) == 2


async def test_empty_stream_far_from_the_window_passes_through(model: WindowedModel,
                                                               make_proxy: ProxyFactory) -> None:
    model.always_answer = Overflow(200, "", "text/event-stream")
    proxy = await make_proxy(compaction_config(threshold=0))
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{proxy.url}/v1/chat/completions",
                                json={"model": "m", "messages": big_history(1), "stream": True}) as response:
            assert (response.status, await response.read()) == (200, b"")
            assert response.headers["x-compaction"] == "none"
    assert model.summarizer_calls == []


async def test_usage_chunk_reaches_only_clients_that_asked(model: WindowedModel, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(compaction_config())
    client = async_client(proxy.url)
    for asked in (False, True):
        options = {"stream_options": {"include_usage": True}} if asked else {}
        stream = await client.chat.completions.create(model="fake-small", messages=big_history(1), stream=True,
                                                      **options)
        chunks = [chunk async for chunk in stream]
        usage_chunks = [c for c in chunks if not c.choices and c.usage is not None]
        assert len(usage_chunks) == (1 if asked else 0)
        assert model.chat_calls[-1].body["stream_options"] == {"include_usage": True}


async def test_store_failure_keeps_serving(model: WindowedModel, make_proxy: ProxyFactory, tmp_path: Any) -> None:
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")
    proxy = await make_proxy({**compaction_config(), "store": {"kind": "sqlite", "path": str(blocked / "x.db")}})
    client = async_client(proxy.url)
    await calibrated(client, model)
    raw = await client.chat.completions.with_raw_response.create(model="fake-small", messages=big_history(20))
    assert raw.headers["x-compaction"] == "proactive"
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{proxy.url}/readyz") as response:
            assert response.status == 503 and (await response.json())["store"] == "unreachable"
        async with session.get(f"{proxy.url}/metrics") as response:
            assert 'compaction_proxy_store_errors_total{operation="put"} 1.0' in await response.text()


async def test_model_that_manages_its_own_context_is_left_alone(model: WindowedModel,
                                                                make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy({**compaction_config(),
                              "models": {"default": {"context_window": WINDOW},
                                         "self-managing": {"context_window": WINDOW, "manages_own_context": True}}})
    with pytest.raises(openai.BadRequestError) as caught:
        await async_client(proxy.url).chat.completions.create(model="self-managing", messages=big_history(30))
    assert caught.value.response.headers["x-compaction"] == "none"
    assert model.summarizer_calls == []


async def test_summariser_uses_the_client_credentials(model: WindowedModel, fake: FakeUpstream,
                                                      make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(compaction_config())
    client = async_client(proxy.url, api_key="sk-client-key")
    await calibrated(client, model)
    await client.chat.completions.create(model="fake-small", messages=big_history(20))
    summariser_requests = [r for r in fake.requests if r.path.endswith("/chat/completions")
                           and is_summarizer_request(json.loads(r.body)["messages"])]
    assert [r.headers["Authorization"] for r in summariser_requests] == ["Bearer sk-client-key"]
    assert "x-compaction-mode" not in {name.lower() for r in fake.requests for name in r.headers}


async def test_separate_summariser_upstream_model_and_key(model: WindowedModel, fake: FakeUpstream,
                                                          make_proxy: ProxyFactory) -> None:
    from tests.conftest import serve_app
    from tests.fakes.openai_upstream import FakeUpstreamApp

    summariser_fake = FakeUpstream()
    summariser_model = WindowedModel(window=32768)
    summariser_fake.chat_hook = summariser_model
    runner, url = await serve_app(FakeUpstreamApp(summariser_fake).build())
    try:
        proxy = await make_proxy(compaction_config(summarizer={
            "model": "summary-model", "upstream": {"base_url": f"{url}/v1", "api_key": "sk-summaries"}}))
        client = async_client(proxy.url)
        await calibrated(client, model)
        raw = await client.chat.completions.with_raw_response.create(model="fake-small", messages=big_history(20))
    finally:
        await runner.cleanup()
    assert raw.headers["x-compaction"] == "proactive"
    assert model.summarizer_calls == [] and len(summariser_model.summarizer_calls) == 1
    assert summariser_model.summarizer_calls[0].body["model"] == "summary-model"
    assert summariser_fake.requests[0].headers["Authorization"] == "Bearer sk-summaries"


async def test_window_named_in_an_overflow_error_is_learned(model: WindowedModel,
                                                            make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy({"compaction": {"threshold": 0.8}})     # the proxy believes in a 128k window
    client = async_client(proxy.url)
    first = await client.chat.completions.with_raw_response.create(model="fake-small", messages=big_history(30))
    assert first.headers["x-compaction"] == "reactive"
    chat_calls = len(model.chat_calls)
    history = big_history(30)
    history[1] = user_turn(1000)                                       # a new conversation, as large
    second = await client.chat.completions.with_raw_response.create(model="fake-small", messages=history)
    assert second.headers["x-compaction"] == "proactive"
    assert len(model.chat_calls) == chat_calls + 1                     # no overflow reached the upstream


async def test_one_structured_log_line_per_compaction_without_text(model: WindowedModel, make_proxy: ProxyFactory,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    proxy = await make_proxy(compaction_config())
    client = async_client(proxy.url, api_key="sk-secret-key-123")
    await calibrated(client, model)
    with caplog.at_level("INFO", logger="proxy.compaction"):
        await client.chat.completions.create(model="fake-small", messages=big_history(20))
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "proxy.compaction"]
    assert len(lines) == 1
    event = lines[0]
    assert event["trigger"] == "proactive" and event["summarizer_calls"] == 1
    assert event["replacement_tokens"] < event["replaced_tokens"]
    assert event["replacement_messages"] < event["prefix_len"]
    assert "tokens_before" not in event  # that name is the whole request's, in the headers and the access log
    assert event["summarizer_prompt_tokens"] > 0 and event["duration_ms"] >= 0
    everything = "\n".join(r.getMessage() for r in caplog.records)
    assert "FACT-" not in everything and "sk-secret-key-123" not in everything


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
async def test_summariser_output_limit_field(field: str, model: WindowedModel, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(compaction_config(summarizer={"output_limit_field": field}))
    client = async_client(proxy.url)
    await calibrated(client, model)
    await client.chat.completions.create(model="fake-small", messages=big_history(20))
    body = model.summarizer_calls[0].body
    other = {"max_tokens", "max_completion_tokens"} - {field}
    assert isinstance(body[field], int) and body[field] > 0 and not other & set(body)


@pytest.mark.parametrize("temperature", [None, 0])
async def test_summariser_temperature(temperature: float | None, model: WindowedModel,
                                      make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(compaction_config(summarizer={"temperature": temperature}))
    client = async_client(proxy.url)
    await calibrated(client, model)
    await client.chat.completions.create(model="fake-small", messages=big_history(20))
    assert model.summarizer_calls[0].body.get("temperature", "unset") == ("unset" if temperature is None else 0)


async def test_retry_that_cannot_reach_the_upstream_returns_the_original_error(
        model: WindowedModel, fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(compaction_config(threshold=0))
    original_hook = fake.chat_hook
    chat_calls = 0

    async def drop_the_retry(request: Any, body: dict[str, Any], state: FakeUpstream) -> Any:
        nonlocal chat_calls
        is_summary = is_summarizer_request(body["messages"])
        chat_calls += 0 if is_summary else 1
        if chat_calls >= 2 and not is_summary and request.transport is not None:
            request.transport.abort()          # the retry (and its reconnect): the connection dies unanswered
            await asyncio.sleep(0.1)
        return await original_hook(request, body, state)

    fake.chat_hook = drop_the_retry
    with pytest.raises(openai.BadRequestError) as caught:
        await async_client(proxy.url).chat.completions.create(model="fake-small", messages=big_history(30))
    assert caught.value.response.headers["x-compaction"] == "failed"
    assert caught.value.response.json()["error"]["code"] == "context_length_exceeded"


def summariser_replying(model: WindowedModel, text: str) -> Any:
    """A chat hook: summariser requests are recorded and answered with `text`, the rest go to `model`."""
    async def hook(request: Any, body: dict[str, Any], state: FakeUpstream) -> Any:
        if is_summarizer_request(body.get("messages") or []):
            model.received.append(Received(0.0, body, 0, True))
            return web.json_response(completion(body, text))
        return await WindowedModel.__call__(model, request, body, state)
    return hook


def varied_words(count: int) -> str:
    """`count` words that do not repeat (note0 note1 …): a long summary as a model writes one, which no check takes
    for a loop."""
    return " ".join(f"note{index}" for index in range(count))


async def summarised_by(reply: str, model: WindowedModel, fake: FakeUpstream, make_proxy: ProxyFactory,
                        **summarizer: Any) -> openai.AsyncOpenAI:
    """A client of a calibrated proxy (no background summaries) whose summariser replies `reply`."""
    proxy = await make_proxy(compaction_config(background=False, summarizer=summarizer))
    client = async_client(proxy.url)
    fake.chat_hook = model
    await calibrated(client, model)
    fake.chat_hook = summariser_replying(model, reply)
    return client


async def test_a_summary_longer_than_the_window_allows_loses_its_middle_and_the_conversation_goes_on(
        model: WindowedModel, fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    # Parts kept side by side can add up like this.
    client = await summarised_by(f"FACT-0 {varied_words(8000)} FACT-LAST", model, fake, make_proxy)
    history = big_history(20)
    first = await client.chat.completions.with_raw_response.create(model="fake-small", messages=history)
    assert first.headers["x-compaction"] == "proactive"
    assert first.parse().choices[0].message.content
    assert all(call.prompt_tokens <= model.window for call in model.chat_calls)
    forwarded = json.dumps(model.chat_calls[-1].body["messages"])
    assert "FACT-0" in forwarded and "FACT-LAST" in forwarded, "both ends of the summary are kept"
    assert "were left out here by the proxy" in forwarded and varied_words(8000) not in forwarded
    fake.chat_hook = model
    second = await client.chat.completions.with_raw_response.create(model="fake-small", messages=history)
    assert second.headers["x-compaction"] == "reused", "the shortened summary is stored and spliced in again"


def failing_command(number: int) -> list[dict[str, Any]]:
    arguments = json.dumps({"command": f"pytest -k shard_{number}"})
    return [{"role": "assistant", "content": None,
             "tool_calls": [{"id": f"call_{number}", "type": "function",
                             "function": {"name": "run_command", "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": f"call_{number}",
             "content": f"collected 3 items\nE   ShardError: checksum mismatch in shard {number}"}]


def history_with_a_failing_command(turns: int) -> list[dict[str, Any]]:
    history = big_history(turns)
    return [*history[:3], *failing_command(77), *history[3:]]


@pytest.mark.parametrize("evidence", [True, False], ids=["evidence", "no-evidence"])
async def test_a_failing_command_the_summary_left_out_is_added_verbatim(evidence: bool, model: WindowedModel,
                                                                         make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(compaction_config(background=False, summarizer={"evidence": evidence}))
    client = async_client(proxy.url)
    await calibrated(client, model)
    history = history_with_a_failing_command(20)
    raw = await client.chat.completions.with_raw_response.create(model="fake-small", messages=history)
    assert raw.headers["x-compaction"] == "proactive"
    summariser_input = json.dumps(model.summarizer_calls[0].body)
    assert "checksum mismatch in shard 77" in summariser_input
    forwarded = model.chat_calls[-1].body["messages"]
    summary = next(m["content"] for m in forwarded if m["role"] == "user" and "# Conversation Summary" in m["content"])
    assert "FACT-0" in summary, "the model's own summary stays"
    quoted = "`pytest -k shard_77` output: `E   ShardError: checksum mismatch in shard 77`"
    assert (quoted in summary) is evidence
    assert all(call.prompt_tokens <= model.window for call in model.chat_calls)


async def test_evidence_follows_a_reply_that_did_not_parse_which_stays_verbatim(
        model: WindowedModel, fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    client = await summarised_by("The user keeps a list of facts, FACT-0 onwards.", model, fake, make_proxy)
    raw = await client.chat.completions.with_raw_response.create(model="fake-small",
                                                                 messages=history_with_a_failing_command(20))
    assert raw.headers["x-compaction"] == "proactive"
    summary = model.chat_calls[-1].body["messages"][1]["content"]
    assert summary.startswith("The user keeps a list of facts, FACT-0 onwards.\n\n# Conversation Summary")
    assert "E   ShardError: checksum mismatch in shard 77" in summary


async def compacted_with(reply: str, evidence: bool, model: WindowedModel, fake: FakeUpstream,
                         make_proxy: ProxyFactory) -> tuple[str, list[int]]:
    """x-compaction of one proactive turn whose summariser replies `reply`, and the chat calls' prompt tokens."""
    model.received.clear()
    client = await summarised_by(reply, model, fake, make_proxy, evidence=evidence)
    try:
        raw = await client.chat.completions.with_raw_response.create(model="fake-small",
                                                                     messages=history_with_a_failing_command(20))
        outcome = raw.headers["x-compaction"]
    except openai.BadRequestError as error:
        outcome = error.response.headers["x-compaction"]
    return outcome, [call.prompt_tokens for call in model.chat_calls]


@pytest.mark.parametrize("evidence", [True, False], ids=["evidence", "no-evidence"])
async def test_a_summary_of_any_length_leaves_a_compacted_request_inside_the_window(
        evidence: bool, model: WindowedModel, fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    # A reply far too long is elided; one a little shorter used to fit alone but not beside the recent turns, so
    # the retry overflowed and the compaction failed, every turn. Whatever length the model writes, the compacted
    # request must fit, and the evidence may take only what the window leaves.
    for words in range(100, 8000, 100):
        outcome, prompts = await compacted_with(f"FACT-0 {varied_words(words)}", evidence, model, fake, make_proxy)
        assert outcome == "proactive", f"{words} words: {outcome}"
        assert all(tokens <= model.window for tokens in prompts), f"{words} words: {prompts}"
        summary = next(str(m["content"]) for m in model.chat_calls[-1].body["messages"]
                       if "FACT-0" in str(m["content"]))
        assert "FACT-0 note0" in summary, f"{words} words: the summary's start is kept"


async def test_with_room_the_evidence_is_added(model: WindowedModel, fake: FakeUpstream,
                                               make_proxy: ProxyFactory) -> None:
    quoted, _ = await compacted_with(f"FACT-0 {varied_words(100)}", True, model, fake, make_proxy)
    summary = next(m["content"] for m in model.chat_calls[-1].body["messages"] if "FACT-0 note0" in str(m["content"]))
    assert quoted == "proactive" and "checksum mismatch in shard 77" in summary


def file_read(number: int, words: int) -> list[dict[str, Any]]:
    arguments = json.dumps({"path": f"src/module_{number}.py"})
    return [{"role": "assistant", "content": None,
             "tool_calls": [{"id": f"read_{number}", "type": "function",
                             "function": {"name": "read_file", "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": f"read_{number}",
             "content": " ".join(f"line{number}x{n}" for n in range(words))}]


async def test_the_evidence_fills_what_the_target_leaves_when_the_tail_cannot(
        model: WindowedModel, fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    # The recent turns are kept whole or not at all: here the turn before the last question is a file read too
    # long for the tail's share, so that share goes unused, and forty failing commands need more than the
    # summary's own allotment. What the target leaves takes them; the compacted request stays within the target.
    client = await summarised_by("FACT-0 the tests fail in many shards.", model, fake, make_proxy)
    history = [SYSTEM, {"role": "user", "content": "Make the shard tests pass."},
               *(message for number in range(100, 140) for message in failing_command(number)),
               *(message for number in range(3) for message in file_read(number, 1000)),
               {"role": "assistant", "content": "Read them all."}, {"role": "user", "content": "What now?"}]
    raw = await client.chat.completions.with_raw_response.create(model="fake-small", messages=history)
    assert raw.headers["x-compaction"] == "proactive"
    forwarded = model.chat_calls[-1]
    summary = next(str(m["content"]) for m in forwarded.body["messages"] if "FACT-0" in str(m["content"]))
    quoted = [number for number in range(100, 140) if f"checksum mismatch in shard {number}" in summary]
    assert len(quoted) == 40, f"quoted {len(quoted)} of 40: {quoted}"
    assert forwarded.prompt_tokens <= WINDOW * 0.5, "the compacted request lands within the target"
