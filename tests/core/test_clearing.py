"""Stage 1 clearing on the neutral conversation: which results go for each rule, a cut that moves only in steps, the
placeholders, and pairing kept for every dialect."""

from __future__ import annotations

import copy
import itertools
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.clearing import AHEAD_ID, ClearingRule, cleared, rounds_ahead, weights
from proxy.core.messages import Message
from proxy.dialects.messages_blocks import alternate, render
from proxy.dialects.messages_blocks import view_of_messages as view_of_anthropic
from proxy.dialects.responses_items import view_of_input


def count(message: Message) -> int:
    return len(json.dumps(message)) // 4


def loop(rounds: int, *, parallel: int = 1, names: tuple[str, ...] = ("bash",), size: int = 400) -> list[Message]:
    """A chat-shaped tool loop: an instruction, then rounds of `parallel` calls and their results."""
    messages: list[Message] = [{"role": "system", "content": "You are an agent."},
                               {"role": "user", "content": "Fix the failing test."}]
    for turn in range(rounds):
        calls = [{"id": f"call_{turn}_{n}", "type": "function",
                  "function": {"name": names[(turn * parallel + n) % len(names)],
                               "arguments": json.dumps({"command": f"step {turn}.{n}"})}} for n in range(parallel)]
        messages.append({"role": "assistant", "content": None, "tool_calls": calls})
        messages += [{"role": "tool", "tool_call_id": call["id"], "content": f"{call['id']}: " + "x" * size}
                     for call in calls]
    return messages


def flags(messages: list[Message]) -> list[bool]:
    return [message["content"].startswith("[tool result cleared") for message in messages if message["role"] == "tool"]


def total(messages: list[Message]) -> int:
    return sum(count(message) for message in messages)


@pytest.mark.parametrize(("rule", "room", "expected"), [
    (ClearingRule(keep=8, clear_at_least=0), 10**9, [False] * 20),  # never past the room: nothing
    # Past a room of nothing: everything but the latest round (half the room holds no more), whatever `keep`.
    (ClearingRule(keep=8, clear_at_least=0), 0, [True] * 19 + [False]),
    (ClearingRule(keep=0, clear_at_least=0), 0, [True] * 19 + [False]),  # the latest round is never cleared
    (ClearingRule(keep=2, clear_at_least=10**6), 0, [False] * 20),  # a move that frees too little is not made
])
def test_the_cut(rule: ClearingRule, room: int, expected: list[bool]) -> None:
    messages = loop(20)
    original = copy.deepcopy(messages)
    result = cleared(messages, rule, count, room=room)
    assert messages == original  # the client's conversation is never touched
    assert flags(result.messages) == expected
    assert result.results == sum(expected)
    assert result.freed == total(messages) - total(result.messages)
    assert (result.freed > 0) == any(expected)


