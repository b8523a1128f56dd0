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

import itertools
import operator
from collections.abc import Callable, Sequence
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
    _owner: dict[int, Group] = field(default_factory=dict, repr=False, compare=False)
    # The client's list the groups were read from, every item of it in one group, in order; None when not a list.
    source: list[Any] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def of(cls, groups: Sequence[Group], source: list[Any] | None = None) -> View:
        """The view whose messages are the groups' messages, in order (read from `source`, when it is a list)."""
        owner = {id(message): group for group in groups for message in group.messages}
        return cls([message for group in groups for message in group.messages], tuple(groups), owner, source)

    def message_keys(self, item_keys: Sequence[int], salt: str) -> list[int] | None:
        """Keys for the history index (core.history_index) of this view's messages, made from the keys of the
        source's items (one per item, as dialects.body_memo gives them: equal keys, equal items): a message is
        keyed by its group's items and its place among the group's messages, which are made from those items alone.
        `salt` (the dialect) keeps two dialects' readings of equal items apart. None when the groups are not the
        source's items, in order."""
        source = self.source
        items_of = list(map(_ITEMS, self.groups))
        sizes = list(map(len, items_of))
        if source is None or len(item_keys) != len(source) or sum(sizes) != len(source) or \
                not all(map(operator.is_, itertools.chain.from_iterable(items_of), source)):
            return None
        # Each group's own key (its items' keys: one, or a tuple of several), repeated for each of its messages and
        # paired with the message's place in it; mapped at C speed (a Python step per group cost 0.1 ms).
        if sizes.count(1) == len(sizes):
            owns: list[Any] = list(item_keys)
        else:
            bounds = list(itertools.accumulate(sizes, initial=0))
            owns = [item_keys[start] if end - start == 1 else tuple(item_keys[start:end])
                    for start, end in itertools.pairwise(bounds)]
        counts = list(map(len, map(_MESSAGES, self.groups)))
        if counts.count(1) == len(counts):
            return list(map(hash, zip(itertools.repeat(salt), owns, itertools.repeat(0))))
        repeated = itertools.chain.from_iterable(map(itertools.repeat, owns, counts))
        places = itertools.chain.from_iterable(map(range, counts))
        return list(map(hash, zip(itertools.repeat(salt), repeated, places)))

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
