"""The request being served: its id, and what code serving it notes for its log line (a ContextVar, no aiohttp)."""

from __future__ import annotations

from contextvars import ContextVar, Token
from dataclasses import dataclass

MAX_MODEL = 128


@dataclass
class Notes:
    """One request's id and what only its handlers know; closed once its log line is written."""

    request_id: str
    model: str | None = None
    upstream_status: int | None = None
    closed: bool = False


# The notes of the request this task serves. Tasks copy it, so a background summary started by a request logs that
# request's id; the request ends, the id stays right.
_current: ContextVar[Notes | None] = ContextVar("request_notes", default=None)


def enter(notes: Notes) -> Token[Notes | None]:
    """Serve a request under `notes` from here on (in this task and the tasks it starts)."""
    return _current.set(notes)


def leave(token: Token[Notes | None]) -> None:
    _current.reset(token)


def current_request_id() -> str | None:
    """The id of the request being served here, for other log lines; None outside a request."""
    notes = _current.get()
    return notes.request_id if notes is not None else None


def annotate(*, model: str | None = None, upstream_status: int | None = None) -> None:
    """Add what only a handler knows (the model asked for, the upstream's status) to this request's log line."""
    notes = _current.get()
    if notes is None or notes.closed:
        return
    if model is not None:
        notes.model = model[:MAX_MODEL]
    if upstream_status is not None:
        notes.upstream_status = upstream_status
