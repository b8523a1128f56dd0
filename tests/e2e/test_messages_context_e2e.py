"""Anthropic's context management through the proxy for a Messages server that has none: the official SDK's beta
`messages.create` and `messages.stream` with each edit type and on-demand compaction, the `applied_edits` report,
the compaction blocks a client sends back, failures told in the body, the headers, the log and the metrics — and,
in front of a server that has it, every request forwarded byte for byte."""

from __future__ import annotations

import json
import logging
from typing import Any

import aiohttp
import anthropic
import pytest

from tests.conftest import ProxyFactory
from tests.fakes.messages_agent import MAX_TOKENS, MODEL, SYSTEM, TOOLS, anthropic_client, file_text
from tests.fakes.messages_model import MessagesModel
from tests.fakes.openai_upstream import FakeUpstream
from tests.fakes.windowed import WindowedModel

WINDOW = 16_000
BETAS = ["context-management-2025-06-27", "compact-2026-01-12"]
INSTRUCTION = "Read every file of the project, one round at a time, and report what each one defines."


@pytest.fixture
def model(fake: FakeUpstream) -> MessagesModel:
    messages = MessagesModel(window=WINDOW)  # a Messages server without context management: it refuses its fields
    fake.messages_hook = messages
    fake.chat_hook = WindowedModel(window=32_768)  # the summariser's model, on chat completions
    return messages


