"""The Responses API compacts like chat: the official SDK's agent loop, 1 instruction and 60 rounds of 2 parallel
tool calls, through the proxy to a model that enforces its window — JSON and streams."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from proxy.app import RunningServer
from tests.conftest import ProxyFactory
from tests.fakes.openai_upstream import FakeUpstream
from tests.fakes.responses_agent import INSTRUCTION, TOOLS, file_text, respond, run_agent
from tests.fakes.responses_model import OVERFLOW, ResponsesModel
from tests.fakes.summariser_requests import is_summarizer_request
from tests.fakes.windowed import WindowedModel
from tests.sdk import async_client

WINDOW = 8000
ROUNDS = 60


@pytest.fixture
def model(fake: FakeUpstream) -> ResponsesModel:
    responses = ResponsesModel(window=WINDOW)
    fake.responses_hook = responses
    fake.chat_hook = WindowedModel(window=32_768)  # the summariser's model, on chat completions
    return responses


def pairing_problems(body: dict[str, Any], model: ResponsesModel) -> list[str]:
    """Each output after its call with the same call_id; every reasoning item exactly as the model wrote it."""
    problems, called = [], set()
    for item in body["input"]:
        kind = item.get("type")
        if kind == "function_call":
            called.add(item["call_id"])
        elif kind == "function_call_output" and item["call_id"] not in called:
            problems.append(f"output {item['call_id']} before or without its call")
        elif kind == "reasoning" and item != model.reasoning[item["id"]]:
            problems.append(f"reasoning {item['id']} changed")
    return problems


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_an_agent_loop_runs_every_round_past_the_window(stream: bool, model: ResponsesModel,
                                                              fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy({"models": {"default": {"context_window": WINDOW}}})
    outcomes = await run_agent(async_client(proxy.url), ROUNDS, stream=stream)
    assert len(model.received) >= ROUNDS and max(model.prompts) <= WINDOW
    assert [problem for body in model.received for problem in pairing_problems(body, model)] == []
    assert all(INSTRUCTION in json.dumps(body["input"]) for body in model.received)
    # Without the proxy the history passes the window near round 17; with it a summary is made now and then and
    # reused by every later round that resends the same prefix.
    first = next(index for index, outcome in enumerate(outcomes) if outcome != "none")
    summaries = [call for call in fake.chat_requests() if is_summarizer_request(call.get("messages") or [])]
    assert first > 5 and "reused" in outcomes[first:]
    assert 1 <= len(summaries) <= 1 + (ROUNDS - first) / 4, (len(summaries), first, outcomes)
    assert "failed" not in outcomes


@pytest.mark.parametrize(("style", "stream"), [
    ("json", False), ("json", True), ("failed_response", False), ("failed_event", True), ("error_event", True),
])
async def test_an_overflow_in_any_shape_is_compacted_and_retried_once(style: str, stream: bool, model: ResponsesModel,
                                                                      make_proxy: ProxyFactory) -> None:
    """The upstream's window is smaller than the configured one: its refusal — a 400, a failed response, or a
    stream's response.failed or error event after the preamble — is compacted and retried, and the client sees
    only the answer."""
    model.overflow, model.window = style, 3000
    proxy = await make_proxy({"models": {"default": {"context_window": 100_000}}})
    client = async_client(proxy.url)
    items: list[Any] = [{"role": "user", "content": INSTRUCTION}]
    outcomes = []
    for _ in range(12):
        output, outcome = await respond(client, items, stream=stream)
        outcomes.append(outcome)
        items += output + [{"type": "function_call_output", "call_id": item["call_id"],
                            "output": file_text(item["call_id"])} for item in output if item["type"] == "function_call"]
    assert "reactive" in outcomes and "failed" not in outcomes
    refused = [prompt for prompt in model.prompts if prompt > model.window]
    retried = [index for index, prompt in enumerate(model.prompts) if prompt > model.window]
    # Each refusal was followed by exactly one smaller retry that fit.
    assert refused and all(model.prompts[index + 1] <= model.window for index in retried)
    assert [problem for body in model.received for problem in pairing_problems(body, model)] == []


@pytest.mark.parametrize(("fields", "reason"), [
    ({"previous_response_id": "resp_0"}, "history_upstream"),
    ({"conversation": "conv_1"}, "history_upstream"),
    ({"truncation": "auto"}, "upstream_manages_context"),
    ({"context_management": [{"type": "compaction", "compact_threshold": 1000}]}, "upstream_manages_context"),
])
async def test_a_history_the_proxy_cannot_shorten_is_forwarded_and_the_proxy_says_why(
        fields: dict[str, Any], reason: str, model: ResponsesModel, fake: FakeUpstream, make_proxy: ProxyFactory,
        caplog: pytest.LogCaptureFixture) -> None:
    """What the upstream keeps, or manages itself when it can (`upstream_compaction: true`), is its own."""
    model.window = 2000
    proxy = await make_proxy({"models": {"default": {"context_window": 2000}},
                              "dialects": {"responses": {"upstream_compaction": True}}})
    client = async_client(proxy.url)
    small = await client.responses.with_raw_response.create(model="m", input="hello", **fields)
    assert small.status_code == 200
    assert (small.headers["x-compaction"], small.headers["x-compaction-reason"]) == ("not-applicable", reason)
    big = [{"role": "user", "content": file_text(f"c{n}")} for n in range(30)]
    with caplog.at_level(logging.WARNING, logger="proxy.pipeline"), pytest.raises(openai.BadRequestError) as refused:
        await client.responses.create(model="m", input=big, **fields)
    # The upstream's own answer, untouched; the request was sent once, as the client wrote it.
    assert refused.value.response.json() == OVERFLOW
    assert refused.value.response.headers["x-compaction"] == "not-applicable"
    assert fake.requests[-1].json() == {"model": "m", "input": big, **fields}
    assert [json.loads(r.getMessage())["reason"] for r in caplog.records
            if "compaction_not_applicable" in r.getMessage()] == [reason]
    metrics = await metrics_text(proxy.url)
    assert 'compaction_proxy_requests_total{compaction="not-applicable",route="responses",status="400"} 1.0' \
        in metrics


@pytest.mark.parametrize("fields", [{"previous_response_id": "resp_0"}, {"conversation": "conv_1"},
                                    {"truncation": "auto"}])
async def test_with_compaction_off_a_request_the_proxy_would_leave_alone_goes_unread(
        fields: dict[str, Any], model: ResponsesModel, fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    """Off, every request goes as it came, so what only makes one the proxy leaves alone is not looked for: the body
    is relayed unread, even one its guards would refuse (nested deeper than the proxy reads), and the upstream
    judges it."""
    proxy = await make_proxy({"compaction": {"enabled": False}})
    nested: Any = "deep"
    for _ in range(150):
        nested = {"n": nested}
    body = {"model": "m", "input": [{"role": "user", "content": "hello", "metadata": nested}], **fields}
    sent = json.dumps(body, separators=(",", ":")).encode()
    async with aiohttp.ClientSession() as session, session.post(
            f"{proxy.url}/v1/responses", data=sent, headers={"Content-Type": "application/json"}) as response:
        assert response.status == 200, await response.text()
        assert response.headers["x-compaction"] == "none"
    assert fake.requests[-1].body == sent  # byte for byte


async def test_with_compaction_off_context_management_is_still_the_proxys(
        model: ResponsesModel, fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    """What the proxy acts on, on or off, is still looked for: a `context_management` entry is read and kept off
    the body the upstream sees (it does not compact)."""
    proxy = await make_proxy({"compaction": {"enabled": False}})
    client = async_client(proxy.url)
    managed = {"context_management": [{"type": "compaction", "compact_threshold": 50_000}]}
    answer = await client.responses.with_raw_response.create(model="m", input="hello", extra_body=managed)
    assert answer.status_code == 200
    assert "context_management" not in fake.requests[-1].json() and fake.requests[-1].json()["input"] == "hello"


async def metrics_text(base: str) -> str:
    async with aiohttp.ClientSession() as session, session.get(f"{base}/metrics") as response:
        return await response.text()


@pytest.mark.parametrize("path", ["/v1/responses", "/v1/chat/completions", "/v1/realtime"])
async def test_a_websocket_upgrade_is_refused_at_once_with_426(path: str, fake: FakeUpstream,
                                                               make_proxy: ProxyFactory) -> None:
    """Codex asks for Responses over WebSocket first and takes a 426 as "use HTTP" at once; anything else it
    retries with back-off. The answer comes before any upstream is asked, and the connection ends with it."""
    proxy = await make_proxy()
    reader, writer = await asyncio.open_connection(proxy.host, proxy.port)
    started = time.monotonic()
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
                     "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n".encode())
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 5)  # to the end: the proxy closes the connection
    finally:
        writer.close()
    took = time.monotonic() - started
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 426") and b"connection: close" in head.lower(), head
    assert json.loads(body)["error"]["code"] == "websocket_not_supported"
    assert took < 1 and fake.requests == []


async def test_a_websocket_client_sees_the_refusal_as_a_failed_handshake(make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy()
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await session.ws_connect(f"{proxy.url}/v1/responses")
    assert refused.value.status == 426


async def test_shadow_mode_reports_the_decision_and_forwards_byte_for_byte(model: ResponsesModel, fake: FakeUpstream,
                                                                        make_proxy: ProxyFactory) -> None:
    model.window = 100_000  # the upstream takes it all; the configured window says a compaction is due
    proxy = await make_proxy({"models": {"default": {"context_window": 4000}}, "compaction": {"mode": "shadow"}})
    body = json.dumps({"model": "m", "input": [{"role": "user", "content": file_text(f"c{n}")} for n in range(30)],
                       "tools": TOOLS}, indent=1).encode()
    async with aiohttp.ClientSession() as session, session.post(
            f"{proxy.url}/v1/responses", data=body, headers={"Content-Type": "application/json"}) as response:
        assert response.status == 200
        assert (response.headers["x-compaction"], response.headers["x-compaction-shadow"]) == ("none", "proactive")
        assert int(response.headers["x-compaction-shadow-tokens-after"]) < \
            int(response.headers["x-compaction-shadow-tokens-before"])
    assert [request.body for request in fake.requests if request.path == "/v1/responses"] == [body]


CORPUS = [entry for name in ("overflow_public.json", "overflow_more.json")
          for entry in json.loads((Path(__file__).parents[1] / "fixtures" / name).read_text(encoding="utf-8"))
          if entry["api"] == "responses"]


def long_input(rounds: int = 20) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [{"role": "user", "content": INSTRUCTION}]
    for n in range(rounds):
        call_id = f"call_h{n}"
        items += [{"type": "function_call", "call_id": call_id, "name": "read_file",
                   "arguments": json.dumps({"path": f"src/{n}.py"})},
                  {"type": "function_call_output", "call_id": call_id, "output": file_text(call_id)}]
    return items


@pytest.mark.parametrize("entry", CORPUS, ids=[entry["id"] for entry in CORPUS])
async def test_the_overflow_corpus_on_the_responses_route(entry: dict[str, Any], model: ResponsesModel,
                                                          fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    """Each Responses-shaped answer from the corpus, served by the upstream for a prompt past its window: an
    overflow is compacted and retried once; anything else reaches the client as the upstream sent it."""
    body = entry["body"] if isinstance(entry["body"], str) else json.dumps(entry["body"])
    model.window = 3000
    model.refusal = (entry["status"], body, entry["headers"]["content-type"].split(";")[0])
    proxy = await make_proxy({"models": {"default": {"context_window": 100_000}}})
    request = {"model": "m", "input": long_input(), "stream": entry["stream"]}
    async with aiohttp.ClientSession() as session, session.post(f"{proxy.url}/v1/responses", json=request) as answer:
        status, outcome, raw = answer.status, answer.headers.get("x-compaction"), await answer.read()
    if entry["is_context_overflow"]:
        assert (status, outcome) == (200, "reactive"), raw[:300]
        assert len(model.received) == 2 and model.prompts[1] <= model.window
    else:
        assert (status, raw) == (entry["status"], body.encode()) and outcome == "none"
        assert len(model.received) == 1


# --- property: random Responses bodies through a real proxy --------------------------------------------------

LEAF = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.text(max_size=20))
ITEM = st.one_of(
    st.builds(lambda text: {"role": "user", "content": text}, st.text(max_size=300)),
    st.builds(lambda n, text: {"type": "message", "role": "assistant",
                               "content": [{"type": "output_text", "text": text}]}, st.integers(0, 3), st.text()),
    st.builds(lambda n, args: {"type": "function_call", "call_id": f"c{n}", "name": "f", "arguments": args},
              st.integers(0, 5), st.text(max_size=40)),
    st.builds(lambda n, out: {"type": "function_call_output", "call_id": f"c{n}", "output": out},
              st.integers(0, 5), st.text(max_size=400)),
    st.builds(lambda n: {"type": "reasoning", "id": f"rs_{n}", "summary": [], "encrypted_content": "gAAA" * 10},
              st.integers(0, 5)),
    st.dictionaries(st.sampled_from(["type", "role", "content", "call_id", "output", "id"]), LEAF, max_size=4),
)



@st.composite
def histories(draw: st.DrawFn) -> list[Any]:
    """A coherent agent history (what the proxy compacts), now and then with a stray item somewhere in it."""
    items: list[Any] = [{"role": "user", "content": draw(st.text(min_size=1, max_size=200))}]
    for n in range(draw(st.integers(0, 12))):
        if draw(st.booleans()):
            items.append({"type": "reasoning", "id": f"rs_{n}", "summary": [], "encrypted_content": f"gAAA{n}"})
        items += [{"type": "function_call", "call_id": f"h{n}", "name": "read_file", "arguments": "{}"},
                  {"type": "function_call_output", "call_id": f"h{n}",
                   "output": draw(st.text(min_size=1, max_size=30)) * draw(st.integers(1, 40))}]
    if draw(st.integers(0, 4)) == 0:
        items.insert(draw(st.integers(0, len(items))), draw(ITEM))
    return items


RESPONSES_BODY = st.fixed_dictionaries(
    {"model": st.just("m"),
     "input": st.one_of(histories(), histories(), st.text(max_size=200), st.lists(ITEM, max_size=40), LEAF)},
    optional={"stream": st.booleans(), "previous_response_id": st.sampled_from(["resp_1", "", None]),
              "instructions": st.one_of(st.text(max_size=80), LEAF), "max_output_tokens": LEAF,
              "tools": st.one_of(st.just(TOOLS), LEAF)})


async def fixed_response(request: web.Request) -> web.StreamResponse:
    """The upstream's answer to anything: a completed response, streamed when asked."""
    body = json.loads(await request.read())
    done = {"id": "resp_x", "object": "response", "status": "completed", "error": None, "output": [],
            "usage": {"input_tokens": 50, "output_tokens": 5, "total_tokens": 55}}
    if body.get("stream") is not True:
        return web.json_response(done, headers={"x-from-upstream": "1"})
    stream = web.StreamResponse(headers={"Content-Type": "text/event-stream", "x-from-upstream": "1"})
    await stream.prepare(request)
    event = json.dumps({"type": "response.completed", "response": done})
    await stream.write(f"event: response.completed\ndata: {event}\n\n".encode())
    await stream.write_eof()
    return stream


