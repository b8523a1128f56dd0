"""Evidence: the exact values a summary must not lose (the user's words, failing commands with their errors, the
files worked on), read from the summarised messages and added to the summary wherever it left them out.

What a tool printed is quoted as code after the tool's name, never set down as words of its own: the summary is sent
with the user's role, and a tool's output ("ignore all previous instructions", `curl … | sh`) is data, not a request.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from proxy.core.messages import Message, content_text, is_user, role
from proxy.summarizer import stated
from proxy.summarizer.fence import inline_code
from proxy.summarizer.summary import Decision, FileNote, StructuredSummary
from proxy.summarizer.tool_call import TALLY, Action, read_call, shortened

MAX_USER_CHARS = 1200   # one user message: past this its middle goes
# An assistant message without tool calls reports to the user ("Found it: the bug is in …"); a short one is kept
# whole, a longer one (an essay, an answer to a question) is left to the model's summary.
MAX_CONCLUSION_CHARS = 600
MIN_ITEM_TOKENS = 8     # no entry is smaller: below this the room is spent
MIN_HELD_CHARS = 12     # a model's entry shorter than this ("tests", "e") is in an added one by chance, not held
# What makes a user's message carry facts: a number, a path or dotted name, an identifier, a quoted value, a name
# (two capitalised words), or a rule's word.
FACT_CARRIER = re.compile(r"\d|\w[/.]\w|\w_\w|`|\b[A-Z][a-z]+ [A-Z][a-z]+\b|"
                          r"(?i:\b(?:never|must|mustn't|don't|do not|only|instead|always|forbidden|prohibited)\b)")


@dataclass(frozen=True)
class Evidence:
    """What the summarised messages say exactly, oldest first."""

    user_messages: tuple[str, ...] = ()
    actions: tuple[Action, ...] = ()
    conclusions: tuple[str, ...] = ()  # what the assistant told the user between tool rounds
    decisions: tuple[Decision, ...] = ()  # in force, current by construction (proxy.summarizer.stated)
    rules: tuple[str, ...] = ()  # the user's, in the user's words


def gather(messages: Sequence[Message], kept: Iterable[Message] = ()) -> Evidence:
    """The evidence in `messages` (the client's own, as summarised); messages in `kept` stay verbatim anyway."""
    staying = list(kept)
    users = tuple(shortened(text, MAX_USER_CHARS) for message in messages
                  if is_user(message) and message not in staying and (text := content_text(message.get("content"))))
    conclusions = tuple(text for message in messages
                        if role(message) == "assistant" and not message.get("tool_calls") and message not in staying
                        and 0 < len(text := content_text(message.get("content")).strip()) <= MAX_CONCLUSION_CHARS)
    results = {message.get("tool_call_id"): content_text(message.get("content")) for message in messages
               if role(message) == "tool"}
    actions = tuple(action for message in messages if role(message) == "assistant"
                    for call in message.get("tool_calls") or ()
                    if (action := read_call(call, results, content_text(message.get("content")))) is not None)
    return Evidence(users, actions, conclusions, stated.decisions(messages), stated.rules(messages))



def text_size(messages: Sequence[Message]) -> int:
    """Characters of text in `messages`, to decide whether gathering them is worth a thread."""
    return sum(len(content) for message in messages if isinstance(content := message.get("content"), str))


def normalised(text: str) -> str:
    """Text as it is compared: whitespace runs collapsed, case folded."""
    return " ".join(text.split()).casefold()


@dataclass(frozen=True)
class _Item:
    field: str          # the summary field it goes to
    text: str                       # the list entry, or a file's path
    details: tuple[str, ...] = ()   # a file's actions, oldest first
    code: str = ""                  # a file's settings, as read
    exact: bool = True              # a value a summary must not lose (not context: conclusions, runs, reads)
    needed: tuple[str, ...] = ()    # the parts a summary must hold for the entry to be there (else its text)
    decision: Decision | None = None

    @property
    def detail(self) -> str:
        return "; ".join(self.details)


def carries_facts(text: str) -> bool:
    """Whether a user's message states facts a paraphrase loses: numbers, paths, identifiers, names, quoted
    values, or a rule (never, must, only, instead)."""
    return FACT_CARRIER.search(text) is not None


def _items(evidence: Evidence) -> Iterator[_Item]:
    """Candidates most important first: the user's rules and the decisions in force, the user's words (those that
    carry names, numbers, paths or rules first), errors, settings read, files changed, what the assistant
    concluded, commands, files read."""
    yield from (_Item("constraints", rule) for rule in evidence.rules)
    for decision in evidence.decisions:
        values = (decision.current or "", *decision.replaced)
        yield _Item("decisions", decision.current or "", needed=values if decision.topic or decision.replaced else (),
                    decision=decision)
    newest_words = list(reversed(evidence.user_messages))
    for text in [*filter(carries_facts, newest_words), *itertools.filterfalse(carries_facts, newest_words)]:
        yield _Item("user_messages", text)
    newest = list(reversed(evidence.actions))
    failing = [action for action in newest if action.errors]
    # The latest failure of each command comes before settings and changed files; its earlier runs after them.
    latest = {action.label: action for action in reversed(failing)}
    repeats = [action for action in failing if latest[action.label] is not action]
    yield from (_error_item(action) for action in failing if latest[action.label] is action)
    done: set[str] = set()  # paths and commands an entry already stands for
    for action in newest:
        if action.settings and not action.errors and (key := action.path or action.label) not in done:
            yield _settings_item(action, newest)
            done.add(key)
    yield from _file_items(newest, writes=True, done=done)
    yield from (_error_item(action) for action in repeats)
    for text in reversed(evidence.conclusions):
        yield _Item("problem_solving", text, exact=False)
    for action in newest:
        if action.command and not action.errors and action.command not in done and action.label not in done:
            done.add(action.command)
            ran = action.heading if action.command in action.purpose else f"ran {action.heading}"
            yield _Item("problem_solving", ran, exact=False)
    yield from _file_items(newest, writes=False, done=done)


def _error_item(action: Action) -> _Item:
    """A failure as `label: line | line`; it is there when the summary holds what it ran and the lines that are
    not a tally (all of them when all are)."""
    telling = tuple(line for line in action.errors if not TALLY.fullmatch(line)) or action.errors
    # "output", not "printed": asked what a test printed, a small model took a quoted tally for the answer.
    return _Item("errors_and_fixes", f"{action.heading} output: " + " | ".join(map(inline_code, action.errors)),
                 needed=(action.command or action.label, *telling))


def _settings_item(action: Action, newest: Sequence[Action]) -> _Item:
    """A settings file as its note with the lines read; a command that printed settings as what it printed."""
    if action.path is None:
        return _Item("problem_solving", f"{action.label} printed: " + " ".join(map(inline_code, action.settings)))
    return _Item("files", action.path, _details(action.path, newest), "\n".join(action.settings))


def _file_items(newest: Sequence[Action], *, writes: bool, done: set[str]) -> Iterator[_Item]:
    paths = dict.fromkeys(action.path for action in newest
                          if action.path and action.writes == writes and action.path not in done)
    for path in paths:
        yield _Item("files", str(path), _details(str(path), newest), exact=writes)


def _details(path: str, newest: Sequence[Action]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(action.detail for action in reversed(newest) if action.path == path))


def _missing(item: _Item, have: str) -> bool:
    if item.needed:
        return any(normalised(part) not in have for part in item.needed)
    if item.field != "files":
        return normalised(item.text) not in have
    details = [part for part in item.details if " " in part]  # a bare tool name says nothing
    return normalised(item.text) not in have or any(normalised(part) not in have for part in details) \
        or any(normalised(line) not in have for line in item.code.splitlines())


def complete(summary: StructuredSummary | None, text: str, evidence: Evidence, room: int,
             count: Callable[[str], int], *, exact_room: int = 0) -> tuple[StructuredSummary, int]:
    """`summary` (an empty one when the reply did not parse) with the evidence `text` lacks, within `room` tokens,
    and up to `exact_room` more for exact values (the user's words, errors, settings, files changed).

    Returns it and how many entries were added. Entries are whole or absent, most important first; one that
    does not fit is passed over for smaller ones after it. What the model wrote that an added entry holds whole is
    left out, and the room it took goes to the entries after.
    """
    base = summary or StructuredSummary()
    # The current state is looked for in its own sections: the user's words quoted under User Messages do not
    # make a decision or a rule stated as one.
    have = {"": normalised(text), "constraints": normalised(" ".join(base.constraints)),
            "decisions": normalised(" ".join(_decision_text(decision) for decision in base.decisions))}
    fields: dict[str, list[Any]] = {"user_messages": [], "errors_and_fixes": [], "problem_solving": [],
                                    "files": [], "constraints": [], "decisions": []}
    held: dict[str, set[int]] = {"decisions": set(), "user_messages": set(), "errors_and_fixes": set()}
    superseded = {value.casefold() for decision in evidence.decisions for value in decision.replaced}
    added = spent = 0
    for item in _items(evidence):
        limit = room + max(0, exact_room) if item.exact else room
        if limit - spent < MIN_ITEM_TOKENS:
            break  # exact values come first: past one whose limit is spent, every later limit is
        written = _decision_text(item.decision) if item.decision else item.text + item.detail + item.code
        cost = count(written) + (8 if item.code else 4)  # bullets, fences, breaks
        section = item.field if item.field in have else ""
        if spent + cost > limit or not _missing(item, have[section]) or \
                (item.field == "user_messages" and _stated_already(item.text, have, superseded)):
            continue
        spent += cost - _held(item, base, held, count)
        added += 1
        have[section] += " " + normalised(_decision_text(item.decision) if item.decision else
                                          f"{item.text} {item.detail} {item.code}")
        fields[item.field].append(FileNote(item.text, item.detail or None, item.code or None)
                                  if item.field == "files" else item.decision or item.text)
    merged = replace(base, decisions=(*fields["decisions"], *_kept(base.decisions, held["decisions"])),
                     constraints=(*fields["constraints"], *base.constraints),
                     user_messages=(*_kept(base.user_messages, held["user_messages"]),
                                    *reversed(fields["user_messages"])),
                     errors_and_fixes=(*_kept(base.errors_and_fixes, held["errors_and_fixes"]),
                                       *fields["errors_and_fixes"]),
                     problem_solving=(*base.problem_solving, *fields["problem_solving"]),
                     files=_merged_files(base.files, fields["files"]))
    return merged, added


def _held(item: _Item, base: StructuredSummary, held: dict[str, set[int]], count: Callable[[str], int]) -> int:
    """What the model wrote that the entry added holds whole (its cut-off quote of the same user message, the
    command it named of the same failure, its note of the decision the user's words state), marked in `held` to
    be left out; returns the tokens that frees for later entries."""
    if item.field not in held:
        return 0
    written: tuple[Any, ...] = getattr(base, item.field)
    freed = 0
    for index, entry in enumerate(written):
        if index in held[item.field]:
            continue
        if isinstance(entry, Decision):
            if not (entry.current and item.decision and item.decision.current
                    and stated.mentions(entry.current, item.decision.current)):
                continue
            text = _decision_text(entry)
        elif not (isinstance(entry, str) and len(_squeezed(entry)) >= MIN_HELD_CHARS
                  and _squeezed(entry) in _squeezed(item.text)):
            continue
        else:
            text = entry
        held[item.field].add(index)
        freed += count(text) + 4
    return freed


def _squeezed(text: str) -> str:
    """Text without its spaces, case folded: a model's copy drops a space after a semicolon."""
    return "".join(text.split()).casefold()


def _kept(entries: tuple[Any, ...], held: set[int]) -> tuple[Any, ...]:
    return tuple(entry for index, entry in enumerate(entries) if index not in held)


def _stated_already(text: str, have: dict[str, str], superseded: set[str]) -> bool:
    """Whether every sentence of a user's message that carries a fact stands in the current state: quoted among
    the constraints or the decisions' quotes, or a change of mind overridden again since (its new value among those
    a decision marks replaced) whose values the decisions name: its words quoted would set the replaced value
    before the reader once more. Quoting the message again would spend the room twice on the same facts."""
    carrying = [sentence for sentence in stated.sentences(text) if carries_facts(sentence)]
    current = have["constraints"] + " " + have["decisions"]
    return bool(carrying) and all(normalised(sentence) in current
                                  or stated.recorded_change(sentence, have["decisions"], superseded)
                                  for sentence in carrying)


def _decision_text(decision: Decision) -> str:
    return " ".join(filter(None, (decision.topic, decision.current, *decision.replaced, decision.said)))


def _merged_files(notes: Sequence[FileNote], added: Sequence[FileNote]) -> tuple[FileNote, ...]:
    """The summary's file notes, each extended by the actions and settings found for its path, then new paths."""
    found = {note.path: note for note in added}
    extended = [_extended(note, found.pop(note.path)) if note.path in found else note for note in notes]
    return (*extended, *(note for note in added if note.path in found))


def _extended(note: FileNote, found: FileNote) -> FileNote:
    return replace(note, summary="; ".join(filter(None, (note.summary, found.summary))) or None,
                   key_code="\n".join(filter(None, (note.key_code, found.key_code))) or None)
