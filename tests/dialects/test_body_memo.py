"""dialects.body_memo: a resent history read from where it grew reads exactly as the whole body does."""

from __future__ import annotations

import json
import threading
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from proxy.dialects.body_memo import COST_PER_BYTE, BodyMemo, common_prefix
from proxy.dialects.call import json_object
from proxy.errors import BadRequest

SMALL = 64  # the memo's size floor in these tests, so that small bodies exercise it


def message(index: int, size: int = 200) -> dict[str, Any]:
    role = ("user", "assistant", "tool")[index % 3]
    return {"role": role, "content": f"message {index} " + "x" * size}


def body_of(messages: list[Any], key: str = "messages", **fields: Any) -> bytes:
    return orjson.dumps({"model": "m", key: messages, **fields})


def memo(**options: Any) -> BodyMemo:
    return BodyMemo(min_bytes=options.pop("min_bytes", SMALL), **options)


def read_both(bodies: BodyMemo, body: bytes, key: str = "messages") -> dict[str, Any]:
    """The memo's reading, checked against the whole body's."""
    got = bodies.read(body, key)
    assert got == json_object(body)
    assert list(got) == list(json_object(body))  # the fields in the order they came
    return got


def test_a_history_resent_with_one_message_more_is_read_from_where_it_grew() -> None:
    bodies, history = memo(), [message(index) for index in range(20)]
    first = read_both(bodies, body_of(history))
    second = read_both(bodies, body_of([*history, message(20)]))
    assert bodies.reused == 1
    assert second["messages"][0] is first["messages"][0]  # the values already read, not read again


@pytest.mark.parametrize(("name", "later"), [
    ("the same body again", lambda history: history),
    ("two messages more", lambda history: [*history, message(30), message(31)]),
    ("the last message changed", lambda history: [*history[:-1], message(99)]),
    ("a message in the middle changed", lambda history: [*history[:5], message(98), *history[6:]]),
    ("the history cut short", lambda history: history[:7]),
    ("the first message changed", lambda history: [message(97), *history[1:]]),
    ("an empty history", lambda history: []),
    ("a message that is not an object", lambda history: [*history, "text"]),
    ("a message that is a list", lambda history: [*history, [1, 2]]),
])
def test_what_follows_a_remembered_body_reads_as_the_whole_body(name: str, later: Any) -> None:
    bodies, history = memo(), [message(index) for index in range(12)]
    read_both(bodies, body_of(history))
    read_both(bodies, body_of(later(history)))


@pytest.mark.parametrize(("name", "encode"), [
    ("spaces after separators (Python's json)", lambda value: json.dumps(value).encode()),
    ("ASCII escapes", lambda value: json.dumps(value, separators=(",", ":")).encode()),
    ("pretty printed", lambda value: json.dumps(value, indent=2).encode()),
])
def test_a_body_not_written_as_orjson_writes_is_read_whole_and_not_remembered(name: str, encode: Any) -> None:
    bodies = memo()
    history = [{"role": "user", "content": "é " + "x" * 100}, *[message(index) for index in range(6)]]
    for more in range(3):
        read_both(bodies, encode({"model": "m", "messages": [*history, message(50 + more)]}))
    assert bodies.reused == 0
    assert bodies.held_bytes == 0


@pytest.mark.parametrize(("name", "tail"), [
    ("a trailing comma", b',]}'),
    ("a second history field", b'],"messages":[]}'),
    ("a second history field spelt with an escape", b'],"messag\\u0065s":[]}'),
    ("garbage after the body", b']}x'),
    ("a digit run orjson would read as a float", b',{"n":123456789012345678901234567890}]}'),
])
def test_a_resent_body_that_is_broken_or_ambiguous_after_the_shared_part_reads_as_the_whole(name: str,
                                                                                           tail: bytes) -> None:
    bodies, history = memo(), [message(index) for index in range(8)]
    read_both(bodies, body_of(history))
    body = body_of(history)[:-2] + tail
    try:
        expected: Any = json_object(body)
    except BadRequest as error:
        with pytest.raises(BadRequest) as raised:
            bodies.read(body, "messages")
        assert raised.value.message == error.message
    else:
        assert bodies.read(body, "messages") == expected


