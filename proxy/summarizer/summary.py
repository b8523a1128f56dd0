"""The structured summary (goose's nine fields, and the decisions and constraints in force): find it in a
summariser reply, coerce it leniently, render it."""

from __future__ import annotations

import json
import logging
import re
from bisect import bisect_left
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from proxy.summarizer.fence import code_fence
from proxy.summarizer.templates import Templates, default_templates

__all__ = ["Decision", "FileNote", "StructuredSummary", "code_fence", "summary_text"]

log = logging.getLogger("proxy.summary")

LIST_FIELDS = (
    "constraints",
    "user_intent",
    "technical_concepts",
    "errors_and_fixes",
    "problem_solving",
    "user_messages",
    "pending_tasks",
)
TEXT_FIELDS = ("current_work", "next_step")
# The current state first (decisions and constraints, rendered before the history), then goose's nine fields.
FIELD_NAMES = ("decisions", "constraints", "user_intent", "technical_concepts", "files", "errors_and_fixes",
               "problem_solving", "user_messages", "pending_tasks", "current_work", "next_step")
_FILE_KEYS = ("path", "summary", "key_code")
_DECISION_KEYS = ("topic", "current", "replaced", "said")
# What models also call a decision's current value.
_CURRENT_ALIASES = ("current", "value", "decision", "choice", "now")

_TERMINATOR = "</analysis>"
_JSON_FENCE = "```json"
# strict=False: models often put raw newlines inside strings (key_code); that is lenience, not repair.
_DECODER = json.JSONDecoder(strict=False)
# An object's opening: a brace, then a key or its closing brace. Anything else cannot decode, so is not tried.
_OBJECT_OPENING = re.compile(r"\{\s*[\"}]")
# A failed decode costs time in proportion to where it fails (the decoder's error counts the lines before it), so
# a reply of thousands of fences or terminators would take quadratic time; a real reply has one or two. Past this
# many decodes the reply is left to the raw-text fallback, which loses nothing.
MAX_DECODES = 64
# A summary object is a few levels deep (fields, lists, file notes) and holds tens to hundreds of values.
MAX_DEPTH = 16
MAX_ITEMS = 4096
_LEADING_BLANK_LINES = re.compile(r"\A(?:[ \t]*(?:\r\n|\n|\r))+")
_LINE_BREAK = re.compile(r"\s*(?:\r\n|\n|\r)\s*")


@dataclass(frozen=True)
class FileNote:
    """One file the conversation touched: where it is, why it matters, the code that matters."""

    path: str | None
    summary: str | None = None
    key_code: str | None = None


@dataclass(frozen=True)
class Decision:
    """A decision in force: what it is about, its current value, the values it replaced (never current), and the
    user's words that settled it."""

    topic: str | None
    current: str | None
    replaced: tuple[str, ...] = ()
    said: str | None = None


