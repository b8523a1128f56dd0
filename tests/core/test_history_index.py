"""The history index: the chain and token counts it gives are the reference ones, however much it remembers."""

from __future__ import annotations

import asyncio
import gc
import json
import threading
from collections import OrderedDict
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.encodings import SLICE_CHARS
from proxy.core.fingerprint import hash_chain
from proxy.core.history_index import HistoryIndex, _common_prefix
from proxy.core.tokens import TokenCounter
from proxy.offload import LARGE, LARGE_COUNT

COUNTER = TokenCounter()

TEXT = st.text(max_size=40)
CALL = st.fixed_dictionaries({"id": TEXT, "type": st.just("function"),
                              "function": st.fixed_dictionaries({"name": TEXT, "arguments": TEXT})})
MESSAGE = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]), "content": TEXT}),
    st.fixed_dictionaries({"role": st.just("assistant"), "content": st.none(),
                           "tool_calls": st.lists(CALL, max_size=2)}),
    st.fixed_dictionaries({"role": st.just("tool"), "tool_call_id": TEXT, "content": TEXT}),
    st.fixed_dictionaries({"role": st.just("user"),
                           "content": st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}),
                                               max_size=3)}),
    st.fixed_dictionaries({"role": st.just("user"), "content": st.integers(min_value=2 ** 70)}),  # not orjson's
)


def reference(messages: list[Any], namespace: str) -> tuple[list[str], list[int]]:
    return hash_chain(messages, namespace), [COUNTER.count_message(message) for message in messages]


def turn(index: int, size: int = 20) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"question {index} " + "word " * size},
            {"role": "assistant", "content": f"answer {index}"}]


@given(st.lists(st.lists(MESSAGE, max_size=6), min_size=1, max_size=4), st.sampled_from(["", "tenant-a"]),
       st.integers(min_value=0, max_value=5))
@settings(max_examples=200, deadline=None)
def test_every_read_gives_the_reference_chain_and_counts(histories: list[list[Any]], namespace: str,
                                                         max_entries: int) -> None:
    index = HistoryIndex(COUNTER, max_entries=max_entries)
    grown: list[Any] = []
    for more in histories:  # a conversation growing turn by turn, as a stateless client resends it
        grown = [*grown, *more]
        for keys in (None, None, spelled_keys(grown), spelled_keys(grown, spaced=True)):
            read = index.read(grown, namespace, keys)
            assert (read.chain, read.tokens) == reference(grown, namespace)
        assert len(index) <= max_entries


def spelled_keys(messages: list[Any], *, spaced: bool = False) -> list[int]:
    """Keys a reader holding each message's own bytes passes (dialects.body_memo): the hash of a spelling of it."""
    return [hash(json.dumps(message, separators=(", ", ": ") if spaced else (",", ":"), ensure_ascii=False).encode())
            for message in messages]


def test_given_keys_skip_the_serialising_and_find_what_computed_keys_find() -> None:
    index = HistoryIndex(COUNTER)
    history = [{"role": "system", "content": "be brief"}, *turn(0), *turn(1)]
    assert index.read(history, "ns", spelled_keys(history)).new == 5
    assert index.read(history, "ns", spelled_keys(history)).new == 0
    read = index.read(history, "ns", spelled_keys(history)[:-1])  # not one per message: computed instead
    assert (read.chain, read.tokens) == reference(history, "ns")


def test_a_resent_history_is_new_only_in_its_last_messages() -> None:
    index = HistoryIndex(COUNTER)
    history = [{"role": "system", "content": "be brief"}, *turn(0)]
    assert index.read(history, "ns").new == 3
    history += turn(1)
    assert index.read(history, "ns").new == 2
    assert index.read(history, "ns").new == 0


