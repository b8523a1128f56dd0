"""answer_may_overflow, the byte test a relayed answer passes instead of being decoded: it may say "maybe" of a
clean answer, never "no" of an overflow, however the answer spells it."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.dialects.catalog import DIALECTS
from proxy.dialects.chat import CHAT
from proxy.upstream.attempt import MAX_LEADING_SPACE, _judged
from proxy.upstream.overflow import answer_may_overflow, detect_context_overflow, overflow_in_answer
from tests.upstream.test_overflow import BEDROCK_EXCEPTION_FRAME, CORPUS, MORE, body_text, completion, error_body

CHOICE = {"index": 0, "message": {"role": "assistant", "content": "done"}, "finish_reason": "stop"}
ANSWER = {"id": "chatcmpl-1", "object": "chat.completion", "choices": [CHOICE],
          "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}}


@pytest.mark.parametrize(("body", "maybe"), [
    (orjson.dumps(ANSWER), False),
    (json.dumps({**ANSWER, "note": "the \"error\" word, quoted in text"}).encode(), False),
    (completion("x", "length").encode(), False),                               # out of output room, not of window
    (error_body("boom").encode(), True),
    (completion("x", "MODEL_CONTEXT_WINDOW_EXCEEDED").encode(), True),
    (json.dumps({"type": "message", "stop_reason": "model_context_window_exceeded"}).encode(), True),
    (json.dumps({"response": {"incomplete_details": {"reason": "model_context_window_exceeded"}}}).encode(), True),
    (b'{"\\u0065rror": {"message": "too long"}}', True),                         # an escape may spell anything
    (json.dumps({**ANSWER, "note": "caf\u00e9"}).encode(), True),               # ensure_ascii's escapes: decoded
    (b"{" + BEDROCK_EXCEPTION_FRAME, True),
], ids=["answer", "quoted-word", "length", "error", "finish-upper", "stop-reason", "incomplete", "escaped-key",
        "ascii-escapes", "frame"])
def test_which_answers_may_overflow(body: bytes, maybe: bool) -> None:
    assert answer_may_overflow(body) is maybe


@pytest.mark.parametrize("entry", CORPUS + MORE, ids=[entry["id"] for entry in CORPUS + MORE])
def test_every_body_read_as_an_overflow_on_a_200_may_overflow(entry: dict[str, Any]) -> None:
    body = body_text(entry).encode()
    opens_an_object = body[:MAX_LEADING_SPACE].lstrip()[:1] == b"{"  # the only bodies the test is asked about
    if opens_an_object and detect_context_overflow(200, body):
        assert answer_may_overflow(body)
    assert answer_may_overflow(b"{" + body) or not detect_context_overflow(200, b"{" + body)


# Each API's ways to end an answer that are not an overflow: a dialect reading one of them as an overflow would
# need the byte test widened.
ENDINGS = [
    {"object": "chat.completion", "choices": [{**CHOICE, "finish_reason": reason}]}
    for reason in ("stop", "length", "tool_calls", "content_filter", "function_call")
] + [
    {"type": "message", "role": "assistant", "content": [], "stop_reason": reason}
    for reason in ("end_turn", "max_tokens", "stop_sequence", "tool_use", "pause_turn", "refusal")
] + [
    {"object": "response", "status": "incomplete", "incomplete_details": {"reason": reason}}
    for reason in ("max_output_tokens", "content_filter")
]


@pytest.mark.parametrize("dialect", DIALECTS, ids=[dialect.name for dialect in DIALECTS])
@pytest.mark.parametrize("answer", ENDINGS, ids=[json.dumps(ending)[:60] for ending in ENDINGS])
def test_no_dialect_reads_an_answer_said_clean_as_an_overflow(dialect: Any, answer: dict[str, Any]) -> None:
    body = orjson.dumps(answer)
    assert not answer_may_overflow(body)
    assert not dialect.overflow(answer)
    assert _judged(200, body, dialect, usage=False) == (False, None)


KEYS = st.sampled_from(["error", "choices", "finish_reason", "stop_reason", "incomplete_details", "reason",
                        "response", "delta", "message", "code", "type", "content", "Error", "data"])
WORDS = st.sampled_from(["model_context_window_exceeded", "Model_Context_Window_Exceeded", "stop", "length",
                         "context_length_exceeded", "prompt is too long", "", "caf\u00e9", "\u212a", "x"])
VALUES = st.recursive(st.none() | st.booleans() | st.integers() | WORDS | st.text(max_size=8),
                      lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=4),
                      max_leaves=12)
ENCODINGS = [orjson.dumps, lambda value: json.dumps(value).encode(),
             lambda value: json.dumps(value, ensure_ascii=False, indent=1).encode("utf-8", "surrogatepass")]


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(KEYS, VALUES, max_size=5), st.sampled_from(range(len(ENCODINGS))))
def test_no_answer_said_clean_is_an_overflow(payload: dict[str, Any], encoding: int) -> None:
    try:
        body = ENCODINGS[encoding](payload)
    except (TypeError, orjson.JSONEncodeError):
        return
    if not answer_may_overflow(body):
        assert not overflow_in_answer(payload)
        assert not detect_context_overflow(200, body)
        for dialect in DIALECTS:  # each dialect's reader, as the relay asks it: the byte test holds for all
            assert not dialect.overflow(payload), dialect.name
            assert not _judged(200, body, dialect)[0]  # decoded, as before: no overflow either
            assert _judged(200, body, dialect, usage=False) == (False, None)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_no_body_said_clean_is_judged_an_overflow(tail: bytes) -> None:
    body = b"{" + tail  # what _judged would decode: anything that opens like an object
    if not answer_may_overflow(body):
        assert not detect_context_overflow(200, body)
        assert _judged(200, body, CHAT, usage=False) == (False, None)