@dataclass(frozen=True)
class StructuredSummary:
    """The summary fields (lists most-important-first) plus any unknown keys the model added."""

    decisions: tuple[Decision, ...] = ()
    constraints: tuple[str, ...] = ()
    user_intent: tuple[str, ...] = ()
    technical_concepts: tuple[str, ...] = ()
    files: tuple[FileNote, ...] = ()
    errors_and_fixes: tuple[str, ...] = ()
    problem_solving: tuple[str, ...] = ()
    user_messages: tuple[str, ...] = ()
    pending_tasks: tuple[str, ...] = ()
    current_work: str | None = None
    next_step: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, hash=False)

    @classmethod
    def parse(cls, text: str) -> StructuredSummary | None:
        """The first non-empty summary among the reply's candidate objects, or None.

        Candidates: for each `</analysis>` from last to first, every ```json fence after it from last to first,
        then an object right after it, each kept only if it covers every later `</analysis>` (so a summary may
        quote the terminator); with no `</analysis>` the same over the whole text; finally an object at the start.
        """
        for data in _candidate_objects(text):
            summary = cls.from_dict(data)
            if not summary.is_empty:
                return summary
        return None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StructuredSummary:
        """Coerce a decoded object leniently: wrong shapes become text, blanks and nulls vanish."""
        return cls(
            decisions=_decisions(data.get("decisions")),
            constraints=_text_list(data.get("constraints")),
            user_intent=_text_list(data.get("user_intent")),
            technical_concepts=_text_list(data.get("technical_concepts")),
            files=_file_notes(data.get("files")),
            errors_and_fixes=_text_list(data.get("errors_and_fixes")),
            problem_solving=_text_list(data.get("problem_solving")),
            user_messages=_text_list(data.get("user_messages")),
            pending_tasks=_text_list(data.get("pending_tasks")),
            current_work=_text(data.get("current_work")),
            next_step=_text(data.get("next_step")),
            extra={key: value for key, value in data.items() if key not in FIELD_NAMES},
        )

    @property
    def is_empty(self) -> bool:
        return not any(getattr(self, name) for name in FIELD_NAMES)

    def to_fields(self) -> dict[str, Any]:
        """Template variables: the fields, `extra`, and each extra key that names no other variable."""
        known: dict[str, Any] = {name: list(getattr(self, name)) for name in LIST_FIELDS}
        known["decisions"] = [{"topic": d.topic, "current": d.current, "replaced": list(d.replaced), "said": d.said}
                              for d in self.decisions]
        known.update({name: getattr(self, name) for name in TEXT_FIELDS})
        known["files"] = [{key: getattr(note, key) for key in _FILE_KEYS} for note in self.files]
        known["extra"] = dict(self.extra)
        loose_extras = {key: value for key, value in self.extra.items() if key not in known}
        return {**loose_extras, **known}

    def render(self, template: str | None = None, templates: Templates | None = None) -> str:
        """Markdown for the summary message; `template` is custom template source, else the configured file."""
        if templates is None:
            templates = default_templates()
        if template is None:
            return templates.summary(self.to_fields())
        return templates.render_string(template, **self.to_fields())


def summary_text(reply: str, templates: Templates | None = None) -> str:
    """The rendered summary, or the raw reply verbatim when it cannot be parsed or rendered."""
    summary = StructuredSummary.parse(reply)
    rendered = rendered_text(summary, templates) if summary is not None else None
    return rendered if rendered is not None else reply


def rendered_text(summary: StructuredSummary, templates: Templates | None = None) -> str | None:
    """The summary rendered, or None when the template fails or renders nothing (the caller keeps its text)."""
    try:
        rendered = summary.render(templates=templates)
    # An override template is operator code and may raise anything; the caller's text loses nothing.
    except Exception as error:  # noqa: BLE001 - operator template code; the caller's text loses nothing
        log.warning("summary template failed (%s); keeping the text as written", type(error).__name__)
        return None
    return rendered if rendered.strip() else None


def _candidate_objects(text: str) -> Iterator[dict[str, Any]]:
    """Decoded candidate objects in the order the spec fixes (see `StructuredSummary.parse`), at most
    `MAX_DECODES` of them tried."""
    terminators = [match.start() for match in re.finditer(re.escape(_TERMINATOR), text)]
    fences = [match.start() for match in re.finditer(re.escape(_JSON_FENCE), text)]
    cuts = [start + len(_TERMINATOR) for start in terminators] or [0]
    openings: list[tuple[int, int]] = []  # (where an object may open, first terminator it must cover)
    # Fences past the next cut were already tried under it; they cannot cover that cut's terminator.
    for cut, next_cut in reversed(list(zip(cuts, [*cuts[1:], len(text) + 1], strict=True))):
        later = bisect_left(terminators, cut)
        region_fences = fences[bisect_left(fences, cut):bisect_left(fences, next_cut)]
        starts = [_object_start(text, fence + len(_JSON_FENCE)) for fence in reversed(region_fences)]
        starts.append(_object_start(text, cut))
        openings += [(start, later) for start in starts if start is not None]
        if len(openings) >= MAX_DECODES:
            break
    opening = _object_start(text, 0)
    if terminators and opening is not None:
        openings.append((opening, len(terminators)))
    for start, later in openings[:MAX_DECODES]:
        decoded = _decode_object(text, start)
        if decoded and _covers(start, decoded[1], terminators, later):
            yield decoded[0]


def _covers(start: int, end: int, terminators: list[int], first: int) -> bool:
    """A terminator after the cut (`terminators[first:]`) but outside the object means the object sat inside the
    analysis."""
    return first == len(terminators) or (start <= terminators[first] and terminators[-1] + len(_TERMINATOR) <= end)


