"""Token counts of stored summaries' replacements, kept between the requests that splice the same one in."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from proxy.core.messages import Message

CountEach = Callable[[Sequence[Message]], list[int]]
# Conversations whose summaries are remembered at once: one entry each (a newer summary replaces an older one's), so
# what is held past the store's own records (a store that decodes each record anew) is bounded by this many
# replacements, each a summary of a few thousand tokens.
DEFAULT_SIZE = 64


class ReplacementCounts:
    """`count_each` of a record's replacement, remembered by the record's key while the replacement is the same
    object: every request of an agent loop after a summary splices in the same stored replacement, and keying its
    messages again for the counter's cache cost each such request about 20 µs (a 38-message replacement). A store
    that decodes each record anew gives a new object each time, which is counted as before."""

    def __init__(self, count_each: CountEach, size: int = DEFAULT_SIZE) -> None:
        if size < 1:
            raise ValueError("size must be at least 1")
        self._count_each = count_each
        self._size = size
        self._held: OrderedDict[tuple[str, str], tuple[Sequence[Any], tuple[int, ...]]] = OrderedDict()

    def of(self, key: tuple[str, str], replacement: Sequence[Message]) -> tuple[int, ...]:
        """The counts of `replacement`, stored under `key` (a namespace and prefix hash)."""
        held = self._held.get(key)
        if held is not None and held[0] is replacement:
            self._held.move_to_end(key)
            return held[1]
        counts = tuple(self._count_each(replacement))
        self._held[key] = (replacement, counts)
        self._held.move_to_end(key)
        while len(self._held) > self._size:
            self._held.popitem(last=False)
        return counts

    def __len__(self) -> int:
        return len(self._held)
