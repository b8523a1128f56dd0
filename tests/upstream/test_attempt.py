"""A whole upstream answer judged once, by its dialect: overflow or not, and its usage, from one JSON decoding."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.core.usage import Usage
from proxy.dialects.chat import CHAT
from proxy.upstream.attempt import _judged
from proxy.upstream.overflow import detect_context_overflow

USAGE = {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}
READ = Usage(12, 3)  # USAGE as the chat dialect reads it


def answer(**fields: Any) -> bytes:
    return json.dumps({"id": "chatcmpl-1", "object": "chat.completion", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}], **fields}).encode()


OVERFLOW_ERROR = json.dumps({"error": {"message": "This model's maximum context length is 4096 tokens. However, "
                                                  "your messages resulted in 5000 tokens.",
                                       "type": "invalid_request_error", "code": "context_length_exceeded"}}).encode()


@pytest.mark.parametrize(("status", "body", "expected"), [
    pytest.param(200, answer(usage=USAGE), (False, READ), id="an answer with usage"),
    pytest.param(200, b"\n  " + answer(usage=USAGE), (False, READ), id="leading whitespace"),
    pytest.param(200, answer(), (False, None), id="no usage"),
    pytest.param(200, answer(usage={}), (False, None), id="empty usage"),
    pytest.param(200, answer(usage="lots"), (False, None), id="usage not an object"),
    pytest.param(200, OVERFLOW_ERROR, (True, None), id="an overflow error inside a 200"),
    pytest.param(200, json.dumps({"choices": [{"finish_reason": "model_context_window_exceeded"}],
                                  "usage": USAGE}).encode(), (True, None), id="an overflow finish reason"),
    pytest.param(400, OVERFLOW_ERROR, (True, None), id="an overflow error"),
    pytest.param(500, b"upstream exploded", (False, None), id="a plain-text error"),
    pytest.param(200, b'{"usage": {"prompt_tokens": NaN}}', (False, None), id="JSON orjson refuses"),
    pytest.param(200, b"[1, 2]", (False, None), id="not an object"),
    pytest.param(200, b"", (False, None), id="empty"),
])
def test_an_answer_is_judged_once(status: int, body: bytes, expected: tuple[bool, Any]) -> None:
    assert _judged(status, body, CHAT) == expected


@pytest.mark.parametrize("body", [answer(usage=USAGE), OVERFLOW_ERROR, b'{"error": "quota"}', b"not json", b"[]"])
@pytest.mark.parametrize("status", [200, 400, 429, 500])
def test_the_verdict_is_the_overflow_detectors(status: int, body: bytes) -> None:
    assert _judged(status, body, CHAT)[0] == detect_context_overflow(status, body)
