"""Sans-io server-sent events: split a byte stream into events without ever changing their bytes."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import orjson

# An event ends at the first blank line; servers mix \n, \r\n and \r line endings.
_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r|\n\r\n|\r\n\n")
_LINE_END = re.compile(r"\r\n|\n|\r")
# An event longer than this is handed on unparsed: no real event is near it, and parsing it would cost the loop.
MAX_PENDING_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class SseEvent:
    """One event: its exact bytes (terminator included) and its parsed fields, in order."""

    raw: bytes
    fields: tuple[tuple[str, str], ...]

    @property
    def event(self) -> str | None:
        return next((value for name, value in self.fields if name == "event"), None)

    @property
    def data(self) -> str | None:
        lines = [value for name, value in self.fields if name == "data"]
        return "\n".join(lines) if lines else None

    def field(self, name: str) -> str | None:
        lines = [value for field_name, value in self.fields if field_name == name]
        return "\n".join(lines) if lines else None

    def json(self) -> Any:
        """The data (or a non-standard `error:` field) decoded as JSON, or None. Never raises."""
        text = self.data if self.data is not None else self.field("error")
        if text is None or text.strip() in ("", "[DONE]"):
            return None
        try:
            return orjson.loads(text)  # a few times faster on the small chunks of a stream
        except orjson.JSONDecodeError:
            pass
        try:  # what orjson refuses (NaN, a lone surrogate, great depth) json may still read
            return json.loads(text)
        except (ValueError, RecursionError):  # an upstream's data is anything, nested to any depth
            return None


def parse_fields(block: bytes) -> tuple[tuple[str, str], ...]:
    text = block.decode("utf-8", errors="replace")
    fields = []
    for line in _LINE_END.split(text):
        if not line or line.startswith(":"):
            continue
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        fields.append((name, value if sep else ""))
    return tuple(fields)


class SseDecoder:
    """Feed bytes as they arrive; get back every event completed so far.

    Linear in the bytes fed: each byte is scanned for a terminator about once, and a chunk holding thousands of
    events is cut once, not once per event. An event that never ends is handed on whole (unparsed) once it passes
    `max_pending` bytes, so a hostile stream cannot grow the buffer without bound.
    """

    def __init__(self, max_pending: int = MAX_PENDING_BYTES) -> None:
        self._buffer = b""
        self._scanned = 0  # bytes of the buffer already searched for a terminator
        self._max_pending = max_pending

    @property
    def pending(self) -> bytes:
        return self._buffer

    def feed(self, chunk: bytes) -> list[SseEvent]:
        buffer = self._buffer + chunk if self._buffer else chunk
        events: list[SseEvent] = []
        start = 0
        # A terminator (at most 4 bytes) may straddle the previous chunk's end.
        for match in _EVENT_END.finditer(buffer, max(0, self._scanned - 3)):
            if match.start() < start:
                continue
            raw = buffer[start: match.end()]
            events.append(SseEvent(raw, parse_fields(buffer[start: match.start()])))
            start = match.end()
        rest = buffer[start:]
        if len(rest) > self._max_pending:
            events.append(SseEvent(rest, ()))
            rest = b""
        self._buffer, self._scanned = rest, len(rest)
        return events

    def flush(self) -> list[SseEvent]:
        """At end of stream: an unterminated last event still counts."""
        raw, self._buffer, self._scanned = self._buffer, b"", 0
        # Trailing blank lines are kept as a field-less event so no byte of the stream is lost.
        return [SseEvent(raw, parse_fields(raw))] if raw else []


def decode_all(body: bytes | str) -> list[SseEvent]:
    decoder = SseDecoder()
    data = body.encode() if isinstance(body, str) else body
    return decoder.feed(data) + decoder.flush()


def looks_like_sse(body: bytes | str) -> bool:
    head = (body.encode() if isinstance(body, str) else body).lstrip()[:64]
    return head.startswith((b"data:", b"event:", b"error:", b":", b"id:", b"retry:"))


def sse_event(event: dict[str, Any]) -> bytes:
    """One typed event as an API's stream frames it (`event:` naming its type, its JSON as `data:`)."""
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n".encode()


