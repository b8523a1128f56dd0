"""Back-off after failed summaries: a conversation whose summary failed is not retried on every turn."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

# After the n-th failure in a row, the next 2**n - 1 attempts are skipped (1, 3, 7, ... then capped).
MAX_SKIPPED = 15
# Each failure halves what the summariser is asked for, down to this share of the first ask.
MAX_LEVEL = 3


@dataclass
class _Entry:
    failures: int = 0
    skip: int = 0
    cause: str | None = None  # what names the last failure (a journal event's id), if anything does


@dataclass(frozen=True)
class Decision:
    """Whether to try now, and how many failures came before (the ask shrinks with each)."""

    allowed: bool
    level: int
    skipped_left: int


class Backoff:
    """Failures per conversation key, bounded in size; counts attempts, not time, so it needs no clock."""

    def __init__(self, max_keys: int = 10_000) -> None:
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._max_keys = max_keys

    def decide(self, key: str) -> Decision:
        """Called once per compaction attempt: a skipped attempt uses up one of the skips."""
        entry = self._entries.get(key)
        if entry is None:
            return Decision(True, 0, 0)
        if entry.skip > 0:
            entry.skip -= 1
            return Decision(False, min(entry.failures, MAX_LEVEL), entry.skip)
        return Decision(True, min(entry.failures, MAX_LEVEL), 0)

    def failed(self, key: str, cause: str | None = None) -> None:
        """A failure for `key`; `cause` names it for the attempts it makes skip (see cause())."""
        entry = self._entries.pop(key, None) or _Entry()
        entry.failures += 1
        entry.skip = min(2 ** entry.failures - 1, MAX_SKIPPED)
        entry.cause = cause
        self._entries[key] = entry
        while len(self._entries) > self._max_keys:
            self._entries.popitem(last=False)

    def succeeded(self, key: str) -> None:
        self._entries.pop(key, None)

    def cause(self, key: str) -> str | None:
        """What named the last failure of `key`, while it is remembered: a skipped attempt names it."""
        entry = self._entries.get(key)
        return entry.cause if entry is not None else None


def shrink(ask_tokens: int, level: int, floor: int) -> int:
    """The summary ask after `level` failures: halved each time, never below `floor`."""
    return max(floor, ask_tokens >> min(level, MAX_LEVEL))
