"""Tests for the compaction policy: tail choice, system message handling, tool pairing and splicing."""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest

from proxy.compaction import (
    Plan,
    apply_replacement,
    check_tool_pairing,
    plan_compaction,
    replacement,
    splice,
)

Message = dict[str, Any]
SUMMARY: Message = {"role": "user", "content": "# Conversation Summary\n..."}
NOTE: Message = {"role": "assistant", "content": "Continuing from the summary."}


def _call(call_id: str) -> Message:
    return {"id": call_id, "type": "function", "function": {"name": "f", "arguments": "{}"}}


def build(spec: str) -> list[Message]:
    """A history from a compact spec: S system, D developer, U user, A assistant, C:x,y calls, T:x answers x."""
    messages: list[Message] = []
    for index, token in enumerate(spec.split()):
        kind, _, ids = token.partition(":")
        if kind == "C":
            calls = [_call(call_id) for call_id in ids.split(",")]
            messages.append(
                {"role": "assistant", "content": None, "tool_calls": calls, "reasoning_content": f"r{index}"}
            )
        elif kind == "T":
            messages.append({"role": "tool", "tool_call_id": ids, "content": f"result {index}"})
        else:
            role = {"S": "system", "D": "developer", "U": "user", "A": "assistant"}[kind]
            messages.append({"role": role, "content": f"{role} {index}"})
    return messages


def ten_each(message: Message) -> int:
    return 10


@pytest.mark.parametrize(
    ("spec", "budget", "expected"),
    [
        # expected: (head length, prefix_len, indices of kept system messages) or None
        ("S U A U A U", 0, (1, 5, [])),
        ("S U A U C:x T:x C:y T:y", 0, (1, 3, [])),
        ("S U A U C:x,y T:y T:x", 0, (1, 3, [])),
        ("U A U C:x T:x A U", 40, (0, 6, [])),
        ("U C:x T:x A U C:x T:x", 0, (0, 4, [])),
        ("U A U C:x U T:x", 0, (0, 2, [])),
        ("S U A D U A U", 0, (1, 6, [3])),
        ("S D U A D S U", 0, (2, 6, [4, 5])),
        ("S U A U A U A U", 30, (1, 5, [])),
        ("S U A U A U A U", 29, (1, 7, [])),
        ("S U A U A U", 1000, (1, 3, [])),
        ("U A U C:x T:x", 5, (0, 2, [])),
        ("S A A", 0, None),
        ("", 0, None),
        ("S U", 0, None),
        ("S U C:x T:x", 0, None),
        ("S D U A", 0, None),
    ],
)
def test_tail_selection(spec: str, budget: int, expected: tuple[int, int, list[int]] | None) -> None:
    messages = build(spec)
    plan = plan_compaction(messages, ten_each, budget)
    if expected is None:
        assert plan is None
        return
    head_len, prefix_len, kept = expected
    assert plan is not None
    assert (len(plan.head), plan.prefix_len) == (head_len, prefix_len)
    assert list(plan.kept_system) == [messages[i] for i in kept]
    assert [*plan.head, *plan.span, *plan.tail] == messages
    assert plan.tail[0]["role"] == "user"


def test_token_figures() -> None:
    messages = build("S U A D U A U C:x T:x")
    plan = plan_compaction(messages, lambda m: len(m["role"]), 0)
    assert plan is not None
    lengths = [len(m["role"]) for m in messages]
    assert plan.tokens_before == sum(lengths)
    assert plan.head_tokens == lengths[0]
    assert plan.span_tokens == sum(lengths[1:6])
    assert plan.kept_system_tokens == len("developer")
    assert plan.tail_tokens == sum(lengths[6:])
    assert plan.tokens_after(100) == plan.head_tokens + plan.kept_system_tokens + plan.tail_tokens + 100


def test_summariser_input_leaves_out_kept_system_messages() -> None:
    messages = build("S U A D U A U")
    plan = plan_compaction(messages, ten_each, 0)
    assert plan is not None
    assert [m["role"] for m in plan.to_summarise] == ["user", "assistant", "user", "assistant"]
    assert messages[3] in plan.span and messages[3] not in plan.to_summarise


