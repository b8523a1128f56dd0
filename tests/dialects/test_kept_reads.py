"""dialects.kept_reads: a view read on from a kept state is the view read afresh, for every shape a resent history
takes; what is kept goes with the history in the body memo."""

from __future__ import annotations

import json
import threading
from typing import Any, Self

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.dialects.body_memo import BodyMemo
from proxy.dialects.kept_reads import read_on
from proxy.dialects.messages_blocks import view_of_messages
from proxy.dialects.responses_items import view_of_input

SMALL = 64  # the memo's size floor here, so that small bodies are remembered


class Letters:
    """A toy reader: takes strings of one letter, refuses anything else; remembers what it read."""

    def __init__(self) -> None:
        self.read_items: list[Any] = []
        self.copies = 0

    def read(self, item: Any) -> bool:
        if not (isinstance(item, str) and len(item) == 1):
            return False
        self.read_items.append(item)
        return True

    def copy(self) -> Self:
        twin = type(self)()
        twin.read_items, twin.copies = list(self.read_items), self.copies + 1
        return twin

    def intact(self) -> bool:
        return True


class Digits(Letters):
    """Another reader kind: a state kept by Letters is not its to go on from."""


class Shelf:
    """Reads kept by list identity, as the body memo keeps them (without its bodies)."""

    def __init__(self) -> None:
        self.kept: dict[int, tuple[list[Any], Any, int]] = {}
        self.asked = 0

    def kept_read(self, messages: object) -> tuple[Any, int] | None:
        self.asked += 1
        held = self.kept.get(id(messages))
        return (held[1], held[2]) if held is not None and held[0] is messages else None

    def keep_read(self, messages: object, read: Any, count: int) -> None:
        assert isinstance(messages, list)
        self.kept[id(messages)] = (messages, read, count)


def test_without_reads_every_item_is_read() -> None:
    reader = read_on(list("abc"), None, Letters)
    assert reader is not None and reader.read_items == list("abc")


def test_the_state_before_the_last_item_is_kept() -> None:
    shelf, items = Shelf(), list("abcd")
    reader = read_on(items, shelf, Letters)
    assert reader is not None and reader.read_items == items
    kept, count = shelf.kept_read(items) or (None, 0)
    assert count == 3 and isinstance(kept, Letters) and kept.read_items == list("abc")


@pytest.mark.parametrize("later, read_again, kept_again", [
    (list("abcdef"), list("def"), False),   # two items more: from the kept state on (the last item read again)
    (list("abcx"), list("x"), True),        # the last item changed: the kept state is kept again, not copied
    (list("abcd"), list("d"), True),        # the same again
])
def test_a_history_that_grew_goes_on_from_the_kept_state(later: list[str], read_again: list[str],
                                                         kept_again: bool) -> None:
    shelf, first = Shelf(), list("abcd")
    read_on(first, shelf, Letters)
    kept = shelf.kept[id(first)]
    shelf.kept[id(later)] = (later, kept[1], kept[2])  # as the memo carries it to the history that grew
    reader = read_on(later, shelf, Letters)
    assert reader is not None and reader.read_items == later
    assert reader.copies >= 1  # went on from a copy of the kept state, which itself is unchanged
    assert kept[1].read_items == list("abc")
    assert reader.read_items[3:] == later[3:] and read_again == later[3:]
    assert (shelf.kept[id(later)][1] is kept[1]) == kept_again
    assert shelf.kept[id(later)][1].read_items == later[:-1]


def test_a_state_of_another_kind_is_not_gone_on_from() -> None:
    shelf, items = Shelf(), list("abc")
    shelf.kept[id(items)] = (items, Digits(), 2)  # a Digits state that read nothing: wrong for Letters
    reader = read_on(items, shelf, Letters)
    assert reader is not None and reader.read_items == items


@pytest.mark.parametrize("items", [["a", "b", "12"], ["a", 2, "c"], [None]])
def test_an_item_not_understood_reads_as_none(items: list[Any]) -> None:
    assert read_on(items, Shelf(), Letters) is None


def test_a_bad_last_item_still_keeps_the_state_before_it() -> None:
    """The state before the last item is sound; the next request (with a better last item) goes on from it."""
    shelf, items = Shelf(), ["a", "b", 7]
    assert read_on(items, shelf, Letters) is None
    assert shelf.kept[id(items)][2] == 2


def test_an_empty_history_reads_as_the_empty_state() -> None:
    shelf: Shelf = Shelf()
    empty: list[Any] = []
    reader = read_on(empty, shelf, Letters)
    assert reader is not None and reader.read_items == [] and shelf.kept[id(empty)][2] == 0


def test_a_single_item_keeps_the_empty_state() -> None:
    shelf, items = Shelf(), ["a"]
    assert read_on(items, shelf, Letters) is not None
    assert shelf.kept[id(items)][2] == 0


# --- the real readers, through the body memo ---------------------------------------------------------------------