@pytest.mark.parametrize(("keep", "rounds_of_room"), [(8, 4), (8, 12), (3, 6), (20, 10), (0, 3)])
def test_what_is_kept_whole(keep: int, rounds_of_room: int) -> None:
    """Past the room, a clearing keeps the latest results whole (`keep` at most, no more than a quarter of the room,
    the latest round always) and frees at least half the room; results that came after it wait for the next."""
    room = total(loop(rounds_of_room))
    messages = loop(30, parallel=2)
    result = cleared(messages, ClearingRule(keep=keep, clear_at_least=0), count, room=room)
    cut = flags(result.messages)
    assert cut[-2:] == [False, False]  # the latest round's two results
    assert cut == sorted(cut, reverse=True) and result.results == sum(cut)  # the oldest go first
    assert result.freed >= room // 2
    # What is left past the cut is the room's worth or less, or too little to clear (under half the room).
    rest = [message for message in result.messages[len(result.messages) - 2 * (30 - sum(cut) // 2):]]
    assert total(result.messages) <= room or sum(count(m) for m in rest if m["role"] == "tool") < room // 2 + \
        (max(keep, 2) + 2) * count(messages[-1])


def test_the_cut_moves_only_when_the_prompt_passes_the_room_again() -> None:
    """Replayed turn by turn: each clearing clears all but `keep`, then the cut stays put while the conversation
    grows back to the room; between two moves every request starts with the bytes of the one before."""
    result_tokens = count(loop(1)[-1])
    rule = ClearingRule(keep=4, clear_at_least=4 * result_tokens)
    room = total(loop(12))
    requests = [cleared(loop(rounds), rule, count, room=room) for rounds in range(8, 40)]
    cuts = [result.results for result in requests]
    assert cuts == sorted(cuts) and 2 <= len(set(cuts)) <= 8, cuts
    for earlier, later in itertools.pairwise(requests):
        if earlier.results == later.results:
            assert later.messages[:len(earlier.messages)] == earlier.messages  # the next request only appends
    moves = sum(earlier.results != later.results for earlier, later in itertools.pairwise(requests))
    assert moves == len(set(cuts)) - 1 and moves < len(requests) // 4


@pytest.mark.parametrize(("keep", "rounds_of_room"), [(8, 8), (8, 16), (2, 16), (30, 24)])
def test_a_move_keeps_a_quarter_of_the_room_at_most(keep: int, rounds_of_room: int) -> None:
    """At each move the results left whole (the latest round's aside) hold a quarter of the room or less, so three
    quarters are left to grow back into before the next move; `indices` are the results the move cleared."""
    room = total(loop(rounds_of_room))
    rule = ClearingRule(keep=keep, clear_at_least=0)
    requests = [(rounds, cleared(loop(rounds, parallel=2), rule, count, room=room)) for rounds in range(4, 60)]
    moves = [(rounds, later) for (_, earlier), (rounds, later) in itertools.pairwise(requests)
             if later.results != earlier.results]
    assert len(moves) >= 2
    for rounds, result in moves:
        messages = loop(rounds, parallel=2)
        tool = [index for index, message in enumerate(messages) if message["role"] == "tool"]
        whole = [index for index in tool[:-2] if index not in result.indices]
        assert sum(count(messages[index]) for index in whole) <= room // 4
        assert len(whole) <= keep
        assert result.indices == {index for index in tool if result.messages[index] != messages[index]}


def test_a_placeholder_keeps_what_the_result_reported() -> None:
    messages = loop(6)
    messages[3] = {**messages[3], "content": "E   ReconcileError: E1464 checksum mismatch\n" + "x" * 1600}
    result = cleared(messages, ClearingRule(keep=0, clear_at_least=0), count, room=0,
                     reported=lambda text: f"`{text.splitlines()[0]}`" if text.startswith("E ") else "")
    first, second = result.messages[3]["content"], result.messages[5]["content"]
    assert first.startswith("[tool result cleared") and "it reported `E   ReconcileError: E1464 checksum mismatch`" \
        in first
    assert second.startswith("[tool result cleared") and "reported" not in second
    assert result.messages == cleared(messages, ClearingRule(keep=0, clear_at_least=0), count, room=0,  # stable
                                      reported=lambda text: f"`{text.splitlines()[0]}`" if text.startswith("E ")
                                      else "").messages


def test_a_small_move_waits_until_it_frees_enough() -> None:
    assert cleared(loop(10), ClearingRule(keep=2, clear_at_least=0), count, room=0).results == 9
    rule = ClearingRule(keep=2, clear_at_least=3 * count(loop(1)[-1]))
    result = cleared(loop(10), rule, count, room=0)
    assert 0 < result.results < 9 and result.freed >= rule.clear_at_least


def test_excluded_tools_and_what_compaction_made_are_kept() -> None:
    messages = loop(12, names=("bash", "memory"))
    result = cleared(messages, ClearingRule(keep=0, clear_at_least=0, exclude_tools=frozenset({"memory"})),
                     count, room=0)
    tools = [message for message in result.messages if message["role"] == "tool"]
    names = ["bash", "memory"] * 6
    # Every bash result but the latest one clearing may touch (the latest round's is always kept whole).
    assert flags(result.messages) == [name == "bash" for name in names[:-2]] + [False, False]
    assert all("memory" not in text["content"] for text in tools if text["content"].startswith("[tool"))
    untouchable = {index for index, message in enumerate(messages) if message["role"] == "tool"}
    assert cleared(messages, ClearingRule(keep=0, clear_at_least=0), count, room=0,
                   untouchable=untouchable).results == 0


def test_a_placeholder_says_what_was_there() -> None:
    messages = loop(3)
    messages[2]["tool_calls"][0]["function"]["arguments"] = json.dumps({"path": "src/" + "deep/" * 40 + "x.py"})
    result = cleared(messages, ClearingRule(keep=1, clear_at_least=0), count, room=0)
    first, second = [message["content"] for message in result.messages if message["role"] == "tool"][:2]
    assert first.startswith("[tool result cleared to save context: bash(") and "sha256:" in first
    assert "tokens" in first and "call the tool again" in first
    assert 'bash({"command": "step 1.0"})' in second  # short arguments quoted whole


def test_inputs_are_cleared_only_where_asked() -> None:
    messages = loop(4, parallel=2)
    kept = cleared(messages, ClearingRule(keep=2, clear_at_least=0), count, room=0)
    assert all(call["function"]["arguments"] != "{}" for message in kept.messages
               for call in message.get("tool_calls") or ())
    gone = cleared(messages, ClearingRule(keep=2, clear_at_least=0, clear_inputs=True), count, room=0)
    arguments = [call["function"]["arguments"] for message in gone.messages for call in message.get("tool_calls") or ()]
    assert arguments[:6] == ["{}"] * 6 and arguments[6:] != ["{}"] * 2
    assert gone.freed > kept.freed


@pytest.mark.parametrize("messages", [
    [], [{"role": "user", "content": "hi"}],
    [{"role": "tool", "tool_call_id": "orphan", "content": "x" * 1000}],  # answers no call: not a pair, kept
    [{"role": "assistant", "tool_calls": [{"id": "a", "function": {"name": "bash", "arguments": "{}"}}]},
     {"role": "user", "content": "interrupted"}, {"role": "tool", "tool_call_id": "a", "content": "late"}],
    [{"role": "assistant", "tool_calls": "bad"}, 5, "x", {"role": "tool", "tool_call_id": None, "content": ""}],
])
def test_odd_conversations_are_left_as_they_are(messages: list[Any]) -> None:
    assert cleared(messages, ClearingRule(keep=0, clear_at_least=0), count, room=0).messages == messages


def anthropic_loop(rounds: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix it."}]
    for turn in range(rounds):
        messages.append({"role": "assistant", "content": [
            {"type": "thinking", "thinking": "t", "signature": f"s{turn}"},
            *[{"type": "tool_use", "id": f"tu_{turn}_{n}", "name": "read", "input": {"n": n}} for n in range(2)]]})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"tu_{turn}_{n}", "content": "y" * 300} for n in range(2)]})
    return messages


