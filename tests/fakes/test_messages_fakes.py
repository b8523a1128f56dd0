"""The Messages API fakes, checked on their own through real sockets: the official SDK's agent loop runs against the
fake model, which frames its SSE as Anthropic does and refuses what Anthropic's servers refuse, in their words."""

from __future__ import annotations

import json
import re
from typing import Any

import aiohttp
import anthropic
import pytest

from tests.fakes.messages_agent import INSTRUCTION, MAX_TOKENS, SYSTEM, TOOLS, anthropic_client, file_text, run_agent
from tests.fakes.messages_model import MessagesModel
from tests.fakes.openai_upstream import FakeUpstream

TOO_LONG = re.compile(r"prompt is too long: (\d+) tokens > (\d+) maximum")


@pytest.fixture
def model(fake: FakeUpstream) -> MessagesModel:
    fake.messages_hook = MessagesModel(window=100_000)
    return fake.messages_hook


async def first_turn(model: MessagesModel, fake: FakeUpstream) -> list[dict[str, Any]]:
    """The history after one round: the instruction, the model's turn as returned, its tool results."""
    api = anthropic_client(fake.url)
    message = await api.messages.create(model="fake-messages", max_tokens=MAX_TOKENS, tools=TOOLS,  # type: ignore[arg-type]
                                        messages=[{"role": "user", "content": INSTRUCTION}])
    content = [block.model_dump(exclude_unset=True) for block in message.content]
    results = [{"type": "tool_result", "tool_use_id": block["id"], "content": file_text(block["id"])}
               for block in content if block["type"] == "tool_use"]
    return [{"role": "user", "content": INSTRUCTION}, {"role": "assistant", "content": content},
            {"role": "user", "content": results}]


async def refused(fake: FakeUpstream, messages: list[dict[str, Any]]) -> str:
    with pytest.raises(anthropic.BadRequestError) as caught:
        await anthropic_client(fake.url).messages.create(model="fake-messages", max_tokens=MAX_TOKENS,
                                                         tools=TOOLS, messages=messages)  # type: ignore[arg-type]
    body = caught.value.body
    assert isinstance(body, dict) and body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    message: str = body["error"]["message"]
    return message


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_the_sdk_agent_runs_five_rounds_against_the_fake(stream: bool, model: MessagesModel,
                                                               fake: FakeUpstream) -> None:
    sent: list[int] = []
    outcomes = await run_agent(anthropic_client(fake.url), 5, stream=stream, sent=sent)
    assert outcomes == ["none"] * 5 and sent == [1, 3, 5, 7, 9]
    assert len(model.received) == 5 and model.prompts == sorted(model.prompts)
    last = model.received[-1]
    assert last["system"] == SYSTEM and last["max_tokens"] == MAX_TOKENS and bool(last.get("stream")) is stream
    for index, message in enumerate(last["messages"]):
        if message["role"] == "assistant":  # every thinking block came back exactly as signed
            thinking, *uses = message["content"]
            assert thinking == model.thinking[thinking["signature"]] and len(uses) == 2
            turn = index // 2
            assert uses[0] == {"type": "tool_use", "id": f"toolu_{turn}_0", "name": "read_file",
                               "input": {"path": f"src/file_{turn}_0.py"}}
    assert len(model.thinking) == 5


async def test_a_stream_is_framed_as_anthropic_frames_it(model: MessagesModel, fake: FakeUpstream) -> None:
    body = {"model": "fake-messages", "max_tokens": 64, "stream": True,
            "messages": [{"role": "user", "content": INSTRUCTION}]}
    async with aiohttp.ClientSession() as session, session.post(f"{fake.url}/v1/messages", json=body) as response:
        assert response.status == 200 and response.content_type == "text/event-stream"
        text = await response.text()
    frames = [frame.split("\n") for frame in text.strip().split("\n\n")]
    names = [lines[0].removeprefix("event: ") for lines in frames]
    data = [json.loads(lines[1].removeprefix("data: ")) for lines in frames]
    assert all(event["type"] == name for event, name in zip(data, names, strict=True))
    thinking, tool, block = ["content_block_start", "content_block_delta", "content_block_delta"], \
        ["content_block_start", *["content_block_delta"] * 3], "content_block_stop"
    assert names == ["message_start", thinking[0], "ping", *thinking[1:], block, *tool, block, *tool, block,
                     "message_delta", "message_stop"]
    assert data[0]["message"]["content"] == [] and data[0]["message"]["usage"]["input_tokens"] == model.prompts[0]
    assert [d["delta"]["type"] for d in data if d["type"] == "content_block_delta"][:2] == [
        "thinking_delta", "signature_delta"]
    assert data[-2] == {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                        "usage": {"output_tokens": 40}}


async def test_the_fake_finishes_in_words(model: MessagesModel, fake: FakeUpstream) -> None:
    model.finish_after = 0
    message = await anthropic_client(fake.url).messages.create(
        model="fake-messages", max_tokens=MAX_TOKENS, messages=[{"role": "user", "content": INSTRUCTION}])
    assert message.stop_reason == "end_turn" and message.content[-1].type == "text"
    assert message.content[-1].text == "Done after 0 rounds."


