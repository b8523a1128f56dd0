"""Tests for the plan: tail choice (chat turns and agent tool loops), kept instructions, pairing and splicing."""

from __future__ import annotations

import copy
import itertools
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.budget import Limits
from proxy.core.plan import (
    Plan,
    apply_replacement,
    check_tool_pairing,
    last_input_tokens,
    plan_compaction,
    replacement,
    replacement_applies,
    splice,
    splits_a_tool_pair,
    unsafe_cuts,
)

Message = dict[str, Any]
SUMMARY: Message = {"role": "user", "content": "# Conversation Summary\n..."}
NOTE: Message = {"role": "assistant", "content": "Continuing from the summary."}
ACK: Message = {"role": "assistant", "content": "Understood."}
BIG = 1_000_000


def limits(tail: int = 0, instructions: int = 0, window: int = BIG, **fields: Any) -> Limits:
    """Limits whose allotment gives exactly `tail` extra tail tokens and `instructions` for earlier user messages."""
    return Limits(window=window, threshold=fields.get("threshold", 0.8), target=fields.get("target", 0.5),
                  reserve=fields.get("reserve", 0), tail_share=(tail + 0.5) / window,
                  instruction_share=(instructions + 0.5) / window)


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
        # expected: (head length, prefix_len, indices of kept system messages, indices of kept user messages)
        ("S U A U A U", 0, (1, 5, [], [])),
        # Agent loops: the tail may begin at an assistant tool call; the latest user message is kept verbatim.
        ("S U A U C:x T:x C:y T:y", 0, (1, 6, [], [3])),
        ("S U A U C:x,y T:y T:x", 0, (1, 3, [], [])),  # the latest user message opens the tail: it costs nothing
        ("U C:x T:x A U C:x T:x", 0, (0, 4, [], [])),
        ("U A U C:x T:x", 5, (0, 2, [], [])),
        ("U A U C:x T:x C:y T:y", 5, (0, 5, [], [2])),
        ("U C:x T:x C:y T:y C:z T:z", 25, (0, 3, [], [0])),
        ("U C:x T:x C:y T:y C:z T:z", 15, (0, 5, [], [0])),
        # Extending the tail over whole exchanges, within the budget, before assistants as well as users.
        ("U A U C:x T:x A U", 40, (0, 2, [], [])),
        ("S U A U A U A U", 30, (1, 4, [], [])),
        ("S U A U A U A U", 29, (1, 5, [], [])),
        ("S U A U A U", 1000, (1, 2, [], [])),
        # A cut never separates a call from its result, even in a history that is invalid around it.
        ("U A U C:x U T:x", 0, (0, 3, [], [])),
        ("S U A D U A U", 0, (1, 6, [3], [])),
        ("S D U A D S U", 0, (2, 6, [4, 5], [])),
        ("S A A", 0, (1, 2, [], [])),
        ("S U C:x T:x", 0, (1, 2, [], [1])),
        ("S D U A", 0, (2, 3, [], [2])),
        ("", 0, None),
        ("S U", 0, None),
        ("S D", 0, None),
    ],
)
def test_tail_selection(spec: str, budget: int, expected: tuple[int, int, list[int], list[int]] | None) -> None:
    messages = build(spec)
    plan = plan_compaction(messages, ten_each, limits(budget))
    if expected is None:
        assert plan is None
        return
    head_len, prefix_len, kept, users = expected
    assert plan is not None
    assert (len(plan.head), plan.prefix_len) == (head_len, prefix_len)
    assert list(plan.kept_system) == [messages[i] for i in kept]
    assert list(plan.kept_users) == [messages[i] for i in users]
    assert [*plan.head, *plan.span, *plan.tail] == messages
    assert plan.tail[0]["role"] in ("user", "assistant")