async def turn(client: anthropic.AsyncAnthropic, messages: list[Any], *, stream: bool,
               **options: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """One beta turn: the message as the SDK parsed it (unset fields left out), and the response headers."""
    request: dict[str, Any] = {"model": MODEL, "max_tokens": MAX_TOKENS, "system": SYSTEM, "tools": TOOLS,
                               "messages": messages, "betas": BETAS, **options}
    if not stream:
        raw = await client.beta.messages.with_raw_response.create(**request)
        return (await raw.parse()).model_dump(exclude_unset=True), dict(raw.headers)
    async with client.beta.messages.stream(**request) as events:
        message = await events.get_final_message()
        headers = dict(events.response.headers)
    return message.model_dump(exclude_unset=True), headers


async def agent(client: anthropic.AsyncAnthropic, rounds: int, *, stream: bool,
                **options: Any) -> list[tuple[dict[str, Any], dict[str, str]]]:
    """A tool loop that keeps every message as returned (compaction blocks included) and answers each tool_use."""
    messages: list[Any] = [{"role": "user", "content": INSTRUCTION}]
    turns = []
    for _ in range(rounds):
        message, headers = await turn(client, messages, stream=stream, **options)
        turns.append((message, headers))
        content = message["content"]
        messages.append({"role": "assistant", "content": content})
        uses = [block for block in content if block["type"] == "tool_use"]
        if not uses:  # paused after a compaction: resend as it is, as Anthropic's docs say, and the turn goes on
            continue
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": use["id"], "content": file_text(use["id"])} for use in uses]})
    return turns


def results_of(body: dict[str, Any]) -> list[str]:
    return [block["content"] for message in body["messages"] if message["role"] == "user"
            and isinstance(message["content"], list) for block in message["content"] if block["type"] == "tool_result"]


async def metrics_text(url: str) -> str:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/metrics") as response:
        return await response.text()


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_tool_results_are_cleared_past_the_trigger_and_reported(
        stream: bool, model: MessagesModel, fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy({"models": {"default": {"context_window": WINDOW}}})
    edit = {"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 3000},
            "keep": {"type": "tool_uses", "value": 4}, "clear_at_least": {"type": "input_tokens", "value": 500}}
    turns = await agent(anthropic_client(proxy.url), 12, stream=stream, context_management={"edits": [edit]})
    reports = [message["context_management"]["applied_edits"] for message, _ in turns]
    cleared = [index for index, report in enumerate(reports) if report]
    assert cleared and cleared == list(range(cleared[0], 12))  # from the trigger on, every turn
    for index in cleared:
        [report] = reports[index]
        assert report["type"] == "clear_tool_uses_20250919" and report["cleared_input_tokens"] >= 500
        body = model.received[index]
        placeholders = [text for text in results_of(body) if text.startswith("[cleared to save context")]
        assert len(placeholders) == report["cleared_tool_uses"] == len(results_of(body)) - 4
        assert turns[index][1]["x-compaction-edits"] == "clear_tool_uses_20250919=applied"
    assert all("clear_tool_uses_20250919=not_triggered" in headers["x-compaction-edits"]
               for _, headers in turns[:cleared[0]])
    # No summary was needed: clearing kept the loop under the proxy's own threshold.
    assert fake.chat_hook.summarizer_calls == [] and [model.problem(body) for body in model.received] == [None] * 12
    text = await metrics_text(proxy.url)
    assert f'compaction_proxy_context_edits_total{{edit="clear_tool_uses_20250919",outcome="applied"}} ' \
           f'{float(len(cleared))}' in text


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_the_compaction_edit_announces_a_block_that_stands_for_the_conversation(
        stream: bool, model: MessagesModel, fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy({"models": {"default": {"context_window": WINDOW}}})
    edit = {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 6000},
            "instructions": "Name every file read so far."}
    turns = await agent(anthropic_client(proxy.url), 24, stream=stream, context_management={"edits": [edit]})
    assert all(any(block["type"] == "tool_use" for block in message["content"]) for message, _ in turns)
    compacted = [index for index, (message, _) in enumerate(turns) if message["content"][0]["type"] == "compaction"]
    assert len(compacted) >= 2, [headers.get("x-compaction") for _, headers in turns]
    for index in compacted:
        message, headers = turns[index]
        block = message["content"][0]
        assert block["content"] and block["encrypted_content"].startswith("cpx2.")
        # Compacted now, from a summary prepared ahead, or from a summary built in the background after the turn
        # before.
        assert (headers["x-compaction"], headers["x-compaction-edits"]) in (
            ("proactive", "compaction=applied"), ("reactive", "compaction=applied"),
            ("prepared", "compaction=applied"), ("reused", "compaction=reused"))
    # The client resends every message it kept; the proxy starts from the latest block, so what reaches the model
    # stays small however long the client's list grows.
    assert max(model.prompts) + MAX_TOKENS <= WINDOW
    assert len(model.received[-1]["messages"]) < 2 * 24 // 2
    assert [model.problem(body) for body in model.received] == [None] * len(model.received)
    # The client's instructions reached the summariser, below the proxy's own.
    assert all("Name every file read so far." in json.dumps(call.body) for call in fake.chat_hook.summarizer_calls)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_pause_after_compaction_answers_the_block_alone_and_the_next_request_goes_on(
        stream: bool, model: MessagesModel, fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy({"models": {"default": {"context_window": WINDOW}}})
    edit = {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 5000},
            "pause_after_compaction": True}
    turns = await agent(anthropic_client(proxy.url), 16, stream=stream, context_management={"edits": [edit]})
    paused = [index for index, (message, _) in enumerate(turns) if message["stop_reason"] == "compaction"]
    assert paused, [message["stop_reason"] for message, _ in turns]
    for index in paused:
        message, headers = turns[index]
        assert [block["type"] for block in message["content"]] == ["compaction"]
        assert message["content"][0]["content"] and message["context_management"] == {"applied_edits": []}
        assert headers["x-compaction"] in ("proactive", "prepared")  # made now, or ahead and spliced in now
    assert paused[0] + 1 < len(turns)
    for index in paused:
        if index + 1 < len(turns):
            assert turns[index + 1][0]["stop_reason"] == "tool_use"  # sent again as it was, the turn goes on
    assert len(model.received) == 16 - len(paused)  # nothing was sampled for a paused turn


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_on_demand_compaction_is_answered_by_the_proxy(stream: bool, model: MessagesModel, fake: FakeUpstream,
                                                             make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy({"models": {"default": {"context_window": WINDOW}}})
    client = anthropic_client(proxy.url)
    history = [message for message, _ in await agent(client, 4, stream=False)]
    messages: list[Any] = [{"role": "user", "content": INSTRUCTION}]
    for message in history:
        uses = [block for block in message["content"] if block["type"] == "tool_use"]
        messages += [{"role": "assistant", "content": message["content"]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"],
                                                   "content": file_text(use["id"])} for use in uses]}]
    sent = len(model.received)
    message, headers = await turn(client, messages, stream=stream,
                                  compaction={"type": "summarize", "instructions": "Only the files."})
    assert len(model.received) == sent  # nothing sampled: the proxy answered
    assert message["stop_reason"] == "compaction" and [block["type"] for block in message["content"]] == ["compaction"]
    assert headers["x-compaction"] == "requested" and message["usage"]["input_tokens"] > 0
    # The block goes first in the next request, in place of what it summarises; the model sees the sealed
    # conversation, never the block.
    follow, _ = await turn(client, [{"role": "assistant", "content": message["content"]},
                                    {"role": "user", "content": "Go on."}], stream=False)
    assert follow["stop_reason"] == "tool_use" and model.problem(model.received[-1]) is None
    assert INSTRUCTION in json.dumps(model.received[-1]["messages"])


async def test_an_on_demand_compaction_that_fails_is_a_502_and_nothing_is_sent(
        model: MessagesModel, fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    fake.chat_hook.summarizer_down = True
    proxy = await make_proxy()
    messages = [{"role": "user", "content": INSTRUCTION}, {"role": "assistant", "content": "I will read them."},
                {"role": "user", "content": "Go on."}]
    with pytest.raises(anthropic.InternalServerError) as failed:
        await turn(anthropic_client(proxy.url), messages, stream=False, compaction={"type": "summarize"})
    assert failed.value.status_code == 502 and model.received == []
    body = failed.value.body
    assert isinstance(body, dict) and body["type"] == "error"


async def test_a_failed_compaction_is_told_everywhere_and_the_answer_stands(
        model: MessagesModel, fake: FakeUpstream, make_proxy: ProxyFactory, caplog: pytest.LogCaptureFixture) -> None:
    fake.chat_hook.summarizer_down = True
    proxy = await make_proxy({"models": {"default": {"context_window": WINDOW}}})
    edit = {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 3000}}
    with caplog.at_level(logging.INFO, logger="proxy.pipeline"):
        turns = await agent(anthropic_client(proxy.url), 6, stream=False, context_management={"edits": [edit]})
    failed = [(message, headers) for message, headers in turns if headers["x-compaction"] == "failed"]
    assert failed
    for message, headers in failed:
        assert message["content"][0] == {"type": "compaction", "content": None}  # Anthropic's sign of a failure
        assert message["content"][1]["type"] in ("thinking", "tool_use") and message["stop_reason"] == "tool_use"
        assert "compaction=failed" in headers["x-compaction-edits"]
    logged = [json.loads(record.getMessage()) for record in caplog.records
              if record.getMessage().startswith('{"event": "context_edits"')]
    assert any(line["edits"].get("compaction") == "failed" for line in logged)
    assert 'compaction_proxy_context_edits_total{edit="compaction",outcome="failed"}' in await metrics_text(proxy.url)


@pytest.mark.parametrize(("options", "param"), [
    ({"context_management": {"edits": [{"type": "clear_tool_uses_20250919", "keep": {"type": "tool_uses",
                                                                                     "value": -1}}]}},
     "context_management.edits[0].keep"),
    ({"context_management": {"edits": [{"type": "clear_tool_uses_20250919"},
                                       {"type": "clear_thinking_20251015"}]}}, "context_management.edits[1]"),
    ({"context_management": {"edits": []}, "compaction": {"type": "summarize"}}, "compaction"),
])
async def test_a_knob_the_proxy_cannot_honour_is_refused(options: dict[str, Any], param: str, model: MessagesModel,
                                                         make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy()
    with pytest.raises(anthropic.BadRequestError) as refused:
        await turn(anthropic_client(proxy.url), [{"role": "user", "content": "hi"}], stream=False, **options)
    body = refused.value.body
    assert isinstance(body, dict) and body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert param in body["error"]["message"] or param.split(".")[-1] in body["error"]["message"]
    assert model.received == []


async def test_in_front_of_a_server_that_manages_context_every_request_goes_byte_for_byte(
        fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    model = MessagesModel(window=WINDOW, manages_context=True)
    fake.messages_hook = model
    proxy = await make_proxy({"dialects": {"messages": {"upstream_context_management": True}}})
    bodies = [
        {"model": MODEL, "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}],
         "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns",
                                                                                      "value": 1}},
                                          {"type": "clear_tool_uses_20250919", "placeholder": "kept as sent"},
                                          {"type": "compact_20260112"}]}},
        {"model": MODEL, "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}],
         "compaction": {"type": "summarize"}},
        {"model": MODEL, "max_tokens": 64, "messages": [
            {"role": "assistant", "content": [{"type": "compaction", "content": "s", "signature": "x"}]},
            {"role": "user", "content": "hi"}]},
    ]
    raws = [json.dumps(body).encode() for body in bodies]
    async with aiohttp.ClientSession() as session:
        for raw in raws:
            async with session.post(f"{proxy.url}/v1/messages", data=raw,
                                    headers={"content-type": "application/json"}) as response:
                assert response.status in (200, 400)
    assert [request.body for request in fake.requests if request.path == "/v1/messages"] == raws