def responses_turn(index: int) -> list[dict[str, Any]]:
    call = f"call_{index}"
    return [{"type": "message", "role": "user", "content": f"step {index} é"},
            {"type": "reasoning", "id": f"rs_{index}", "summary": [], "encrypted_content": "x" * 20},
            {"type": "function_call", "call_id": call, "name": "shell", "arguments": json.dumps({"n": index})},
            {"type": "function_call_output", "call_id": call, "output": f"result {index}"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": f"done {index}"}]}]


def messages_turn(index: int) -> list[dict[str, Any]]:
    call = f"toolu_{index}"
    return [{"role": "user", "content": f"step {index}"},
            {"role": "assistant", "content": [{"type": "text", "text": "on it"},
                                              {"type": "tool_use", "id": call, "name": "bash",
                                               "input": {"cmd": f"ls {index}", "deep": {"n": [index]}}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call, "content": f"out {index}"},
                                         {"type": "text", "text": "and then?"}]},
            {"role": "assistant", "content": f"done {index}"}]


DIALECTS = {
    "responses": ("input", responses_turn, view_of_input),
    "messages": ("messages", messages_turn, view_of_messages),
}


def resend(kind: str, shapes: list[tuple[int, int]]) -> BodyMemo:
    """Requests of one conversation, each `(turns, cut)`: the first `turns` turns' items without the last `cut`
    (a history that grows, is resent as it was, loses its end or changes its last item); each view read through
    the memo must be the view read afresh."""
    key, turn, view_of = DIALECTS[kind]
    bodies = BodyMemo(min_bytes=SMALL, key_bytes=SMALL)
    for turns, cut in shapes:
        items = [item for index in range(turns) for item in turn(index)]
        items = items[:len(items) - cut] if cut < len(items) else items[:1]
        if turns % 3 == 2 and len(items) > 1:
            items[-1] = turn(99)[0]  # another last item
        body = orjson.dumps({"model": "m", key: items})
        resumed = view_of(bodies.read(body, key)[key], bodies)
        fresh = view_of(json.loads(body)[key])
        assert (resumed is None) == (fresh is None)
        if resumed is not None and fresh is not None:
            assert resumed.messages == fresh.messages
            assert resumed.groups == fresh.groups
            assert resumed.messages == [message for group in resumed.groups for message in group.messages]
            assert bodies.keys_of_view(resumed, kind) == fresh_keys(kind, body)
    assert bodies.intact()
    return bodies


def fresh_keys(kind: str, body: bytes) -> list[int] | None:
    """The history index's keys of a body's view, read by a memo that has seen nothing before it."""
    key, _, view_of = DIALECTS[kind]
    alone = BodyMemo(min_bytes=SMALL, key_bytes=SMALL)
    view = view_of(alone.read(body, key)[key])
    return alone.keys_of_view(view, kind) if view is not None else None


@pytest.mark.parametrize("kind", DIALECTS)
def test_an_agent_loop_goes_on_from_each_last_read(kind: str) -> None:
    bodies = resend(kind, [(turns, 0) for turns in range(1, 12)])
    assert bodies.resumed == 10


@pytest.mark.parametrize("kind", DIALECTS)
def test_an_agent_loop_keys_only_the_groups_each_turn_adds(kind: str) -> None:
    key, turn, view_of = DIALECTS[kind]
    bodies = BodyMemo(min_bytes=SMALL, key_bytes=SMALL)
    shared, groups = [], []
    for turns in range(1, 6):
        items = [item for index in range(turns) for item in turn(index)]
        view = view_of(bodies.read(orjson.dumps({"model": "m", key: items}), key)[key], bodies)
        assert view is not None and bodies.keys_of_view(view, kind) is not None
        kept = bodies._reads[id(view.source)].keys
        assert kept is not None and kept.groups == view.groups
        shared.append(kept.shared)
        groups.append(len(view.groups))
    # Each view keeps the keys of every group of the one before but its last (read again after the kept read).
    assert shared == [0] + [count - 1 for count in groups[:-1]]


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(sorted(DIALECTS)),
       shapes=st.lists(st.tuples(st.integers(1, 8), st.integers(0, 6)), min_size=1, max_size=8))
def test_a_view_read_on_is_the_view_read_afresh(kind: str, shapes: list[tuple[int, int]]) -> None:
    resend(kind, shapes)


@pytest.mark.parametrize("kind", DIALECTS)
def test_a_kept_read_changed_in_place_is_told(kind: str) -> None:
    key, turn, view_of = DIALECTS[kind]
    bodies = BodyMemo(min_bytes=SMALL, key_bytes=SMALL)
    items = [item for index in range(4) for item in turn(index)]
    view = view_of(bodies.read(orjson.dumps({"model": "m", key: items}), key)[key], bodies)
    assert view is not None and bodies.intact()
    view.messages[0]["content"] = "changed in place"
    assert not bodies.intact()


def test_conversations_in_threads_at_once_each_read_their_own() -> None:
    """Four conversations of each dialect through one memo from eight threads: every view, and its keys, are the
    fresh ones."""
    bodies = BodyMemo(min_bytes=SMALL, key_bytes=SMALL)
    failures: list[str] = []

    def converse(kind: str, salt: int) -> None:
        key, turn, view_of = DIALECTS[kind]
        for turns in range(1, 10):
            items = [{"role": "user", "content": f"conversation {salt}"}] if kind == "messages" else \
                [{"type": "message", "role": "user", "content": f"conversation {salt}"}]
            items += [item for index in range(turns) for item in turn(index)]
            body = orjson.dumps({"model": "m", key: items})
            resumed, fresh = view_of(bodies.read(body, key)[key], bodies), view_of(json.loads(body)[key])
            if resumed is None or fresh is None or resumed.groups != fresh.groups or \
                    bodies.keys_of_view(resumed, kind) != fresh_keys(kind, body):
                failures.append(f"{kind} {salt} {turns}")

    threads = [threading.Thread(target=converse, args=(kind, salt)) for kind in DIALECTS for salt in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures and bodies.intact()
    assert bodies.resumed > 0


# --- the parse spared a look at what a view reader read (read_plainly) --------------------------------------------

def envelope(kind: str) -> Any:
    """The proxy's own compaction, as the client resends it: an input item, or a block of an assistant message."""
    from proxy.core.envelope import Sealed, seal

    sealed = seal(Sealed(({"role": "user", "content": "before"},), "the summary", ()))
    if kind == "responses":
        return {"type": "compaction", "id": "cmp_x", "encrypted_content": sealed}
    return {"role": "assistant", "content": [{"type": "compaction", "content": "the summary",
                                              "encrypted_content": sealed}]}


def parsed(kind: str, body: bytes, bodies: BodyMemo | None) -> Any:
    from proxy.dialects.messages import read_call as messages_call
    from proxy.dialects.responses import read_call as responses_call

    key = DIALECTS[kind][0]
    payload = bodies.read(body, key) if bodies is not None else json.loads(body)
    if kind == "responses":
        return responses_call(body, {}, "", upstream_compacts=False, payload=payload, reads=bodies)
    return messages_call(body, {}, "", upstream_manages=False, payload=payload, reads=bodies)


@pytest.mark.parametrize("kind", DIALECTS)
def test_a_request_parsed_with_kept_reads_is_the_request_parsed_without(kind: str) -> None:
    """An agent loop whose later turns resend the proxy's compaction (where the last kept read stopped, then in the
    middle of what was read before): every parse, and every view, is what it is without the kept reads."""
    key, turn, view_of = DIALECTS[kind]
    bodies = BodyMemo(min_bytes=SMALL, key_bytes=SMALL)
    history: list[Any] = []
    for index in range(10):
        if index == 6:  # just where the last kept read stopped (before the last request's last item)
            history.insert(len(history) - 1, envelope(kind))
        history += turn(index)
        if index == 8:
            history.insert(3, envelope(kind))  # before what a kept read read: the parse must still find it
        body = orjson.dumps({"model": "m", key: history})
        with_reads, without = parsed(kind, body, bodies), parsed(kind, body, None)
        assert with_reads.payload == without.payload and with_reads.body == without.body
        ours, theirs = view_of(with_reads.payload[key], bodies), view_of(without.payload[key])
        assert (ours is None) == (theirs is None) and (ours is None or ours.groups == theirs.groups)
    assert bodies.resumed > 0 and bodies.intact()


@pytest.mark.parametrize("kind", DIALECTS)
def test_plainly_read_is_how_far_a_kept_reader_read(kind: str) -> None:
    from proxy.dialects.messages_blocks import read_plainly as messages_plainly
    from proxy.dialects.responses_items import read_plainly as responses_plainly

    plainly = responses_plainly if kind == "responses" else messages_plainly
    key, turn, view_of = DIALECTS[kind]
    bodies = BodyMemo(min_bytes=SMALL, key_bytes=SMALL)
    items = bodies.read(orjson.dumps({"model": "m", key: [*turn(0), *turn(1)]}), key)[key]
    assert plainly(items, bodies) == 0 and plainly(items, None) == 0  # nothing read yet
    view_of(items, bodies)
    assert plainly(items, bodies) == len(items) - 1 and bodies.resumed == 0  # a look, not a read on
    assert plainly(list(items), bodies) == 0  # another list


def test_a_responses_reader_that_met_a_compaction_item_spares_nothing() -> None:
    from proxy.dialects.responses_items import read_plainly

    bodies = BodyMemo(min_bytes=SMALL, key_bytes=SMALL)
    foreign = {"type": "compaction", "id": "cmp_y", "encrypted_content": "gAAAA-another-issuer"}
    items = bodies.read(orjson.dumps({"model": "m", "input": [foreign, *responses_turn(0), *responses_turn(1)]}),
                        "input")["input"]
    assert view_of_input(items, bodies) is not None
    assert read_plainly(items, bodies) == 0
