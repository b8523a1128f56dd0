"""bench.api_bodies and the bench's bodies in each API: what the proxy reads as the same conversation."""

from __future__ import annotations

import itertools
import json

import orjson
import pytest

from bench.api_bodies import APIS, HISTORY_KEYS, PATHS, anthropic_messages, history_in, responses_items, with_turn
from bench.bodies import SHAPES, Bodies, long_history, new_message
from proxy.dialects.messages_blocks import view_of_messages
from proxy.dialects.responses_items import view_of_input

SPOKEN = [message for message in long_history() if message["role"] != "system"]


def test_the_responses_items_read_as_the_chat_history() -> None:
    view = view_of_input(responses_items(SPOKEN))
    assert view is not None
    assert [message["role"] for message in view.messages] == [message["role"] for message in SPOKEN]
    calls = [call["id"] for message in view.messages for call in message.get("tool_calls") or ()]
    assert calls == [call["id"] for message in SPOKEN for call in message.get("tool_calls") or ()] and calls


def test_the_anthropic_messages_alternate_and_read_as_the_chat_history() -> None:
    messages = anthropic_messages(SPOKEN)
    roles = [message["role"] for message in messages]
    assert all(first != second for first, second in itertools.pairwise(roles))
    view = view_of_messages(messages)
    assert view is not None
    assert sum(message["role"] == "tool" for message in view.messages) == sum(m["role"] == "tool" for m in SPOKEN)


@pytest.mark.parametrize("api", APIS)
def test_each_apis_bodies_are_the_same_conversation_with_a_new_turn(api: str) -> None:
    shape = {"chat": "long", "responses": "long-responses", "messages": "long-messages"}[api]
    assert SHAPES[shape].path == PATHS[api]
    made = Bodies(SHAPES[shape])
    first, second = made.body(1), made.body(2)
    assert first != second
    # Spelt as orjson spells it, as the SDKs' JSON is: the proxy reads a resent body from where it grew.
    assert orjson.dumps(json.loads(first)) == first
    payload = json.loads(first)
    history = payload[HISTORY_KEYS[api]]
    assert history == with_turn(api, history_in(api, list(long_history())), new_message(SHAPES[shape], 1))
    assert "Next step 1" in json.dumps(history[-1])
    if api == "messages":  # one user message per turn, as Claude Code sends it: the words after the tool results
        assert all(first["role"] != second["role"] for first, second in itertools.pairwise(history))
        assert [block["type"] for block in history[-1]["content"]] == ["tool_result", "text"]
    if api != "chat":
        instructions = payload["instructions" if api == "responses" else "system"]
        assert instructions == long_history()[0]["content"]
    assert 0.5 < made.bytes_per_token < 10
