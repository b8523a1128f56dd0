"""Whether a summariser's reply can be a summary at all: words, not markup; not one thing over and over; enough."""

from __future__ import annotations

import re
import zlib

# Below this many characters a text compresses too little to tell a loop from prose.
MIN_JUDGED_CHARS = 2048
# Compressed size over raw size. Prose is ~0.4, code ~0.3, a summary listing 300 near-identical ids 0.25, a quoted
# test log of 100 similar lines 0.12; a model looping one sentence is under 0.01, a markup string repeated 0.003.
MIN_COMPRESSED_SHARE = 0.04
# Word characters among the visible ones: prose and JSON ~0.8-0.9, markdown and code over 0.75, punctuation noise 0.03.
MIN_WORD_SHARE = 0.3
# Distinct words asked of a summary: one per this many characters it replaces, within the bounds below. Loose on
# purpose: a terse but real summary of a long span (a small model's) is still a summary.
CHARS_PER_WORD = 400
MIN_WORDS, MAX_WORDS = 2, 4
# A word: two or more word characters; in scripts written without spaces (CJK), each character.
_WORD = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]|\w{2,}")
_SPACE = re.compile(r"\s+")
_NOT_WORD = re.compile(r"\W+")


def problem(reply: str, replaced_chars: int) -> str | None:
    """Why `reply` cannot stand in for `replaced_chars` characters of history, or None when it can."""
    visible = len(_SPACE.sub("", reply))
    if visible and len(_NOT_WORD.sub("", reply)) < MIN_WORD_SHARE * visible:
        return "it is mostly markup, not words"
    if len(reply) >= MIN_JUDGED_CHARS:
        data = reply.encode("utf-8", "replace")
        if len(zlib.compress(data, 1)) < MIN_COMPRESSED_SHARE * len(data):
            return "it is mostly one thing repeated"
    needed = min(MAX_WORDS, max(MIN_WORDS, replaced_chars // CHARS_PER_WORD))
    distinct: set[str] = set()
    for word in _WORD.finditer(reply):
        distinct.add(word.group())
        if len(distinct) >= needed:
            return None
    return f"it has {len(distinct)} distinct word(s), fewer than the {needed} asked of a summary of this history"
