"""The JSON schema of the structured summary, built from proxy.summary's own field names for `response_format`."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from functools import cache
from typing import Any

from proxy.summarizer.summary import FIELD_NAMES, LIST_FIELDS, TEXT_FIELDS, FileNote

SCHEMA_NAME = "conversation_summary"
_FILES = "files"
_DECISIONS = "decisions"


CHARS_PER_TOKEN = 3         # a cautious average for paths, numbers and prose: bounds are meant to hold
FIELD_KEYS_TOKENS = 70      # the eleven keys, the braces and the separators between fields
STRING_OVERHEAD_TOKENS = 3  # the quotes and the comma around each string
FILE_KEYS_TOKENS = 12       # the keys and braces of one file entry
DECISION_KEYS_TOKENS = 14   # the keys and braces of one decision
MAX_REPLACED = 2            # replaced values kept per decision: the latest ones matter
DECISION_STRINGS = 3 + MAX_REPLACED  # topic, current, said, and the replaced values
MIN_STRING_CHARS = 80       # items are given up before strings shrink below this (while more than one item fits)
MAX_LIST_ITEMS = 8


@dataclass(frozen=True)
class Bounds:
    """Most items per list and characters per string: with every one filled, the reply still fits its limit."""

    items: int
    chars: int


def schema_bounds(limit: int) -> Bounds:
    """Bounds under which a grammar-constrained reply (llama.cpp enforces maxItems and maxLength) must end within
    `limit` tokens: a weak model that loops inside a list or a string is stopped by the grammar, not cut off.
    As many items per list as leave strings of MIN_STRING_CHARS; one item with shorter strings if none do."""
    # strings added by one more item in every list
    per_item = len(LIST_FIELDS) + len(fields(FileNote)) + DECISION_STRINGS
    for items in range(MAX_LIST_ITEMS, 0, -1):
        slots = items * per_item + len(TEXT_FIELDS)
        room = limit - FIELD_KEYS_TOKENS - STRING_OVERHEAD_TOKENS * slots - \
            (FILE_KEYS_TOKENS + DECISION_KEYS_TOKENS) * items
        chars = room * CHARS_PER_TOKEN // slots
        if chars >= MIN_STRING_CHARS or items == 1:
            return Bounds(items, max(1, chars))
    raise AssertionError("unreachable: the loop ends at one item")


@cache
def summary_schema(limit: int | None = None) -> dict[str, Any]:
    """The schema (shared: treat it as read-only), bounded to fit `limit` output tokens when given. Lists are
    required, so a constrained model fills or empties each one rather than skipping it; the two optional strings
    may be left out, as the prompt allows."""
    bounds = schema_bounds(limit) if limit else None
    return {"type": "object",
            "properties": {name: _field_schema(name, bounds) for name in FIELD_NAMES},
            "required": [name for name in FIELD_NAMES if name not in TEXT_FIELDS],
            "additionalProperties": False}


def _string(bounds: Bounds | None) -> dict[str, Any]:
    return {"type": "string"} if bounds is None else {"type": "string", "maxLength": bounds.chars}


def _array(items: dict[str, Any], bounds: Bounds | None) -> dict[str, Any]:
    return {"type": "array", "items": items, **({} if bounds is None else {"maxItems": bounds.items})}


def _field_schema(name: str, bounds: Bounds | None = None) -> dict[str, Any]:
    if name in LIST_FIELDS:
        return _array(_string(bounds), bounds)
    if name in TEXT_FIELDS:
        return _string(bounds)
    if name == _FILES:
        return _array(_file_schema(bounds), bounds)
    if name == _DECISIONS:
        return _array(_decision_schema(bounds), bounds)
    # A field added to proxy.summary must say here what shape it has; failing at import shows that at once.
    raise ValueError(f"summary field {name!r} has no schema")


def _file_schema(bounds: Bounds | None) -> dict[str, Any]:
    """One FileNote: every field a string, those without a default required (the path)."""
    notes = fields(FileNote)
    return {"type": "object",
            "properties": {note.name: _string(bounds) for note in notes},
            "required": [note.name for note in notes if note.default is MISSING and note.default_factory is MISSING],
            "additionalProperties": False}


def _decision_schema(bounds: Bounds | None) -> dict[str, Any]:
    """One Decision: its topic and current value required, what it replaced and the user's words optional."""
    return {"type": "object",
            "properties": {"topic": _string(bounds), "current": _string(bounds),
                           "replaced": {**_array(_string(bounds), bounds), "maxItems": MAX_REPLACED},
                           "said": _string(bounds)},
            "required": ["topic", "current"], "additionalProperties": False}


summary_schema()  # at import: a summary field without a schema fails here, not at the first summary

