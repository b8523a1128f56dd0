"""core.tail_walks: a walk that goes on from where the last one stopped says what a walk of the whole tail says."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.fingerprint import hash_chain
from proxy.core.plan import splits_a_tool_pair
from proxy.core.tail_walks import TailWalks

IDS = st.sampled_from(["a", "b", "c", "d"])
MESSAGE = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "content": st.sampled_from(["x", "y"])}),
    st.fixed_dictionaries({"role": st.just("assistant"), "content": st.none(),
                           "tool_calls": st.lists(st.fixed_dictionaries({"id": IDS, "type": st.just("function")}),
                                                  min_size=1, max_size=2)}),
    st.fixed_dictionaries({"role": st.just("tool"), "tool_call_id": IDS, "content": st.just("ok")}),
)
# How the next request's history comes from the last: messages added, one changed, the last ones dropped.
STEP = st.one_of(st.tuples(st.just("add"), st.lists(MESSAGE, min_size=1, max_size=4)),
                 st.tuples(st.just("change"), st.tuples(st.integers(0, 30), MESSAGE)),
                 st.tuples(st.just("drop"), st.integers(1, 3)))


class Walked(dict[str, Any]):
    """A message that counts how often a walk reads its role."""

    reads = 0

    def get(self, key: str, default: Any = None) -> Any:
        if key == "role":
            Walked.reads += 1
        return super().get(key, default)


def call(call_id: str) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [{"id": call_id, "type": "function"}]}


def result(call_id: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": "ok"}


def said(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


@pytest.mark.parametrize(("name", "messages", "cut", "splits"), [
    ("no tools", [said("a"), said("b"), said("c")], 1, False),
    ("a pair after the cut", [said("a"), call("x"), result("x")], 1, False),
    ("a result after the cut, its call before", [said("a"), call("x"), result("x"), said("b")], 2, True),
    ("a result answering no call at all", [said("a"), result("x"), said("b")], 1, False),
    ("the call after its result", [said("a"), result("x"), call("x")], 1, False),
])
def test_a_first_walk_says_what_the_whole_walk_says(name: str, messages: list[Any], cut: int, splits: bool) -> None:
    walks = TailWalks()
    assert walks.splits("k", messages, hash_chain(messages, "ns"), cut) is splits
    assert splits_a_tool_pair(messages, cut) is splits


@pytest.mark.parametrize(("name", "next_turn", "walked"), [
    ("two messages added", lambda turn: [Walked(call(f"t{turn}")), Walked(result(f"t{turn}"))], 3),
    ("the last message asked again otherwise", lambda turn: None, 1),
])
def test_a_resent_tail_is_walked_from_where_the_last_walk_stopped(name: str, next_turn: Any, walked: int) -> None:
    walks = TailWalks()
    messages: list[Any] = [Walked(said("a")), Walked(call("x")), Walked(result("x")), Walked(said("b"))]
    assert not walks.splits("k", messages, hash_chain(messages, "ns"), 1)
    for turn in range(5):
        added = next_turn(turn)
        messages = [*messages, *added] if added is not None else [*messages[:-1], Walked(said(f"question {turn}"))]
        Walked.reads = 0
        assert not walks.splits("k", messages, hash_chain(messages, "ns"), 1)
        assert Walked.reads == 2 * walked  # the messages after the last walk's kept part, each read twice
    assert not walks.splits("k", messages, hash_chain(messages, "ns"), 3)  # another cut: walked whole
    messages.append(Walked(result("x")))  # a result whose call is before that cut: the cut splits it now
    assert walks.splits("k", messages, hash_chain(messages, "ns"), 3)


def test_a_changed_message_sends_the_walk_back_to_the_cut() -> None:
    walks = TailWalks()
    messages: list[Any] = [said("a"), call("x"), said("b"), said("c")]
    assert not walks.splits("k", messages, hash_chain(messages, "ns"), 2)
    changed = [*messages[:2], result("x"), said("c"), said("d")]  # a walked message changed, one more added
    assert walks.splits("k", changed, hash_chain(changed, "ns"), 2)  # walked from the cut: the result is seen


def test_the_walks_kept_are_bounded() -> None:
    walks = TailWalks(size=3)
    messages = [said("a"), said("b"), said("c")]
    for key in range(10):
        walks.splits(key, messages, hash_chain(messages, "ns"), 1)
    assert len(walks) == 3


def test_a_chain_that_does_not_fit_the_messages_is_not_trusted() -> None:
    walks = TailWalks()
    messages = [said("a"), call("x"), said("b")]
    walks.splits("k", messages, hash_chain(messages, "ns"), 1)
    grown = [*messages, result("x")]
    assert walks.splits("k", grown, hash_chain(messages, "ns"), 2) is splits_a_tool_pair(grown, 2) is True


@given(st.lists(MESSAGE, min_size=2, max_size=12), st.integers(1, 6), st.lists(STEP, max_size=8))
@settings(max_examples=300, deadline=None)
def test_any_sequence_of_requests_reads_as_whole_walks(start: list[Any], cut: int, steps: list[Any]) -> None:
    walks, messages = TailWalks(), list(start)
    for kind, value in [("start", None), *steps]:
        if kind == "add":
            messages += value
        elif kind == "change" and value[0] < len(messages):
            messages[value[0]] = value[1]
        elif kind == "drop":
            messages = messages[:max(len(messages) - value, 2)]
        at = min(cut, len(messages) - 1)
        assert walks.splits("k", messages, hash_chain(messages, "ns"), at) is splits_a_tool_pair(messages, at)