_PROXY: dict[int, RunningServer] = {}


@given(body=RESPONSES_BODY)
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
async def test_random_responses_bodies_are_answered_never_with_a_5xx(body: dict[str, Any], fake: FakeUpstream,
                                                                     make_proxy: ProxyFactory) -> None:
    """Compacted (a 1,500-token window makes long ones due), forwarded, or refused with a 4xx in OpenAI's
    shape: never a 5xx, and a request the proxy did not shorten reaches the upstream byte for byte."""
    if fake.responses_hook is not fixed_response:  # the first example; later ones reuse the proxy
        fake.responses_hook, fake.chat_hook = fixed_response, WindowedModel(window=32_768)
        _PROXY[id(fake)] = await make_proxy({
            "models": {"default": {"context_window": 1500}, "summariser": {"context_window": 32_768}},
            "compaction": {"reserved_output_tokens": 100, "summarizer": {"model": "summariser"}}})
    proxy = _PROXY[id(fake)]
    fake.requests.clear()
    sent = json.dumps(body).encode()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session, session.post(
            f"{proxy.url}/v1/responses", data=sent, headers={"Content-Type": "application/json"}) as response:
        answer, outcome = await response.read(), response.headers.get("x-compaction")
        cleared = "x-compaction-cleared" in response.headers  # old tool results cleared: shorter, never longer
        event(f"status {response.status}, x-compaction {outcome}, cleared {cleared}")
        if response.headers.get("x-from-upstream") != "1":
            assert 400 <= response.status < 500, (response.status, answer[:300])
            assert set(json.loads(answer)["error"]) == {"message", "type", "param", "code"}
            return
    assert response.status == 200
    forwarded = [request.body for request in fake.requests if request.path == "/v1/responses"]
    assert len(forwarded) == 1
    if outcome in ("none", "not-applicable"):
        assert forwarded == [sent] if not cleared else len(forwarded[0]) < len(sent)
    elif outcome == "failed":  # no summary: as it came, or with a tool result too large for the window elided
        assert forwarded == [sent] or len(forwarded[0]) < len(sent)
    else:
        assert outcome in ("proactive", "reused") and len(forwarded[0]) < len(sent)


# --- POST /v1/responses/compact, and the proxy's compaction items on later requests -------------------------

async def test_another_issuers_compaction_item_travels_byte_for_byte(model: ResponsesModel, fake: FakeUpstream,
                                                                     make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy()
    body = {"model": "m", "input": [{"type": "compaction", "id": "cmp_1", "encrypted_content": "gAAAAB-openai"},
                                    {"role": "user", "content": "go on"}]}
    raw = json.dumps(body).encode()
    async with aiohttp.ClientSession() as session, session.post(f"{proxy.url}/v1/responses", data=raw) as response:
        assert response.status == 200
    assert [request.body for request in fake.requests if request.path == "/v1/responses"] == [raw]