def test_the_responses_input_is_read_from_where_it_grew() -> None:
    bodies = memo()
    items = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "x" * 300}]}] * 6
    read_both(bodies, body_of(items, key="input", instructions="be brief"), key="input")
    read_both(bodies, body_of([*items, {"type": "function_call_output", "call_id": "c", "output": "ok"}],
                              key="input", instructions="be brief"), key="input")
    assert bodies.reused == 1


def test_fields_after_the_history_are_read_from_the_new_body() -> None:
    bodies, history = memo(), [message(index) for index in range(8)]
    read_both(bodies, body_of(history, stream=False, tools=[{"name": "a"}]))
    got = read_both(bodies, body_of([*history, message(8)], stream=True, tools=[{"name": "b"}]))
    assert bodies.reused == 1
    assert got["stream"] is True and got["tools"] == [{"name": "b"}]


def test_a_value_changed_in_place_is_told_by_intact() -> None:
    bodies, history = memo(), [message(index) for index in range(8)]
    first = read_both(bodies, body_of(history))
    second = read_both(bodies, body_of([*history, message(8)]))
    assert bodies.intact()
    second["messages"][2]["content"] = "changed by someone"  # what nothing in the proxy may do
    assert not bodies.intact()
    first["messages"][2]["content"] = message(2)["content"]  # the values are one: set back through either
    assert bodies.intact()


def test_intact_checks_every_remembered_history() -> None:
    bodies = memo()
    kept = [read_both(bodies, body_of([message(index, size=100 + opening)])) for opening in range(3)
            for index in range(2)]
    assert bodies.intact()
    kept[0]["messages"][0]["role"] = "system"
    assert not bodies.intact()


def test_a_small_body_is_read_whole_and_not_remembered() -> None:
    bodies = BodyMemo()  # the default floor
    small = body_of([message(0, size=10)])
    for _ in range(3):
        read_both(bodies, small)
    assert bodies.reused == 0 and bodies.held_bytes == 0


def test_what_is_remembered_stays_within_its_budget() -> None:
    bodies = memo(budget_bytes=60_000)
    for conversation in range(40):
        history = [{"role": "user", "content": f"conversation {conversation} " + "y" * 3000}]
        read_both(bodies, body_of(history))
        assert bodies.held_bytes <= 60_000
        assert_accounts_hold(bodies)
    assert bodies.held_bytes > 0


def test_a_conversation_grown_many_times_holds_one_body() -> None:
    bodies, history = memo(), [message(index) for index in range(4)]
    for turn in range(30):
        history.append(message(10 + turn))
        read_both(bodies, body_of(history))
    assert bodies.reused == 29
    assert bodies.held_bytes == 3 * len(body_of(history))  # the earlier bodies it grew from are gone


def test_conversations_read_at_once_from_threads_each_read_as_whole_bodies() -> None:
    bodies, failures = memo(), []

    def converse(number: int) -> None:
        history = [{"role": "system", "content": "shared prompt " + "s" * 500}]
        for turn in range(25):
            history.append({"role": "user", "content": f"conversation {number} turn {turn}"})
            body = body_of(history)
            if bodies.read(body, "messages") != json_object(body):
                failures.append((number, turn))

    threads = [threading.Thread(target=converse, args=(number,)) for number in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert bodies.reused > 0
    assert_accounts_hold(bodies)


@pytest.mark.parametrize(("left", "right", "shared"), [
    (b"", b"", 0),
    (b"abc", b"", 0),
    (b"abc", b"abd", 2),
    (b"abc", b"abc", 3),
    (b"abc", b"abcdef", 3),
    (b"x" * 200_000, b"x" * 200_000, 200_000),
    (b"x" * 70_000 + b"a", b"x" * 70_000 + b"b", 70_000),
    (b"x" * 65_536 + b"a", b"x" * 65_536 + b"b", 65_536),
])
def test_common_prefix(left: bytes, right: bytes, shared: int) -> None:
    assert common_prefix(left, right) == shared
    assert common_prefix(right, left) == shared


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=300), st.binary(max_size=300), st.binary(max_size=300))
def test_common_prefix_property(shared: bytes, left: bytes, right: bytes) -> None:
    expected = len(shared) + next((index for index, (a, b) in enumerate(zip(left, right, strict=False)) if a != b),
                                  min(len(left), len(right)))
    assert common_prefix(shared + left, shared + right) == expected


_TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=40)
_LEAF = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1), _TEXT,
                  st.floats(allow_nan=False, allow_infinity=False))
_VALUE = st.recursive(_LEAF, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
                      max_leaves=8)
_MESSAGE = st.dictionaries(st.sampled_from(["role", "content", "name", "tool_calls"]), _VALUE, min_size=1)
# How a later body grows out of an earlier one: messages added, dropped from the end, one replaced, the fields around
# the history changed, or the body written another way.
_STEP = st.one_of(
    st.tuples(st.just("add"), st.lists(_MESSAGE | _VALUE, min_size=1, max_size=3)),
    st.tuples(st.just("drop"), st.integers(1, 3)),
    st.tuples(st.just("replace"), st.tuples(st.integers(0, 20), _MESSAGE)),
    st.tuples(st.just("fields"), st.dictionaries(st.sampled_from(["stream", "tools", "model"]), _VALUE)),
    st.tuples(st.just("spaces"), st.none()),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(_MESSAGE, max_size=6), st.lists(_STEP, max_size=8))
def test_any_sequence_of_bodies_reads_as_each_whole_body(start: list[Any], steps: list[Any]) -> None:
    bodies = memo(min_bytes=0, key_bytes=2)  # "messages":[ and one byte: most bodies meet a remembered one
    history, fields, spaced = list(start), {}, False
    for kind, argument in [("add", []), *steps]:
        if kind == "add":
            history += argument
        elif kind == "drop":
            history = history[:-argument]
        elif kind == "replace" and history:
            index, replacement = argument
            history[index % len(history)] = replacement
        elif kind == "fields":
            fields = {key: value for key, value in argument.items() if key != "messages"}
        elif kind == "spaces":
            spaced = not spaced
        value = {**fields, "messages": history}
        body = json.dumps(value).encode() if spaced else orjson.dumps(value)
        assert bodies.read(body, "messages") == json_object(body)
        assert_accounts_hold(bodies)
    event(f"read from a remembered body: {bodies.reused > 0}")


def assert_accounts_hold(bodies: BodyMemo) -> None:
    """What the memo counts is what it holds, and every history it hands keys for is one it holds."""
    held = [entry for kept in bodies._buckets.values() for entry in kept]
    assert bodies.held_bytes == COST_PER_BYTE * sum(len(entry.body) for entry in held)
    assert all(kept for kept in bodies._buckets.values())
    assert {id(entry) for entry in bodies._by_history.values()} <= {id(entry) for entry in held}
    assert all(bodies.keys_of(entry.messages) == entry.keys for entry in held)


def test_a_remembered_history_comes_with_its_index_keys() -> None:
    bodies, history = memo(), [message(index) for index in range(10)]
    first = bodies.read(body_of(history), "messages")
    assert bodies.keys_of(first["messages"]) == [hash(orjson.dumps(each)) for each in history]
    second = bodies.read(body_of([*history, message(10)]), "messages")
    assert bodies.keys_of(second["messages"]) == [hash(orjson.dumps(each)) for each in [*history, message(10)]]
    assert bodies.keys_of(first["messages"]) is None  # the body it grew from is let go
    assert bodies.keys_of(list(second["messages"])) is None  # an equal list is not the one read
    assert bodies.keys_of(json_object(body_of(history))["messages"]) is None


def test_a_history_let_go_for_the_budget_has_no_keys() -> None:
    bodies = memo(budget_bytes=30_000)
    read = bodies.read(body_of([message(0, size=4000)]), "messages")
    assert bodies.keys_of(read["messages"]) is not None
    for conversation in range(1, 6):
        bodies.read(body_of([message(conversation, size=4000)]), "messages")
    assert bodies.keys_of(read["messages"]) is None


