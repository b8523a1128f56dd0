"""A conversation as compaction sees it: the client's history, and the stored summary standing in for its start."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

from proxy.core.messages import Message, is_instruction
from proxy.core.stored_replacements import synthetic_positions
from proxy.store.store import CompactedPrefix


@dataclass(frozen=True)
class Conversation:
    """A client's history as sent, and the stored summary (if any) that stands in for its first messages."""

    original: Sequence[Message]
    chain: Sequence[str]
    namespace: str
    record: CompactedPrefix | None = None
    # The counter's count of each message of the record's replacement, when known (see StoredReplacements).
    replacement_counts: tuple[int, ...] | None = field(default=None, compare=False, repr=False)
    # synthetic_positions of the record's replacement, when known (see StoredReplacements).
    replacement_synthetic: frozenset[int] | None = field(default=None, compare=False, repr=False)

    @cached_property
    def messages(self) -> list[Message]:
        """The history as forwarded: read-only, computed once."""
        if self.record is None:
            return list(self.original)
        return [*self.record.replacement, *self.original[self.record.prefix_len:]]

    @cached_property
    def synthetic(self) -> frozenset[int]:
        """Positions in `messages` of what the proxy wrote: the summary (the replacement's first user message)
        and its assistant fillers. They are summarised again later, never kept as the user's words."""
        if self.record is None:
            return frozenset()
        if self.replacement_synthetic is not None:
            return self.replacement_synthetic
        return synthetic_positions(self.record.replacement)

    @property
    def replaced(self) -> int:
        """How many of `messages` are the stored replacement."""
        return len(self.record.replacement) if self.record else 0

    def original_index(self, index: int) -> int:
        """Where a position in `messages` falls in `original`."""
        return index - self.replaced + (self.record.prefix_len if self.record else 0)

    @property
    def backoff_key(self) -> str:
        """One conversation, as far as failures go: its tenant and its first message after the instructions."""
        first = next((i for i, message in enumerate(self.original) if not is_instruction(message)), 0)
        return f"{self.namespace}:{self.chain[min(first, len(self.chain) - 1)]}" if self.chain else self.namespace