@pytest.mark.parametrize(
    ("allotted", "kept"),
    [
        (0, [7]),           # the latest is kept whatever the budget
        (10, [5, 7]),       # then the newest earlier ones...
        (25, [3, 5, 7]),
        (1000, [0, 3, 5, 7]),
    ],
)
def test_earlier_user_messages_kept_newest_first(allotted: int, kept: list[int]) -> None:
    messages = build("U C:a T:a U A U A U C:x T:x C:y T:y")
    plan = plan_compaction(messages, ten_each, limits(0, allotted))
    assert plan is not None and plan.prefix_len == 10
    assert list(plan.kept_users) == [messages[i] for i in kept]
    spliced = splice(plan, SUMMARY, NOTE, ACK)
    roles = [m["role"] for m in spliced]
    assert all(pair != ("user", "user") and pair != ("assistant", "assistant") for pair in itertools.pairwise(roles))
    assert [m for m in spliced if m["role"] == "user" and m is not SUMMARY] == [messages[i] for i in kept]


def test_synthetic_messages_are_never_kept_as_instructions() -> None:
    messages = [SUMMARY, NOTE, *build("U C:x T:x C:y T:y")]
    plan = plan_compaction(messages, ten_each, limits(0, 1000), synthetic=frozenset({0, 1}))
    assert plan is not None
    assert SUMMARY in plan.to_summarise and SUMMARY not in plan.kept_users
    assert list(plan.kept_users) == [messages[2]]


