"""core.stored_replacements: a stored replacement is counted and encoded once while it is the same object."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import orjson
import pytest

from proxy.core.messages import Message
from proxy.core.stored_replacements import StoredReplacements, synthetic_positions


class Counting:
    """A count_each that counts characters and remembers what it was asked."""

    def __init__(self) -> None:
        self.asked: list[Sequence[Message]] = []

    def __call__(self, messages: Sequence[Message]) -> list[int]:
        self.asked.append(messages)
        return [len(str(message.get("content"))) for message in messages]


SUMMARY = ({"role": "user", "content": "the summary"}, {"role": "assistant", "content": "ok"})
KEY = ("tenant", "abc")


def test_the_same_replacement_is_counted_once() -> None:
    count, stored = Counting(), StoredReplacements()
    assert [stored.counts(KEY, SUMMARY, count) for _ in range(5)] == [(11, 2)] * 5
    assert count.asked == [SUMMARY]


@pytest.mark.parametrize(("second_key", "second", "counted"), [
    (KEY, tuple(dict(message) for message in SUMMARY), 2),  # equal, not the same object: a store that decodes anew
    (KEY, ({"role": "user", "content": "another summary"},), 2),  # the key's summary replaced
    (("tenant", "def"), SUMMARY, 2),  # another record holding the same messages
    (("other", "abc"), SUMMARY, 2),  # the same prefix hash in another namespace
    (KEY, SUMMARY, 1),
])
def test_a_replacement_is_counted_again_unless_key_and_object_are_the_same(
        second_key: tuple[str, str], second: tuple[Message, ...], counted: int) -> None:
    count, stored = Counting(), StoredReplacements()
    stored.counts(KEY, SUMMARY, count)
    assert stored.counts(second_key, second, count) == tuple(len(str(message["content"])) for message in second)
    assert len(count.asked) == counted


def test_the_encoding_is_orjsons_without_brackets_made_once_and_made_again_for_a_new_replacement() -> None:
    stored = StoredReplacements()
    first = stored.encoded(KEY, SUMMARY)
    assert first == orjson.dumps(list(SUMMARY))[1:-1]
    assert stored.encoded(KEY, SUMMARY) is first  # kept, not made again
    newer = ({"role": "user", "content": "newer"},)
    assert stored.encoded(KEY, newer) == orjson.dumps(list(newer))[1:-1]


@pytest.mark.parametrize("refused", [False, True])
def test_a_rendering_is_made_once_per_dialect_and_again_for_a_new_replacement(refused: bool) -> None:
    stored, asked = StoredReplacements(), []

    def render(dialect: str) -> Any:
        def made(replacement: Sequence[Message]) -> Any:
            asked.append((dialect, replacement))
            return None if refused else ([{"rendered": dialect}], b"encoded " + dialect.encode())
        return made

    first = stored.rendered(KEY, SUMMARY, "responses", render("responses"))
    assert first == (None if refused else ([{"rendered": "responses"}], b"encoded responses"))
    assert stored.rendered(KEY, SUMMARY, "responses", render("responses")) is first  # kept, refused or not
    stored.rendered(KEY, SUMMARY, "messages", render("messages"))  # another dialect's own
    newer = ({"role": "user", "content": "newer"},)
    stored.rendered(KEY, newer, "responses", render("responses"))  # the key's summary replaced
    assert asked == [("responses", SUMMARY), ("messages", SUMMARY), ("responses", newer)]


def test_encoding_and_counts_are_kept_together() -> None:
    count, stored = Counting(), StoredReplacements()
    encoded = stored.encoded(KEY, SUMMARY)
    stored.counts(KEY, SUMMARY, count)
    assert stored.encoded(KEY, SUMMARY) is encoded and len(stored) == 1 and len(count.asked) == 1


def test_a_replacement_orjson_refuses_has_no_encoding_and_keeps_its_counts() -> None:
    count, stored = Counting(), StoredReplacements()
    lone = ({"role": "user", "content": "half a pair: \ud800"},)
    assert stored.encoded(KEY, lone) is None
    assert stored.encoded(KEY, lone) is None
    assert stored.counts(KEY, lone, count) == (len(lone[0]["content"]),)
    assert len(count.asked) == 1
    assert stored.intact(count)


def test_a_key_holds_its_latest_replacement_only() -> None:
    count, stored = Counting(), StoredReplacements()
    newer = ({"role": "user", "content": "newer"},)
    stored.counts(KEY, SUMMARY, count)
    stored.counts(KEY, newer, count)
    assert len(stored) == 1
    stored.counts(KEY, newer, count)
    assert len(count.asked) == 2


def test_it_holds_at_most_size_records_and_lets_the_least_recent_go() -> None:
    count, stored = Counting(), StoredReplacements(size=2)
    first, second, third = ("t", "1"), ("t", "2"), ("t", "3")
    stored.counts(first, SUMMARY, count)
    stored.counts(second, SUMMARY, count)
    stored.counts(first, SUMMARY, count)  # used again: the second is now the least recent
    stored.counts(third, SUMMARY, count)
    assert len(stored) == 2
    asked = len(count.asked)
    stored.counts(first, SUMMARY, count)
    assert len(count.asked) == asked  # kept
    stored.counts(second, SUMMARY, count)
    assert len(count.asked) == asked + 1  # let go, counted again


def test_interleaved_conversations_each_keep_their_own() -> None:
    count, stored = Counting(), StoredReplacements()
    summaries = {("t", str(n)): ({"role": "user", "content": "x" * n},) for n in range(1, 9)}
    for _ in range(3):
        for key, replacement in summaries.items():
            assert stored.counts(key, replacement, count) == (int(key[1]),)
            assert stored.encoded(key, replacement) == orjson.dumps(list(replacement))[1:-1]
    assert len(count.asked) == len(summaries)


def test_threads_asking_at_once_each_get_the_counts_and_the_bound_holds() -> None:
    count, stored = Counting(), StoredReplacements(size=4)
    summaries = [(("t", str(n)), ({"role": "user", "content": "x" * n},)) for n in range(1, 9)]
    wrong: list[str] = []

    def ask() -> None:
        for _ in range(50):
            for key, replacement in summaries:
                if stored.counts(key, replacement, count) != (int(key[1]),):
                    wrong.append(key[1])

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not wrong and len(stored) == 4


@pytest.mark.parametrize("change", ["content", "added key", "role", "none"])
def test_intact_tells_a_held_message_changed_in_place(change: str) -> None:
    count, stored = Counting(), StoredReplacements()
    replacement = ({"role": "user", "content": "the summary"}, {"role": "user", "content": "kept words"})
    stored.counts(KEY, replacement, count)
    stored.encoded(KEY, replacement)
    stored.synthetic(KEY, replacement)
    if change == "content":
        replacement[0]["content"] = "the summary, edited"
    elif change == "added key":
        replacement[0]["name"] = "x"
    elif change == "role":  # what the proxy wrote is found by role: a changed one moves it
        replacement[1]["role"] = "assistant"
    assert stored.intact(count) is (change == "none")


SYSTEM = {"role": "system", "content": "be brief"}
FILLER = {"role": "assistant", "content": "Understood."}
WORDS = {"role": "user", "content": "the user's own words, kept"}


@pytest.mark.parametrize(("replacement", "positions"), [
    ((SYSTEM, *SUMMARY), {1, 2}),  # the summary and its acknowledgement, after the kept instructions
    ((SUMMARY[0],), {0}),
    ((SUMMARY[0], FILLER, WORDS, FILLER), {0, 1, 3}),  # a later user message is the client's, kept verbatim
    ((SYSTEM, FILLER), {1}),  # no user message: the fillers only
    ((), set()),
])
def test_what_the_proxy_wrote_is_the_first_user_message_and_every_assistant_one(
        replacement: tuple[dict[str, Any], ...], positions: set[int]) -> None:
    assert synthetic_positions(replacement) == positions
    assert StoredReplacements().synthetic(KEY, replacement) == positions


def test_what_the_proxy_wrote_is_found_once_per_replacement_object() -> None:
    stored = StoredReplacements()
    first = stored.synthetic(KEY, SUMMARY)
    assert all(stored.synthetic(KEY, SUMMARY) is first for _ in range(3))
    equal = tuple(dict(message) for message in SUMMARY)  # a store that decodes anew: found again, the same answer
    again = stored.synthetic(KEY, equal)
    assert again == first and again is not first


@pytest.mark.parametrize("size", [0, -1])
def test_a_size_below_one_is_refused(size: int) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        StoredReplacements(size=size)