@pytest.mark.parametrize(("first", "second", "equal"), [
    ("tenant-a", "tenant-a", True),
    ("tenant-a", "tenant-b", False),
    ("", "tenant-a", False),
])
def test_namespaces_keep_chains_apart_but_share_counts(first: str, second: str, equal: bool) -> None:
    index = HistoryIndex(COUNTER)
    history = [*turn(0), *turn(1)]
    one, two = index.read(history, first), index.read(history, second)
    assert (one.chain == two.chain) is equal
    assert one.tokens == two.tokens and two.new == 0
    assert two.chain == hash_chain(history, second)


def test_a_message_repeated_in_one_history_is_one_entry() -> None:
    index = HistoryIndex(COUNTER)
    same = {"role": "user", "content": "again"}
    history = [same, {"role": "assistant", "content": "ok"}, same, {"role": "assistant", "content": "ok"}, same]
    read = index.read(history, "ns")
    assert len(index) == 2 and read.new == 2  # five positions, two distinct messages
    assert (read.chain, read.tokens) == reference(history, "ns")


def test_a_shared_system_prompt_is_remembered_after_many_prefixes() -> None:
    index = HistoryIndex(COUNTER)
    system = {"role": "system", "content": "shared"}
    for tenant in range(12):  # a message keeps one link: the others are computed again
        history = [system, *turn(tenant)]
        assert index.read(history, f"tenant-{tenant}").chain == hash_chain(history, f"tenant-{tenant}")
    assert index.read([system], "tenant-0").chain == hash_chain([system], "tenant-0")


def test_the_least_recently_used_messages_are_dropped_first() -> None:
    index = HistoryIndex(COUNTER, max_entries=4)
    kept = turn(0)
    index.read(kept, "ns")
    for number in range(1, 4):
        index.read(turn(number), "ns")
        assert index.read(kept, "ns").new == 0  # used again each time: never the oldest
    assert index.read(turn(1), "ns").new == 2  # dropped to make room


def test_a_negative_size_is_refused() -> None:
    with pytest.raises(ValueError, match="max_entries"):
        HistoryIndex(COUNTER, max_entries=-1)


async def test_large_new_histories_read_concurrently_in_threads_match_the_reference() -> None:
    index = HistoryIndex(COUNTER)
    histories = [[message for number in range(40) for message in turn(1000 * tag + number, size=2000)]
                 for tag in range(3)]
    assert all(sum(len(str(m["content"])) for m in history) > LARGE for history in histories)
    reads = await asyncio.gather(*(index.read_off_loop(history, "ns") for history in histories),
                                 index.read_off_loop(histories[0], "ns"))
    for history, read in zip([*histories, histories[0]], reads, strict=True):
        assert (read.chain, read.tokens) == reference(history, "ns")
    assert len(index) == 3 * 80