class EventWatcher:
    """A stream tap that passes every byte on unchanged and reads each event once it is whole: a dialect's usage
    and finish readers override `read`."""

    def __init__(self) -> None:
        self._decoder = SseDecoder()

    def feed(self, chunk: bytes) -> bytes:
        self.read(self._decoder.feed(chunk))
        return chunk

    def finish(self) -> bytes:
        self.read(self._decoder.flush())
        return b""

    def read(self, events: list[SseEvent]) -> None:
        raise NotImplementedError


def is_content_event(event: SseEvent) -> bool:
    """An event that carries model output, after which an error no longer means 'prompt too long'."""
    payload = event.json()
    if event.data is not None and event.data.strip() == "[DONE]":
        return True
    if not isinstance(payload, dict) or "error" in payload:
        return False
    choices = payload.get("choices")
    for choice in choices if isinstance(choices, list) else ():
        if not isinstance(choice, dict):
            continue  # hostile or malformed chunks are data, not a reason to crash
        delta = choice.get("delta") or choice.get("message") or {}
        if isinstance(delta, dict) and any(
                delta.get(key) for key in ("content", "tool_calls", "function_call", "refusal")):
            return True
        if choice.get("finish_reason") or choice.get("text"):
            return True
    kind = payload.get("type")  # not str(): a hostile value can be nested too deep to print
    return isinstance(kind, str) and (kind.endswith(".delta") or kind in _CONTENT_TYPES)


# Output in Anthropic's stream, and the end of an answer in both newer APIs (whose finish may still say overflow).
_CONTENT_TYPES = frozenset({"content_block_start", "content_block_delta", "message_delta", "response.completed",
                            "response.incomplete"})
# The Responses and Messages APIs open a stream with lifecycle events that carry no output yet (Anthropic's pings
# may come before any): an overflow error follows them.
PREAMBLE_TYPES = frozenset({"response.created", "response.in_progress", "response.queued", "message_start", "ping"})


def is_preamble_event(event: SseEvent) -> bool:
    """A lifecycle event before any output: waiting past it costs nothing, and an error may still follow."""
    payload = event.json()
    return isinstance(payload, dict) and payload.get("type") in PREAMBLE_TYPES


def is_error_event(event: SseEvent) -> bool:
    if event.event == "error" or event.field("error") is not None:
        return True
    payload = event.json()
    return isinstance(payload, dict) and ("error" in payload or payload.get("type") in ("error", "response.failed"))


def usage_of(payload: Any) -> dict[str, Any] | None:
    usage = payload.get("usage") if isinstance(payload, dict) else None
    return usage if isinstance(usage, dict) and usage else None


def finish_reasons(payload: Any) -> list[str]:
    """The finish reasons a chunk reports; anything malformed reports none."""
    choices = payload.get("choices") if isinstance(payload, dict) else None
    if not isinstance(choices, list):
        return []
    reasons = [choice.get("finish_reason") for choice in choices if isinstance(choice, dict)]
    return [reason for reason in reasons if isinstance(reason, str) and reason]


def is_usage_only_chunk(payload: Any) -> bool:
    """The extra chunk `stream_options.include_usage` adds: usage and no choices."""
    return isinstance(payload, dict) and usage_of(payload) is not None and not payload.get("choices")


class UsageTap:
    """Watches a chat stream for usage; hides the usage-only chunk from a client that did not ask for it.

    When nothing is hidden, chunks pass through untouched; otherwise whole events are passed on, bytes unchanged.
    """

    def __init__(self, *, hide_usage_chunk: bool) -> None:
        self.hide_usage_chunk = hide_usage_chunk
        self.usage: dict[str, Any] | None = None
        self.finish_reasons: list[str] = []
        self._decoder = SseDecoder()

    def feed(self, chunk: bytes) -> bytes:
        events = self._decoder.feed(chunk)
        kept = [event.raw for event in events if self._keep(event)]
        return b"".join(kept) if self.hide_usage_chunk else chunk

    def finish(self) -> bytes:
        leftover = [event.raw for event in self._decoder.flush() if self._keep(event)]
        return b"".join(leftover) if self.hide_usage_chunk else b""

    def _keep(self, event: SseEvent) -> bool:
        """Whether to pass the event on; total, since it runs after the 200 went out, when a raise cuts the stream."""
        payload = event.json()
        self.finish_reasons += finish_reasons(payload)
        if (usage := usage_of(payload)) is not None:
            self.usage = usage
            return not is_usage_only_chunk(payload)
        return True
