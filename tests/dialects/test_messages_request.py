"""proxy.dialects.messages_request: a Messages request read once; its output room is its `max_tokens`."""

from __future__ import annotations

import json
from typing import Any

import pytest
from multidict import CIMultiDict

from proxy.dialects.messages_request import MessagesCall


def call(**fields: Any) -> MessagesCall:
    return MessagesCall.parse(json.dumps({"model": "claude", "messages": [], **fields}).encode(), CIMultiDict(), "")


@pytest.mark.parametrize(("fields", "reserved"), [
    ({"max_tokens": 4096}, 4096), ({}, 1024), ({"max_tokens": 0}, 1024), ({"max_tokens": "9"}, 1024),
    ({"max_tokens": True}, 1024), ({"max_output_tokens": 99}, 1024),  # the Responses name means nothing here
])
def test_the_output_room_is_max_tokens(fields: dict[str, Any], reserved: int) -> None:
    assert call(**fields).reserved_output(1024) == reserved


def test_a_messages_call_names_its_model_and_stream() -> None:
    request = call(stream=True)
    assert (request.model, request.stream, request.compaction_requested, request.compact_threshold) == \
        ("claude", True, False, None)
