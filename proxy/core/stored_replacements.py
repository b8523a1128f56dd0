"""What is made of a stored summary's replacement once and kept between the requests that splice the same one in."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import orjson

from proxy.core.messages import Message

CountEach = Callable[[Sequence[Message]], list[int]]
# Conversations whose summaries are remembered at once: one entry each (a newer summary replaces an older one's), so
# what is held past the store's own records (a store that decodes each record anew) is bounded by this many
# replacements, each a summary of a few thousand tokens, and its JSON once a request has asked for it.
DEFAULT_SIZE = 64


@dataclass(slots=True)
class _Held:
    replacement: Sequence[Message]
    counts: tuple[int, ...]
    encoded: bytes | None = None  # b"" once orjson refused it


class StoredReplacements:
    """A record's replacement counted (`count_each`) and encoded, remembered by the record's key while the
    replacement is the same object: every request of an agent loop after a summary splices in the same stored
    replacement. Keying its messages again for the counter's cache cost such a request about 20 µs (a 38-message
    replacement), and encoding the forwarded body whole about 40. A store that decodes each record anew gives a new
    object each time, which is worked out again as before. The messages are read-only, as every message the proxy
    holds is."""

    def __init__(self, count_each: CountEach, size: int = DEFAULT_SIZE) -> None:
        if size < 1:
            raise ValueError("size must be at least 1")
        self._count_each = count_each
        self._size = size
        self._held: OrderedDict[tuple[str, str], _Held] = OrderedDict()

    def counts(self, key: tuple[str, str], replacement: Sequence[Message]) -> tuple[int, ...]:
        """`count_each` of `replacement`, stored under `key` (a namespace and prefix hash)."""
        return self._entry(key, replacement).counts

    def encoded(self, key: tuple[str, str], replacement: Sequence[Message]) -> bytes | None:
        """orjson's encoding of the replacement's messages, comma-separated, without the list's brackets; None when
        orjson refuses one (a lone surrogate: the caller encodes its body the way that spells it)."""
        held = self._entry(key, replacement)
        if held.encoded is None:
            try:
                held.encoded = orjson.dumps(list(replacement))[1:-1]
            except (TypeError, orjson.JSONEncodeError):
                held.encoded = b""
        return held.encoded or None

    def _entry(self, key: tuple[str, str], replacement: Sequence[Message]) -> _Held:
        held = self._held.get(key)
        if held is None or held.replacement is not replacement:
            held = self._held[key] = _Held(replacement, tuple(self._count_each(replacement)))
        self._held.move_to_end(key)
        while len(self._held) > self._size:
            self._held.popitem(last=False)
        return held

    def __len__(self) -> int:
        return len(self._held)