class ThreadNoting(TokenCounter):
    """Notes the thread each message is counted on."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[int] = []

    def count_message(self, message: Any) -> int:
        self.threads.append(threading.get_ident())
        return super().count_message(message)


async def ticks_during(read: Any) -> tuple[Any, int]:
    """`read` awaited beside a task that counts how often the loop lets it run: how often the read let go."""
    ticks, done = 0, False

    async def tick() -> None:
        nonlocal ticks
        await asyncio.sleep(0)  # started: from here on each turn of the loop is one the read gave up
        while not done:
            ticks += 1
            await asyncio.sleep(0)

    ticker = asyncio.ensure_future(tick())
    await asyncio.sleep(0)
    try:
        return await read, ticks
    finally:
        done = True
        await ticker


@pytest.mark.parametrize(("text", "slices"), [
    (16, 0),
    (SLICE_CHARS, 0),  # past LARGE_COUNT with its JSON, but one slice: counted whole, under a millisecond
    (SLICE_CHARS + 1, 2),
    (3 * SLICE_CHARS + 5, 4),
])
async def test_a_turns_long_text_is_counted_a_slice_at_a_time_on_the_loop(text: int, slices: int) -> None:
    counter = ThreadNoting()
    index = HistoryIndex(counter)
    message = {"role": "tool", "tool_call_id": "c1", "content": "word " * (text // 5) + "x" * (text % 5)}
    read, ticks = await ticks_during(index.read_off_loop([message], "ns"))
    assert read.tokens == [COUNTER.count_message(message)]
    assert counter.threads == [threading.get_ident()]  # on the loop's own thread: no hand-off
    assert ticks >= slices and (ticks == 0) is (slices == 0)


async def test_more_than_large_is_counted_in_a_thread() -> None:
    counter = ThreadNoting()
    index = HistoryIndex(counter)
    history = [{"role": "user", "content": "word " * (LARGE // 4)}]
    read = await index.read_off_loop(history, "ns")
    assert (read.chain, read.tokens) == reference(history, "ns")
    assert counter.threads and threading.get_ident() not in counter.threads


async def test_only_what_a_turn_adds_weighs() -> None:
    """A history far past every limit, grown by a small turn: counted on the loop at once; grown by a long tool
    result: counted a slice at a time."""
    counter = ThreadNoting()
    index = HistoryIndex(counter)
    history = [{"role": "system", "content": "be brief"},
               *(message for number in range(8) for message in turn(number, size=LARGE_COUNT // 4))]
    await index.read_off_loop(history, "ns", spelled_keys(history))
    counter.threads.clear()
    grown = [*history, *turn(99)]
    read, ticks = await ticks_during(index.read_off_loop(grown, "ns", spelled_keys(grown)))
    assert (read.chain, read.tokens) == reference(grown, "ns")
    assert counter.threads == [threading.get_ident()] * 2 and ticks == 0
    longer = [*grown, {"role": "tool", "tool_call_id": "c9", "content": "line of output\n" * 4000}]
    read, ticks = await ticks_during(index.read_off_loop(longer, "ns", spelled_keys(longer)))
    assert (read.chain, read.tokens) == reference(longer, "ns")
    assert ticks >= 3  # 60,000 characters: four slices, the loop let go after each


async def test_a_message_dropped_while_a_read_waits_for_its_thread_is_put_back() -> None:
    index = HistoryIndex(COUNTER, max_entries=2)
    known = {"role": "system", "content": "seen before"}
    index.read([known], "ns")
    large = [known, *(message for number in range(20) for message in turn(number, size=3000))]
    small = turn(99)

    async def evict() -> None:  # runs while the large read's new messages are in a thread
        await asyncio.sleep(0)
        index.read(small, "ns")

    read, _ = await asyncio.gather(index.read_off_loop(large, "ns"), evict())
    assert (read.chain, read.tokens) == reference(large, "ns")
    assert len(index) == 2


def test_a_full_index_is_nothing_the_garbage_collector_tracks() -> None:
    index = HistoryIndex(COUNTER)
    for number in range(50):
        index.read([{"role": "system", "content": "shared"}, *turn(number)], f"tenant-{number % 3}")
    gc.collect()  # tuples of atomic values are untracked by a collection
    assert len(index) == 101
    assert not any(gc.is_tracked(entry) for entry in index._entries.values())


def test_a_history_resent_after_another_linked_its_messages_otherwise_is_linked_again() -> None:
    """The stored links are read as far as they run unbroken; where another history relinked a message they share,
    the chain is computed on from there, and the least recently used order follows every message read."""
    index = HistoryIndex(COUNTER, max_entries=6)  # the six messages of the two histories
    first = [{"role": "system", "content": "one"}, *turn(0), *turn(1)]
    other = [{"role": "system", "content": "two"}, *turn(1)]  # links turn 1's messages after another prefix
    for history in (first, first, other, first, other, first):
        read = index.read(history, "ns")
        assert (read.chain, read.tokens) == reference(history, "ns")
    index.read([{"role": "user", "content": "newest"}], "ns")  # one more than room: the oldest used goes
    assert index.read(first, "ns").new == 0 and index.read(other, "ns").new == 1


class CountingCounter(TokenCounter):
    """Counts how many messages were counted: a read from where a history grew counts only its new ones."""

    def __init__(self) -> None:
        super().__init__()
        self.counted = 0

    def count_message(self, message: Any) -> int:
        self.counted += 1
        return super().count_message(message)


@pytest.mark.parametrize(("grown_by", "replaced", "looked_up"), [(0, 0, 0), (1, 0, 1), (4, 0, 4), (0, 1, 1), (1, 2, 3)])
def test_a_history_resent_with_more_is_read_from_where_it_grew(grown_by: int, replaced: int, looked_up: int) -> None:
    """Grown by some messages, or with its last ones replaced (a new question each time, the history kept): only
    the messages after the part it shares with the last read are looked up and counted."""
    counter = CountingCounter()
    index = HistoryIndex(counter)
    history = [{"role": "system", "content": "be brief"}, *[message for n in range(20) for message in turn(n)]]
    index.read(history, "ns", spelled_keys(history))
    counter.counted = 0
    seen: list[int] = []
    look_up = index._look_up
    index._look_up = lambda messages, keys: (seen.append(len(messages)), look_up(messages, keys))[1]  # type: ignore[method-assign]
    kept = history[:len(history) - replaced]
    grown = [*kept, *[{"role": "user", "content": f"new {n}"} for n in range(grown_by + replaced)]]
    read = index.read(grown, "ns", spelled_keys(grown))
    assert (read.chain, read.tokens) == reference(grown, "ns")
    assert read.new == counter.counted == looked_up
    assert seen == [looked_up]
    assert index._lineages[("ns", *spelled_keys(grown)[:2])].keys == spelled_keys(grown)


@pytest.mark.parametrize("change", ["last message edited", "a message dropped", "another namespace",
                                    "an entry dropped", "opening alike"])
def test_what_did_not_simply_grow_from_the_last_read_reads_right(change: str) -> None:
    index = HistoryIndex(COUNTER, max_entries=100_000)
    history = [{"role": "system", "content": "be brief"}, *[message for n in range(10) for message in turn(n)]]
    index.read(history, "ns", spelled_keys(history))
    namespace, other = "ns", list(history)
    if change == "last message edited":
        other[-1] = {"role": "assistant", "content": "a different answer"}
    elif change == "a message dropped":
        del other[3]
    elif change == "another namespace":
        namespace = "ns-2"
    elif change == "an entry dropped":
        index._entries.pop(spelled_keys(history)[5])  # as the least recently used would be
        other += turn(50)
    else:  # another conversation with the same first two messages takes the slot, then the first comes back
        index.read([*history[:2], *turn(70)], "ns", spelled_keys([*history[:2], *turn(70)]))
        other += turn(51)
    read = index.read(other, namespace, spelled_keys(other))
    assert (read.chain, read.tokens) == reference(other, namespace)


def test_reads_from_where_they_grew_keep_their_messages_in_use() -> None:
    """The shared messages are marked used on each such read: another conversation's messages go first."""
    index = HistoryIndex(COUNTER, max_entries=40)
    kept = [{"role": "system", "content": "be brief"}, *turn(0)]
    index.read(kept, "ns", spelled_keys(kept))
    for number in range(1, 12):
        other = [{"role": "system", "content": f"other {number}"}, *turn(1000 + number)]
        index.read(other, "ns", spelled_keys(other))  # fills the index
        kept = [*kept, *turn(number)]
        index.read(kept, "ns", spelled_keys(kept))
    assert all(key in index._entries for key in spelled_keys(kept))


