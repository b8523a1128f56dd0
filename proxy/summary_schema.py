"""The JSON schema of the nine-field summary, built from proxy.summary's own field names for `response_format`."""

from __future__ import annotations

from dataclasses import MISSING, fields
from functools import cache
from typing import Any

from proxy.summary import FIELD_NAMES, LIST_FIELDS, TEXT_FIELDS, FileNote

SCHEMA_NAME = "conversation_summary"
_FILES = "files"


@cache
def summary_schema() -> dict[str, Any]:
    """The schema (shared: treat it as read-only). Lists are required, so a constrained model fills or empties
    each one rather than skipping it; the two optional strings may be left out, as the prompt allows."""
    return {"type": "object",
            "properties": {name: _field_schema(name) for name in FIELD_NAMES},
            "required": [name for name in FIELD_NAMES if name not in TEXT_FIELDS],
            "additionalProperties": False}


def _field_schema(name: str) -> dict[str, Any]:
    if name in LIST_FIELDS:
        return {"type": "array", "items": {"type": "string"}}
    if name in TEXT_FIELDS:
        return {"type": "string"}
    if name == _FILES:
        return {"type": "array", "items": _file_schema()}
    # A field added to proxy.summary must say here what shape it has; failing at import shows that at once.
    raise ValueError(f"summary field {name!r} has no schema")


def _file_schema() -> dict[str, Any]:
    """One FileNote: every field a string, those without a default required (the path)."""
    notes = fields(FileNote)
    return {"type": "object",
            "properties": {note.name: {"type": "string"} for note in notes},
            "required": [note.name for note in notes if note.default is MISSING and note.default_factory is MISSING],
            "additionalProperties": False}


summary_schema()  # at import: a summary field without a schema fails here, not at the first summary