@pytest.mark.parametrize(("summary_tokens", "ask", "tail_messages"), [
    (20, 460, 26),    # a small earlier summary: the usual floor (15 % of the window), the tail its share
    (300, 560, 26),   # carried whole (with its filler), and half a floor more, out of what the tail left
    (900, 614, 26),   # at most a fifth of the window
])
def test_an_earlier_summary_in_the_span_is_asked_for_whole(summary_tokens: int, ask: int, tail_messages: int) -> None:
    messages = [SUMMARY, NOTE, *build("U " + "C:x T:x " * 40)]

    def count(message: Message) -> int:
        return summary_tokens if message is SUMMARY else 30

    plan = plan_compaction(messages, count, Limits(window=3072, threshold=0.8, target=0.5, reserve=32),
                           synthetic=frozenset({0, 1}))
    assert plan is not None and SUMMARY in plan.to_summarise
    assert (plan.summary_tokens, len(plan.tail)) == (ask, tail_messages)
    without = plan_compaction(messages, count, Limits(window=3072, threshold=0.8, target=0.5, reserve=32))
    assert without is not None and without.summary_tokens == max(256, min(460, without.span_tokens // 2))


def test_token_figures() -> None:
    messages = build("S U A D U A U C:x T:x")
    plan = plan_compaction(messages, lambda m: len(m["role"]), limits())
    assert plan is not None and plan.prefix_len == 6
    lengths = [len(m["role"]) for m in messages]
    assert plan.tokens_before == sum(lengths)
    assert plan.head_tokens == lengths[0]
    assert plan.span_tokens == sum(lengths[1:6])
    assert plan.kept_system_tokens == len("developer")
    assert plan.kept_user_tokens == 0
    assert plan.tail_tokens == sum(lengths[6:])
    assert plan.tokens_after(100) == plan.head_tokens + plan.kept_system_tokens + plan.kept_user_tokens \
        + plan.tail_tokens + 100


def test_the_plan_reserves_room_for_the_next_turn() -> None:
    """Tail and summary together leave room for the reserve and one more exchange like the last."""
    messages = build("S " + "U A " * 30 + "U")
    plan = plan_compaction(messages, ten_each, Limits(window=1000, threshold=0.8, target=0.5, reserve=100,
                                                      tail_share=0.5, instruction_share=0))
    assert plan is not None
    allotment = plan.allotment
    assert allotment.growth == 10 + 10  # the last user message again, and an answer like the last one
    assert allotment.goal == 500 - 100 - 20
    assert plan.kept_tokens + plan.summary_tokens <= allotment.goal


@pytest.mark.parametrize(
    ("turn_tokens", "overhead", "unused_tail"),
    [
        (10, 0, 0),      # ten turns of 10 fill the tail's 200 exactly
        (30, 0, 20),     # three exchanges of 60 take 180 of 200
        (30, 50, 20),    # the request's overhead comes out of the goal, not out of what is left
        (250, 0, 200),   # no turn fits: the tail's whole share is left
    ],
)
def test_room_at_goal_is_the_summary_allotment_beyond_its_ask_plus_the_tail_left_unused(
        turn_tokens: int, overhead: int, unused_tail: int) -> None:
    messages = build("S " + "U A " * 30 + "U")

    def count(message: Message) -> int:
        return 10 if message is messages[0] or message is messages[-1] else turn_tokens

    plan = plan_compaction(messages, count, limits(tail=200, window=2000), overhead=overhead)
    assert plan is not None and plan.overhead == overhead and plan.kept_user_tokens == 0
    replacement = plan.head_tokens + plan.summary_tokens  # the summary as long as asked, no fillers
    assert plan.room_at_goal(replacement) == plan.allotment.summary_tokens - plan.summary_tokens + unused_tail
    assert plan.room_at_goal(replacement + 7) == plan.room_at_goal(replacement) - 7


def test_summariser_input_leaves_out_kept_system_messages() -> None:
    messages = build("S U A D U A U")
    plan = plan_compaction(messages, ten_each, limits())
    assert plan is not None
    assert [m["role"] for m in plan.to_summarise] == ["user", "assistant", "user", "assistant"]
    assert messages[3] in plan.span and messages[3] not in plan.to_summarise


@pytest.mark.parametrize(
    ("spec", "roles"),
    [
        ("S U A U", ["system", "user", "assistant", "user"]),
        ("U A U A U", ["user", "assistant", "user"]),
        ("S U A D U C:x T:x", ["system", "developer", "user", "assistant", "user", "assistant", "tool"]),
        ("S U C:x T:x C:y T:y", ["system", "user", "assistant", "user", "assistant", "tool"]),
        ("S A C:x T:x", ["system", "user", "assistant", "tool"]),
    ],
)
def test_splice_shape(spec: str, roles: list[str]) -> None:
    messages = build(spec)
    plan = plan_compaction(messages, ten_each, limits())
    assert plan is not None
    spliced = splice(plan, SUMMARY, NOTE, ACK)
    assert [m["role"] for m in spliced] == roles
    assert spliced[-1] is messages[-1]
    assert check_tool_pairing(spliced) == []
    assert replacement(plan, SUMMARY, NOTE, ACK) + messages[plan.prefix_len :] == spliced


def test_invalid_input_stays_detectably_invalid() -> None:
    """Splicing cannot repair a broken client history; the checker must still catch it before forwarding."""
    plan = plan_compaction(build("S D U A U A U T:q"), ten_each, limits())
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
    plan = plan_compaction(messages, ten_each, limits())
    assert plan is not None and plan.prefix_len == 4
    assert check_tool_pairing(messages) != []


def test_splice_keeps_assistant_fields_verbatim() -> None:
    messages = build("U A U C:x T:x C:y")
    messages[-1]["reasoning"] = {"summary": "kept"}
    messages.append({"role": "tool", "tool_call_id": "y", "content": "ok"})
    plan = plan_compaction(messages, ten_each, limits(20))
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
    plan = plan_compaction(build("U A U"), ten_each, limits())
    assert plan is not None
    with pytest.raises(ValueError):
        splice(plan, summary, note)


def test_inputs_are_not_mutated() -> None:
    messages = build("S U A D U C:x T:x A U C:y,z T:z T:y")
    before = copy.deepcopy(messages)
    plan = plan_compaction(messages, ten_each, limits(25, 10))
    assert plan is not None
    spliced = splice(plan, SUMMARY, NOTE)
    apply_replacement(messages, replacement(plan, SUMMARY, NOTE), plan.prefix_len)
    assert messages == before
    assert spliced is not messages and len(messages) == len(before)


@pytest.mark.parametrize(
    ("spec", "prefix_len", "stored_ends_with", "applies"),
    [
        ("S U A U A U", 3, "assistant", True),
        ("S U A U A U", 5, "assistant", True),
        ("S U A U A U", 6, "assistant", False),
        ("S U A U A U", 0, "assistant", False),
        ("S U A U A U", 2, "assistant", False),   # two assistants in a row at the seam
        ("S U A U A U", 2, "user", True),         # a replacement ending in the kept instruction
        ("S U A U A U", 3, "user", False),        # two users in a row
        ("U C:x U T:x", 2, "assistant", False),   # the cut would orphan a tool result
        ("U C:x T:x C:y T:y", 3, "user", True),   # mid-loop: the tail opens with the next tool call
        ("U C:x T:x C:y T:y", 2, "user", False),  # before a tool result: never a cut
    ],
)
def test_apply_replacement(spec: str, prefix_len: int, stored_ends_with: str, applies: bool) -> None:
    messages = build(spec)
    kept: Message = {"role": "user", "content": "kept instruction"}
    stored = [messages[0], SUMMARY, NOTE] if stored_ends_with == "assistant" else [SUMMARY, NOTE, kept]
    result = apply_replacement(messages, stored, prefix_len)
    if applies:
        assert result == stored + messages[prefix_len:]
    else:
        assert result is None
    assert replacement_applies(messages, stored, prefix_len) is applies


def test_replacement_applies_asks_the_given_walk_whether_the_cut_splits_a_pair() -> None:
    messages, stored = build("S U A U A U"), [SUMMARY, NOTE]
    asked: list[int] = []

    def splits(walked: Any, cut: int) -> bool:
        asked.append(cut)
        return True

    assert replacement_applies(messages, stored, 3) is True
    assert replacement_applies(messages, stored, 3, splits) is False
    assert asked == [3]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [("U A U", 10), ("U C:x T:x", 10), ("U C:x,y T:x T:y", 20), ("U A", 0), ("", 0)],
)
def test_last_input_tokens(spec: str, expected: int) -> None:
    messages = build(spec)
    assert last_input_tokens(messages, [10] * len(messages)) == expected


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


def _size(message: Message) -> int:
    return 4 + len(str(message.get("content") or "")) + 10 * len(message.get("tool_calls") or [])


def test_random_histories_splice_into_valid_requests() -> None:
    rng = random.Random(20240611)
    planned = 0
    for _ in range(800):
        messages = _random_history(rng)
        assert check_tool_pairing(messages) == []
        before = copy.deepcopy(messages)
        budget, kept = rng.choice([0, 20, 60, 150, 400, 10_000]), rng.choice([0, 30, 10_000])
        plan = plan_compaction(messages, _size, limits(budget, kept))
        assert messages == before
        if plan is None:
            assert all(m["role"] in {"system", "developer"} for m in messages[:-1]) or len(messages) < 2
            continue
        planned += 1
        _assert_valid_plan(messages, plan)
    assert planned > 600


def _assert_valid_plan(messages: list[Message], plan: Plan) -> None:
    spliced = splice(plan, SUMMARY, NOTE, ACK)
    assert check_tool_pairing(spliced) == []
    assert spliced[-1] is messages[-1]
    assert spliced == replacement(plan, SUMMARY, NOTE, ACK) + messages[plan.prefix_len :]
    assert [*plan.head, *plan.span, *plan.tail] == messages
    assert plan.tail[0]["role"] in ("user", "assistant")
    assert list(plan.kept_system) == [m for m in plan.span if m["role"] in {"system", "developer"}]
    assert any(m["role"] not in {"system", "developer"} for m in plan.span)
    # The user's latest words are in the request, verbatim, whatever was summarised.
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    assert any(m is messages[last_user] for m in spliced)
    roles = [m["role"] for m in spliced]
    summary_at = spliced.index(SUMMARY)
    seam = roles[summary_at: len(spliced) - len(plan.tail) + 1]
    assert all(a != b for a, b in itertools.pairwise(seam)), seam
    assert all(role in {"system", "developer"} for role in roles[:summary_at])


# --- the check a stored summary's cut gets on every request ------------------------------------------------

CALL_IDS = st.sampled_from(["a", "b", "c", 7, None])
TOOL_MESSAGES = st.one_of(
    st.builds(lambda ids: {"role": "assistant", "content": None,
                           "tool_calls": [{"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}}
                                          for i in ids]}, st.lists(CALL_IDS, max_size=3)),
    st.builds(lambda i: {"role": "tool", "tool_call_id": i, "content": "r"}, CALL_IDS),
    st.just({"role": "user", "content": "u"}),
    st.just({"role": "assistant", "content": "a"}),
)


@given(st.lists(TOOL_MESSAGES, max_size=12), st.data())
@settings(max_examples=500)
def test_the_cut_check_agrees_with_every_unsafe_cut(messages: list[Any], data: st.DataObject) -> None:
    cut = data.draw(st.integers(min_value=0, max_value=len(messages)))
    expected = unsafe_cuts(messages)[cut] if cut < len(messages) else False
    assert splits_a_tool_pair(messages, cut) is expected