async def test_with_compaction_off_the_clearing_edits_still_apply_and_the_compaction_edit_says_off(
        model: MessagesModel, fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy({"compaction": {"enabled": False}})
    edits = [{"type": "clear_tool_uses_20250919", "trigger": {"type": "tool_uses", "value": 2},
              "keep": {"type": "tool_uses", "value": 1}}, {"type": "compact_20260112"}]
    turns = await agent(anthropic_client(proxy.url), 5, stream=False, context_management={"edits": edits})
    message, headers = turns[-1]
    # The last request holds 4 rounds of 2 parallel calls: all but the last one cleared.
    assert message["context_management"]["applied_edits"][0]["cleared_tool_uses"] == 7
    assert headers["x-compaction"] == "none"
    assert headers["x-compaction-edits"] == "clear_tool_uses_20250919=applied, compaction=off"
    assert len([text for text in results_of(model.received[-1]) if text.startswith("[cleared")]) == 7


@pytest.mark.parametrize("upstream_counts", [False, True], ids=["estimated", "upstream"])
async def test_count_tokens_counts_the_request_as_it_would_be_sent(
        upstream_counts: bool, model: MessagesModel, fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    """Anthropic's count applies the edits and says what the request held before them; a server without context
    management never sees its fields (the fake would refuse them)."""
    fake.count_tokens = upstream_counts
    proxy = await make_proxy()
    client = anthropic_client(proxy.url)
    history = await agent(client, 5, stream=False)
    messages: list[Any] = [{"role": "user", "content": INSTRUCTION}]
    for message, _ in history:
        uses = [block for block in message["content"] if block["type"] == "tool_use"]
        messages += [{"role": "assistant", "content": message["content"]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"],
                                                   "content": file_text(use["id"])} for use in uses]}]
    edit = {"type": "clear_tool_uses_20250919", "trigger": {"type": "tool_uses", "value": 1},
            "keep": {"type": "tool_uses", "value": 2}}
    raw = await client.beta.messages.with_raw_response.count_tokens(
        model=MODEL, system=SYSTEM, tools=TOOLS, messages=messages, betas=BETAS, context_management={"edits": [edit]})
    counted = (await raw.parse()).model_dump()
    assert 0 < counted["input_tokens"] < counted["context_management"]["original_input_tokens"]
    assert ("x-compaction-counted-by" in raw.headers) is not upstream_counts
    if upstream_counts:  # both counts the upstream's own, of bodies without the fields it does not know
        assert model.counted[-2:] == [counted["input_tokens"], counted["context_management"]["original_input_tokens"]]
    plain = await client.messages.count_tokens(model=MODEL, system=SYSTEM, tools=TOOLS, messages=messages)
    assert plain.input_tokens == counted["context_management"]["original_input_tokens"]
