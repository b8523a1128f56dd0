"""What is made of a stored summary's replacement once and kept between the requests that splice the same one in."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.core.messages import Message, is_user, role

CountEach = Callable[[Sequence[Message]], list[int]]
# Conversations whose summaries are remembered at once: one entry each (a newer summary replaces an older one's), so
# what is held past the store's own records (a store that decodes each record anew) is bounded by this many
# replacements, each a summary of a few thousand tokens, and its JSON once a request has asked for it.
DEFAULT_SIZE = 64


# A replacement rendered as a dialect's items and their encoding (comma-separated, no brackets); None: not spliced.
Front = tuple[list[Any], bytes] | None


@dataclass(slots=True)
class _Held:
    replacement: Sequence[Message]
    counts: tuple[int, ...] | None = None
    encoded: bytes | None = None  # b"" once orjson refused it
    synthetic: frozenset[int] | None = None
    rendered: dict[str, Front] = field(default_factory=dict)  # by dialect


class StoredReplacements:
    """A record's replacement counted and encoded, remembered by the record's key while the replacement is the same
    object: every request of an agent loop after a summary splices in the same stored replacement. Keying its
    messages again for the counter's cache cost such a request about 20 µs (a 38-message replacement), and encoding
    the forwarded body whole about 40. A store that decodes each record anew gives a new object each time, which is
    worked out again as before.

    One per process, beside the token counter every caller counts with, so what it holds outlives a reload. The
    messages are shared, so nothing may change them in place (the proxy builds every edit anew); the test suite asks
    `intact()` of every proxy it ran, as it asks the body memo."""

    def __init__(self, size: int = DEFAULT_SIZE) -> None:
        if size < 1:
            raise ValueError("size must be at least 1")
        self._size = size
        self._held: OrderedDict[tuple[str, str], _Held] = OrderedDict()
        self._lock = threading.Lock()

    def counts(self, key: tuple[str, str], replacement: Sequence[Message], count_each: CountEach) -> tuple[int, ...]:
        """`count_each` of `replacement` (the process's one counter's), stored under `key` (a namespace and prefix
        hash)."""
        held = self._entry(key, replacement)
        if held.counts is None:
            held.counts = tuple(count_each(replacement))
        return held.counts

    def synthetic(self, key: tuple[str, str], replacement: Sequence[Message]) -> frozenset[int]:
        """synthetic_positions of `replacement`, stored under `key`: every request that splices it in asks (the
        tool-result stages keep their hands off those messages), and finding them again cost a reuse hit some
        55,000 instructions."""
        held = self._entry(key, replacement)
        if held.synthetic is None:
            held.synthetic = synthetic_positions(replacement)
        return held.synthetic

    def encoded(self, key: tuple[str, str], replacement: Sequence[Message]) -> bytes | None:
        """orjson's encoding of the replacement's messages, comma-separated, without the list's brackets; None when
        orjson refuses one (a lone surrogate: the caller encodes its body the way that spells it)."""
        held = self._entry(key, replacement)
        if held.encoded is None:
            held.encoded = _encoding(replacement)
        return held.encoded or None

    def rendered(self, key: tuple[str, str], replacement: Sequence[Message], dialect: str,
                 render: Callable[[Sequence[Message]], Front]) -> Front:
        """`render` of `replacement` for `dialect` (its items and their JSON, spliced into a Responses or Messages
        body), stored under `key` with it: rendering and encoding a summary with the user's kept messages cost a
        reuse hit 60 µs. The items are shared, so nothing may change them in place."""
        held = self._entry(key, replacement)
        if dialect not in held.rendered:
            held.rendered[dialect] = render(replacement)
        return held.rendered[dialect]

    def intact(self, count_each: CountEach) -> bool:
        """Whether every held replacement still counts and encodes as it did when it was held: False when something
        changed a stored message in place."""
        with self._lock:
            held = list(self._held.values())
        return all((entry.counts is None or entry.counts == tuple(count_each(entry.replacement))) and
                   (entry.encoded is None or entry.encoded == _encoding(entry.replacement)) and
                   (entry.synthetic is None or entry.synthetic == synthetic_positions(entry.replacement))
                   for entry in held)

    def _entry(self, key: tuple[str, str], replacement: Sequence[Message]) -> _Held:
        with self._lock:
            held = self._held.get(key)
            if held is None or held.replacement is not replacement:
                held = self._held[key] = _Held(replacement)
            self._held.move_to_end(key)
            while len(self._held) > self._size:
                self._held.popitem(last=False)
            return held

    def __len__(self) -> int:
        return len(self._held)


def synthetic_positions(replacement: Sequence[Message]) -> frozenset[int]:
    """Positions in a stored replacement of what the proxy wrote: the summary (its first user message) and the
    assistant fillers. They are summarised again later, never kept as the user's words."""
    summary_at = next((i for i, message in enumerate(replacement) if is_user(message)), None)
    return frozenset(i for i, message in enumerate(replacement) if i == summary_at or role(message) == "assistant")


def _encoding(replacement: Sequence[Message]) -> bytes:
    try:
        return orjson.dumps(list(replacement))[1:-1]
    except (TypeError, orjson.JSONEncodeError):
        return b""
