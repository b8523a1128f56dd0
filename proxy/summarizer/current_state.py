"""Deterministic checks after the summariser writes: no replaced value named as current, no reply copied as the
plan, the user's rules in the user's words, exact values spelled as the conversation spells them."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from proxy.core.messages import Message, content_text, role
from proxy.summarizer.stated import EXACT, MAX_SENTENCE_CHARS, announced, mentions, overrides
from proxy.summarizer.stated import sentences as stated_sentences
from proxy.summarizer.summary import Decision, StructuredSummary

# Fields that state what is current: a value the conversation replaced must not appear there as if it were.
CURRENT_LIST_FIELDS = ("user_intent", "pending_tasks")
CURRENT_TEXT_FIELDS = ("current_work", "next_step")
# History fields may name a replaced value (what was tried); an entry that says the value holds now states it as
# current all the same ("Snapshots are now written in snapfmt_a").
CURRENT_SAYING_FIELDS = ("problem_solving", "technical_concepts")
_NOW = re.compile(r"\b(?:now|currently|from here on|going forward|still|in use|in force|is current)\b", re.IGNORECASE)
# A copied reply: the plan must not be the assistant's own words; below this many characters a match is chance.
MIN_COPIED_CHARS = 40
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z`\"'(])")
_SPACE = re.compile(r"\s+")
_WORD = re.compile(r"[\w./:@+-]+")
_SHOWN = 80
# Fields the model writes in its own words: an exact value there is spelled as the conversation spells it.
RESPELLED_LIST_FIELDS = ("user_intent", "technical_concepts", "errors_and_fixes", "problem_solving", "pending_tasks")
RESPELLED_TEXT_FIELDS = ("current_work", "next_step")
# A value's skeleton: its letters and digits, case folded. Below this length two different values share one by chance.
MIN_SKELETON_CHARS = 6
_NOT_SKELETON = re.compile(r"[\W_]+")
_STRIPPED = ".,:;()\"'"
# A replaced value is a value ("SQLite", "port 5432"); past this many words with no exact value it is a sentence
# a small model set down as replaced ("The tests were failing due to rounding issues"), not a decision's value.
MAX_VALUE_WORDS = 6
# A quote cut short by the model (… or ...): each piece must be the user's words.
_QUOTE_CUT = re.compile(r"\s*(?:…|\.\.\.)\s*")
# The summary's own rendering of a decision, copied by a small model from an earlier summary into a value: what
# follows it is another value's record, not part of this one.
_RENDERED = re.compile(r"\s*\((?:replaced, no longer current|the user):.*", re.DOTALL)
# Markup a small model copies from the transcript's framing into the user's messages ("<tool_response>").
_MARKUP_ONLY = re.compile(r"\s*(?:</?[\w:-]+\s*/?>\s*)+")


@dataclass(frozen=True)
class Correction:
    """One change the checks made, for the compaction's log line."""

    field: str
    # "replaced_value" | "copied_reply" | "decision_current" | "replaced_is_current" | "quoted" | "unfounded"
    # | "misquoted" | "respelled" | "replaced_later" | "not_a_value" | "unsaid" | "empty" | "markup" | "rendered"
    rule: str
    text: str  # what was dropped or rewritten, shortened

    def as_log(self) -> dict[str, str]:
        """The field and the rule only: the text is the conversation's, and logs never carry a client's words."""
        return {"field": self.field, "rule": self.rule}


def replaced_values(summary: StructuredSummary, stated: Sequence[tuple[str, str]]) -> dict[str, str]:
    """Each replaced value, and the value now current in its place (from the user's own words, then from the
    summary's decisions); a value chosen again later is current, not replaced."""
    current: dict[str, str] = {}
    pairs = [*((old, d.current or "") for d in summary.decisions for old in d.replaced), *stated]
    for old, new in pairs:
        current[old.lower()] = new
        current.pop(new.lower(), None)
        for key, value in list(current.items()):  # A -> B, then B -> C: A's current value is C
            if value.lower() == old.lower():
                current[key] = new
    return {old: new for old, new in current.items() if len(old) >= 2}