def test_a_messages_conversation_keeps_its_pairing_after_clearing() -> None:
    view = view_of_anthropic(anthropic_loop(6))
    assert view is not None
    result = cleared(view.messages, ClearingRule(keep=2, clear_at_least=0), count, room=0)
    sent = alternate(view.back(result.messages, render))
    for index, message in enumerate(sent):
        if message["role"] == "assistant":
            uses = [block["id"] for block in message["content"] if block["type"] == "tool_use"]
            answered = [block["tool_use_id"] for block in sent[index + 1]["content"] if block["type"] == "tool_result"]
            assert uses == answered
            assert message["content"][0]["type"] == "thinking"  # the assistant turns go back byte for byte
    assert sum("[tool result cleared" in json.dumps(message) for message in sent) == 5  # results of 5 rounds cleared


def test_a_responses_conversation_keeps_its_pairing_after_clearing() -> None:
    items: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": "Fix it."}]
    for turn in range(6):
        items += [{"type": "function_call", "call_id": f"fc_{turn}", "name": "shell", "arguments": "{}"},
                  {"type": "function_call_output", "call_id": f"fc_{turn}", "output": "z" * 400}]
    view = view_of_input(items)
    assert view is not None
    result = cleared(view.messages, ClearingRule(keep=2, clear_at_least=0), count, room=0)
    assert result.results == 5  # a room of nothing: all but the latest round's
    assert [message["role"] for message in result.messages] == [message["role"] for message in view.messages]


tool_messages = st.lists(st.tuples(st.integers(1, 3), st.integers(0, 800), st.booleans()), max_size=15)


def generated(rounds: list[tuple[int, int, bool]]) -> list[Message]:
    """A tool loop from (parallel calls, result size, interrupted by the user) per round."""
    messages: list[Message] = [{"role": "user", "content": "go"}]
    for turn, (parallel, size, interrupted) in enumerate(rounds):
        calls = [{"id": f"c{turn}_{n}", "function": {"name": "t", "arguments": "{}"}} for n in range(parallel)]
        messages.append({"role": "assistant", "content": None, "tool_calls": calls})
        messages += [{"role": "tool", "tool_call_id": call["id"], "content": "r" * size} for call in calls]
        if interrupted:
            messages.append({"role": "user", "content": "and?"})
    return messages