async def test_a_prompt_past_the_window_is_refused_in_anthropics_words(model: MessagesModel,
                                                                       fake: FakeUpstream) -> None:
    model.window = 1100
    text = await refused(fake, [{"role": "user", "content": INSTRUCTION}])
    prompt, maximum = map(int, TOO_LONG.fullmatch(text).groups())  # type: ignore[union-attr]
    assert prompt == model.prompts[-1] and maximum == 1100 - MAX_TOKENS
    async with aiohttp.ClientSession() as session, session.post(f"{fake.url}/v1/messages", json={
            "model": "m", "max_tokens": 1090, "messages": [{"role": "user", "content": "hi"}]}) as response:
        assert response.status == 400
        assert await response.json() == {"type": "error", "error": {
            "type": "invalid_request_error", "message": f"prompt is too long: {model.prompts[-1]} tokens > 10 maximum"}}
    model.sum_wording = True  # Anthropic's own wording when only max_tokens does not fit
    assert (await refused(fake, [{"role": "user", "content": INSTRUCTION}])).startswith(
        f"input length and `max_tokens` exceed context limit: {model.prompts[-1]} + {MAX_TOKENS} > 1100, ")


async def test_a_stream_past_the_window_may_fail_in_an_error_event(model: MessagesModel, fake: FakeUpstream) -> None:
    model.window, model.overflow = 1030, "error_event"
    body = {"model": "m", "max_tokens": MAX_TOKENS, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as session, session.post(f"{fake.url}/v1/messages", json=body) as response:
        assert response.status == 200
        frames = (await response.text()).strip().split("\n\n")
    assert [frame.split("\n")[0] for frame in frames] == ["event: message_start", "event: ping", "event: error"]
    assert json.loads(frames[-1].split("\n")[1].removeprefix("data: ")) == {"type": "error", "error": {
        "type": "invalid_request_error", "message": model.overflow_message(model.prompts[-1], MAX_TOKENS)}}
    with pytest.raises(anthropic.APIStatusError, match="prompt is too long"):
        async with anthropic_client(fake.url).messages.stream(
                model="m", max_tokens=MAX_TOKENS, messages=[{"role": "user", "content": "hi"}]) as events:
            await events.get_final_message()


async def test_histories_a_real_server_refuses_are_refused(model: MessagesModel, fake: FakeUpstream) -> None:
    history = await first_turn(model, fake)
    wrong_id = [*history[:2], {"role": "user", "content": [{**history[2]["content"][0], "tool_use_id": "toolu_x"},
                                                            history[2]["content"][1]]}]
    assert "`tool_use` ids were found without `tool_result` blocks immediately after: toolu_0_0" in await refused(
        fake, wrong_id)
    history_missing = [*history[:2], {"role": "user", "content": "go on"}]
    assert "without `tool_result` blocks" in await refused(fake, history_missing)
    stray = [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_0_0", "content": "x"}]}]
    assert "unexpected `tool_use_id` found in `tool_result` blocks: toolu_0_0" in await refused(fake, stray)
    assert "roles must alternate" in await refused(fake, [*history, {"role": "user", "content": "and?"}])
    assert "first message must use the \"user\" role" in await refused(fake, history[1:])
    assert len(model.received) == 6  # every refused body was still received and counted


async def test_a_thinking_block_must_come_back_as_signed(model: MessagesModel, fake: FakeUpstream) -> None:
    history = await first_turn(model, fake)
    thinking, *uses = history[1]["content"]
    changed = {**thinking, "thinking": thinking["thinking"] + " "}
    edited = [history[0], {"role": "assistant", "content": [changed, *uses]}, history[2]]
    assert await refused(fake, edited) == "messages.1.content.0: Invalid `signature` in `thinking` block"
    dropped = [history[0], {"role": "assistant", "content": uses}, history[2]]
    assert (await refused(fake, dropped)).startswith(
        "messages.1.content.0.type: Expected `thinking` or `redacted_thinking`, but found `tool_use`.")
    answered = await anthropic_client(fake.url).messages.create(model="fake-messages", max_tokens=MAX_TOKENS,
                                                                messages=history)  # type: ignore[arg-type]
    assert answered.stop_reason == "tool_use"


async def test_count_tokens_is_answered_only_when_switched_on(model: MessagesModel, fake: FakeUpstream) -> None:
    api = anthropic_client(fake.url)
    request: dict[str, Any] = {"model": "fake-messages", "system": SYSTEM, "tools": TOOLS,
                               "messages": [{"role": "user", "content": INSTRUCTION}]}
    with pytest.raises(anthropic.NotFoundError):
        await api.messages.count_tokens(**request)
    fake.count_tokens = True
    counted = await api.messages.count_tokens(**request)
    assert [counted.input_tokens] == model.counted == [model.prompt_tokens({**request, "max_tokens": 1})]
    assert model.received == []  # a count is no turn


async def test_without_a_messages_hook_the_route_is_missing(fake: FakeUpstream) -> None:
    with pytest.raises(anthropic.NotFoundError):
        await anthropic_client(fake.url).messages.create(model="m", max_tokens=8,
                                                         messages=[{"role": "user", "content": "hi"}])
