"""Evidence: the exact values a summary must not lose (the user's words, failing commands with their errors, the
files worked on), read from the summarised messages and added to the summary wherever it left them out."""

from __future__ import annotations

import json
import re
import string
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from proxy.messages import Message, content_text, is_user, role
from proxy.summary import FileNote, StructuredSummary

# A line of tool output reporting a failure. The line is quoted as printed: an error's exact text is the fact
# most often lost, and a model asked for it verbatim paraphrases it anyway.
ERROR_WORD = re.compile(r"(?:error|exception|traceback)\b|\b(?:failed|failure|fatal|panic)\b|^(?-i:E)[ \t]",
                        re.IGNORECASE)
ERROR_WORDS = ("error", "exception", "traceback", "failed", "failure", "fatal", "panic")
ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)
MAX_CANDIDATES = 64     # lines looked at per word of one output: a word repeated in every line costs no more
COMMAND_KEYS = ("command", "cmd", "script")
PATH_KEYS = ("path", "file_path", "filepath", "filename", "file")
# A tool whose name has one of these changes the file it names; any other path-bearing call reads it.
WRITE_WORDS = ("edit", "write", "patch", "create", "replace", "apply", "insert", "append", "delete", "move",
               "rename", "update", "set")
MAX_ERROR_LINES = 3     # per tool result: the failing test, the error, the tally
MAX_LINE_CHARS = 240    # one quoted line of output
MAX_VALUE_CHARS = 80    # one argument of a file action
MAX_USER_CHARS = 1200   # one user message: past this its middle goes
ELLIPSIS = " […] "
MIN_ITEM_TOKENS = 8     # no entry is smaller: below this the room is spent


@dataclass(frozen=True)
class Action:
    """One tool call, as the evidence knows it: what it ran or touched, and the failure lines it printed."""

    label: str                  # `command` when it ran one, else name(args)
    command: str | None
    path: str | None
    writes: bool
    detail: str                 # the file action: the name and its other arguments, shortened
    errors: tuple[str, ...]


@dataclass(frozen=True)
class Evidence:
    """What the summarised messages say exactly, oldest first."""

    user_messages: tuple[str, ...] = ()
    actions: tuple[Action, ...] = ()


def gather(messages: Sequence[Message], kept: Iterable[Message] = ()) -> Evidence:
    """The evidence in `messages` (the client's own, as summarised); user messages in `kept` stay verbatim anyway."""
    staying = [message for message in kept if is_user(message)]
    users = tuple(_shortened(text, MAX_USER_CHARS) for message in messages
                  if is_user(message) and message not in staying and (text := content_text(message.get("content"))))
    results = {message.get("tool_call_id"): content_text(message.get("content")) for message in messages
               if role(message) == "tool"}
    actions = tuple(action for message in messages if role(message) == "assistant"
                    for call in message.get("tool_calls") or () if (action := _action(call, results)) is not None)
    return Evidence(users, actions)


def _action(call: Any, results: dict[Any, str]) -> Action | None:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        return None
    name = function["name"]
    try:
        arguments = json.loads(function.get("arguments") or "{}")
    except (TypeError, ValueError):
        return None
    if not isinstance(arguments, dict):
        return None
    command = _first_text(arguments, COMMAND_KEYS)
    path = _first_text(arguments, PATH_KEYS)
    others = {key: value for key, value in arguments.items() if key not in PATH_KEYS}
    detail = " ".join([name, *(f"{key}={_shortened(_text(value), MAX_VALUE_CHARS)}" for key, value in others.items())])
    label = f"`{command}`" if command else f"{name}({_shortened(json.dumps(arguments), MAX_VALUE_CHARS)})"
    errors = tuple(_error_lines(results.get(call.get("id"), "")))
    return Action(label, command, path, any(word in name.lower() for word in WRITE_WORDS), detail, errors)


