"""Anthropic's compaction blocks as the proxy makes and opens them, and the answers that carry them."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.usage import Usage
from proxy.dialects.messages import MessagesTap
from proxy.dialects.messages_blocks import view_of_messages
from proxy.dialects.messages_compaction import (
    FAILED_BLOCK,
    AnnouncingTap,
    announced_body,
    compaction_block,
    compaction_message,
    message_events,
    with_compactions_opened,
)
from proxy.upstream.streaming import SseDecoder, sse_event

THINKING = {"type": "thinking", "thinking": "plan", "signature": "sig-abc"}
CONVERSATION: list[dict[str, Any]] = [
    {"role": "user", "content": "Fix the failing test."},
    {"role": "assistant", "content": [THINKING, {"type": "tool_use", "id": "toolu_1", "name": "bash",
                                                 "input": {"command": "pytest"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "1 failed"}]},
    {"role": "assistant", "content": [{"type": "text", "text": "Looking at it."}]},
    {"role": "user", "content": "Go on."},
]
SUMMARY = {"role": "user", "content": "Summary: the user asked to fix a failing test; pytest shows 1 failed."}
ACK = {"role": "assistant", "content": "Understood."}


def compacted() -> tuple[Any, list[dict[str, Any]], frozenset[int]]:
    """The view of CONVERSATION and a compacted history: its first message, the summary and its acknowledgement,
    the last two messages."""
    view = view_of_messages(CONVERSATION)
    assert view is not None
    messages = view.messages
    history = [messages[0], SUMMARY, ACK, *messages[-2:]]
    return view, history, frozenset({1, 2})


def test_a_block_holds_the_summary_and_seals_everything_kept() -> None:
    view, history, synthetic = compacted()
    block = compaction_block(view, history, synthetic)
    assert block["type"] == "compaction" and block["content"] == SUMMARY["content"]
    later = [{"role": "user", "content": "old, dropped by the client or not"},
             {"role": "assistant", "content": [block, {"type": "text", "text": "Fixed."}]},
             {"role": "user", "content": "Thanks, now the docs."}]
    # Everything before the block is dropped; the block opens into the conversation it stands for (the kept
    # messages byte for byte, the summary as a user message), merged where two user messages meet.
    assert with_compactions_opened(later) == [
        {"role": "user", "content": [{"type": "text", "text": "Fix the failing test."},
                                     {"type": "text", "text": SUMMARY["content"]}]},
        CONVERSATION[3], CONVERSATION[4],
        {"role": "assistant", "content": [{"type": "text", "text": "Fixed."}]},
        later[2]]


def test_thinking_kept_after_the_summary_is_byte_exact_through_the_block() -> None:
    view = view_of_messages(CONVERSATION)
    assert view is not None
    history = [SUMMARY, ACK, *view.messages[1:]]
    block = compaction_block(view, history, frozenset({0, 1}))
    opened = with_compactions_opened([{"role": "assistant", "content": [block]}, {"role": "user", "content": "next"}])
    assert opened is not None and opened[1] == CONVERSATION[1] and THINKING in opened[1]["content"]


@pytest.mark.parametrize(("block", "expected"), [
    # Another issuer's block: its text stands for what came before.
    ({"type": "compaction", "content": "They fixed X.", "encrypted_content": "opaque", "signature": "s"},
     [{"role": "user", "content": [{"type": "text", "text": "They fixed X."}]},
      {"role": "assistant", "content": [{"type": "text", "text": "Next."}]}]),
    # A failed compaction (null content) is a no-op, as Anthropic treats it: taken out, nothing before it dropped.
    (FAILED_BLOCK, [{"role": "user", "content": "old"},
                    {"role": "assistant", "content": [{"type": "text", "text": "Next."}]}]),
    # A forged or broken envelope is just another issuer's block: with no text, a no-op too.
    ({"type": "compaction", "content": None, "encrypted_content": "cpx2.!!!"},
     [{"role": "user", "content": "old"}, {"role": "assistant", "content": [{"type": "text", "text": "Next."}]}]),
])
def test_other_blocks(block: dict[str, Any], expected: list[Any]) -> None:
    next_text = {"type": "text", "text": "Next."}
    messages = [{"role": "user", "content": "old"}, {"role": "assistant", "content": [block, next_text]}]
    assert with_compactions_opened(messages) == expected


def test_a_turn_that_was_only_a_failed_block_goes_and_the_roles_still_alternate() -> None:
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": [FAILED_BLOCK]},
                {"role": "user", "content": "b"}]
    assert with_compactions_opened(messages) == [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                              {"type": "text", "text": "b"}]}]


def test_the_latest_block_wins_and_no_block_means_nothing_to_open() -> None:
    first = {"type": "compaction", "content": "first"}
    second = {"type": "compaction", "content": "second"}
    messages = [{"role": "assistant", "content": [first]}, {"role": "user", "content": "a"},
                {"role": "assistant", "content": [second]}, {"role": "user", "content": "b"}]
    assert with_compactions_opened(messages) == [{"role": "user", "content": [{"type": "text", "text": "second"},
                                                                              {"type": "text", "text": "b"}]}]
    assert with_compactions_opened(CONVERSATION) is None
    assert with_compactions_opened("not a list") is None


@given(st.lists(st.one_of(st.none(), st.integers(), st.text(max_size=5),
                          st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]),
                                                 "content": st.one_of(st.text(max_size=5), st.lists(
                                                     st.one_of(st.integers(), st.fixed_dictionaries(
                                                         {"type": st.sampled_from(["text", "compaction"]),
                                                          "content": st.one_of(st.none(), st.text(max_size=5))})),
                                                     max_size=3))})), max_size=6))
def test_any_messages_open_or_stay(messages: list[Any]) -> None:
    opened = with_compactions_opened(messages)
    assert opened is None or isinstance(opened, list)


def test_a_whole_answer_announces_the_block_and_the_edits() -> None:
    body = json.dumps({"type": "message", "content": [{"type": "text", "text": "Done."}]}).encode()
    applied = [{"type": "clear_tool_uses_20250919", "cleared_tool_uses": 2, "cleared_input_tokens": 900}]
    out = json.loads(announced_body(body, FAILED_BLOCK, applied))
    assert out["content"] == [FAILED_BLOCK, {"type": "text", "text": "Done."}]
    assert out["context_management"] == {"applied_edits": applied}
    assert json.loads(announced_body(body, None, []))["content"] == [{"type": "text", "text": "Done."}]
    assert announced_body(b"not json", FAILED_BLOCK, []) == b"not json"
    assert announced_body(b'{"type": "error"}', FAILED_BLOCK, []) == b'{"type": "error"}'


def upstream_stream() -> list[dict[str, Any]]:
    return [{"type": "message_start", "message": {"id": "msg_1", "content": [], "usage": {"input_tokens": 900,
                                                                                          "output_tokens": 1}}},
            {"type": "ping"},
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Done."}},
            {"type": "content_block_stop", "index": 0},
            {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 7}},
            {"type": "message_stop"}]


def decoded(raw: bytes) -> list[dict[str, Any]]:
    decoder = SseDecoder()
    return [event.json() for event in [*decoder.feed(raw), *decoder.flush()]]


@pytest.mark.parametrize("split", [1, 7, 10_000])
def test_a_stream_announces_the_block_first_and_moves_every_index(split: int) -> None:
    block = {"type": "compaction", "content": "Summary.", "encrypted_content": "cpx2.e30"}
    applied: list[dict[str, Any]] = []
    tap = AnnouncingTap(MessagesTap(), block, applied)
    raw = b"".join(sse_event(event) for event in upstream_stream())
    out = b"".join(tap.feed(raw[start:start + split]) for start in range(0, len(raw), split)) + tap.finish()
    events = decoded(out)
    assert [event["type"] for event in events] == [
        "message_start", "ping", "content_block_start", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop"]
    assert events[3]["delta"] == {"type": "compaction_delta", "content": "Summary.", "encrypted_content": "cpx2.e30"}
    assert [event.get("index") for event in events[2:8]] == [0, 0, 0, 1, 1, 1]
    assert events[8]["context_management"] == {"applied_edits": []}
    assert tap.usage == Usage(900, 7) and tap.finish_reasons == ["end_turn"]


def test_a_stream_that_errs_first_announces_nothing() -> None:
    raw = sse_event({"type": "message_start", "message": {"usage": {"input_tokens": 5}}}) + \
        sse_event({"type": "error", "error": {"type": "overloaded_error", "message": "busy"}})
    tap = AnnouncingTap(MessagesTap(), FAILED_BLOCK, [])
    assert tap.feed(raw) + tap.finish() == raw


@pytest.mark.parametrize("stream", [False, True])
def test_the_compaction_alone_as_json_and_as_a_stream(stream: bool) -> None:
    view, history, synthetic = compacted()
    message = compaction_message("claude", compaction_block(view, history, synthetic), Usage(5000, 300))
    assert message["stop_reason"] == "compaction" and message["usage"] == {"input_tokens": 5000,
                                                                            "output_tokens": 300}
    assert [block["type"] for block in message["content"]] == ["compaction"]
    if stream:
        events = decoded(message_events(message, [{"type": "clear_thinking_20251015", "cleared_thinking_turns": 1,
                                                   "cleared_input_tokens": 3}]))
        assert [event["type"] for event in events] == ["message_start", "content_block_start", "content_block_delta",
                                                       "content_block_stop", "message_delta", "message_stop"]
        assert events[2]["delta"]["content"] == message["content"][0]["content"]
        assert events[4]["delta"]["stop_reason"] == "compaction"
        assert events[4]["context_management"]["applied_edits"][0]["cleared_thinking_turns"] == 1