def corrected(summary: StructuredSummary, messages: Sequence[Message]) -> tuple[StructuredSummary,
                                                                                tuple[Correction, ...]]:
    """The summary with the checks applied, and what they changed (nothing: the same summary)."""
    corrections: list[Correction] = []
    changes: dict[str, object] = {}
    own = _replaced_checked(summary.decisions, messages, corrections)
    replaced = replaced_values(replace(summary, decisions=own), overrides(messages))
    decisions = _founded(_current_decisions(own, replaced, corrections), messages, corrections)
    decisions = _said_by_user(tuple(_said_checked(decision, corrections) for decision in decisions), messages,
                              corrections)
    if decisions != summary.decisions:
        changes["decisions"] = decisions
    users = tuple(item for item in summary.user_messages if not _MARKUP_ONLY.fullmatch(item))
    if users != summary.user_messages:
        corrections.append(Correction("user_messages", "markup", _short(summary.user_messages[0])))
        changes["user_messages"] = users
    for name in (*CURRENT_LIST_FIELDS, *CURRENT_SAYING_FIELDS):
        items: tuple[str, ...] = getattr(summary, name)
        saying = name in CURRENT_SAYING_FIELDS  # a history field states as current only what it says holds now
        kept = tuple(item for item in items if not ((not saying or _NOW.search(item))
                                                    and _names_replaced(item, replaced, name, corrections)))
        if kept != items:
            changes[name] = kept
    for name in CURRENT_TEXT_FIELDS:
        text: str | None = getattr(summary, name)
        if text is None:
            continue
        kept_text = " ".join(s for s in _SENTENCE.split(text) if not _names_replaced(s, replaced, name, corrections))
        if name == "next_step" and kept_text and _copied(kept_text, messages):
            corrections.append(Correction(name, "copied_reply", _short(kept_text)))
            kept_text = ""
        if kept_text != text:
            changes[name] = kept_text or None
    constraints = _quoted(summary.constraints, messages, corrections)
    if constraints != summary.constraints:
        changes["constraints"] = constraints
    changes |= _respelled({name: changes.get(name, getattr(summary, name))
                           for name in (*RESPELLED_LIST_FIELDS, *RESPELLED_TEXT_FIELDS)}, messages, corrections)
    return (replace(summary, **changes) if changes else summary), tuple(corrections)  # type: ignore[arg-type]


def _quoted(constraints: tuple[str, ...], messages: Sequence[Message],
            corrections: list[Correction]) -> tuple[str, ...]:
    """Each constraint in the user's own words: one the model paraphrased or cut off, whose exact values (a path, a
    name with a digit or punctuation) the user's sentences hold, becomes those sentences, whole and quoted as said:
    the latest one holding them all, else the latest holding each (a model joins two sentences into one rule)."""
    # Sentences are cut at line breaks too, and a paragraph is no sentence: an earlier summary, sent with the
    # user's role, holds every rule in one block, and quoting that block would nest the summary in itself.
    sentences = [sentence for message in messages if role(message) == "user"
                 for sentence in stated_sentences(content_text(message.get("content")))
                 if len(sentence) <= MAX_SENTENCE_CHARS]
    quoted: list[str] = []
    for item in constraints:
        values = _exact_values(item)
        found = _holding(values, sentences)
        if not values or not found or _folded(" ".join(found)) == _folded(item):
            quoted.append(item)
            continue
        corrections.append(Correction("constraints", "quoted", _short(item)))
        quoted.extend(found)
    return tuple(dict.fromkeys(quoted))


def _holding(values: set[str], sentences: Sequence[str]) -> list[str]:
    """The latest sentence naming every value; else, oldest first, the latest naming each; else none."""
    if whole := [sentence for sentence in sentences if all(mentions(sentence, value) for value in values)]:
        return [whole[-1]]
    each = [next((s for s in reversed(sentences) if mentions(s, value)), None) for value in values]
    if any(sentence is None for sentence in each):
        return []
    return sorted({s for s in each if s is not None}, key=sentences.index)


def _exact_values(text: str) -> set[str]:
    """The values `text` names exactly: its tokens with a digit or inner punctuation (a path, a host, a version)."""
    tokens = {token.strip(_STRIPPED) for token in _WORD.findall(text)}
    return {token for token in tokens if token and EXACT.search(token)}