def _first_text(arguments: dict[str, Any], keys: Sequence[str]) -> str | None:
    return next((value.strip() for key in keys if isinstance(value := arguments.get(key), str) and value.strip()),
                None)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _error_lines(output: str) -> list[str]:
    """The first lines of `output` that report a failure.

    Outputs run to megabytes and `re` holds the GIL for ~100 ns a character: lines are found by `str.find`
    for each word (C speed), at most MAX_CANDIDATES per word, and only those lines are matched.
    """
    lowered = output.translate(ASCII_LOWER)  # str.lower() may lengthen a text and shift every position after
    starts: set[int] = set()
    for needle, text in [*((word, lowered) for word in ERROR_WORDS), ("\nE ", output), ("\nE\t", output)]:
        found, at = 0, text.find(needle)
        while at >= 0 and found < MAX_CANDIDATES:
            line_start = output.rfind("\n", 0, at + (needle[0] == "\n")) + 1
            starts.add(line_start)
            found += 1
            at = text.find(needle, max(at + 1, output.find("\n", at + 1)))
    starts.add(0)  # the first line may open with "E "
    lines: list[str] = []
    for start in sorted(starts):
        end = output.find("\n", start)
        line = output[start:end if end >= 0 else len(output)]
        if ERROR_WORD.search(line):
            lines.append(_shortened(line.strip(), MAX_LINE_CHARS))
            if len(lines) == MAX_ERROR_LINES:
                break
    return lines


def _shortened(text: str, limit: int) -> str:
    text = text.strip()
    if len(text) <= limit:
        return text
    keep = (limit - len(ELLIPSIS)) // 2
    return text[:keep].rstrip() + ELLIPSIS + text[-keep:].lstrip()


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

    @property
    def detail(self) -> str:
        return "; ".join(self.details)


def _items(evidence: Evidence) -> Iterator[_Item]:
    """Candidates most important first: the user's words, then errors, files changed, commands, files read."""
    for text in reversed(evidence.user_messages):
        yield _Item("user_messages", text)
    newest = list(reversed(evidence.actions))
    for action in newest:
        if action.errors:
            yield _Item("errors_and_fixes", f"{action.label}: " + " | ".join(action.errors))
    yield from _file_items(newest, writes=True)
    seen: set[str] = set()
    for action in newest:
        if action.command and not action.errors and action.command not in seen:
            seen.add(action.command)
            yield _Item("problem_solving", f"ran `{action.command}`")
    yield from _file_items(newest, writes=False)


def _file_items(newest: Sequence[Action], *, writes: bool) -> Iterator[_Item]:
    paths = dict.fromkeys(action.path for action in newest if action.path and action.writes == writes)
    for path in paths:
        details = dict.fromkeys(action.detail for action in reversed(newest) if action.path == path)
        yield _Item("files", str(path), tuple(details))


def _missing(item: _Item, have: str) -> bool:
    if item.field != "files":
        return normalised(item.text) not in have
    details = [part for part in item.details if " " in part]  # a bare tool name says nothing
    return normalised(item.text) not in have or any(normalised(part) not in have for part in details)


def complete(summary: StructuredSummary | None, text: str, evidence: Evidence, room: int,
             count: Callable[[str], int]) -> tuple[StructuredSummary, int]:
    """`summary` (an empty one when the reply did not parse) with the evidence `text` lacks, within `room` tokens.

    Returns it and how many entries were added. Entries are whole or absent, most important first; one that
    does not fit is passed over for smaller ones after it.
    """
    have = normalised(text)
    fields: dict[str, list[Any]] = {"user_messages": [], "errors_and_fixes": [], "problem_solving": [],
                                    "files": []}
    added = 0
    for item in _items(evidence):
        if room < MIN_ITEM_TOKENS:
            break
        cost = count(item.text + item.detail) + 4  # a bullet or a heading, and the line breaks
        if cost > room or not _missing(item, have):
            continue
        room -= cost
        added += 1
        have += " " + normalised(f"{item.text} {item.detail}")
        fields[item.field].append(FileNote(item.text, item.detail or None) if item.field == "files" else item.text)
    base = summary or StructuredSummary()
    merged = replace(base,
                     user_messages=(*base.user_messages, *reversed(fields["user_messages"])),
                     errors_and_fixes=(*base.errors_and_fixes, *fields["errors_and_fixes"]),
                     problem_solving=(*base.problem_solving, *fields["problem_solving"]),
                     files=_merged_files(base.files, fields["files"]))
    return merged, added


def _merged_files(notes: Sequence[FileNote], added: Sequence[FileNote]) -> tuple[FileNote, ...]:
    """The summary's file notes, each extended by the actions found for its path, then the new paths."""
    actions = {note.path: note.summary for note in added}
    extended = [replace(note, summary="; ".join(filter(None, (note.summary, actions.pop(note.path, None)))) or None)
                if note.path in actions else note for note in notes]
    return (*extended, *(note for note in added if note.path in actions))
