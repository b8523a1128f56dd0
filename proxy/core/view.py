"""The neutral view of a conversation: chat-shaped messages, and the client items each one came from.

The journey (token counts, the history index, the plan, the summary, the stores) works on one message shape, the
chat-completions one of `core.messages`: instructions (`system`/`developer`), `user` and `assistant` text with
content parts (`image_url` and `file` parts stand for images and documents), assistant `tool_calls` with ids,
`tool` results naming the call they answer, and reasoning parts (`thinking`, `redacted_thinking`, `reasoning`)
that are counted as nothing and never shown to a summariser. A dialect whose client speaks another shape maps
its items onto such messages in groups (one client item may become several messages, several items one message)
and keeps each group's items, so what compaction leaves untouched goes back to the upstream byte for byte, and
only what compaction made (the summary, its acknowledgement, a placeholder) is rendered in the client's shape.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import operator
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.core.messages import Message

_ITEMS = operator.attrgetter("items")
_MESSAGES = operator.attrgetter("messages")
# Renders a run of messages compaction made (summary, acknowledgement, placeholders) as client items.
Render = Callable[[list[Message]], list[Any]]


@dataclass(frozen=True)
class Group:
    """Client items and the neutral messages made from them: one goes back whole, or not at all."""

    items: tuple[Any, ...]
    messages: tuple[Message, ...]


@dataclass(frozen=True)
class View:
    """A request's conversation as neutral messages; `groups` empty means the messages are the client's own items
    (chat completions), so mapping back is the identity."""

    messages: list[Message]
    groups: tuple[Group, ...] = ()
    # The client's list the groups were read from, every item of it in one group, in order; None when not a list.
    source: list[Any] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def of(cls, groups: Sequence[Group], source: list[Any] | None = None,
           messages: Sequence[Message] | None = None) -> View:
        """The view whose messages are the groups' messages, in order (read from `source`, when it is a list);
        `messages`: those, as a reader that made the groups kept them beside (gathering 400 groups' cost 20 µs)."""
        made = list(messages) if messages is not None else list(itertools.chain.from_iterable(map(_MESSAGES, groups)))
        return cls(made, tuple(groups), source)

    @functools.cached_property
    def _owner(self) -> dict[int, Group]:
        """Each message's group, by the message's id: made when a history goes back (most requests never do)."""
        return {id(message): group for group in self.groups for message in group.messages}

    def message_keys(self, item_keys: Sequence[int], salt: str) -> list[int] | None:
        """Keys for the history index (core.history_index) of this view's messages, made from the keys of the
        source's items (one per item, as dialects.body_memo gives them: equal keys, equal items): a message is
        keyed by its group's items and its place among the group's messages, which are made from those items alone.
        `salt` (the dialect) keeps two dialects' readings of equal items apart. None when the groups are not the
        source's items, in order."""
        keyed = self.keyed(item_keys, salt)
        return keyed.keys if keyed is not None else None

    def keyed(self, item_keys: Sequence[int], salt: str, earlier: ViewKeys | None = None) -> ViewKeys | None:
        """message_keys, kept with what they were made from: given an `earlier` view's (the conversation's last
        request), the groups this view shares with it, the same objects from its first on, keep their keys, and
        only the groups after them are keyed (an agent's turn adds a few to hundreds: keying them all cost a
        Messages request 0.15 ms)."""
        source = self.source
        if source is None or len(item_keys) != len(source):
            return None
        shared = _shared_groups(self.groups, earlier.groups) if earlier is not None and earlier.salt == salt else 0
        start = earlier.items[shared] if earlier is not None and shared else 0
        if shared and (start > len(source) or source[start - 1] is not self.groups[shared - 1].items[-1]):
            shared, start = 0, 0
        rest = self.groups[shared:]
        items_of = list(map(_ITEMS, rest))
        sizes = list(map(len, items_of))
        if not _read_from(itertools.chain.from_iterable(items_of), sum(sizes), source, start):
            return None
        counts = list(map(len, map(_MESSAGES, rest)))
        made = _keys(item_keys[start:], sizes, counts, salt)
        empty = list(itertools.compress(range(shared, len(self.groups)), map(operator.not_, counts)))
        if earlier is None or not shared:
            return ViewKeys(salt, self.groups, list(itertools.accumulate(sizes, initial=0)),
                            list(itertools.accumulate(counts, initial=0)), made, 0, empty)
        kept = earlier.messages[shared]
        return ViewKeys(salt, self.groups, earlier.items[:shared] + list(itertools.accumulate(sizes, initial=start)),
                        earlier.messages[:shared] + list(itertools.accumulate(counts, initial=kept)),
                        earlier.keys[:kept] + made, shared,
                        earlier.empty[:bisect.bisect_left(earlier.empty, shared)] + empty)

    def kept_after(self, count: int, keyed: ViewKeys | None = None) -> tuple[int, int] | None:
        """What goes back as it came when the view's first `count` messages are replaced (a stored summary's
        cut): the groups from the first that starts at or after it, as that group's first message and first source
        item (a group the cut splits is rendered, with what replaced the messages before it). None when nothing
        is kept, a group after the cut makes no message (it would not go back), or the groups from there on are
        not the source's items, in order. `keyed`: this view's keys (View.keyed), whose counts save a pass."""
        source = self.source
        if source is None or count <= 0:
            return None
        keyed = keyed if keyed is not None and keyed.groups is self.groups else None
        starts = keyed.messages if keyed is not None else \
            list(itertools.accumulate(map(len, map(_MESSAGES, self.groups)), initial=0))
        first = bisect.bisect_left(starts, count)
        if first >= len(self.groups):
            return None
        if keyed is not None:  # keyed: the groups are the source's items, in order, and those making none are known
            return None if keyed.empty and keyed.empty[-1] >= first else (starts[first], keyed.items[first])
        if 0 in map(len, map(_MESSAGES, self.groups[first:])):
            return None
        start = sum(map(len, map(_ITEMS, self.groups[:first])))
        kept = list(itertools.chain.from_iterable(map(_ITEMS, self.groups[first:])))
        return (starts[first], start) if _read_from(kept, len(kept), source, start) else None

    def back(self, history: Sequence[Message], render: Render) -> list[Any]:
        """`history` (this view's messages, some replaced by what compaction made) as client items.

        A group goes back as its own items when all its messages stand together in `history`, in order; any other
        message (one compaction made, or a group that was split or changed) is rendered, runs of them at once so the
        dialect can merge them (roles that must alternate, results that share one message).
        """
        if not self.groups:
            return list(history)
        items: list[Any] = []
        made: list[Message] = []
        index = 0
        while index < len(history):
            group = self._owner.get(id(history[index]))
            if group is not None and _stands_whole(group, history, index):
                if made:
                    items.extend(render(made))
                    made = []
                items.extend(group.items)
                index += len(group.messages)
                continue
            made.append(history[index])
            index += 1
        if made:
            items.extend(render(made))
        return items


def _stands_whole(group: Group, history: Sequence[Message], start: int) -> bool:
    """Whether the group's messages, the same objects, stand in `history` from `start` on, in order."""
    end = start + len(group.messages)
    return end <= len(history) and all(a is b for a, b in zip(history[start:end], group.messages, strict=True))


@dataclass(frozen=True, eq=False)
class ViewKeys:
    """A view's message keys (View.keyed) and what they were made from, kept for the conversation's next view."""

    salt: str
    groups: tuple[Group, ...]
    items: list[int]  # the source's items before each group, and after the last (one more than the groups)
    messages: list[int]  # the view's messages before each group, and after the last
    keys: list[int]  # one per message
    shared: int  # the first groups, whose keys were the earlier view's
    # The groups that make no message, in order (looking at every group after a summary's cut for one cost a
    # Messages reuse hit some 60,000 instructions).
    empty: list[int] = field(default_factory=list)


def _read_from(items: Iterable[Any], count: int, source: list[Any], start: int) -> bool:
    """Whether `items` (`count` of them) are the source's from `start` to its end, the same objects in order."""
    return count == len(source) - start and all(map(operator.is_, items, itertools.islice(source, start, None)))


def _shared_groups(groups: Sequence[Group], earlier: Sequence[Group]) -> int:
    """How many groups, from the first, are the same objects in both. A reader only ever appends groups, so they
    part once: found by halving, then the shared run checked whole at C speed (0 when it is not one run)."""
    shared = bisect.bisect_left(range(min(len(groups), len(earlier))), True,
                                key=lambda index: groups[index] is not earlier[index])
    return shared if all(map(operator.is_, groups[:shared], earlier[:shared])) else 0


def _keys(item_keys: Sequence[int], sizes: list[int], counts: list[int], salt: str) -> list[int]:
    """Keys of the messages of groups holding `sizes` items and `counts` messages each, from their items' keys:
    each group's own key (its items' keys: one, or a tuple of several) with the message's place among its
    messages, hashed with the salt; mapped at C speed (a Python step per group cost 0.1 ms)."""
    if sizes.count(1) == len(sizes):
        owns: list[Any] = list(item_keys)
    else:
        bounds = list(itertools.accumulate(sizes, initial=0))
        owns = [item_keys[start] if end - start == 1 else tuple(item_keys[start:end])
                for start, end in itertools.pairwise(bounds)]
    firsts = list(map(hash, zip(itertools.repeat(salt), owns, itertools.repeat(0))))
    if counts.count(1) == len(counts):
        return firsts
    # Groups of one message are most: only the others are keyed one by one.
    keys: list[int] = []
    done = 0
    for index in itertools.compress(range(len(counts)), map(operator.ne, counts, itertools.repeat(1))):
        keys.extend(firsts[done:index])
        keys.extend(hash((salt, owns[index], place)) for place in range(counts[index]))
        done = index + 1
    keys.extend(firsts[done:])
    return keys
