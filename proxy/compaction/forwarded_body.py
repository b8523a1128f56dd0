"""The body a journey forwards: the client's as it came, its history's edits encoded, or a reused summary spliced
into the client's bytes."""

from __future__ import annotations

from typing import Generic

from proxy.compaction.journey import C, Journey
from proxy.compaction.journey_tokens import JourneyTokens
from proxy.core.stored_replacements import StoredReplacements
from proxy.dialects.body_memo import BodyMemo
from proxy.dialects.dialect import Dialect


class ForwardedBody(Generic[C]):
    """One pipeline's forwarded bodies."""

    def __init__(self, dialect: Dialect[C], bodies: BodyMemo, replacements: StoredReplacements,
                 tokens: JourneyTokens) -> None:
        self._dialect = dialect
        self._bodies = bodies
        self._replacements = replacements
        self._tokens = tokens

    def of(self, journey: Journey[C], *, ask_usage: bool) -> bytes:
        """What goes upstream for `journey` (usage asked for in a stream if `ask_usage`)."""
        edited = journey.elided or journey.cleared or journey.swapped or ask_usage
        if journey.conversation.record is None and not edited:
            return journey.call.body
        spliced = None if edited else self._spliced(journey)
        return spliced or self._dialect.forwarded(journey.call, journey.view, self._tokens.messages(journey),
                                                  ask_usage=ask_usage)

    def _spliced(self, journey: Journey[C]) -> bytes | None:
        """A stored summary spliced in and nothing else changed: the client's bytes after the summary's cut, and
        the summary's own JSON, kept while it is reused (dialects.body_memo.BodyMemo.spliced)."""
        conversation = journey.conversation
        record = conversation.record
        if record is None or not self._dialect.forwards_history_as_read:
            return None
        front = self._replacements.encoded((conversation.namespace, record.prefix_hash), record.replacement)
        if front is None:
            return None
        return self._bodies.spliced(journey.call.body, journey.view.messages, front, record.prefix_len)
