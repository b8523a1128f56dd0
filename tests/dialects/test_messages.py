"""proxy.dialects.messages: what the journey asks of the Messages API — its history, the body it forwards, usage in
answers and streams, and the proxy's errors in Anthropic's shape."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from multidict import CIMultiDict

from proxy.core.usage import Usage
from proxy.dialects.dialect import Dialect
from proxy.dialects.messages import MESSAGES, MESSAGES_MANAGING_UPSTREAM, MessagesDialect, MessagesTap, messages_usage
from proxy.dialects.messages_request import MessagesCall
from proxy.errors import BadRequest, ProxyError, UpstreamUnreachable

THINKING = {"type": "thinking", "thinking": "list first", "signature": "sig-1"}
MESSAGES_IN = [
    {"role": "user", "content": "Fix the bug."},
    {"role": "assistant", "content": [THINKING, {"type": "tool_use", "id": "toolu_1", "name": "ls", "input": {}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.py"}]},
]


def call(**fields: Any) -> MessagesCall:
    body = {"model": "claude", "max_tokens": 512, "messages": MESSAGES_IN, **fields}
    return MESSAGES.parse(json.dumps(body).encode(), CIMultiDict(), "")


def test_it_is_a_dialect() -> None:
    dialect: Dialect[MessagesCall] = MessagesDialect()
    assert (dialect.name, dialect.path) == ("messages", "/messages")


def test_a_conversation_is_compactable_and_maps_back_as_it_came() -> None:
    request = call(system=[{"type": "text", "text": "be careful", "cache_control": {"type": "ephemeral"}}])
    view = MESSAGES.history(request)
    assert view is not None
    forwarded = json.loads(MESSAGES.forwarded(request, view, view.messages, ask_usage=False))
    assert forwarded == json.loads(request.body)  # system, thinking and every field exactly as sent


def test_a_compacted_history_alternates_and_keeps_the_round_whole() -> None:
    request = call()
    view = MESSAGES.history(request)
    assert view is not None
    summary = [{"role": "user", "content": "summary"}, {"role": "assistant", "content": "Understood."}]
    sent = json.loads(MESSAGES.forwarded(request, view, [*summary, *view.messages[-2:]], ask_usage=False))["messages"]
    assert [message["role"] for message in sent] == ["user", "assistant", "user"]  # the ack and the call merged
    assert sent[1]["content"][-2:] == MESSAGES_IN[1]["content"] and sent[2] == MESSAGES_IN[2]


@pytest.mark.parametrize(("fields", "reason"), [
    ({}, None), ({"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}},
                 "upstream_manages_context"),
    # What Claude Code sends with thinking on: an edit that changes nothing, so the proxy still compacts.
    ({"context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}}, None),
    ({"context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": {"type": "all"}}]}}, None),
    ({"context_management": {"edits": [{"type": "clear_thinking_20251015",
                                        "keep": {"type": "thinking_turns", "value": 1}}]}}, "upstream_manages_context"),
    ({"context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"},
                                       {"type": "compact_20260112"}]}}, "upstream_manages_context"),
    ({"context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all", "x": 1}]}},
     "upstream_manages_context"),
    ({"context_management": {"edits": "all"}}, "upstream_manages_context"),
    ({"context_management": {"edits": [], "compaction": {"type": "summarize"}}}, "upstream_manages_context"),
    ({"compaction": {"type": "summarize"}}, "upstream_manages_context"),
])
def test_anthropics_own_context_management_is_left_to_an_upstream_that_runs_it(fields: dict[str, Any],
                                                                                reason: str | None) -> None:
    body = json.dumps({"model": "claude", "max_tokens": 512, "messages": MESSAGES_IN, **fields}).encode()
    request = MESSAGES_MANAGING_UPSTREAM.parse(body, {}, "")
    assert request.body == body  # forwarded byte for byte
    dialect = MESSAGES_MANAGING_UPSTREAM
    assert dialect.left_alone(request) == reason and (dialect.history(request) is None) == (reason is not None)


@pytest.mark.parametrize("messages", [[], "hi", [{"role": "system", "content": "x"}], [5]])
def test_what_the_view_cannot_read_is_not_compacted(messages: Any) -> None:
    assert MESSAGES.history(call(messages=messages)) is None


@pytest.mark.parametrize(("usage", "expected"), [
    ({"input_tokens": 10, "output_tokens": 5}, Usage(10, 5)),
    ({"input_tokens": 10, "cache_read_input_tokens": 900, "cache_creation_input_tokens": 90, "output_tokens": 1},
     Usage(1000, 1)),
    ({"input_tokens": 10, "cache_read_input_tokens": None}, Usage(10, None)),
    ({"output_tokens": 7}, Usage(None, 7)), ({"input_tokens": True, "output_tokens": -1}, Usage(None, None)),
    ({}, None), (None, None), ("x", None),
])
def test_usage_counts_every_input_the_window_holds(usage: Any, expected: Usage | None) -> None:
    assert messages_usage(usage) == expected
    assert MESSAGES.usage({"usage": usage}) == expected


def sse(*events: dict[str, Any]) -> bytes:
    return b"".join(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode() for event in events)


STREAM = sse({"type": "message_start", "message": {"id": "msg_1", "content": [], "usage": {
                 "input_tokens": 20, "cache_read_input_tokens": 100, "output_tokens": 1}}},
             {"type": "ping"},
             {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
             {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}},
             {"type": "content_block_stop", "index": 0},
             {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
              "usage": {"output_tokens": 12}},
             {"type": "message_stop"})


@given(st.lists(st.integers(0, len(STREAM)), max_size=6))
def test_a_stream_passes_unchanged_and_its_usage_is_read_wherever_it_is_cut(cuts: list[int]) -> None:
    points = [0, *sorted(cuts), len(STREAM)]
    tap = MessagesTap()
    out = b"".join(tap.feed(STREAM[a:b]) for a, b in itertools.pairwise(points)) + tap.finish()
    assert out == STREAM and tap.usage == Usage(120, 12) and tap.finish_reasons == ["end_turn"]


def test_a_stream_without_its_start_reports_no_usage() -> None:
    tap = MESSAGES.tap(call(), hide_usage=False)
    tap.feed(sse({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 3}}))
    assert tap.usage is None and tap.finish_reasons == ["end_turn"]


@pytest.mark.parametrize(("error", "kind"), [
    (BadRequest("bad input", param="messages"), "invalid_request_error"),
    (UpstreamUnreachable("upstream down"), "api_error"),
])
def test_the_proxys_errors_take_anthropics_shape(error: ProxyError, kind: str) -> None:
    assert MESSAGES.error_body(error) == {"type": "error", "error": {"type": kind, "message": error.message}}


def test_the_tools_a_summariser_sees_are_the_custom_tools_in_chats_shape() -> None:
    tools = [{"name": "ls", "description": "list", "input_schema": {"type": "object"}},
             {"type": "web_search_20250305", "name": "web_search"}, "junk"]
    assert MESSAGES.tools(call(tools=tools)) == [{"type": "function", "function": {
        "name": "ls", "description": "list", "parameters": {"type": "object"}}}]
    assert MESSAGES.tools(call()) is None and MESSAGES.tools(call(tools=[5])) is None


@pytest.mark.parametrize("usage", [[1, 2], "12", {"output_tokens": True}, {"output_tokens": -3}, None])
def test_a_broken_usage_in_a_stream_is_no_usage_and_never_raises(usage: Any) -> None:
    """The tap runs after the status went out, when a raise would cut the stream: what is not a count is none."""
    tap = MessagesTap()
    raw = sse({"type": "message_start", "message": {"usage": {"input_tokens": 7}}},
              {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": usage})
    assert tap.feed(raw) + tap.finish() == raw and tap.usage == Usage(7, None)