def _respelled(fields: dict[str, Any], messages: Sequence[Message],
               corrections: list[Correction]) -> dict[str, Any]:
    """The fields that name an exact value spelled otherwise than the conversation spells it, respelled: a small
    model writes "1701_add_krillIndex" for "1701_add_krill_index", and a reader repeats the summary's spelling."""
    spellings: dict[str, str | None] | None = None
    changed: dict[str, Any] = {}
    for name, value in fields.items():
        texts = (value,) if isinstance(value, str) else value if isinstance(value, tuple) else ()
        if not any(EXACT.search(text) for text in texts):
            continue
        spellings = spellings if spellings is not None else _spellings(messages)
        fixed = tuple(_respell(text, spellings) for text in texts)
        if fixed != texts:
            first = next(text for text, fix in zip(texts, fixed, strict=True) if text != fix)
            corrections.append(Correction(name, "respelled", _short(first)))
            changed[name] = fixed[0] if isinstance(value, str) else fixed
    return changed


def _spellings(messages: Sequence[Message]) -> dict[str, str | None]:
    """Each exact value the conversation holds, by its skeleton; None where it spells one skeleton two ways (which
    was meant cannot be told)."""
    found: dict[str, str | None] = {}
    for message in messages:
        for value in _exact_values(_message_text(message)):
            key = _skeleton(value)
            if len(key) >= MIN_SKELETON_CHARS:
                known = found.setdefault(key, value)
                if known is not None and known.lower() != value.lower():
                    found[key] = None
    return found


def _respell(text: str, spellings: dict[str, str | None]) -> str:
    def fix(match: re.Match[str]) -> str:
        word = match.group()
        token = word.strip(_STRIPPED)
        right = spellings.get(_skeleton(token)) if token and EXACT.search(token) else None
        return word.replace(token, right, 1) if right is not None and right.lower() != token.lower() else word
    return _WORD.sub(fix, text)


def _skeleton(value: str) -> str:
    return _NOT_SKELETON.sub("", value).lower()


def _founded(decisions: tuple[Decision, ...], messages: Sequence[Message],
             corrections: list[Correction]) -> tuple[Decision, ...]:
    """The decisions whose exact values (a name with a digit or inner punctuation) the conversation holds: a
    small model garbles one now and then ("1416_add_vesar" for "1416_add_vesper_index"), and a reader takes the
    garbled one as current."""
    said: str | None = None
    kept = []
    for decision in decisions:
        if exact := _exact_values(decision.current or ""):
            said = said if said is not None else "\n".join(_message_words(message) for message in messages)
            if missing := [value for value in exact if not mentions(said, value)]:
                corrections.append(Correction("decisions", "unfounded", _short(missing[0])))
                continue
        kept.append(decision)
    return tuple(kept)


def _said_checked(decision: Decision, corrections: list[Correction]) -> Decision:
    """A decision whose quote names none of its values loses the quote: a small model fills `said` with whatever
    sentence it last read ("Dana Reyes reviews ledger-sync" for a snapshot format), and a reader takes it as why."""
    values = _exact_values(" ".join(filter(None, (decision.current, *decision.replaced))))
    if decision.said is None or not values or any(mentions(decision.said, value) for value in values):
        return decision
    corrections.append(Correction("decisions", "misquoted", _short(decision.said)))
    return replace(decision, said=None)


def _replaced_checked(decisions: tuple[Decision, ...], messages: Sequence[Message],
                      corrections: list[Correction]) -> tuple[Decision, ...]:
    """Each decision with only the replaced values it can have replaced: not a sentence standing for a value, not
    a decision announced after its current value was (a later decision is not replaced by an earlier one: a small
    model lists the other decisions in force as replaced); a decision left with no value at all is dropped."""
    order: dict[str, int] | None = None
    kept = []
    for decision in (_unrendered(written, corrections) for written in decisions):
        olds = []
        for old in decision.replaced:
            if not _exact_values(old) and len(old.split()) > MAX_VALUE_WORDS:
                corrections.append(Correction("decisions", "not_a_value", _short(old)))
                continue
            order = order if order is not None else _announced_order(messages)
            if _announced_after(old, decision.current or "", order):
                corrections.append(Correction("decisions", "replaced_later", _short(old)))
                continue
            olds.append(old)
        if not decision.current and not olds:
            corrections.append(Correction("decisions", "empty", _short(decision.topic or "")))
            continue
        kept.append(decision if len(olds) == len(decision.replaced) else replace(decision, replaced=tuple(olds)))
    return tuple(kept)


def _unrendered(decision: Decision, corrections: list[Correction]) -> Decision:
    """The decision with its values cut where the summary's rendering of another one was copied into them
    ("snapfmt_b (replaced, no longer current: snapfmt_a (replaced, …"); a value left empty is none."""
    copied = [value for value in (decision.current or "", *decision.replaced) if _RENDERED.search(value)]
    if not copied:
        return decision
    corrections.append(Correction("decisions", "rendered", _short(copied[0])))
    current = _RENDERED.sub("", decision.current or "").strip() or None
    olds = (_RENDERED.sub("", old).strip() for old in decision.replaced)
    return replace(decision, current=current, replaced=tuple(dict.fromkeys(old for old in olds if old)))


