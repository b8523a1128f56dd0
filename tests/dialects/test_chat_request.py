"""proxy.dialects.chat_request: a chat request read once; its model, messages, stream and output ask read totally."""

from __future__ import annotations

import json
from typing import Any

import pytest
from multidict import CIMultiDict

from proxy.dialects.chat_request import ChatCall
from proxy.errors import BadRequest

MESSAGES = [{"role": "user", "content": "hi"}]


def parse(payload: Any, **headers: str) -> ChatCall:
    return ChatCall.parse(json.dumps(payload).encode(), CIMultiDict(headers), "")


def test_the_clients_mode_is_read_and_not_forwarded() -> None:
    call = parse({"model": "m", "messages": MESSAGES}, Authorization="Bearer k", **{"x-compaction-mode": "Force"})
    assert call.mode == "force"
    assert "x-compaction-mode" not in call.headers and call.headers["authorization"] == "Bearer k"


def test_a_body_that_is_not_an_object_is_a_bad_request() -> None:
    with pytest.raises(BadRequest, match="JSON object"):
        parse(["a", "list"])


@pytest.mark.parametrize(("payload", "model", "compactable", "stream"), [
    ({"model": "gpt", "messages": MESSAGES, "stream": True}, "gpt", True, True),
    ({"model": None, "messages": MESSAGES, "stream": "yes"}, "", True, False),
    ({"messages": []}, "", False, False),
    ({"messages": [MESSAGES[0], "junk"]}, "", False, False),
    ({"messages": {"role": "user"}}, "", False, False),
    ({"prompt": "hi"}, "", False, False),
])
def test_fields_read_totally(payload: dict[str, Any], model: str, compactable: bool, stream: bool) -> None:
    call = parse(payload)
    assert (call.model, call.messages is not None, call.stream) == (model, compactable, stream)


@pytest.mark.parametrize(("fields", "reserved"), [
    ({}, 100), ({"max_tokens": 50}, 50), ({"max_completion_tokens": 70, "max_tokens": 50}, 70),
    ({"max_completion_tokens": 0, "max_tokens": 50}, 50), ({"max_tokens": True}, 100), ({"max_tokens": "9"}, 100),
    ({"max_tokens": -5}, 100), ({"max_tokens": 2.5}, 100),
])
def test_the_output_asked_for(fields: dict[str, Any], reserved: int) -> None:
    assert parse({"messages": MESSAGES, **fields}).reserved_output(100) == reserved


def test_the_body_is_kept_byte_for_byte() -> None:
    body = b'{ "messages" : [ {"role":"user","content":"hi"} ] , "model":"m" }'
    call = ChatCall.parse(body, CIMultiDict(), "a=1&b=2")
    assert (call.body, call.query, call.payload["model"]) == (body, "a=1&b=2", "m")
