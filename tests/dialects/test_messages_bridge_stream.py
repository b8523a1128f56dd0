"""proxy.dialects.messages_bridge_stream: a chat stream as the Messages API's events — the blocks in order however the
chat server interleaves parallel calls, the same bytes however the stream is split, the same message the whole
answer gives once the `anthropic` SDK has put the events together, and errors as Anthropic's `error` event."""

from __future__ import annotations

import itertools
import json
from typing import Any

from anthropic.lib.streaming._messages import accumulate_event
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.usage import Usage
from proxy.dialects.messages_bridge import message_from_chat
from proxy.dialects.messages_bridge_stream import MessagesFromChatStream

REQUEST = {"model": "m", "max_tokens": 64, "stream": True}


def sse(payload: Any) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


def chunk(delta: dict[str, Any], finish: str | None = None, **choice: Any) -> dict[str, Any]:
    return {"id": "chatcmpl-9", "model": "served", "created": 5,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, **choice}]}


def call_piece(index: int, arguments: str, call_id: str | None = None, name: str | None = None) -> dict[str, Any]:
    head = {"id": call_id, "type": "function"} if call_id else {}
    return chunk({"tool_calls": [{"index": index, **head,
                                  "function": {**({"name": name} if name else {}), "arguments": arguments}}]})


USAGE = sse({"id": "chatcmpl-9", "choices": [], "usage": {"prompt_tokens": 40, "completion_tokens": 12}})
# Text, then two parallel calls whose argument deltas the server interleaves (chat allows it; Anthropic's blocks
# cannot interleave), the finish, the usage chunk of stream_options.include_usage, and [DONE].
STREAM = b"".join([
    sse(chunk({"role": "assistant", "content": ""})),
    sse(chunk({"content": "Looking"})), sse(chunk({"content": " now."})),
    sse(call_piece(0, "", "call_a", "read_file")), sse(call_piece(1, '{"path"', "call_b", "run_tests")),
    sse(call_piece(0, '{"path": "a.py"')), sse(call_piece(1, ': "tests/"}')), sse(call_piece(0, "}")),
    sse(chunk({}, "tool_calls")), USAGE, b"data: [DONE]\n\n",
])
WHOLE = {"id": "chatcmpl-9", "model": "served", "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
    "role": "assistant", "content": "Looking now.", "tool_calls": [
        {"id": "call_a", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}},
        {"id": "call_b", "type": "function", "function": {"name": "run_tests", "arguments": '{"path": "tests/"}'}}]}}],
    "usage": {"prompt_tokens": 40, "completion_tokens": 12}}


def events(raw: bytes) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in raw.decode().splitlines() if line.startswith("data: ")]


def translated(raw: bytes, request: dict[str, Any] = REQUEST) -> tuple[MessagesFromChatStream, list[dict[str, Any]]]:
    tap = MessagesFromChatStream(request)
    return tap, events(tap.feed(raw) + tap.finish())


def test_a_chat_stream_becomes_the_messages_events() -> None:
    tap, out = translated(STREAM)
    assert [(event["type"], event.get("index")) for event in out] == [
        ("message_start", None), ("content_block_start", 0), ("content_block_delta", 0),
        ("content_block_delta", 0), ("content_block_stop", 0),
        ("content_block_start", 1), ("content_block_delta", 1), ("content_block_stop", 1),
        ("content_block_start", 2), ("content_block_delta", 2), ("content_block_stop", 2),
        ("message_delta", None), ("message_stop", None)]
    assert out[0]["message"]["usage"] == {"input_tokens": 0, "output_tokens": 0}  # chat counts at the end
    assert [out[i]["content_block"] for i in (5, 8)] == [
        {"type": "tool_use", "id": "call_a", "name": "read_file", "input": {}},
        {"type": "tool_use", "id": "call_b", "name": "run_tests", "input": {}}]
    assert [json.loads(out[i]["delta"]["partial_json"]) for i in (6, 9)] == [{"path": "a.py"}, {"path": "tests/"}]
    assert out[-2]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert out[-2]["usage"] == {"input_tokens": 40, "output_tokens": 12}
    assert tap.usage == Usage(40, 12) and tap.finish_reasons == ["tool_use"]


def test_the_sdk_reads_the_stream_as_the_same_message_as_the_whole_answer() -> None:
    snapshot, partial_json = None, dict[int, bytes]()
    for event in translated(STREAM)[1]:
        snapshot = accumulate_event(event=event, current_snapshot=snapshot,  # type: ignore[arg-type]
                                    json_bufs=partial_json)
    whole = message_from_chat(WHOLE, REQUEST)
    assert snapshot is not None and whole is not None
    assert snapshot.to_dict(exclude_none=True) == {key: value for key, value in whole.items() if value is not None}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_a_stream_reads_the_same_however_it_is_split(cuts: list[int]) -> None:
    whole = MessagesFromChatStream(REQUEST)
    expected = whole.feed(STREAM) + whole.finish()
    tap = MessagesFromChatStream(REQUEST)
    edges = [0, *sorted(cuts), len(STREAM)]
    assert b"".join(tap.feed(STREAM[a:b]) for a, b in itertools.pairwise(edges)) + tap.finish() == expected
    assert tap.usage == Usage(40, 12)


def test_a_stop_sequence_vllm_names_is_reported() -> None:
    raw = sse(chunk({"content": "one two"})) + sse(chunk({}, "stop", stop_reason="THREE")) + b"data: [DONE]\n\n"
    tap, out = translated(raw, {**REQUEST, "stop_sequences": ["THREE"]})
    assert out[-2]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "THREE"}
    assert "input_tokens" not in out[-2]["usage"] and tap.usage is None  # no usage chunk: nothing made up


def test_an_error_after_content_ends_the_stream_with_an_error_event() -> None:
    raw = sse(chunk({"content": "Half"})) + sse({"error": {"message": "model overloaded", "code": 529}})
    _, out = translated(raw + sse(chunk({"content": " more"})))
    assert [event["type"] for event in out] == ["message_start", "content_block_start", "content_block_delta",
                                                "error"]
    assert out[-1] == {"type": "error", "error": {"type": "overloaded_error", "message": "model overloaded"}}


def test_an_error_before_anything_is_the_only_event() -> None:
    """llama.cpp's own form (an `error:` field), as the first event: no message was begun, none is ended."""
    raw = b'error: {"code": 400, "message": "the request exceeds the available context size", ' \
          b'"type": "exceed_context_size_error"}\n\n'
    tap, out = translated(raw)
    assert out == [{"type": "error", "error": {
        "type": "invalid_request_error", "message": "the request exceeds the available context size"}}]
    assert tap.usage is None and tap.finish_reasons == []


def test_an_empty_stream_says_nothing() -> None:
    assert translated(b"")[1] == [] and translated(b": keep-alive\n\n")[1] == []


@given(st.binary(max_size=300))
def test_any_bytes_never_raise(noise: bytes) -> None:
    tap = MessagesFromChatStream({})
    tap.feed(noise)
    tap.finish()