@pytest.mark.parametrize(
    ("spec", "roles"),
    [
        ("S U A U", ["system", "user", "assistant", "user"]),
        ("U A U A U", ["user", "assistant", "user"]),
        ("S U A D U C:x T:x", ["system", "developer", "user", "assistant", "user", "assistant", "tool"]),
    ],
)
def test_splice_shape(spec: str, roles: list[str]) -> None:
    messages = build(spec)
    plan = plan_compaction(messages, ten_each, 0)
    assert plan is not None
    spliced = splice(plan, SUMMARY, NOTE)
    assert [m["role"] for m in spliced] == roles
    summary_at = spliced.index(SUMMARY)
    assert spliced[summary_at + 1] is NOTE and spliced[summary_at + 2]["role"] == "user"
    assert spliced[-1] is messages[-1]
    assert check_tool_pairing(spliced) == []
    assert replacement(plan, SUMMARY, NOTE) + messages[plan.prefix_len :] == spliced


def test_invalid_input_stays_detectably_invalid() -> None:
    """Splicing cannot repair a broken client history; the checker must still catch it before forwarding."""
    plan = plan_compaction(build("S D U A U A U T:q"), ten_each, 0)
    assert plan is not None
    assert check_tool_pairing(splice(plan, SUMMARY, NOTE)) != []


def test_hostile_field_types_do_not_crash_planning() -> None:
    messages: list[Any] = [
        {"role": "user", "content": "u"},
        {"role": "assistant", "tool_calls": [{"id": {"x": 1}}, "junk"]},
        {"role": "tool", "tool_call_id": ["x"]},
        {"role": ["system"], "content": "odd role"},
        {"role": "user", "content": "again"},
    ]
    plan = plan_compaction(messages, ten_each, 0)
    assert plan is not None and plan.prefix_len == 4
    assert check_tool_pairing(messages) != []


def test_splice_keeps_assistant_fields_verbatim() -> None:
    messages = build("U A U C:x T:x C:y")
    messages[-1]["reasoning"] = {"summary": "kept"}
    messages.append({"role": "tool", "tool_call_id": "y", "content": "ok"})
    plan = plan_compaction(messages, ten_each, 0)
    assert plan is not None
    spliced = splice(plan, SUMMARY, NOTE)
    assert spliced[-4:] == messages[-4:]
    assert spliced[-2]["reasoning"] == {"summary": "kept"} and spliced[-4]["reasoning_content"] == "r3"


@pytest.mark.parametrize(
    ("summary", "note"),
    [
        ({"role": "assistant", "content": "x"}, NOTE),
        ({"content": "x"}, NOTE),
        (SUMMARY, {"role": "user", "content": "x"}),
        (SUMMARY, build("C:z")[0]),
    ],
)
def test_splice_rejects_wrong_roles(summary: Message, note: Message) -> None:
    plan = plan_compaction(build("U A U"), ten_each, 0)
    assert plan is not None
    with pytest.raises(ValueError):
        splice(plan, summary, note)


def test_inputs_are_not_mutated() -> None:
    messages = build("S U A D U C:x T:x A U C:y,z T:z T:y")
    before = copy.deepcopy(messages)
    plan = plan_compaction(messages, ten_each, 25)
    assert plan is not None
    spliced = splice(plan, SUMMARY, NOTE)
    apply_replacement(messages, replacement(plan, SUMMARY, NOTE), plan.prefix_len)
    assert messages == before
    assert spliced is not messages and len(messages) == len(before)


@pytest.mark.parametrize(
    ("spec", "prefix_len", "applies"),
    [
        ("S U A U A U", 3, True),
        ("S U A U A U", 5, True),
        ("S U A U A U", 6, False),
        ("S U A U A U", 0, False),
        ("S U A U A U", 2, False),
        ("U C:x U T:x", 2, False),
    ],
)
def test_apply_replacement(spec: str, prefix_len: int, applies: bool) -> None:
    messages = build(spec)
    stored = [messages[0], SUMMARY, NOTE]
    result = apply_replacement(messages, stored, prefix_len)
    if applies:
        assert result == stored + messages[prefix_len:]
    else:
        assert result is None