def _announced_order(messages: Sequence[Message]) -> dict[str, int]:
    """Each exact value of a decision announced or a change of mind stated, with where it was last decided."""
    return {value.lower(): index for index, text in announced(messages, changes=True)
            for value in _exact_values(text) | ({text} if EXACT.search(text) else set())}


def _announced_after(old: str, current: str, order: dict[str, int]) -> bool:
    """Whether every exact value of `old` was decided later than every one of `current` (both decided)."""
    olds = [order.get(value.lower()) for value in _exact_values(old)]
    nows = [order.get(value.lower()) for value in _exact_values(current)]
    if not olds or not nows or None in olds or None in nows:
        return False
    return min(index for index in olds if index is not None) > max(index for index in nows if index is not None)


def _said_by_user(decisions: tuple[Decision, ...], messages: Sequence[Message],
                  corrections: list[Correction]) -> tuple[Decision, ...]:
    """Each decision's quote is the user's words (whole, or cut short with an ellipsis): a quote nobody said is
    dropped ("I noticed that the rounding bug was causing problems", written as the user's)."""
    if not any(decision.said for decision in decisions):
        return decisions
    words = "\n".join(_folded(content_text(message.get("content"))) for message in messages if role(message) == "user")
    checked = []
    for decision in decisions:
        pieces = [piece for piece in _QUOTE_CUT.split(_folded(decision.said or "")) if piece]
        if pieces and not all(piece in words for piece in pieces):
            corrections.append(Correction("decisions", "unsaid", _short(decision.said or "")))
            decision = replace(decision, said=None)
        checked.append(decision)
    return tuple(checked)


def _message_words(message: Message) -> str:
    return _message_text(message).lower()


def _message_text(message: Message) -> str:
    calls = message.get("tool_calls")
    return content_text(message.get("content")) + (json.dumps(calls) if calls else "")


def _current_decisions(decisions: tuple[Decision, ...], replaced: dict[str, str],
                       corrections: list[Correction]) -> tuple[Decision, ...]:
    """A decision whose current value was replaced since names its replacement, the old value marked replaced."""
    fixed = []
    for decision in decisions:
        # A value is current or replaced, never both (a small model lists the current one among those it replaced).
        if decision.current and any(old.lower() == decision.current.lower() for old in decision.replaced):
            corrections.append(Correction("decisions", "replaced_is_current", _short(decision.current)))
            decision = Decision(decision.topic, decision.current,
                                tuple(old for old in decision.replaced if old.lower() != decision.current.lower()),
                                decision.said)
        now = decision.current
        if now is not None and now.lower() in replaced and replaced[now.lower()]:
            corrections.append(Correction("decisions", "decision_current", _short(now)))
            decision = Decision(decision.topic, replaced[now.lower()], (*decision.replaced, now), decision.said)
        elif now is not None and _names_replaced(now, replaced, "decisions", corrections):
            continue  # "use B instead of A", written when B was chosen and B replaced since: the user's chain says it
        fixed.append(decision)
    return tuple(fixed)


def _names_replaced(text: str, replaced: dict[str, str], name: str, corrections: list[Correction]) -> bool:
    """Whether `text` names a replaced value without naming what replaced it (then it states it as current)."""
    for old, new in replaced.items():
        if mentions(text, old) and not (new and mentions(text, new)):
            corrections.append(Correction(name, "replaced_value", _short(text)))
            return True
    return False


def _copied(text: str, messages: Sequence[Message]) -> bool:
    """Whether `text` is an assistant reply's words (or holds one whole), after folding case and spaces."""
    mine = _folded(text)
    if len(mine) < MIN_COPIED_CHARS:
        return False
    for message in messages:
        if role(message) == "assistant":
            theirs = _folded(content_text(message.get("content")))
            if len(theirs) >= MIN_COPIED_CHARS and (mine in theirs or theirs in mine):
                return True
    return False


def _folded(text: str) -> str:
    return _SPACE.sub(" ", text).strip().lower()


def _short(text: str) -> str:
    return text if len(text) <= _SHOWN else f"{text[:_SHOWN - 1]}…"
