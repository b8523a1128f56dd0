"""proxy.core.view: groups go back whole as the client's own items; anything compaction made is rendered."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.messages import Message
from proxy.core.view import Group, View

# A client's items: "call" (two neutral messages from one item, like a tool call and its result in one message),
# "ask" and "answer" (one message each).
CALL = Group(({"kind": "call"},), ({"role": "assistant", "tool_calls": [{"id": "a"}]},
                                   {"role": "tool", "tool_call_id": "a", "content": "ok"}))
ASK = Group(({"kind": "ask"},), ({"role": "user", "content": "go on"},))
ANSWER = Group(({"kind": "answer"},), ({"role": "assistant", "content": "done"},))
SUMMARY: Message = {"role": "user", "content": "summary"}


def rendered(made: list[Message]) -> list[Any]:
    """Stands for a dialect's render: one item per run, naming the roles it holds."""
    return [{"rendered": [message["role"] for message in made]}]


def test_the_view_reads_the_groups_messages_in_order() -> None:
    view = View.of([ASK, CALL, ANSWER])
    assert view.messages == [*ASK.messages, *CALL.messages, *ANSWER.messages]


@pytest.mark.parametrize(("history", "expected"), [
    pytest.param(lambda v: v.messages, [*ASK.items, *CALL.items, *ANSWER.items], id="untouched: the items"),
    pytest.param(lambda v: [SUMMARY, *v.messages[1:]], [{"rendered": ["user"]}, *CALL.items, *ANSWER.items],
                 id="a summary in place of the first group"),
    pytest.param(lambda v: [SUMMARY, {"role": "assistant", "content": "ok"}, *v.messages[3:]],
                 [{"rendered": ["user", "assistant"]}, *ANSWER.items], id="a run of made messages: rendered at once"),
    pytest.param(lambda v: [v.messages[0], v.messages[2], v.messages[3]],
                 [*ASK.items, {"rendered": ["tool"]}, *ANSWER.items], id="a split group is rendered, not sent half"),
    pytest.param(lambda v: [v.messages[0], v.messages[1], {**v.messages[2], "content": "[cleared]"}, v.messages[3]],
                 [*ASK.items, {"rendered": ["assistant", "tool"]}, *ANSWER.items],
                 id="a changed message: its group is rendered"),
    pytest.param(lambda v: [v.messages[0], v.messages[1]], [*ASK.items, {"rendered": ["assistant"]}],
                 id="a group cut off at the end"),
    pytest.param(lambda v: [], [], id="nothing"),
])
def test_back(history: Any, expected: list[Any]) -> None:
    view = View.of([ASK, CALL, ANSWER])
    assert view.back(history(view), rendered) == expected


def test_an_untouched_group_goes_back_as_the_same_objects() -> None:
    view = View.of([ASK, CALL])
    back = view.back(view.messages, rendered)
    assert all(a is b for a, b in zip(back, [*ASK.items, *CALL.items], strict=True))


def test_without_groups_the_messages_are_the_items() -> None:
    messages: list[Message] = [{"role": "user", "content": "hi"}]
    view = View(messages)
    assert view.back([SUMMARY, *messages], rendered) == [SUMMARY, *messages]


def test_equal_but_distinct_messages_are_not_taken_for_the_clients() -> None:
    """Identity, not equality: a made message that happens to equal a client's is still rendered."""
    view = View.of([ASK])
    assert view.back([dict(ASK.messages[0])], rendered) == [{"rendered": ["user"]}]


@given(st.lists(st.sampled_from(["ask", "call", "answer"]), max_size=12),
       st.lists(st.booleans(), max_size=30))
def test_back_keeps_every_kept_group_in_order_and_renders_the_rest(kinds: list[str], keep: list[bool]) -> None:
    groups = [Group(({"n": index},), tuple(dict(message) for message in {"ask": ASK, "call": CALL,
                                                                           "answer": ANSWER}[kind].messages))
              for index, kind in enumerate(kinds)]
    view = View.of(groups)
    kept = [message for index, message in enumerate(view.messages) if index >= len(keep) or keep[index]]
    back = view.back(kept, rendered)
    whole = [group.items[0] for group in groups if all(any(m is k for k in kept) for m in group.messages)]
    assert [item for item in back if "n" in item] == whole
    rendered_roles = [role for item in back if "rendered" in item for role in item["rendered"]]
    assert len(rendered_roles) + sum(len(g.messages) for g in groups if g.items[0] in whole) == len(kept)


# --- message_keys: the history index's keys from the client's items' keys -------------------------------------------

def keyed(groups: list[Group]) -> View:
    return View.of(groups, [item for group in groups for item in group.items])


def test_equal_items_give_equal_keys_and_each_message_its_own() -> None:
    view = keyed([ASK, CALL, ANSWER])
    keys = view.message_keys([11, 22, 33], "responses")
    assert keys is not None and len(keys) == 4 and len(set(keys)) == 4  # CALL's two messages apart
    again = keyed([Group(({"kind": "ask"},), ASK.messages), CALL, ANSWER]).message_keys([11, 22, 33], "responses")
    assert again == keys  # keys go by the items' keys, not by the objects


@pytest.mark.parametrize("change", ["another item key", "another dialect", "items grouped otherwise"])
def test_anything_else_gives_other_keys(change: str) -> None:
    keys = keyed([ASK, CALL, ANSWER]).message_keys([11, 22, 33], "responses")
    assert keys is not None
    if change == "another item key":
        other = keyed([ASK, CALL, ANSWER]).message_keys([11, 22, 34], "responses")
        assert other is not None and other[:3] == keys[:3] and other[3] != keys[3]
    elif change == "another dialect":
        other = keyed([ASK, CALL, ANSWER]).message_keys([11, 22, 33], "messages")
        assert other is not None and not set(other) & set(keys)
    else:
        both = Group((*ASK.items, *CALL.items), (*ASK.messages, *CALL.messages))
        other = keyed([both, ANSWER]).message_keys([11, 22, 33], "responses")
        assert other is not None and other[:3] != keys[:3]


@pytest.mark.parametrize("case", ["no source", "fewer keys", "other objects", "a source with an item more"])
def test_keys_only_for_groups_read_from_the_source_in_order(case: str) -> None:
    groups = [ASK, ANSWER]
    items = [item for group in groups for item in group.items]
    if case == "no source":
        view = View.of(groups)
    elif case == "fewer keys":
        assert keyed(groups).message_keys([1], "x") is None
        return
    elif case == "other objects":
        view = View.of(groups, [dict(item) for item in items])
    else:
        view = View.of(groups, [*items, {"kind": "more"}])
    assert view.message_keys([1] * len(view.source or items), "x") is None