def _object_start(text: str, position: int) -> int | None:
    """Where an object opens at `position`, allowing only whitespace before its brace."""
    while position < len(text) and text[position].isspace():
        position += 1
    return position if _OBJECT_OPENING.match(text, position) else None


def _decode_object(text: str, start: int) -> tuple[dict[str, Any], int] | None:
    """The object opening at `start` and where it ends, or None.

    The decoder balances the braces itself, skipping strings and escapes, so values may hold braces,
    backticks and fences; text that never closes (a truncated reply) fails and is never repaired. It also
    stops at the first error instead of scanning the rest of a long reply for a closing brace.
    """
    try:
        value, end = _DECODER.raw_decode(text, start)
    except (ValueError, RecursionError):
        return None
    return (value, end) if isinstance(value, dict) and _shallow(value) else None


def _shallow(value: Any) -> bool:
    """Whether a decoded object stays within MAX_DEPTH levels and MAX_ITEMS containers and values in all; anything
    bigger is no summary a model writes, and reading it (recursively, then rendering it) would cost without bound."""
    pending: list[tuple[dict[str, Any] | list[Any], int]] = [(value, 1)]
    seen = 1
    while pending:
        container, depth = pending.pop()
        children = list(container.values()) if isinstance(container, dict) else container
        seen += len(children)
        if depth > MAX_DEPTH or seen > MAX_ITEMS:
            return False
        pending += [(child, depth + 1) for child in children if isinstance(child, dict | list)]
    return True


def _text(value: Any) -> str | None:
    """Any JSON value as one stripped string; None when nothing is left."""
    if value is None:
        return None
    if isinstance(value, str):
        return value.strip() or None
    if isinstance(value, bool | int | float):
        return json.dumps(value)
    if isinstance(value, Mapping):
        pairs = (f"{str(key).strip()}: {text}" for key, item in value.items() if (text := _text(item)))
        return "; ".join(pairs) or None
    if isinstance(value, list):
        return "; ".join(text for item in value if (text := _text(item))) or None
    return str(value).strip() or None


def _text_list(value: Any) -> tuple[str, ...]:
    items = value if isinstance(value, list) else [value]
    return tuple(text for item in items if (text := _text(item)))


def _decisions(value: Any) -> tuple[Decision, ...]:
    entries = value if isinstance(value, list) else [value]
    return tuple(decision for entry in entries if (decision := _decision(entry)) is not None)


def _decision(entry: Any) -> Decision | None:
    """One decision: an object with its keys (or the names models use for them), or a bare text as its value."""
    if not isinstance(entry, Mapping):
        text = _text(entry)
        return Decision(None, text) if text else None
    current = next((text for key in _CURRENT_ALIASES if (text := _text(entry.get(key)))), None)
    decision = Decision(_single_line(_text(entry.get("topic"))), current, _text_list(entry.get("replaced")),
                        _text(entry.get("said")))
    return decision if decision.current or decision.replaced else None


def _file_notes(value: Any) -> tuple[FileNote, ...]:
    entries = value if isinstance(value, list) else [value]
    return tuple(note for entry in entries if (note := _file_note(entry)) is not None)


def _file_note(entry: Any) -> FileNote | None:
    if not isinstance(entry, Mapping):
        path = _single_line(_text(entry))
        return FileNote(path) if path else None
    path = _single_line(_text(entry.get("path")))
    # Keys the model invented for a file still describe it: fold them into the summary.
    other = {key: item for key, item in entry.items() if key not in _FILE_KEYS}
    summary = _text([entry.get("summary"), other])
    key_code = _code(entry.get("key_code"))
    if path is None and summary is None and key_code is None:
        return None
    return FileNote(path, summary, key_code)


def _code(value: Any) -> str | None:
    """Code keeps its indentation and inner blank lines; a list of lines is joined with newlines."""
    if isinstance(value, list):
        value = "\n".join(item if isinstance(item, str) else (_text(item) or "") for item in value)
    if not isinstance(value, str):
        return _text(value)
    return _LEADING_BLANK_LINES.sub("", value.rstrip()) or None


def _single_line(text: str | None) -> str | None:
    return _LINE_BREAK.sub(" ", text) if text else None