@given(rounds=tool_messages, keep=st.integers(0, 6), room=st.integers(0, 3000), least=st.integers(0, 500))
def test_every_forwarded_conversation_stays_valid(rounds: list[tuple[int, int, bool]], keep: int, room: int,
                                                  least: int) -> None:
    messages = generated(rounds)
    result = cleared(messages, ClearingRule(keep=keep, clear_at_least=least), count, room=room)
    assert len(result.messages) == len(messages)
    for before, after in zip(messages, result.messages, strict=True):
        assert {key: value for key, value in before.items() if key != "content"} == \
            {key: value for key, value in after.items() if key != "content"}
        assert before == after or before["role"] == "tool"
    assert result.results == sum(flags(result.messages)) - sum(flags(messages))


@pytest.mark.parametrize(("tail", "rounds", "roles", "cleared_tool"), [
    pytest.param([{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c9", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c9", "content": "x"}], 2,
        ["assistant", "tool", "assistant", "tool"], "read_file", id="a tool's input: rounds of the same tool"),
    pytest.param([{"role": "user", "content": "go on"}], 2, ["assistant", "user", "assistant", "user"], None,
                 id="a user's input: answers and user messages, nothing to clear"),
    pytest.param([{"role": "user", "content": "go on"}], 0, [], None, id="no rounds"),
])
def test_the_rounds_ahead_are_shaped_like_the_latest(tail: list[dict[str, object]], rounds: int, roles: list[str],
                                                     cleared_tool: str | None) -> None:
    added, sizes = rounds_ahead([{"role": "system", "content": "s"}, *tail], rounds, 30, 400)
    assert [message["role"] for message in added] == roles
    assert sizes == [30, 400] * rounds
    calls = [call for message in added for call in message.get("tool_calls") or ()]
    assert {call["function"]["name"] for call in calls} == ({cleared_tool} if cleared_tool else set())
    assert all(call["id"].startswith(AHEAD_ID) for call in calls)
    assert len({call["id"] for call in calls}) == len(calls)


def _round(number: int, result: int) -> tuple[list[Message], list[int]]:
    call = {"id": f"c{number}", "type": "function", "function": {"name": "run", "arguments": ""}}
    return ([{"role": "assistant", "content": None, "tool_calls": [call]},
             {"role": "tool", "tool_call_id": f"c{number}", "content": "x" * result}], [30, result])


@pytest.mark.parametrize("ahead", [1, 3, 6, 12])
def test_a_replay_on_the_rounds_ahead_is_the_replay_on_those_rounds_once_they_came(ahead: int) -> None:
    """What the pace asks: the clearing on a conversation grown by rounds like the latest is what it will be when
    such rounds have come, though a move frees half the room and what it leaves jumps from turn to turn."""
    messages: list[Message] = [{"role": "user", "content": "fix it"}]
    sizes = [20]
    for number in range(14):
        grown, grown_sizes = _round(number, 400)
        messages, sizes = [*messages, *grown], [*sizes, *grown_sizes]

    def count(message: Message) -> int:  # a placeholder is 10 tokens whatever it names
        return 10

    rule = ClearingRule(keep=4)
    added, added_sizes = rounds_ahead(messages, ahead, 30, 400)
    replayed = cleared([*messages, *added], rule, count, room=3000, sizes=[*sizes, *added_sizes])
    came, came_sizes = list(messages), list(sizes)
    for number in range(14, 14 + ahead):
        grown, grown_sizes = _round(number, 400)
        came, came_sizes = [*came, *grown], [*came_sizes, *grown_sizes]
    real = cleared(came, rule, count, room=3000, sizes=came_sizes)
    assert (replayed.results, replayed.freed) == (real.results, real.freed)
    assert sum(came_sizes) == sum(sizes) + sum(added_sizes)


@given(rounds=tool_messages, keep=st.integers(0, 6), room=st.integers(0, 3000), least=st.integers(0, 500))
def test_one_replay_weighs_every_beginning_as_its_own_clearing_would(
        rounds: list[tuple[int, int, bool]], keep: int, room: int, least: int) -> None:
    messages = generated(rounds)
    rule = ClearingRule(keep=keep, clear_at_least=least)
    sizes = [count(message) for message in messages]
    ends = range(1, len(messages) + 1)
    each = [sum(sizes[:end]) - cleared(messages[:end], rule, count, room=room).freed for end in ends]
    assert weights(messages, rule, count, room=room, sizes=sizes, ends=ends) == each
    assert weights(messages, rule, count, room=room, sizes=sizes, ends=[len(messages), 1, 1]) == \
        [each[end - 1] for end in sorted({1, len(messages)})]  # in increasing order, once each
