"""proxy.dialects.responses_bridge: a Responses request as a chat completion, and the chat answer (whole or
streamed) back as a response — table tests, and streams read the same however they are split."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.usage import Usage
from proxy.dialects.responses_bridge import ResponsesFromChatStream, chat_request, response_from_chat

TOOL = {"type": "function", "name": "ls", "description": "list", "parameters": {"type": "object"}}


@pytest.mark.parametrize(("payload", "history", "expected"), [
    pytest.param({"model": "m", "instructions": "be brief", "max_output_tokens": 64, "temperature": 0.2},
                 [{"role": "user", "content": "hi"}],
                 {"model": "m", "temperature": 0.2, "max_tokens": 64,
                  "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]},
                 id="instructions, output cap, sampling"),
    pytest.param({"model": "m", "stream": True, "store": False, "include": ["reasoning.encrypted_content"]},
                 [{"role": "developer", "content": [{"type": "text", "text": "rules"}]}],
                 {"model": "m", "stream": True, "stream_options": {"include_usage": True},
                  "messages": [{"role": "system", "content": "rules"}]},
                 id="a stream asks usage; developer is system; Responses-only fields dropped"),
    pytest.param({"model": "m", "tools": [TOOL, {"type": "web_search"}], "tool_choice": {"type": "function",
                                                                                          "name": "ls"}},
                 [{"role": "assistant", "content": [{"type": "reasoning", "item": {}}],
                   "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]},
                  {"role": "tool", "tool_call_id": "c1", "content": "a.py", "item_type": "x"}],
                 {"model": "m", "tools": [{"type": "function", "function": {"name": "ls", "description": "list",
                                                                            "parameters": {"type": "object"}}}],
                  "tool_choice": {"type": "function", "function": {"name": "ls"}},
                  "messages": [{"role": "assistant", "content": "",
                                "tool_calls": [{"id": "c1", "type": "function",
                                                "function": {"name": "ls", "arguments": "{}"}}]},
                               {"role": "tool", "content": "a.py", "tool_call_id": "c1"}]},
                 id="function tools only; reasoning and the view's keys left out"),
    pytest.param({"model": "m"},
                 [{"role": "assistant", "content": None,
                   "tool_calls": [{"id": "c2", "type": "custom", "custom": {"name": "patch", "input": "*** x"}}]}],
                 {"model": "m", "messages": [{"role": "assistant", "content": None, "tool_calls": [
                     {"id": "c2", "type": "function",
                      "function": {"name": "patch", "arguments": json.dumps({"input": "*** x"})}}]}]},
                 id="a custom tool call as a function call"),
])
def test_chat_request(payload: dict[str, Any], history: list[dict[str, Any]], expected: dict[str, Any]) -> None:
    assert chat_request(payload, history) == expected


def completion(message: dict[str, Any], finish: str = "stop") -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 7, "model": "m",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 9, "total_tokens": 109}}


def test_a_chat_answer_as_a_response() -> None:
    chat = completion({"role": "assistant", "content": "Reading.", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{\"d\":1}"}}]}, "tool_calls")
    response = response_from_chat(chat, {"model": "m", "tools": [TOOL]})
    assert response is not None
    assert (response["object"], response["status"], response["created_at"]) == ("response", "completed", 7)
    assert [item["type"] for item in response["output"]] == ["message", "function_call"]
    assert response["output"][0]["content"][0]["text"] == "Reading."
    assert {key: response["output"][1][key] for key in ("call_id", "name", "arguments")} == {
        "call_id": "c1", "name": "ls", "arguments": "{\"d\":1}"}
    assert response["usage"] == {"input_tokens": 100, "output_tokens": 9, "total_tokens": 109}
    assert response["tools"] == [TOOL]


def test_an_answer_cut_at_the_output_cap_is_incomplete() -> None:
    response = response_from_chat(completion({"role": "assistant", "content": "Half"}, "length"), {})
    assert response is not None and response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}


@pytest.mark.parametrize("junk", [{}, [], {"choices": []}, {"choices": ["x"]}, "text", None])
def test_what_is_no_completion_is_not_translated(junk: Any) -> None:
    assert response_from_chat(junk, {}) is None


def sse(payload: Any) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"id": "chatcmpl-9", "created": 5, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


STREAM = b"".join([
    sse(chunk({"role": "assistant", "content": ""})),
    sse(chunk({"content": "Looking"})), sse(chunk({"content": " now."})),
    sse(chunk({"tool_calls": [{"index": 0, "id": "c1", "type": "function", "function": {"name": "ls",
                                                                                      "arguments": ""}}]})),
    sse(chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{\"d\":"}}]})),
    sse(chunk({"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]})),
    sse(chunk({"tool_calls": [{"index": 1, "id": "c2", "type": "function", "function": {"name": "cat",
                                                                                      "arguments": "{}"}}]})),
    sse(chunk({}, "tool_calls")),
    sse({"id": "chatcmpl-9", "choices": [], "usage": {"prompt_tokens": 40, "completion_tokens": 12}}),
    b"data: [DONE]\n\n",
])


def events(raw: bytes) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in raw.decode().splitlines() if line.startswith("data: ")]


def test_a_chat_stream_becomes_the_responses_events() -> None:
    tap = ResponsesFromChatStream({"model": "m"})
    out = events(tap.feed(STREAM) + tap.finish())
    assert [event["type"] for event in out] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta", "response.output_item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.delta",
        "response.output_item.added", "response.function_call_arguments.delta", "response.output_text.done",
        "response.output_item.done", "response.function_call_arguments.done", "response.output_item.done",
        "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    assert [event["sequence_number"] for event in out] == list(range(len(out)))
    done = out[-1]["response"]
    assert [item.get("arguments") for item in done["output"]] == [None, "{\"d\":1}", "{}"]
    assert done["output"][0]["content"][0]["text"] == "Looking now."
    assert done["usage"]["input_tokens"] == 40 and tap.usage == Usage(40, 12)
    assert tap.finish_reasons == ["tool_calls"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=10))
def test_a_stream_reads_the_same_however_it_is_split(cuts: list[int]) -> None:
    whole = ResponsesFromChatStream({"model": "m"})
    expected = whole.feed(STREAM) + whole.finish()
    tap = ResponsesFromChatStream({"model": "m"})
    edges = [0, *sorted(cuts), len(STREAM)]
    assert b"".join(tap.feed(STREAM[a:b]) for a, b in itertools.pairwise(edges)) + tap.finish() == expected


def test_an_error_in_the_stream_is_passed_as_an_error_event() -> None:
    tap = ResponsesFromChatStream({})
    raw = sse(chunk({"content": "x"})) + sse({"error": {"message": "overloaded", "type": "server_error"}})
    assert [event["type"] for event in events(tap.feed(raw) + tap.finish())][-1] == "error"


@given(st.binary(max_size=300))
def test_any_bytes_never_raise(noise: bytes) -> None:
    tap = ResponsesFromChatStream({})
    tap.feed(noise)
    tap.finish()


def test_every_event_of_a_streamed_response_names_one_creation_time() -> None:
    """The first chunk's `created`, in the preamble and the closing response alike (the closing one read the clock)."""
    tap = ResponsesFromChatStream({"model": "m"})
    created = {event["response"]["created_at"] for event in events(tap.feed(STREAM) + tap.finish())
               if "response" in event}
    assert created == {5}