def test_a_body_read_twice_in_a_row_is_read_once_and_handed_out_twice_at_most() -> None:
    bodies, history = memo(), [message(index) for index in range(8)]
    body = body_of(history)
    glanced = bodies.read(body, "messages")  # a glance at it, then its parse: one reading
    assert bodies.read(body, "messages") is glanced
    again = bodies.read(body, "messages")  # a third read is a read of its own
    assert again is not glanced and again == glanced
    other = bodies.read(bytes(bytearray(body)), "messages")  # equal bytes, another body: read of its own
    assert other is not again and other == glanced
    last = bodies.read(body, "messages")
    assert bodies.read(body, "input") is not last  # a reading for one field is not one for another


def spliced_as_encoded(bodies: BodyMemo, body: bytes, front: list[Any], kept_from: int) -> bytes | None:
    """The memo's splice of `body` (read through it), checked against encoding the spliced object whole."""
    payload = bodies.read(body, "messages")
    messages = payload["messages"]
    spliced = bodies.spliced(body, messages, orjson.dumps(front)[1:-1], kept_from)
    if spliced is not None:
        assert spliced == orjson.dumps({**payload, "messages": [*front, *messages[kept_from:]]})
    return spliced


@pytest.mark.parametrize("fields", [{}, {"stream": True, "tools": [{"type": "function"}]}], ids=["bare", "fields"])
@pytest.mark.parametrize("kept_from", [1, 7, 19])
def test_a_summary_spliced_into_the_bytes_is_the_spliced_object_encoded(fields: dict[str, Any],
                                                                        kept_from: int) -> None:
    bodies, history = memo(), [message(index) for index in range(20)]
    summary = [{"role": "user", "content": "the summary: \u00e9\u4e2d \"quoted\""},
               {"role": "assistant", "content": "ok"}]
    assert spliced_as_encoded(bodies, body_of(history, **fields), summary, kept_from) is not None
    grown = body_of([*history, message(20)], **fields)  # read from the remembered body: spliced as well
    assert spliced_as_encoded(bodies, grown, summary, kept_from) is not None


def test_no_splice_without_the_memos_spans_or_anything_kept() -> None:
    bodies, history = memo(), [message(index) for index in range(20)]
    body = body_of(history)
    messages = bodies.read(body, "messages")["messages"]
    front = orjson.dumps([{"role": "user", "content": "summary"}])[1:-1]
    assert bodies.spliced(body, messages, front, 5) is not None and bodies.holds(body, messages)
    assert bodies.spliced(bytes(bytearray(body)), messages, front, 5) is None  # equal bytes, not the body it read
    assert not bodies.holds(bytes(bytearray(body)), messages)
    assert bodies.spliced(body, list(messages), front, 5) is None  # a list it did not read
    assert not bodies.holds(body, list(messages))
    assert bodies.spliced(body, messages, b"", 5) is None  # nothing in front
    for kept_from in (0, len(messages), len(messages) + 1, -1):
        assert bodies.spliced(body, messages, front, kept_from) is None
    spaced = json.dumps({"model": "m", "messages": history}).encode()  # not orjson's spelling: not remembered
    assert bodies.spliced(spaced, read := bodies.read(spaced, "messages")["messages"], front, 5) is None
    assert not bodies.holds(spaced, read)
    small = memo(min_bytes=len(body) + 1)  # read whole, not remembered
    assert small.spliced(body, read := small.read(body, "messages")["messages"], front, 5) is None
    assert not small.holds(body, read)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(_MESSAGE, min_size=2, max_size=8), st.lists(_MESSAGE, min_size=1, max_size=3),
       st.dictionaries(st.sampled_from(["stream", "tools", "model"]), _VALUE), st.data())
def test_any_splice_is_the_spliced_object_encoded(history: list[Any], front: list[Any], fields: dict[str, Any],
                                                  data: st.DataObject) -> None:
    bodies = memo(min_bytes=0)
    try:
        body = orjson.dumps({**fields, "messages": history})
        orjson.dumps(front)
    except orjson.JSONEncodeError:
        return  # an integer orjson cannot write: such a body is read whole and never spliced
    kept_from = data.draw(st.integers(1, len(history) - 1))
    spliced = spliced_as_encoded(bodies, body, front, kept_from)
    event(f"spliced: {spliced is not None}")


