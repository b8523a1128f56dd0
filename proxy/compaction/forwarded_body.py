"""The body a journey forwards: the client's as it came, its history's edits encoded, or a reused summary spliced
into the client's bytes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Generic

import orjson

from proxy.compaction.journey import C, Journey
from proxy.compaction.journey_tokens import JourneyTokens
from proxy.core.messages import Message
from proxy.core.stored_replacements import Front, StoredReplacements
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
        self.spliced = 0  # bodies spliced from the client's bytes (for tests and the curious)

    def of(self, journey: Journey[C], *, ask_usage: bool) -> bytes:
        """What goes upstream for `journey` (usage asked for in a stream if `ask_usage`)."""
        edited = journey.elided or journey.cleared or journey.swapped or ask_usage
        if journey.conversation.record is None and not edited:
            return journey.call.body
        spliced = None if edited else self._spliced(journey)
        if spliced is not None:
            self.spliced += 1
            return spliced
        return self._dialect.forwarded(journey.call, journey.view, self._tokens.messages(journey), ask_usage=ask_usage)

    def _spliced(self, journey: Journey[C]) -> bytes | None:
        """A stored summary spliced in and nothing else changed: the client's bytes after the summary's cut, and
        the summary's own JSON, kept while it is reused (dialects.body_memo.BodyMemo.spliced)."""
        conversation, view = journey.conversation, journey.view
        record = conversation.record
        read = view.messages if self._dialect.forwards_history_as_read else view.source
        # A body the memo does not hold (a small one, a bridge's chat request) is encoded whole: nothing is made
        # for a splice that cannot be.
        if record is None or read is None or not self._bodies.holds(journey.call.body, read):
            return None
        if not self._dialect.forwards_history_as_read:
            return self._items_spliced(journey, (conversation.namespace, record.prefix_hash), record.replacement,
                                       record.prefix_len)
        front = self._replacements.encoded((conversation.namespace, record.prefix_hash), record.replacement)
        if front is None:
            return None
        return self._bodies.spliced(journey.call.body, view.messages, front, record.prefix_len)

    def _items_spliced(self, journey: Journey[C], key: tuple[str, str], made: Sequence[Message],
                       cut: int) -> bytes | None:
        """A dialect whose view is read from the client's items (Responses, Messages): the summary rendered as
        items in place of those its cut stands for, the rest the client's bytes, when that is what `forwarded`
        would send (Dialect.splices). Encoding the rest cost a reuse hit 0.2 ms on a 100k-token history."""
        view = journey.view
        kept = view.kept_after(cut, self._bodies.view_keys(view))
        if kept is None or view.source is None:
            return None
        first, kept_from = kept
        if first == cut:  # the summary alone goes in front: rendered once while it is reused
            front = self._replacements.rendered(key, made, self._dialect.name, self._front)
        else:  # and what follows it of the group the cut split, rendered with it as `forwarded` renders it
            front = self._front([*made, *view.messages[cut:first]])
        if front is None or not self._dialect.splices(journey.call, view, front[0], kept_from, self._bodies):
            return None
        return self._bodies.spliced(journey.call.body, view.source, front[1], kept_from)

    def _front(self, made: Sequence[Message]) -> Front:
        items = self._dialect.rendered(list(made))
        try:
            encoded = orjson.dumps(items)
        except (TypeError, orjson.JSONEncodeError):
            return None  # encoded whole, the way that spells it
        return (items, encoded[1:-1]) if items else None
