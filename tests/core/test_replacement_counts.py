"""core.replacement_counts: a stored replacement is counted once while it is the same object, by its record's key."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from proxy.core.messages import Message
from proxy.core.replacement_counts import ReplacementCounts


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
    count = Counting()
    counts = ReplacementCounts(count)
    assert [counts.of(KEY, SUMMARY) for _ in range(5)] == [(11, 2)] * 5
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
    count = Counting()
    counts = ReplacementCounts(count)
    counts.of(KEY, SUMMARY)
    assert counts.of(second_key, second) == tuple(len(str(message["content"])) for message in second)
    assert len(count.asked) == counted


def test_a_key_holds_its_latest_replacement_only() -> None:
    count = Counting()
    counts = ReplacementCounts(count)
    newer = ({"role": "user", "content": "newer"},)
    counts.of(KEY, SUMMARY)
    counts.of(KEY, newer)
    assert len(counts) == 1
    counts.of(KEY, newer)
    assert len(count.asked) == 2


def test_it_holds_at_most_size_records_and_lets_the_least_recent_go() -> None:
    count = Counting()
    counts = ReplacementCounts(count, size=2)
    first, second, third = ("t", "1"), ("t", "2"), ("t", "3")
    counts.of(first, SUMMARY)
    counts.of(second, SUMMARY)
    counts.of(first, SUMMARY)  # used again: the second is now the least recent
    counts.of(third, SUMMARY)
    assert len(counts) == 2
    asked = len(count.asked)
    counts.of(first, SUMMARY)
    assert len(count.asked) == asked  # kept
    counts.of(second, SUMMARY)
    assert len(count.asked) == asked + 1  # let go, counted again


def test_interleaved_conversations_each_keep_their_counts() -> None:
    count = Counting()
    counts = ReplacementCounts(count)
    summaries = {("t", str(n)): ({"role": "user", "content": "x" * n},) for n in range(1, 9)}
    for _ in range(3):
        for key, replacement in summaries.items():
            assert counts.of(key, replacement) == (int(key[1]),)
    assert len(count.asked) == len(summaries)


@pytest.mark.parametrize("size", [0, -1])
def test_a_size_below_one_is_refused(size: int) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        ReplacementCounts(Counting(), size=size)
