"""proxy.core.view: groups go back whole as the client's own items; anything compaction made is rendered."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.messages import Message
from proxy.core.view import Group, View, ViewKeys, _keys, _shared_groups

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


# --- keyed: the keys of the groups a view shares with the conversation's last one are kept -------------------------

def item(name: str) -> dict[str, Any]:
    return {"kind": name}


def group(name: str, items: int = 1, messages: int = 1) -> Group:
    """A group of `items` client items making `messages` neutral messages (0: a group that makes none)."""
    return Group(tuple(item(f"{name}.{index}") for index in range(items)),
                 tuple({"role": "user", "content": f"{name} {index}"} for index in range(messages)))


def item_keys(view: View) -> list[int]:
    """Keys as the body memo gives them: equal items, equal keys."""
    return [hash(repr(one)) for one in view.source or ()]


FIRST = [group("a"), group("b", items=2), group("c", messages=2), group("d"), group("e", items=3, messages=3)]


@pytest.mark.parametrize("later, shared", [
    (lambda groups: [*groups, group("f"), group("g", messages=0)], 5),  # a turn added
    (lambda groups: [*groups[:-1], group("z")], 4),                     # the last one changed
    (lambda groups: list(groups), 5),                                    # resent as it was
    (lambda groups: groups[:2], 2),                                      # cut
    (lambda groups: [groups[0], group("b", items=2)], 1),                # an equal group, another object
    (lambda groups: [groups[0], group("b", items=2), *groups[2:]], 0),   # ... and the same ones again: afresh
    (lambda groups: [group("x"), *groups[1:]], 0),                       # parts at the first
])
def test_a_view_keyed_from_the_last_one_is_keyed_as_afresh(later: Any, shared: int) -> None:
    first = keyed(FIRST)
    earlier = first.keyed(item_keys(first), "messages")
    assert earlier is not None and earlier.shared == 0
    view = keyed(later(FIRST))
    got = view.keyed(item_keys(view), "messages", earlier)
    assert got is not None and got.shared == shared
    assert got.keys == view.message_keys(item_keys(view), "messages")
    again = view.keyed(item_keys(view), "messages")
    assert again is not None and (got.items, got.messages) == (again.items, again.messages)


def test_the_shared_groups_keys_are_the_earlier_ones_not_made_again() -> None:
    first = keyed(FIRST)
    made = first.keyed(item_keys(first), "messages")
    assert made is not None
    marked = ViewKeys(made.salt, made.groups, made.items, made.messages, [-1] * len(made.keys), 0)
    view = keyed([*FIRST[:-1], group("z")])
    got = view.keyed(item_keys(view), "messages", marked)
    assert got is not None and got.keys[:made.messages[4]] == [-1] * made.messages[4]
    assert -1 not in got.keys[made.messages[4]:]


@pytest.mark.parametrize("case", ["another salt", "counted otherwise", "a source not lined up"])
def test_earlier_keys_that_do_not_line_up_are_not_taken(case: str) -> None:
    first = keyed(FIRST)
    made = first.keyed(item_keys(first), "messages")
    assert made is not None
    view = keyed([*FIRST, group("f")])
    salt = "responses" if case == "another salt" else "messages"
    if case == "counted otherwise":
        made = ViewKeys(made.salt, made.groups, [count + 1 for count in made.items], made.messages, made.keys, 0)
    elif case == "a source not lined up":
        view = View.of(view.groups, [item("stray"), *(view.source or [])][:-1])
    got = view.keyed(item_keys(view), salt, made)
    expected = view.message_keys(item_keys(view), salt)
    assert (got.keys if got is not None else None) == expected
    assert got is None or got.shared == 0


@given(st.lists(st.tuples(st.integers(1, 3), st.integers(0, 3)), min_size=1, max_size=12),
       st.lists(st.tuples(st.integers(1, 3), st.integers(0, 3)), max_size=6),
       st.integers(0, 12), st.sampled_from(["messages", "responses"]))
def test_keyed_on_is_keyed_afresh(shapes: list[tuple[int, int]], added: list[tuple[int, int]], kept: int,
                                  salt: str) -> None:
    """Any earlier view (groups of 1-3 items making 0-3 messages), any next one keeping some of its groups and
    adding others: the keys are those made afresh."""
    groups = [group(f"g{index}", items, messages) for index, (items, messages) in enumerate(shapes)]
    first = keyed(groups)
    earlier = first.keyed(item_keys(first), salt)
    assert earlier is not None
    view = keyed(groups[:kept] + [group(f"n{index}", items, messages) for index, (items, messages) in
                                  enumerate(added)])
    got = view.keyed(item_keys(view), salt, earlier)
    if not view.groups:
        return
    assert got is not None and got.keys == view.message_keys(item_keys(view), salt)
    assert got.shared == min(kept, len(groups))
    assert got.empty == [index for index, each in enumerate(view.groups) if not each.messages]
    # What is kept after any cut is the same from the counts kept with the keys as from the groups looked at.
    for count in range(len(view.messages) + 2):
        assert view.kept_after(count, got) == view.kept_after(count)


@pytest.mark.parametrize("sizes, counts, expected", [
    ([1, 1, 1], [1, 1, 1], [("s", 1, 0), ("s", 2, 0), ("s", 3, 0)]),
    ([1, 1], [2, 1], [("s", 1, 0), ("s", 1, 1), ("s", 2, 0)]),
    ([1, 1, 1], [1, 1, 2], [("s", 1, 0), ("s", 2, 0), ("s", 3, 0), ("s", 3, 1)]),
    ([1, 1, 1], [1, 0, 3], [("s", 1, 0), ("s", 3, 0), ("s", 3, 1), ("s", 3, 2)]),
    ([2, 1], [1, 2], [("s", (1, 2), 0), ("s", 3, 0), ("s", 3, 1)]),
    ([], [], []),
])
def test_keys_as_a_table(sizes: list[int], counts: list[int], expected: list[Any]) -> None:
    assert _keys(list(range(1, sum(sizes) + 1)), sizes, counts, "s") == list(map(hash, expected))


@pytest.mark.parametrize("left, right, shared", [
    ("abc", "abc", 3), ("abc", "abx", 2), ("abc", "ab", 2), ("abc", "xbc", 0), ("", "abc", 0),
    ("abcd", "abxd", 2),  # parted at c: d, the same object again after, is not shared
])
def test_shared_groups_as_a_table(left: str, right: str, shared: int) -> None:
    made = {name: group(name) for name in "abcdx"}
    assert _shared_groups([made[name] for name in left], [made[name] for name in right]) == shared


@pytest.mark.parametrize("count, expected", [(0, None), (1, (1, 1)), (2, (3, 2)), (3, (3, 2)), (4, None),
                                             (5, None)],
                         ids=["none", "after ASK", "inside CALL", "after CALL", "all", "past the end"])
def test_what_is_kept_after_a_cut_as_a_table(count: int, expected: tuple[int, int] | None) -> None:
    view = keyed([ASK, CALL, ANSWER])
    assert view.kept_after(count) == expected
    keys = view.keyed(item_keys(view), "x")
    assert view.kept_after(count, keys) == expected  # the same from the view's keys' counts


def test_a_group_that_makes_no_message_after_the_cut_keeps_nothing() -> None:
    view = keyed([ASK, group("empty", messages=0), ANSWER])
    assert view.kept_after(1) is None and view.kept_after(1, view.keyed(item_keys(view), "x")) is None


def test_a_group_that_makes_no_message_before_the_cut_is_replaced_with_it() -> None:
    view = keyed([group("empty", messages=0), ASK, CALL, ANSWER])
    keys = view.keyed(item_keys(view), "x")
    assert keys is not None and keys.empty == [0]
    assert view.kept_after(1) == view.kept_after(1, keys) == (1, 2)
    later = keyed([*view.groups, group("none", messages=0)])  # a turn that adds one: known from the new groups
    on = later.keyed(item_keys(later), "x", keys)
    assert on is not None and on.shared == 4 and on.empty == [0, 4] and later.kept_after(1, on) is None


def test_keys_of_another_view_are_not_taken_for_its_counts() -> None:
    view, other = keyed([ASK, CALL, ANSWER]), keyed([CALL, ASK, ANSWER])
    assert view.kept_after(1, other.keyed(item_keys(other), "x")) == (1, 1)


@pytest.mark.parametrize("case", ["no source", "a source not lined up", "a source with an item more"])
def test_what_is_kept_after_a_cut_is_the_sources(case: str) -> None:
    groups = [ASK, CALL, ANSWER]
    items = [item for group in groups for item in group.items]
    source = None if case == "no source" else \
        [*items[:2], dict(items[2])] if case == "a source not lined up" else [*items, {"kind": "more"}]
    assert View.of(groups, source).kept_after(1) is None
