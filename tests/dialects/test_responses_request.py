"""proxy.dialects.responses_request: a Responses request read once; model, stream, output ask and upstream history."""

from __future__ import annotations

import json
from typing import Any

import pytest
from multidict import CIMultiDict

from proxy.dialects.responses_request import ResponsesCall
from proxy.errors import BadRequest


def parse(payload: Any, **headers: str) -> ResponsesCall:
    return ResponsesCall.parse(json.dumps(payload).encode(), CIMultiDict(headers), "")


@pytest.mark.parametrize(("payload", "model", "stream", "upstream"), [
    ({"model": "gpt-5", "input": "hi", "stream": True}, "gpt-5", True, False),
    ({"input": []}, "", False, False),
    ({"model": "m", "input": "hi", "previous_response_id": "resp_1"}, "m", False, True),
    ({"model": "m", "input": "hi", "conversation": "conv_1"}, "m", False, True),
    ({"model": "m", "input": "hi", "conversation": {"id": "conv_1"}}, "m", False, True),
    ({"model": "m", "input": "hi", "previous_response_id": None}, "m", False, False),
    ({"model": "m", "input": "hi", "previous_response_id": ""}, "m", False, False),
    ({"model": 5, "stream": "true"}, "5", False, False),
])
def test_fields_read_totally(payload: dict[str, Any], model: str, stream: bool, upstream: bool) -> None:
    call = parse(payload)
    assert (call.model, call.stream, call.history_upstream) == (model, stream, upstream)


@pytest.mark.parametrize(("fields", "reserved"), [
    ({}, 100), ({"max_output_tokens": 64}, 64), ({"max_output_tokens": 0}, 100), ({"max_output_tokens": True}, 100),
    ({"max_output_tokens": "64"}, 100), ({"max_tokens": 64}, 100),
])
def test_the_output_asked_for(fields: dict[str, Any], reserved: int) -> None:
    assert parse({"input": "hi", **fields}).reserved_output(100) == reserved


def test_the_mode_header_is_read_and_the_body_kept() -> None:
    body = b'{"input": "hi",  "model": "m"}'
    call = ResponsesCall.parse(body, CIMultiDict({"X-Compaction-Mode": "shadow", "OpenAI-Beta": "x"}), "q=1")
    assert (call.mode, call.body, call.query) == ("shadow", body, "q=1")
    assert "x-compaction-mode" not in call.headers and call.headers["openai-beta"] == "x"


def test_a_body_that_is_not_an_object_is_a_bad_request() -> None:
    with pytest.raises(BadRequest, match="JSON object"):
        parse(["input"])