@pytest.mark.parametrize(
    "messages",
    [
        [],
        build("S U A"),
        build("U C:x T:x A"),
        build("U C:x,y T:y T:x A U"),
        build("U C:x T:x U C:x T:x"),
        build("U C:x T:x C:y T:y"),
        [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a", "tool_calls": []}],
        [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a", "tool_calls": None}],
    ],
)
def test_pairing_accepts_valid_histories(messages: list[Message]) -> None:
    assert check_tool_pairing(messages) == []


@pytest.mark.parametrize(
    ("messages", "problem"),
    [
        (build("U C:x"), "'x' has no tool response"),
        (build("U C:x,y T:x"), "'y' has no tool response"),
        (build("U T:x"), "does not follow an assistant tool call"),
        (build("U C:x T:x A T:x"), "does not follow an assistant tool call"),
        (build("U C:x T:y"), "'y' answers no open call"),
        (build("U C:x T:x T:x"), "'x' answers no open call"),
        (build("U C:x U T:x"), "'x' has no tool response"),
        (build("U C:x,x T:x T:x"), "duplicate tool call ids"),
        ([{"role": "assistant", "tool_calls": [{"type": "function"}]}], "without a usable id"),
        (["not a message"], "not a JSON object"),
        ([{"role": "assistant", "tool_calls": [{"id": ["x"]}]}], "without a usable id"),
        ([*build("U C:x"), {"role": "tool", "tool_call_id": {"id": "x"}}], "answers no open call"),
    ],
)
def test_pairing_reports_problems(messages: list[Any], problem: str) -> None:
    problems = check_tool_pairing(messages)
    assert any(problem in text for text in problems), problems


def _random_history(rng: random.Random) -> list[Message]:
    """A valid history: optional instructions, turns with tool loops, maybe an in-progress loop at the end."""
    messages: list[Message] = [{"role": "system", "content": "s"}] if rng.random() < 0.8 else []
    next_id = 0
    for turn in range(rng.randint(1, 8)):
        if rng.random() < 0.15:
            messages.append({"role": "developer", "content": f"d{turn}"})
        messages.append({"role": "user", "content": "u" * rng.randint(1, 50)})
        for _ in range(rng.choice([0, 0, 1, 2, 3])):
            ids = [f"call_{next_id + k}" if rng.random() < 0.7 else f"call_{k}" for k in range(rng.randint(1, 3))]
            ids = list(dict.fromkeys(ids))
            next_id += len(ids)
            messages.append({"role": "assistant", "tool_calls": [_call(i) for i in ids], "reasoning_content": "why"})
            for call_id in rng.sample(ids, len(ids)):
                messages.append({"role": "tool", "tool_call_id": call_id, "content": "r" * rng.randint(1, 40)})
        if rng.random() < 0.6:
            messages.append({"role": "assistant", "content": "a" * rng.randint(1, 80)})
    return messages


def _size(message: Message) -> int:
    return 4 + len(str(message.get("content") or "")) + 10 * len(message.get("tool_calls") or [])


def test_random_histories_splice_into_valid_requests() -> None:
    rng = random.Random(20240611)
    planned = 0
    for _ in range(800):
        messages = _random_history(rng)
        assert check_tool_pairing(messages) == []
        before = copy.deepcopy(messages)
        budget = rng.choice([0, 20, 60, 150, 400, 10_000])
        plan = plan_compaction(messages, _size, budget)
        assert messages == before
        if plan is None:
            last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
            assert all(m["role"] in {"system", "developer"} for m in messages[:last_user])
            continue
        planned += 1
        _assert_valid_plan(messages, plan, budget)
    assert planned > 300


def _assert_valid_plan(messages: list[Message], plan: Plan, budget: int) -> None:
    spliced = splice(plan, SUMMARY, NOTE)
    assert check_tool_pairing(spliced) == []
    assert spliced[-1] is messages[-1]
    assert spliced == replacement(plan, SUMMARY, NOTE) + messages[plan.prefix_len :]
    assert [*plan.head, *plan.span, *plan.tail] == messages
    assert plan.tail[0]["role"] == "user"
    assert list(plan.kept_system) == [m for m in plan.span if m["role"] in {"system", "developer"}]
    assert any(m["role"] not in {"system", "developer"} for m in plan.span)
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    assert plan.prefix_len == last_user or plan.tail_tokens <= budget
    roles = [m["role"] for m in spliced]
    summary_at = spliced.index(SUMMARY)
    assert roles[summary_at : summary_at + 3] == ["user", "assistant", "user"]
    assert all(role in {"system", "developer"} for role in roles[:summary_at])
