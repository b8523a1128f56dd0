"""SSE decoding: events independent of chunk boundaries, bytes never changed, content/error classification."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from proxy.upstream.streaming import (
    SseDecoder,
    SseEvent,
    UsageTap,
    decode_all,
    finish_reasons,
    is_content_event,
    is_error_event,
    is_usage_only_chunk,
    looks_like_sse,
)

Fields = tuple[tuple[str, str], ...]

# name -> (stream bytes, expected events as (raw bytes, parsed fields))
STREAMS: dict[str, tuple[bytes, list[tuple[bytes, Fields]]]] = {
    "lf": (b"data: a\n\ndata: b\n\n",
           [(b"data: a\n\n", (("data", "a"),)), (b"data: b\n\n", (("data", "b"),))]),
    "crlf": (b"data: a\r\n\r\ndata: b\r\n\r\n",
             [(b"data: a\r\n\r\n", (("data", "a"),)), (b"data: b\r\n\r\n", (("data", "b"),))]),
    "cr": (b"data: a\r\rdata: b\r\r",
           [(b"data: a\r\r", (("data", "a"),)), (b"data: b\r\r", (("data", "b"),))]),
    "mixed endings": (b"event: x\r\ndata: a\n\ndata: b\r\n\n",
                      [(b"event: x\r\ndata: a\n\n", (("event", "x"), ("data", "a"))),
                       (b"data: b\r\n\n", (("data", "b"),))]),
    "comment": (b": keep-alive\n\ndata: x\n: inline note\n\n",
                [(b": keep-alive\n\n", ()), (b"data: x\n: inline note\n\n", (("data", "x"),))]),
    "no space after colon": (b"data:x\ndata:  two\n\n",
                             [(b"data:x\ndata:  two\n\n", (("data", "x"), ("data", " two")))]),
    "field without colon": (b"data\n\n", [(b"data\n\n", (("data", ""),))]),
    "multi-line data": (b'data: {"a":\ndata: 1}\n\n',
                        [(b'data: {"a":\ndata: 1}\n\n', (("data", '{"a":'), ("data", "1}")))]),
    "event id retry": (b"event: message\nid: 7\nretry: 100\ndata: {}\n\n",
                       [(b"event: message\nid: 7\nretry: 100\ndata: {}\n\n",
                         (("event", "message"), ("id", "7"), ("retry", "100"), ("data", "{}")))]),
    "error field": (b'error: {"message": "too long"}\n\n',
                    [(b'error: {"message": "too long"}\n\n', (("error", '{"message": "too long"}'),))]),
    "unterminated last event": (b"data: a\n\ndata: [DONE]",
                                [(b"data: a\n\n", (("data", "a"),)), (b"data: [DONE]", (("data", "[DONE]"),))]),
    "unterminated last line": (b"data: a\n", [(b"data: a\n", (("data", "a"),))]),
    "trailing blank line": (b"data: a\n\n\n", [(b"data: a\n\n", (("data", "a"),)), (b"\n", ())]),
    "utf-8 text": ("data: héllo ✓\n\n".encode(), [("data: héllo ✓\n\n".encode(), (("data", "héllo ✓"),))]),
    "empty": (b"", []),
}


def events_of(chunks: list[bytes]) -> list[tuple[bytes, Fields]]:
    decoder = SseDecoder()
    events: list[SseEvent] = []
    for chunk in chunks:
        events += decoder.feed(chunk)
    events += decoder.flush()
    assert decoder.pending == b""
    return [(event.raw, event.fields) for event in events]


def random_splits(data: bytes, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(data)), rng.randint(0, max(0, len(data) - 1)))) if len(data) > 1 else []
    return [data[start:end] for start, end in zip([0, *cuts], [*cuts, len(data)], strict=True)]


@pytest.mark.parametrize("name", STREAMS)
def test_whole_stream(name: str) -> None:
    stream, expected = STREAMS[name]
    assert events_of([stream]) == expected


@pytest.mark.parametrize("name", STREAMS)
def test_byte_by_byte_gives_identical_events(name: str) -> None:
    stream, expected = STREAMS[name]
    assert events_of([stream[i:i + 1] for i in range(len(stream))]) == expected


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("name", STREAMS)
def test_random_splits_give_identical_events(name: str, seed: int) -> None:
    stream, expected = STREAMS[name]
    assert events_of(random_splits(stream, seed)) == expected


@pytest.mark.parametrize("name", STREAMS)
def test_raw_bytes_concatenate_to_the_input(name: str) -> None:
    stream, _ = STREAMS[name]
    assert b"".join(event.raw for event in decode_all(stream)) == stream


def test_realistic_chat_stream_survives_any_split() -> None:
    chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}]
    chunks += [{"choices": [{"index": 0, "delta": {"content": word}}]} for word in ("Hel", "lo\n\n", " wo", "rld")]
    stream = b"".join(f"data: {json.dumps(chunk)}\r\n\r\n".encode() for chunk in chunks) + b"data: [DONE]\r\n\r\n"
    whole = events_of([stream])
    assert len(whole) == 6 and whole[-1] == (b"data: [DONE]\r\n\r\n", (("data", "[DONE]"),))
    for seed in range(50):
        assert events_of(random_splits(stream, seed)) == whole


def test_events_only_complete_at_the_blank_line() -> None:
    decoder = SseDecoder()
    assert decoder.feed(b"data: a\r\n") == []
    assert decoder.feed(b"\r") == []
    assert decoder.pending == b"data: a\r\n\r"
    [event] = decoder.feed(b"\ndata: b")
    assert event.raw == b"data: a\r\n\r\n" and decoder.pending == b"data: b"


def test_decode_all_accepts_text() -> None:
    [event] = decode_all('data: {"x": 1}\n\n')
    assert event.json() == {"x": 1}


@pytest.mark.parametrize(("stream", "event_name", "data", "payload"), [
    (b"data: {\"a\": 1}\n\n", None, '{"a": 1}', {"a": 1}),
    (b"event: error\ndata: {\"error\": {}}\n\n", "error", '{"error": {}}', {"error": {}}),
    (b"data: {\"a\":\ndata: 1}\n\n", None, '{"a":\n1}', {"a": 1}),
    (b"error: {\"code\": \"x\"}\n\n", None, None, {"code": "x"}),
    (b"data: [DONE]\n\n", None, "[DONE]", None),
    (b"data: not json\n\n", None, "not json", None),
    (b"data:\n\n", None, "", None),
    (b": comment only\n\n", None, None, None),
])
def test_event_accessors(stream: bytes, event_name: str | None, data: str | None, payload: Any) -> None:
    [event] = decode_all(stream)
    assert (event.event, event.data, event.json()) == (event_name, data, payload)


def sse(payload: Any) -> SseEvent:
    [event] = decode_all(f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n")
    return event


def chat_chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    return {"object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}


TOOL_CALL = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": ""}}
OVERFLOW = {"error": {"message": "maximum context length exceeded", "code": "context_length_exceeded"}}

# event -> (is content, is error)
CLASSIFIED: list[tuple[str, SseEvent, bool, bool]] = [
    ("role-only delta", sse(chat_chunk({"role": "assistant", "content": ""})), False, False),
    ("role-only delta, null content", sse(chat_chunk({"role": "assistant", "content": None})), False, False),
    ("empty delta", sse(chat_chunk({})), False, False),
    ("content delta", sse(chat_chunk({"content": "Hi"})), True, False),
    ("tool_calls delta", sse(chat_chunk({"tool_calls": [TOOL_CALL]})), True, False),
    ("function_call delta", sse(chat_chunk({"function_call": {"name": "f"}})), True, False),
    ("refusal delta", sse(chat_chunk({"refusal": "no"})), True, False),
    ("finish only", sse(chat_chunk({}, "stop")), True, False),
    ("legacy completion text", sse({"choices": [{"index": 0, "text": "Hi"}]}), True, False),
    ("usage-only chunk", sse({"choices": [], "usage": {"prompt_tokens": 3}}), False, False),
    ("[DONE]", sse("[DONE]"), True, False),
    ("error payload", sse(OVERFLOW), False, True),
    ("error payload with choices", sse({**OVERFLOW, **chat_chunk({"content": "x"})}), False, True),
    ("event: error", decode_all(b"event: error\ndata: {\"message\": \"boom\"}\n\n")[0], False, True),
    ("non-standard error field", decode_all(b'error: {"message": "prompt is too long"}\n\n')[0], False, True),
    ("responses output_text.delta", sse({"type": "response.output_text.delta", "delta": "Hi"}), True, False),
    ("responses created", sse({"type": "response.created", "response": {}}), False, False),
    ("responses failed", sse({"type": "response.failed", "response": {}}), False, True),
    ("type error", sse({"type": "error", "message": "boom"}), False, True),
    ("comment", decode_all(b": ping\n\n")[0], False, False),
    ("not json", sse("hello"), False, False),
    ("json list", sse([1, 2]), False, False),
    ("choices is a string", sse({"choices": "abc"}), False, False),
    ("choice is a number", sse({"choices": [1]}), False, False),
    ("delta is a string", sse({"choices": [{"delta": "content"}]}), False, False),
    ("choices is null", sse({"choices": None}), False, False),
]


@pytest.mark.parametrize(("event", "content", "error"), [case[1:] for case in CLASSIFIED],
                         ids=[case[0] for case in CLASSIFIED])
def test_classification(event: SseEvent, content: bool, error: bool) -> None:
    assert (is_content_event(event), is_error_event(event)) == (content, error)


@pytest.mark.parametrize(("body", "expected"), [
    (b"data: {}\n\n", True),
    (b"\r\n\n  data: {}\n\n", True),
    (b"event: message\ndata: x\n\n", True),
    (b": keep-alive\n\n", True),
    (b"error: {}\n\n", True),
    (b"id: 1\n\n", True),
    (b"retry: 100\n\n", True),
    ("data: text\n\n", True),
    (b'{"error": {"message": "data: no"}}', False),
    (b"<html>502 Bad Gateway</html>", False),
    (b"", False),
    (b"   \n", False),
    (b"dat", False),
])
def test_looks_like_sse(body: bytes | str, expected: bool) -> None:
    assert looks_like_sse(body) is expected


# --- UsageTap: total on anything an upstream sends ---------------------------------------------------

HOSTILE_CHUNKS = [
    b'data: {"choices": 5}\n\n',
    b'data: {"choices": "abc"}\n\n',
    b'data: {"choices": [5, null, "x", []]}\n\n',
    b'data: {"choices": {"finish_reason": "stop"}}\n\n',
    b'data: {"choices": [{"finish_reason": {"a": [1]}}, {"finish_reason": 7}]}\n\n',
    b'data: {"choices": [], "usage": 5}\n\n',
    b'data: {"choices": [], "usage": [1, 2]}\n\n',
    b'data: {"usage": {"prompt_tokens": "x"}}\n\n',
    b"data: " + b"[" * 5000 + b"]" * 5000 + b"\n\n",
    b'data: {"type": ' + b"[" * 900 + b"]" * 900 + b', "choices": [{"finish_reason": ' + b"[" * 900 + b"]" * 900
    + b"}]}\n\n",
    b'data: {"choices": [{"delta": {"content": "\\ud800"}, "finish_reason": "\\udc00"}]}\n\n',
    b"data: {nope\n\n",
    b"data: \xff\xfe\n\n",
    b"data: 5\n\n",
    b"data: null\n\n",
]
HOSTILE_IDS = [chunk[:40].decode(errors="replace") for chunk in HOSTILE_CHUNKS]


@pytest.mark.parametrize("hide", [False, True], ids=["pass through", "hide usage"])
@pytest.mark.parametrize("hostile", HOSTILE_CHUNKS, ids=HOSTILE_IDS)
def test_usage_tap_never_raises(hostile: bytes, hide: bool) -> None:
    tap = UsageTap(hide_usage_chunk=hide)
    good = b'data: {"choices": [{"delta": {"content": "hi"}, "finish_reason": null}]}\n\n'
    out = tap.feed(good) + tap.feed(hostile) + tap.feed(b'data: {"choices": [{"finish_reason": "stop"}]}\n\n')
    out += tap.finish()
    hidden = hide and is_usage_only_chunk(decode_all(hostile)[0].json())
    assert (hostile in out) is not hidden  # hostile events are data: passed on, bytes unchanged
    assert tap.finish_reasons[-1] == "stop" and all(isinstance(reason, str) for reason in tap.finish_reasons)


@pytest.mark.parametrize("hostile", HOSTILE_CHUNKS, ids=HOSTILE_IDS)
def test_classification_never_raises(hostile: bytes) -> None:
    [event] = decode_all(hostile)
    assert is_content_event(event) in (True, False) and is_error_event(event) in (True, False)


def test_finish_reasons_of_malformed_chunks() -> None:
    assert finish_reasons({"choices": [{"finish_reason": "stop"}, {"finish_reason": ""}, 5, {"finish_reason": 1}]}) \
        == ["stop"]
    assert finish_reasons({"choices": 5}) == finish_reasons([1]) == finish_reasons(None) == []
