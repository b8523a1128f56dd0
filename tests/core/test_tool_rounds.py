"""Tool rounds: which are complete, what names and fingerprints them, and that swapping one keeps every pairing."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.core.messages import Message
from proxy.core.tool_rounds import (
    ToolRound,
    call_arguments,
    described,
    textual,
    tool_rounds,
    with_round_summaries,
    with_round_summary,
)
from proxy.dialects import messages_blocks, responses_items
from proxy.dialects.messages_blocks import view_of_messages
from proxy.dialects.responses_items import view_of_input


def call(call_id: Any, name: Any = "shell", arguments: str = '{"cmd": "ls"}') -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def asks(*calls: dict[str, Any], content: Any = None) -> Message:
    return {"role": "assistant", "content": content, "tool_calls": list(calls)}


def result(call_id: Any, content: Any = "ok") -> Message:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


USER = {"role": "user", "content": "go"}
SYSTEM = {"role": "system", "content": "be brief"}

# (conversation, the (call_index, result_indices, call_ids) of each round found)
CASES: dict[str, tuple[list[Any], list[tuple[int, tuple[int, ...], tuple[str, ...]]]]] = {
    "one call": ([SYSTEM, USER, asks(call("a")), result("a")], [(2, (3,), ("a",))]),
    "two rounds": ([USER, asks(call("a")), result("a"), asks(call("b")), result("b")],
                   [(1, (2,), ("a",)), (3, (4,), ("b",))]),
    "parallel calls answered together": ([USER, asks(call("a"), call("b")), result("a"), result("b")],
                                         [(1, (2, 3), ("a", "b"))]),
    "results out of order": ([USER, asks(call("a"), call("b"), call("c")), result("c"), result("a"), result("b")],
                             [(1, (2, 3, 4), ("a", "b", "c"))]),
    "an unanswered call": ([USER, asks(call("a"), call("b")), result("a"), USER], []),
    "the last call not answered yet": ([USER, asks(call("a")), result("a"), asks(call("b"))], [(1, (2,), ("a",))]),
    "answered after a user message": ([USER, asks(call("a")), USER, result("a")], []),
    "a result for another call": ([USER, asks(call("a")), result("a"), result("x")], []),
    "a result given twice": ([USER, asks(call("a"), call("b")), result("a"), result("a"), result("b")], []),
    "a call id used twice": ([USER, asks(call("a"), call("a")), result("a"), result("a")], []),
    "a call without an id": ([USER, asks(call(None)), result("a")], []),
    "a call with an empty id": ([USER, asks(call("")), result("")], []),
    "a call without a name": ([USER, asks(call("a", name=None)), result("a")], []),
    "legacy function role": ([USER, {"role": "assistant", "content": None,
                                     "function_call": {"name": "shell", "arguments": "{}"}},
                              {"role": "function", "name": "shell", "content": "ok"}], []),
    "a legacy result among the tool results": ([USER, asks(call("a"), call("b")), result("a"),
                                                {"role": "function", "name": "shell", "content": "ok"},
                                                result("b")], []),
    "a custom tool (Responses)": ([USER, asks({"id": "p", "type": "custom",
                                               "custom": {"name": "apply_patch", "input": "*** Begin"}}),
                                   result("p")], [(1, (2,), ("p",))]),
    "odd input": ([None, 3, "text", {"role": 7}, {"role": "assistant", "tool_calls": "x"},
                   {"role": "assistant", "tool_calls": [None]}, {"role": "assistant", "tool_calls": []},
                   {"role": "tool", "tool_call_id": 5}], []),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_which_rounds_are_complete(name: str) -> None:
    conversation, expected = CASES[name]
    found = tool_rounds(conversation)
    assert [(r.call_index, r.result_indices, r.call_ids) for r in found] == expected


def test_names_and_result_tokens() -> None:
    conversation = [USER, asks(call("a", "ls"), call("b", "cat"), call("c", "ls")),
                    result("b", "12345"), result("a", "1"), result("c", "")]
    (found,) = tool_rounds(conversation, count=lambda message: len(message["content"]))
    assert found.names == ("ls", "cat", "ls") and found.tools == ("ls", "cat")
    assert found.result_tokens == 6
    assert tool_rounds(conversation)[0].result_tokens is None


def test_a_responses_conversation_read_into_neutral_form() -> None:
    view = view_of_input([
        {"type": "message", "role": "user", "content": "look around"},
        {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": '{"path": "."}'},
        {"type": "function_call", "call_id": "c2", "name": "cat", "arguments": '{"path": "a.py"}'},
        {"type": "function_call_output", "call_id": "c2", "output": "print(1)"},
        {"type": "function_call_output", "call_id": "c1", "output": "a.py b.py"},
        {"type": "custom_tool_call", "call_id": "c3", "name": "apply_patch", "input": "*** Begin Patch"},
        {"type": "custom_tool_call_output", "call_id": "c3", "output": "Done"},
        {"type": "function_call", "call_id": "c4", "name": "ls", "arguments": "{}"},
    ])
    assert view is not None
    found = tool_rounds(view.messages)
    assert [(r.call_ids, r.names) for r in found] == [(("c1", "c2"), ("ls", "cat")), (("c3",), ("apply_patch",))]
    assert call_arguments(view.messages[found[1].call_index]["tool_calls"][0]) == "*** Begin Patch"


def test_a_messages_conversation_read_into_neutral_form() -> None:
    view = view_of_messages([
        {"role": "user", "content": "look around"},
        {"role": "assistant", "content": [{"type": "text", "text": "Listing."},
                                          {"type": "tool_use", "id": "t1", "name": "ls", "input": {"path": "."}},
                                          {"type": "tool_use", "id": "t2", "name": "cat", "input": {"p": "a"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t2", "content": "print(1)"},
                                     {"type": "tool_result", "tool_use_id": "t1", "is_error": True,
                                      "content": [{"type": "text", "text": "denied"}]},
                                     {"type": "text", "text": "and then?"}]},
    ])
    assert view is not None
    (found,) = tool_rounds(view.messages)
    assert found.call_ids == ("t1", "t2") and found.result_indices == (2, 3)
    assert described(view.messages, found) == {
        "calls": [{"name": "ls", "arguments": '{"path":"."}'}, {"name": "cat", "arguments": '{"p":"a"}'}],
        "results": [{"name": "cat", "text": "print(1)"}, {"name": "ls", "text": "denied"}]}


# --- what names a round and what fingerprints it -------------------------------------------------------------

BASE = [USER, asks(call("a", arguments='{"path": "src/app.py"}')), result("a", "line 1\nline 2")]


@pytest.mark.parametrize(("change", "same_key", "same_fingerprint"), [
    (lambda m: None, True, True),
    (lambda m: m[2].update(content="line 1\nline 3"), True, False),  # one byte of the result
    (lambda m: m[2].update(content=[{"type": "text", "text": "line 1\nline 2"}]), True, False),  # its shape
    (lambda m: m[1]["tool_calls"][0]["function"].update(arguments='{"path": "src/app.pY"}'), True, False),
    (lambda m: m[1]["tool_calls"][0]["function"].update(name="cat"), False, False),
    (lambda m: (m[1]["tool_calls"][0].update(id="b"), m[2].update(tool_call_id="b")), False, False),
    (lambda m: m[1].update(content="some words beside the call"), True, True),  # not part of the round
    (lambda m: m.insert(0, SYSTEM), True, True),  # where the round stands is not part of it
])
def test_key_and_fingerprint(change: Any, same_key: bool, same_fingerprint: bool) -> None:
    changed = copy.deepcopy(BASE)
    change(changed)
    (before,), (after,) = tool_rounds(BASE), tool_rounds(changed)
    assert (before.key == after.key, before.fingerprint == after.fingerprint) == (same_key, same_fingerprint)


def test_results_reordered_are_the_same_round() -> None:
    one = [USER, asks(call("a"), call("b")), result("a", "A"), result("b", "B")]
    other = [USER, asks(call("a"), call("b")), result("b", "B"), result("a", "A")]
    assert tool_rounds(one)[0].fingerprint == tool_rounds(other)[0].fingerprint


# --- swapping ------------------------------------------------------------------------------------------------

def test_the_first_result_carries_the_summary_the_others_a_pointer() -> None:
    conversation = [USER, asks(call("a"), call("b")),
                    {"role": "tool", "tool_call_id": "b", "content": "B" * 50, "is_error": True, "name": "cat"},
                    {"role": "tool", "tool_call_id": "a", "content": [{"type": "text", "text": "A"}],
                     "item_type": "function_call_output"}, USER]
    before = copy.deepcopy(conversation)
    (found,) = tool_rounds(conversation)
    swapped = with_round_summary(conversation, found, "SUMMARY", "POINTER")
    assert conversation == before  # a copy: the client's messages are untouched
    assert swapped[2] == {"role": "tool", "tool_call_id": "b", "content": "SUMMARY", "is_error": True, "name": "cat"}
    assert swapped[3] == {"role": "tool", "tool_call_id": "a", "content": "POINTER",
                          "item_type": "function_call_output"}
    assert all(swapped[i] is conversation[i] for i in (0, 1, 4))  # untouched messages are the same objects


def test_a_round_that_is_not_in_the_messages_is_refused() -> None:
    conversation = [USER, asks(call("a")), result("a")]
    (found,) = tool_rounds(conversation)
    for other in ([USER], [USER, asks(call("a")), USER], [USER, asks(call("a")), result("b")]):
        with pytest.raises(ValueError):
            with_round_summary(other, found, "S", "P")


def test_textual_results_only() -> None:
    image = [{"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": "data:,"}}]
    for content, expected in (("text", True), ([{"type": "text", "text": "x"}], True), (image, False)):
        conversation = [USER, asks(call("a")), result("a", content)]
        assert textual(conversation, tool_rounds(conversation)[0]) is expected


def test_a_swapped_responses_conversation_renders_valid_items() -> None:
    items = [{"type": "message", "role": "user", "content": "go"},
             {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": "{}"},
             {"type": "function_call", "call_id": "c2", "name": "cat", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "c2", "output": "long output " * 20},
             {"type": "function_call_output", "call_id": "c1", "output": "a.py"},
             {"type": "message", "role": "user", "content": "next"}]
    view = view_of_input(items)
    assert view is not None
    (found,) = tool_rounds(view.messages)
    rendered = view.back(with_round_summary(view.messages, found, "SUMMARY", "POINTER"), responses_items.render)
    outputs = [(item["call_id"], item["output"]) for item in rendered if item.get("type") == "function_call_output"]
    assert outputs == [("c2", "SUMMARY"), ("c1", "POINTER")]
    again = view_of_input(rendered)
    assert again is not None and [r.call_ids for r in tool_rounds(again.messages)] == [("c1", "c2")]


def test_a_swapped_messages_conversation_renders_valid_blocks() -> None:
    conversation = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "ls", "input": {}},
                                          {"type": "tool_use", "id": "t2", "name": "cat", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "x " * 40},
                                     {"type": "tool_result", "tool_use_id": "t2", "content": "y", "is_error": True},
                                     {"type": "text", "text": "and then?"}]}]
    view = view_of_messages(conversation)
    assert view is not None
    (found,) = tool_rounds(view.messages)
    rendered = view.back(with_round_summary(view.messages, found, "SUMMARY", "POINTER"), messages_blocks.render)
    assert [message["role"] for message in rendered] == ["user", "assistant", "user"]
    assert rendered[:2] == conversation[:2]
    blocks = rendered[2]["content"]
    results = [(b["tool_use_id"], b["content"], b.get("is_error")) for b in blocks if b["type"] == "tool_result"]
    assert results == [("t1", "SUMMARY", None), ("t2", "POINTER", True)]
    assert {"type": "text", "text": "and then?"} in blocks
    again = view_of_messages(rendered)
    assert again is not None and [r.call_ids for r in tool_rounds(again.messages)] == [("t1", "t2")]


# --- property: swapping never breaks pairing -------------------------------------------------------------

@st.composite
def conversations(draw: st.DrawFn) -> list[Message]:
    """Agent conversations: user turns, rounds of parallel calls with results in any order, and broken rounds
    (an unanswered call, a stray or repeated result, a legacy function result, a call id reused)."""
    messages: list[Message] = [{"role": "system", "content": "s"}]
    ids = iter(range(10_000))
    for _ in range(draw(st.integers(0, 12))):
        kind = draw(st.sampled_from(["user", "round", "round", "round", "broken"]))
        if kind == "user":
            messages.append({"role": "user", "content": draw(st.text(max_size=5))})
            continue
        made = [f"call_{next(ids)}" for _ in range(draw(st.integers(1, 4)))]
        if draw(st.booleans()) and len(messages) > 2:
            made[0] = "call_0"  # an id used before, in an earlier round
        messages.append(asks(*(call(i, draw(st.sampled_from(["ls", "cat"]))) for i in made)))
        answers = draw(st.permutations(made))
        if kind == "broken":
            answers = draw(st.sampled_from([answers[1:], [*answers, answers[0]], [*answers, "stray"]]))
            if draw(st.booleans()):
                messages.append({"role": "function", "name": "ls", "content": "legacy"})
        messages.extend(result(i, draw(st.text(max_size=8))) for i in answers)
    return messages


def pairing(messages: list[Message]) -> list[tuple[int, list[Any]]]:
    """For each assistant message with calls: the ids the tool messages right after it answer."""
    found = []
    for index, message in enumerate(messages):
        if message.get("role") == "assistant" and message.get("tool_calls"):
            after = []
            for follower in messages[index + 1:]:
                if follower.get("role") != "tool":
                    break
                after.append(follower.get("tool_call_id"))
            found.append((index, after))
    return found


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversations(), st.data())
def test_swapping_never_breaks_pairing(messages: list[Message], data: st.DataObject) -> None:
    rounds = tool_rounds(messages)
    chosen: list[ToolRound] = data.draw(st.lists(st.sampled_from(rounds), unique_by=lambda r: r.call_index)
                                        if rounds else st.just([]))
    before = json.dumps(messages)
    swapped = with_round_summaries(messages, [(r, f"summary of {r.call_ids}", "see above") for r in chosen])
    assert json.dumps(messages) == before
    assert len(swapped) == len(messages)
    assert [m.get("role") for m in swapped] == [m.get("role") for m in messages]
    assert [m.get("tool_call_id") for m in swapped] == [m.get("tool_call_id") for m in messages]
    assert [m.get("tool_calls") for m in swapped] == [m.get("tool_calls") for m in messages]
    assert pairing(swapped) == pairing(messages)
    # Every round is still the same round (its key), so it is found again and answered by exactly its calls.
    assert [(r.call_index, r.result_indices, r.key) for r in tool_rounds(swapped)] == \
        [(r.call_index, r.result_indices, r.key) for r in rounds]
    for r in rounds:
        assert sorted(swapped[i]["tool_call_id"] for i in r.result_indices) == sorted(r.call_ids)
    for r in chosen:
        assert swapped[r.result_indices[0]]["content"].startswith("summary of")