async def test_concurrent_reads_of_one_growing_conversation_each_get_their_own_chain() -> None:
    index = HistoryIndex(COUNTER)
    base = [{"role": "system", "content": "be brief"}, *turn(0, size=LARGE // 20)]  # large: read in a thread
    await index.read_off_loop(base, "ns", spelled_keys(base))
    growths = [[*base, *turn(n, size=LARGE // 20)] for n in range(1, 6)]
    reads = await asyncio.gather(*(index.read_off_loop(grown, "ns", spelled_keys(grown)) for grown in growths))
    for grown, read in zip(growths, reads, strict=True):
        assert (read.chain, read.tokens) == reference(grown, "ns")


class MarkingEntries(OrderedDict[int, Any]):
    """The index's entries, counting how often one is marked used."""

    marked = 0

    def move_to_end(self, key: int, last: bool = True) -> None:
        self.marked += 1
        super().move_to_end(key, last)


def test_shared_entries_are_marked_used_again_only_once_half_the_index_has_turned_over() -> None:
    index = HistoryIndex(COUNTER, max_entries=1_000)
    entries = index._entries = MarkingEntries()
    kept = [{"role": "system", "content": "be brief"}, *[message for n in range(50) for message in turn(n)]]
    index.read(kept, "ns", spelled_keys(kept))
    for number in range(50, 60):  # grown by a turn each time: only the new turn is marked, not the 101 before it
        kept = [*kept, *turn(number)]
        entries.marked = 0
        read = index.read(kept, "ns", spelled_keys(kept))
        assert (read.chain, read.tokens) == reference(kept, "ns")
        assert entries.marked == 2
    for number in range(200):  # another conversation adds 400 entries, and marks them: past half the index
        index.read(turn(10_000 + number), "other")
    kept = [*kept, *turn(60)]
    entries.marked = 0
    read = index.read(kept, "ns", spelled_keys(kept))
    assert (read.chain, read.tokens) == reference(kept, "ns")
    assert entries.marked == len(kept)  # every shared entry marked again, then the new turn
    assert all(key in entries for key in spelled_keys(kept))


def test_a_busy_conversation_keeps_its_entries_while_others_fill_the_index() -> None:
    index = HistoryIndex(COUNTER, max_entries=100)
    entries = index._entries = MarkingEntries()
    kept = [{"role": "system", "content": "be brief"}, *turn(0)]
    index.read(kept, "ns", spelled_keys(kept))
    passes = set()
    for number in range(1, 25):  # 216 entries of others through an index of 100, the conversation (at most 51)
        # resent between
        other = [{"role": "system", "content": f"other {number}"},
                 *[message for n in range(4) for message in turn(1000 * number + n)]]
        index.read(other, "ns", spelled_keys(other))
        kept = [*kept, *turn(number)]
        entries.marked = 0
        read = index.read(kept, "ns", spelled_keys(kept))
        assert (read.chain, read.tokens) == reference(kept, "ns")
        assert all(key in entries for key in spelled_keys(kept))
        passes.add(entries.marked > 2)
    assert passes == {False, True}  # reads that marked only the new turn, and reads that marked every entry


def naive_common_prefix(first: list[Any], second: list[Any]) -> int:
    count = 0
    for left, right in zip(first, second, strict=False):
        if left != right:
            break
        count += 1
    return count


def copied(items: list[int]) -> list[int]:
    """Equal items that are not the same objects (a key computed again rather than carried)."""
    return [int(str(item)) for item in items]


@given(st.lists(st.integers(-2**70, 2**70), max_size=60), st.lists(st.integers(0, 3), max_size=8),
       st.lists(st.integers(0, 3), max_size=8), st.booleans(), st.booleans())
def test_common_prefix_is_where_two_lists_part(shared: list[int], left: list[int], right: list[int],
                                               same_objects: bool, swap: bool) -> None:
    first = shared + left
    second = (shared if same_objects else copied(shared)) + right
    if swap:
        first, second = second, first
    assert _common_prefix(first, second) == naive_common_prefix(first, second)


@pytest.mark.parametrize(("first", "second", "shared"), [
    ([], [], 0), ([1], [], 0), ([1, 2, 3], [1, 2, 3], 3), ([1, 2, 3], [1, 2, 3, 4], 3),
    ([1, 2, 3], [1, 2, 4], 2), ([1, 2, 3], [9, 2, 3], 0), ([5] * 400 + [1], [5] * 400 + [2], 400),
    ([5] * 400, [5] * 200 + [6] * 200, 200), (list(range(401)), [*range(400), -1], 400),
])
def test_common_prefix_table(first: list[int], second: list[int], shared: int) -> None:
    assert _common_prefix(first, second) == shared == _common_prefix(second, first)