# --- reads kept with a history (dialects.kept_reads) --------------------------------------------------------------

class Kept:
    def intact(self) -> bool:
        return True


def test_a_read_is_kept_only_with_a_history_the_memo_holds() -> None:
    bodies, history = memo(), [message(index) for index in range(10)]
    held = bodies.read(body_of(history), "messages")["messages"]
    kept = Kept()
    bodies.keep_read(list(held), kept, 5)  # an equal list, not the one held
    assert bodies.kept_read(held) is None
    bodies.keep_read(held, kept, 11)  # past its end
    assert bodies.kept_read(held) is None
    bodies.keep_read(held, kept, 9)
    assert bodies.kept_read(held) == (kept, 9) and bodies.resumed == 1


@pytest.mark.parametrize("later, carried, grew", [
    (lambda history: [*history, message(30)], True, True),          # every message read is shared
    (lambda history: [*history[:-1], message(31)], True, True),     # its last changed: the read stopped before it
    (lambda history: [*history[:-2], message(32)], False, True),    # cut before where the read stopped
    (lambda history: [message(33), *history[1:]], False, False),    # read whole: nothing shared
])
def test_a_read_goes_on_with_the_history_that_grew_when_it_read_no_further(later: Any, carried: bool,
                                                                          grew: bool) -> None:
    bodies, history = memo(), [message(index) for index in range(10)]
    first = bodies.read(body_of(history), "messages")["messages"]
    kept = Kept()
    bodies.keep_read(first, kept, 9)
    second = bodies.read(body_of(later(history)), "messages")["messages"]
    assert bodies.kept_read(second) == ((kept, 9) if carried else None)
    # A history that grew from the first lets it go, with its read; one read whole leaves it be.
    assert bodies.kept_read(first) == (None if grew else (kept, 9))


def test_a_read_goes_when_its_history_is_let_go() -> None:
    history = [message(index, size=2000) for index in range(10)]
    bodies = memo(budget_bytes=COST_PER_BYTE * len(body_of(history)) + 100)
    first = bodies.read(body_of(history), "messages")["messages"]
    bodies.keep_read(first, Kept(), 9)
    bodies.read(body_of([message(index + 50, size=2000) for index in range(10)]), "messages")  # another one
    assert bodies.kept_read(first) is None
    assert bodies.intact()


def test_a_kept_read_is_charged_to_the_budget_and_given_back_with_its_history() -> None:
    from proxy.dialects.body_memo import READ_COST_DIVISOR

    history = [message(index, size=2000) for index in range(10)]
    first_body = body_of(history)
    bodies = memo()
    first = bodies.read(first_body, "messages")["messages"]
    bodies.keep_read(first, Kept(), 9)
    bodies.keep_read(first, Kept(), 9)  # kept again: charged once
    charged = COST_PER_BYTE * len(first_body) + len(first_body) // READ_COST_DIVISOR
    assert bodies.held_bytes == charged
    grown_body = body_of([*history, message(10, size=2000)])
    bodies.read(grown_body, "messages")  # the read goes on with the history that grew, charged to it
    assert bodies.held_bytes == COST_PER_BYTE * len(grown_body) + len(grown_body) // READ_COST_DIVISOR


def test_a_kept_read_over_the_budget_lets_the_oldest_go() -> None:
    history = [message(index, size=2000) for index in range(10)]
    other = [message(index + 50, size=2000) for index in range(10)]
    bodies = memo(budget_bytes=2 * COST_PER_BYTE * len(body_of(history)) + 100)
    first = bodies.read(body_of(history), "messages")["messages"]
    second = bodies.read(body_of(other), "messages")["messages"]
    assert bodies.keys_of(first) is not None and bodies.keys_of(second) is not None  # both fit
    bodies.keep_read(second, Kept(), 9)  # one read more: over the budget, the least recently used goes
    assert bodies.keys_of(first) is None and bodies.kept_read(second) is not None
    assert bodies.held_bytes <= 2 * COST_PER_BYTE * len(body_of(history)) + 100
