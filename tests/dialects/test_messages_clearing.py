"""Anthropic's clearing edits as the proxy applies them: which results and inputs are cleared for each knob, what
is reported, and that the client's own messages are never changed."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from proxy.dialects.messages_clearing import cleared
from proxy.dialects.messages_context import ClearThinking, ClearToolUses, ContextEdits


def count(value: Any) -> int:
    """A token per four characters of JSON: enough to see what was freed."""
    return len(value if isinstance(value, str) else json.dumps(value)) // 4


def tool_loop(rounds: int, *, names: tuple[str, ...] = ("bash",), result: str = "line\n" * 100) -> list[Any]:
    messages: list[Any] = [{"role": "user", "content": "Fix the bug."}]
    for index in range(rounds):
        name = names[index % len(names)]
        messages.append({"role": "assistant", "content": [
            {"type": "thinking", "thinking": f"step {index}", "signature": f"sig{index}"},
            {"type": "tool_use", "id": f"toolu_{index}", "name": name, "input": {"command": f"cmd {index}"}}]})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"toolu_{index}", "content": f"{index}: {result}"}]})
    return messages


def results(messages: list[Any]) -> list[str]:
    return [block["content"] for message in messages if message["role"] == "user"
            and isinstance(message["content"], list) for block in message["content"]]


def inputs(messages: list[Any]) -> list[Any]:
    return [block["input"] for message in messages if message["role"] == "assistant"
            for block in message["content"] if block["type"] == "tool_use"]


def is_cleared(text: str) -> bool:
    return text.startswith("[cleared to save context")


def big() -> int:
    return 10**9


def small() -> int:
    return 0


@pytest.mark.parametrize(("edit", "prompt", "cleared_flags", "cleared_inputs"), [
    # Past the trigger, all but the last `keep` (3 by default) are cleared; results only by default.
    (ClearToolUses(trigger=100), big, [True, True, False, False, False], [False] * 5),
    # Below it, nothing.
    (ClearToolUses(trigger=100), small, [False] * 5, [False] * 5),
    (ClearToolUses(keep=1, trigger=100), big, [True, True, True, True, False], [False] * 5),
    (ClearToolUses(keep=0, trigger=100), big, [True] * 5, [False] * 5),
    (ClearToolUses(keep=9, trigger=100), big, [False] * 5, [False] * 5),
    # A trigger in tool uses: more uses than the value.
    (ClearToolUses("tool_uses", 4, keep=3), small, [True, True, False, False, False], [False] * 5),
    (ClearToolUses("tool_uses", 5, keep=3), small, [False] * 5, [False] * 5),
    # Excluded tools keep their results (the loop alternates bash and memory).
    (ClearToolUses(keep=1, trigger=100, exclude_tools=frozenset({"memory"})), big,
     [True, False, True, False, False], [False] * 5),
    # Inputs cleared too: all of them, or those of the tools named.
    (ClearToolUses(keep=3, trigger=100, clear_inputs=True), big, [True, True, False, False, False],
     [True, True, False, False, False]),
    (ClearToolUses(keep=1, trigger=100, clear_inputs=frozenset({"memory"})), big,
     [True, True, True, True, False], [False, True, False, True, False]),
    # Too little to free: nothing changes (a cleared prefix busts the upstream's cache).
    (ClearToolUses(keep=3, trigger=100, clear_at_least=10**6), big, [False] * 5, [False] * 5),
])
def test_each_clearing_knob(edit: ClearToolUses, prompt: Any, cleared_flags: list[bool],
                            cleared_inputs: list[bool]) -> None:
    messages = tool_loop(5, names=("bash", "memory"))
    original = copy.deepcopy(messages)
    clearing = cleared(messages, ContextEdits(clear_tool_uses=edit), prompt, count)
    assert messages == original  # the client's copy is never touched
    assert [is_cleared(text) for text in results(clearing.messages)] == cleared_flags
    assert [value == {} for value in inputs(clearing.messages)] == cleared_inputs
    if any(cleared_flags):
        [report] = clearing.applied
        assert report["type"] == "clear_tool_uses_20250919"
        assert report["cleared_tool_uses"] == sum(cleared_flags)
        freed = [count(old) - count(new) for old, new in ((*zip(results(original), results(clearing.messages),
                                                               strict=True),
                                                           *zip(inputs(original), inputs(clearing.messages),
                                                                strict=True))) if old != new]
        assert report["cleared_input_tokens"] == sum(freed) > 0
        assert clearing.outcomes == {"clear_tool_uses_20250919": "applied"}
    else:
        assert clearing.applied == [] and clearing.messages == original
        assert clearing.outcomes["clear_tool_uses_20250919"] in ("not_triggered", "too_little", "nothing_to_clear")


def test_a_placeholder_names_the_tool_and_what_was_there() -> None:
    clearing = cleared(tool_loop(4), ContextEdits(clear_tool_uses=ClearToolUses(keep=3, trigger=1)), big, count)
    first = results(clearing.messages)[0]
    assert "bash" in first and "tokens" in first
    ids = [block.get("tool_use_id") for message in clearing.messages if message["role"] == "user"
           and isinstance(message["content"], list) for block in message["content"]]
    assert ids == ["toolu_0", "toolu_1", "toolu_2", "toolu_3"]  # every result still answers its call


def test_an_unanswered_call_is_left_as_it_is() -> None:
    messages = tool_loop(4)[:-1]  # the last call has no result yet
    clearing = cleared(messages, ContextEdits(clear_tool_uses=ClearToolUses(keep=0, trigger=1, clear_inputs=True)),
                       big, count)
    assert inputs(clearing.messages)[-1] == {"command": "cmd 3"}
    assert clearing.applied[0]["cleared_tool_uses"] == 3


@pytest.mark.parametrize(("keep", "kept_turns", "report"), [
    (1, [False, False, False, True], 3), (2, [False, False, True, True], 2), (None, [True] * 4, 0),
    (9, [True] * 4, 0)])
def test_thinking_is_kept_in_the_last_turns_only(keep: int | None, kept_turns: list[bool], report: int) -> None:
    messages = tool_loop(4)
    clearing = cleared(messages, ContextEdits(clear_thinking=ClearThinking(keep)), small, count)
    assistants = [message for message in clearing.messages if message["role"] == "assistant"]
    assert [any(block["type"] == "thinking" for block in message["content"]) for message in assistants] == kept_turns
    kept = [message for message, flag in zip(assistants, kept_turns, strict=True) if flag]
    assert all(message in messages for message in kept)  # a kept turn goes on byte for byte
    if report:
        assert clearing.applied == [{"type": "clear_thinking_20251015", "cleared_thinking_turns": report,
                                     "cleared_input_tokens": report * count(messages[1]["content"][0])}]
    else:
        assert clearing.applied == []


def test_a_turn_that_is_only_thinking_keeps_it() -> None:
    messages = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": [{"type": "redacted_thinking", "data": "xyz"}]},
                {"role": "user", "content": "go on"}, {"role": "assistant", "content": "ok"},
                {"role": "user", "content": "and?"}]
    clearing = cleared(messages, ContextEdits(clear_thinking=ClearThinking(1)), small, count)
    assert clearing.messages == messages and clearing.outcomes == {"clear_thinking_20251015": "nothing_to_clear"}


def test_thinking_is_cleared_before_tool_results_and_both_are_reported() -> None:
    edits = ContextEdits(clear_thinking=ClearThinking(1), clear_tool_uses=ClearToolUses(keep=1, trigger=1))
    clearing = cleared(tool_loop(3), edits, big, count)
    assert [report["type"] for report in clearing.applied] == ["clear_thinking_20251015", "clear_tool_uses_20250919"]


@pytest.mark.parametrize("messages", [
    [], [{"role": "user", "content": "hi"}], [5, "x", {"role": "assistant", "content": [5, {"type": "tool_use"}]}],
    [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": 5, "content": "x"}]}]])
def test_odd_messages_are_left_alone(messages: list[Any]) -> None:
    edits = ContextEdits(clear_thinking=ClearThinking(1), clear_tool_uses=ClearToolUses(keep=0, trigger=0))
    assert cleared(messages, edits, big, count).messages == messages
