"""Oversized messages: elide the middle of their text with a visible marker so the request can still be sent.

Only the forwarded copy changes; the client's own history (and every fingerprint of it) is untouched.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from proxy.core import budget
from proxy.core.budget import Limits
from proxy.core.messages import Message, is_tool_result, with_text

# A marker names how much was left out, so the model never mistakes the gap for the whole text.
Marker = Callable[[int], str]
# Each try keeps a little less when the estimate of the kept text came out over the cap.
SHRINK = 0.85
MAX_TRIES = 6


@dataclass(frozen=True)
class Elided:
    """The messages as they will be sent, and how many of them had text left out."""

    messages: list[Message]
    count: int


def _text_of(message: Message) -> str | None:
    content = message.get("content")
    return content if isinstance(content, str) else None


def elide_text(text: str, keep_tokens: int, count_text: Callable[[str], int], marker: Marker) -> str:
    """`text` with its middle replaced by the marker, keeping both ends within `keep_tokens` in all."""
    total = count_text(text)
    if total <= keep_tokens:
        return text
    chars = int(len(text) * keep_tokens / max(total, 1))
    for _ in range(MAX_TRIES):
        head, tail = text[: chars // 2], text[len(text) - chars // 2:] if chars // 2 else ""
        kept = count_text(head) + count_text(tail)
        shortened = f"{head}\n{marker(max(total - kept, 1))}\n{tail}"
        if count_text(shortened) <= keep_tokens or chars == 0:
            return shortened
        chars = int(chars * SHRINK)
    return f"{marker(total)}"


def elide_oversized(messages: Sequence[Message], first: int, count: Callable[[Message], int],
                    count_text: Callable[[str], int], limits: Limits, marker: Marker) -> Elided:
    """Shrink the largest text messages from index `first` on until the request fits; the rest is kept.

    Only tool results are elided: the user's own words and instructions are never shortened, and a result whose
    content is not plain text (parts, images) is left whole.
    """
    sent = list(messages)
    counts = [count(message) for message in sent]
    elided = 0
    order = sorted((i for i in range(first, len(sent))
                    if is_tool_result(sent[i]) and _text_of(sent[i]) is not None),
                   key=lambda i: counts[i], reverse=True)
    for index in order:
        total = sum(counts)
        if budget.fits_window(limits, total) and not budget.over_threshold(limits, total):
            break
        cap = budget.elision_cap(limits, total - counts[index])
        if counts[index] <= cap:
            continue
        text = _text_of(sent[index])
        assert text is not None
        overhead = counts[index] - count_text(text)
        sent[index] = with_text(sent[index], elide_text(text, max(cap - overhead, 1), count_text, marker))
        counts[index] = count(sent[index])
        elided += 1
    return Elided(sent, elided)
