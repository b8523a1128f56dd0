"""proxy.dialects.responses_compaction: the proxy's compaction items made, opened in place, and answered with."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from multidict import CIMultiDict

from proxy.core.envelope import PREFIX_V1, Sealed, opened, seal
from proxy.core.usage import Usage
from proxy.dialects.responses import ResponsesTap
from proxy.dialects.responses_compaction import (
    AnnouncingTap,
    announced_body,
    compaction_item,
    compaction_response,
    compaction_turn,
    turn_events,
    with_envelopes_opened,
)
from proxy.dialects.responses_items import view_of_input
from proxy.dialects.responses_request import ResponsesCall
from proxy.upstream.streaming import SseDecoder

INSTRUCTION = {"role": "user", "content": "Fix the bug."}
CALL = {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": "{}"}
OUTPUT = {"type": "function_call_output", "call_id": "c1", "output": "a.py"}
DEVELOPER = {"role": "developer", "content": "sandbox: read-only"}
SUMMARY = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "the summary"}]}


def ours(before: list[Any], summary: str | None, after: list[Any]) -> dict[str, Any]:
    sealed = Sealed(tuple(before), summary, tuple(after))
    return {"type": "compaction", "id": "cmp_x", "encrypted_content": seal(sealed)}


@pytest.mark.parametrize(("items", "expected"), [
    ("a string input", None), (None, None), ([INSTRUCTION, CALL, OUTPUT], None),
    ([{"type": "compaction", "encrypted_content": "gAAAA-openai"}, INSTRUCTION], None),  # another issuer's
    ([{"type": "compaction", "encrypted_content": PREFIX_V1 + "!!"}, INSTRUCTION], None),  # broken: not ours
    ([ours([DEVELOPER], "the summary", [CALL, OUTPUT]), {"role": "user", "content": "go on"}],
     [DEVELOPER, SUMMARY, CALL, OUTPUT, {"role": "user", "content": "go on"}]),
    # Codex keeps its user messages before the item and resends its context after it: each appears once.
    ([INSTRUCTION, ours([DEVELOPER, INSTRUCTION], "the summary", [CALL, OUTPUT]), DEVELOPER],
     [INSTRUCTION, SUMMARY, CALL, OUTPUT, DEVELOPER]),
    # The same words in another form (the proxy writes the long one) are the same message.
    ([{"role": "user", "content": [{"type": "input_text", "text": "Fix the bug."}]},
      ours([{"type": "message", "role": "user", "content": "Fix the bug."}], "the summary", [])],
     [{"role": "user", "content": [{"type": "input_text", "text": "Fix the bug."}]}, SUMMARY]),
    # The same words from another speaker are not.
    ([{"role": "developer", "content": "Fix the bug."}, ours([INSTRUCTION], None, [])],
     [{"role": "developer", "content": "Fix the bug."}, INSTRUCTION]),
    # Tool calls and results are never taken for the client's copies: the envelope's stay.
    ([CALL, OUTPUT, ours([], "the summary", [CALL, OUTPUT])], [CALL, OUTPUT, SUMMARY, CALL, OUTPUT]),
    ([ours([INSTRUCTION], None, [])], [INSTRUCTION]),
    ([{"type": "compaction", "encrypted_content": PREFIX_V1 + "eyJ2IjogMSwgInN1bW1hcnkiOiAidGhlIHN1bW1hcnkifQ"}],
     [SUMMARY]),  # version 1: the summary alone
])
def test_the_proxys_items_open_in_place_and_no_others(items: Any, expected: list[Any] | None) -> None:
    assert with_envelopes_opened(items) == expected


def test_a_compacted_history_seals_into_one_item_that_opens_to_it() -> None:
    original = [INSTRUCTION, CALL, OUTPUT, {"role": "user", "content": "and now?"}]
    view = view_of_input(original)
    assert view is not None
    summary = {"role": "user", "content": "what happened so far"}
    ack = {"role": "assistant", "content": "Understood."}
    messages = [view.messages[0], summary, ack, *view.messages[-2:]]  # the tool round replaced by the summary
    item = compaction_item(view, messages, frozenset({1, 2}))
    sealed = opened(item["encrypted_content"])
    assert sealed == Sealed((INSTRUCTION,), "what happened so far", tuple(original[-2:]))
    assert item["id"].startswith("cmp_") and item == compaction_item(view, messages, frozenset({1, 2}))
    assert with_envelopes_opened([item]) == [INSTRUCTION, {"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "what happened so far"}]}, *original[-2:]]


def test_a_history_with_nothing_summarised_seals_as_it_is() -> None:
    view = view_of_input([INSTRUCTION, CALL, OUTPUT])
    assert view is not None
    item = compaction_item(view, view.messages, frozenset())
    assert opened(item["encrypted_content"]) == Sealed((INSTRUCTION, CALL, OUTPUT), None, ())


def test_the_answers_carry_the_item_and_the_usage() -> None:
    item = {"type": "compaction", "id": "cmp_1", "encrypted_content": "cpx2.x"}
    compact = compaction_response(item, Usage(900, 100))
    assert (compact["object"], compact["output"]) == ("response.compaction", [item])
    assert compact["usage"] == {"input_tokens": 900, "output_tokens": 100, "total_tokens": 1000}
    call = ResponsesCall.parse(json.dumps({"model": "m", "input": "x", "tools": [{"type": "function", "name": "ls"}]})
                               .encode(), CIMultiDict(), "")
    turn = compaction_turn(call, item, Usage(900, None))
    assert (turn["object"], turn["status"], turn["model"], turn["output"]) == ("response", "completed", "m", [item])
    assert turn["usage"]["total_tokens"] == 900 and turn["tools"] == [{"type": "function", "name": "ls"}]
    decoder = SseDecoder()
    events = decoder.feed(turn_events(turn)) + decoder.flush()
    assert [event.event for event in events] == [event.json()["type"] for event in events] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.output_item.done",
        "response.completed"]
    assert events[0].json()["response"]["status"] == "in_progress" and events[0].json()["response"]["output"] == []
    assert events[3].json()["item"] == item and events[-1].json()["response"] == turn


@given(st.lists(st.dictionaries(st.sampled_from(["type", "role", "encrypted_content", "content"]),
                                st.sampled_from(["compaction", "user", "message", "cpx2.e30", "cpx2.", "x", 3]),
                                max_size=4), max_size=6))
def test_any_items_open_or_not_but_never_raise(items: list[Any]) -> None:
    result = with_envelopes_opened(items)
    assert result is None or isinstance(result, list)


def sse(events: list[dict[str, Any]]) -> bytes:
    return b"".join(f"event: {e['type']}\ndata: {json.dumps({**e, 'sequence_number': n})}\n\n".encode()
                    for n, e in enumerate(events))


MESSAGE = {"type": "message", "id": "msg_1", "role": "assistant", "content": [{"type": "output_text", "text": "hi"}]}
COMPLETED = {"id": "resp_1", "status": "completed", "output": [MESSAGE], "usage": {"input_tokens": 9,
                                                                                  "output_tokens": 1}}
STREAM = sse([{"type": "response.created", "response": {"id": "resp_1", "output": []}},
              {"type": "response.in_progress", "response": {"id": "resp_1", "output": []}},
              {"type": "response.output_item.added", "output_index": 0, "item": MESSAGE},
              {"type": "response.output_text.delta", "output_index": 0, "item_id": "msg_1", "delta": "hi"},
              {"type": "response.output_item.done", "output_index": 0, "item": MESSAGE},
              {"type": "response.completed", "response": COMPLETED}])
ITEM = {"type": "compaction", "id": "cmp_1", "encrypted_content": "cpx2.e30"}


def tapped(chunks: list[bytes]) -> list[dict[str, Any]]:
    tap = AnnouncingTap(ResponsesTap(), ITEM)
    out = b"".join(tap.feed(chunk) for chunk in chunks) + tap.finish()
    decoder = SseDecoder()
    assert tap.usage == Usage(9, 1)  # the inner tap still reads the stream as the upstream sent it
    return [event.json() for event in [*decoder.feed(out), *decoder.flush()]]


def test_a_stream_announces_the_item_first_and_moves_everything_after_it() -> None:
    events = tapped([STREAM])
    assert [(e["type"], e.get("output_index"), e["sequence_number"]) for e in events] == [
        ("response.created", None, 0), ("response.in_progress", None, 1),
        ("response.output_item.added", 0, 2), ("response.output_item.done", 0, 3),
        ("response.output_item.added", 1, 4), ("response.output_text.delta", 1, 5),
        ("response.output_item.done", 1, 6), ("response.completed", None, 7)]
    assert events[2]["item"] == events[3]["item"] == ITEM
    assert events[-1]["response"]["output"] == [ITEM, MESSAGE]


@given(st.lists(st.integers(0, len(STREAM)), max_size=8))
def test_the_announcement_does_not_depend_on_where_the_stream_is_cut(cuts: list[int]) -> None:
    points = [0, *sorted(cuts), len(STREAM)]
    assert tapped([STREAM[a:b] for a, b in itertools.pairwise(points)]) == tapped([STREAM])


@pytest.mark.parametrize("failure", [
    {"type": "error", "code": "context_length_exceeded", "message": "too long"},
    {"type": "response.failed", "response": {"id": "resp_1", "status": "failed", "output": []}},
])
def test_a_stream_that_fails_before_any_output_announces_nothing(failure: dict[str, Any]) -> None:
    raw = sse([{"type": "response.created", "response": {"id": "resp_1", "output": []}}, failure])
    tap = AnnouncingTap(ResponsesTap(), ITEM)
    assert tap.feed(raw[:7]) + tap.feed(b": keep-alive\n\n" + raw[7:]) + tap.finish() == \
        raw[:7] + b": keep-alive\n\n" + raw[7:]


@pytest.mark.parametrize(("body", "expected"), [
    (json.dumps({"id": "r", "output": [MESSAGE]}).encode(), {"id": "r", "output": [ITEM, MESSAGE]}),
    (b"not json", None), (b"[1, 2]", None), (json.dumps({"error": {"message": "x"}}).encode(), None),
])
def test_a_whole_response_gets_the_item_first_and_anything_else_passes(body: bytes, expected: Any) -> None:
    out = announced_body(body, ITEM)
    assert (json.loads(out) == expected) if expected is not None else out == body
