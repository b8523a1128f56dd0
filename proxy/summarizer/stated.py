"""What a conversation states in so many words: the user's changes of mind, decisions announced as such, and the
user's rules; read without a model, so a summary carries them whatever its summariser wrote."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from proxy.core.messages import Message, content_text, role
from proxy.summarizer.summary import Decision

# A user's word for a change of mind, and the old and new values around it. A value is one token: an identifier,
# a path, a version, a backticked span.
_VALUE = r"`([^`\n]{1,80})`|([\w][\w./:@+-]{1,80})"
_OVERRIDES = (
    re.compile(rf"\buse\s+(?:{_VALUE})\s+(?:instead\s+of|rather\s+than)\s+(?:{_VALUE})", re.IGNORECASE),
    re.compile(rf"\bswitch(?:ed)?\s+from\s+(?:{_VALUE})\s+to\s+(?:{_VALUE})", re.IGNORECASE),
    re.compile(rf"\breplace\s+(?:{_VALUE})\s+with\s+(?:{_VALUE})", re.IGNORECASE),
)
# Which group pair of each pattern is (new, old): "use NEW instead of OLD" names the new value first.
_NEW_FIRST = (True, False, False)
# A bare word is a value only when it looks like one (a name with a capital, a digit or punctuation inside):
# "use caching instead of polling" names no value to police; "use Postgres instead of SQLite" does.
_VALUE_LIKE = re.compile(r"[A-Z0-9_./:@+-]")
# What a change of mind is about, when the user said: "… for the ledger snapshots."
_TOPIC = re.compile(r"^\s*(?:\S+\s+){0,3}?for\s+(?:the\s+|our\s+|all\s+)?([A-Za-z][\w -]{2,48}?)\s*(?:[.;,!?]|$)")
# A decision announced as one ("Decision: …", "We decided to …"), by the user or the agent.
_ANNOUNCED = re.compile(r"^(?:decision|decided|agreed)\s*:\s*|^(?:we|i)(?:'ve| have)?\s+(?:decided|agreed)\b\s*",
                        re.IGNORECASE)
# A rule's words; a rule is kept when it also names an exact value (a path, a host, a number): "never run
# migrations against ledger-prod-4" is a fact a summary must carry, "do not mix them up" is not one on its own.
_RULE = re.compile(r"\b(?:never|must|mustn't|must not|don't|do not|only|always|forbidden|prohibited|not allowed)\b",
                   re.IGNORECASE)
# An exact value: a token with a digit or inner punctuation (a path, a host, a version).
EXACT = re.compile(r"\d|\w[_/.:@-]\w|/$")
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z`\"'(])|\n+")
_BULLET = re.compile(r"^[-*] +")
MAX_SENTENCE_CHARS = 300  # past this a "sentence" is a paragraph: it is the user's message, not a rule
# What else a change of mind's sentence may say that a decision does not record: a name, a rule, a condition.
BEYOND_CHANGE = re.compile(r"\b[A-Z][a-z]+ [A-Z][a-z]+\b|(?i:\b(?:never|must|mustn't|don't|do not|only|always|"
                           r"forbidden|prohibited|unless|except)\b)")
MAX_STATED = 16           # decisions and rules each: a conversation of hundreds of rules keeps its latest


@dataclass(frozen=True)
class Override:
    """A change of mind the user stated: the value replaced, the value now current, the sentence that said so."""

    old: str
    new: str
    said: str


def sentences(text: str) -> list[str]:
    """`text`'s sentences and lines, a list's bullet taken off (an earlier summary's entries are sentences too)."""
    return [_BULLET.sub("", sentence.strip()) for sentence in _SENTENCE.split(text) if sentence.strip()]


def stated_overrides(messages: Sequence[Message]) -> list[Override]:
    """Each change of mind the user stated in so many words, oldest first."""
    return [found for message in messages if role(message) == "user"
            for sentence in sentences(content_text(message.get("content")))
            for found in sentence_overrides(sentence)]


def sentence_overrides(sentence: str) -> list[Override]:
    """The changes of mind one sentence states, in the order it states them."""
    matches = [(match.start(), match, new_first) for pattern, new_first in zip(_OVERRIDES, _NEW_FIRST, strict=True)
               for match in pattern.finditer(sentence)]
    found: list[Override] = []
    for _, match, new_first in sorted(matches, key=lambda candidate: candidate[0]):
        first, second = _value(match.group(1), match.group(2)), _value(match.group(3), match.group(4))
        if first is None or second is None:
            continue
        new, old = (first, second) if new_first else (second, first)
        if old.lower() != new.lower():
            found.append(Override(old, new, sentence))
    return found


def overrides(messages: Sequence[Message]) -> list[tuple[str, str]]:
    """(old, new) for each change of mind the user stated in so many words, oldest first."""
    return [(found.old, found.new) for found in stated_overrides(messages)]


def _value(quoted: str | None, bare: str | None) -> str | None:
    if quoted:
        return quoted.strip()
    word = (bare or "").rstrip(".,;:")
    return word if len(word) >= 2 and _VALUE_LIKE.search(word) else None


def decisions(messages: Sequence[Message]) -> tuple[Decision, ...]:
    """The decisions in force, current by construction: each chain of the user's changes of mind as one decision
    (its latest value current, every earlier one replaced, the user's last words), then the decisions announced as
    such that name no value since replaced; oldest first, the latest MAX_STATED."""
    chains: list[Decision] = []
    for override in stated_overrides(messages):
        topic = _topic(override.said)
        earlier = next((d for d in chains if d.current and d.current.lower() == override.old.lower()), None)
        if earlier is not None:
            chains.remove(earlier)
            topic = topic or earlier.topic
        replaced = (*(earlier.replaced if earlier else ()), override.old)
        replaced = tuple(dict.fromkeys(v for v in replaced if v.lower() != override.new.lower()))
        chains = [d for d in chains if not (d.current and d.current.lower() == override.new.lower())]
        chains.append(Decision(topic, override.new, replaced, override.said))
    values = [value for d in chains for value in (d.current or "", *d.replaced)]
    announced = [Decision(None, text) for text in _announced(messages)
                 if not any(mentions(text, value) for value in values)]
    return (*chains, *dict.fromkeys(announced))[-MAX_STATED:]


def _topic(sentence: str) -> str | None:
    after = next((match.end() for pattern in _OVERRIDES if (match := pattern.search(sentence))), None)
    found = _TOPIC.match(sentence[after:]) if after is not None else None
    return found.group(1).strip() if found else None


def _announced(messages: Sequence[Message]) -> list[str]:
    """What follows "Decision:" (and the like) in the user's and the agent's prose, one sentence each."""
    return [text for _, text in announced(messages)]


def announced(messages: Sequence[Message], *, changes: bool = False) -> list[tuple[int, str]]:
    """(message index, what was decided) for each decision announced as one ("Decision: …"), and with `changes`
    each change of mind the user stated (its new value), oldest first."""
    found = []
    for index, message in enumerate(messages):
        if role(message) not in ("user", "assistant"):
            continue
        for sentence in sentences(content_text(message.get("content"))):
            match = _ANNOUNCED.match(sentence)
            rest = sentence[match.end():].strip() if match else ""
            if rest and len(rest) <= MAX_SENTENCE_CHARS and EXACT.search(rest):
                found.append((index, rest))
            if changes and role(message) == "user":
                found.extend((index, change.new) for change in sentence_overrides(sentence))
    return found


def rules(messages: Sequence[Message]) -> tuple[str, ...]:
    """The user's rules in the user's words: each sentence with a rule's word and an exact value, oldest first,
    once each, the latest MAX_STATED."""
    found = [sentence for message in messages if role(message) == "user"
             for sentence in sentences(content_text(message.get("content")))
             if len(sentence) <= MAX_SENTENCE_CHARS and _RULE.search(sentence) and EXACT.search(sentence)]
    return tuple(dict.fromkeys(found))[-MAX_STATED:]


def mentions(text: str, value: str) -> bool:
    """Whether `text` names `value` as a whole token (`v1.2` is not named by `v1.2.3`), in any case."""
    return bool(value) and re.search(rf"(?<![\w.-]){re.escape(value)}(?![\w-]|\.\w)", text, re.IGNORECASE) is not None


def recorded_change(sentence: str, decisions: str, superseded: set[str]) -> bool:
    """Whether `sentence` states changes of mind since superseded and no other fact, each with both its values
    named by the decisions."""
    changes = sentence_overrides(sentence)
    values = [value for change in changes for value in (change.old, change.new)]
    rest = sentence
    for value in values:
        rest = rest.replace(value, "")
    return bool(changes) and all(change.new.casefold() in superseded for change in changes) \
        and all(mentions(decisions, value) for value in values) \
        and not EXACT.search(rest) and not BEYOND_CHANGE.search(rest)
