"""Recognise upstream answers that mean "the prompt did not fit the model's context window"."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from proxy.streaming import SseEvent, decode_all, is_content_event, is_error_event, looks_like_sse

# Error bodies are a few KiB; a huge one is judged on its head so the check stays cheap on every response.
_SCAN_LIMIT = 256 * 1024
# Hostile bodies may nest deeply or fan out widely; real error envelopes need a handful of levels.
_MAX_DEPTH = 32
_MAX_NODES = 4096

_OVERFLOW_CODES = frozenset({
    "context_length_exceeded", "exceed_context_size_error", "model_context_window_exceeded",
})
# Codes of look-alike failures: compacting would not fix them, or would loop.
_LOOKALIKE_CODES = frozenset({
    "rate_limit_exceeded", "rate_limit_error", "insufficient_quota", "resource_exhausted",
    "content_filter", "content_policy_violation", "overloaded_error", "request_too_large",
})
_OVERFLOW_FINISH_REASONS = frozenset({"model_context_window_exceeded"})
# Keys whose values carry a type or code (compared exactly) versus human-readable text (searched).
_CODE_KEYS = frozenset({"code", "type", "type_", "error_type", "status", "reason"})
_MESSAGE_KEYS = frozenset({
    "message", "error", "raw", "detail", "details", "msg", "error_message", "status_msg",
})

# Patterns run on lower-cased text: case-insensitive alternations are an order of magnitude slower.
_OVERFLOW_TEXT = re.compile(
    r"maximum context length|context (?:length|window|limit)|available context size"
    r"|prompt is too long|input is too long|reduce the length of the messages"
    r"|input length\b.{0,80}\bexceed|tokens \+ `?max_new_tokens`? must be <="
    r"|input token count\b.{0,40}\bexceeds the maximum number of tokens"
    r"|longer than the maximum model length|maximum prompt length"
    r"|prompt token count\b.{0,40}\bexceeds the limit|exceeded model token limit"
    r"|context_length_exceeded|model_context_window_exceeded",
    re.DOTALL,
)
# Quota, rate and policy answers sometimes borrow overflow vocabulary ("reduce", "tokens", "limit").
_LOOKALIKE_TEXT = re.compile(
    r"tokens per min|per[ -]minute|\(tpm\)|rate[ _-]?limit|quota"
    r"|content (?:management )?polic|content[ _]filter|overloaded",
)
_NUMBER = r"(\d[\d,]*\d|\d)"
_LIMIT_TEXT = re.compile(
    "|".join((
        rf"maximum context length(?: is|:)? {_NUMBER}",
        rf"with {_NUMBER} maximum context length",
        rf"context length is only {_NUMBER}",
        rf"context length of only {_NUMBER}",
        rf"context length \({_NUMBER} tokens\)",
        rf"context size \({_NUMBER} tokens\)",
        rf"maximum model length of {_NUMBER}",
        rf"maximum prompt length is {_NUMBER}",
        rf"max_new_tokens`? must be <= {_NUMBER}",
        rf"maximum number of tokens allowed \({_NUMBER}\)",
        rf"> {_NUMBER} maximum",
        rf"exceed context limit: \d+ \+ \d+ > {_NUMBER}",
        rf"n_ctx: {_NUMBER}",
        rf"token count of \d+ exceeds the limit of {_NUMBER}",
        rf"model token limit:? {_NUMBER}",
    )),
)
# AWS event-stream frames (not SSE) name their kind in binary headers; the payload JSON stays readable.
_EVENT_STREAM_KIND = re.compile(r":message-type[^a-z0-9]{0,4}(event|exception)|:exception-type", re.IGNORECASE)
_NOT_JSON = object()


@dataclass
class _Findings:
    """What an error body says, gathered from every envelope layer (nested JSON strings included)."""

    codes: set[str] = field(default_factory=set)
    messages: list[str] = field(default_factory=list)  # lower-cased
    token_counts: list[tuple[int, int]] = field(default_factory=list)  # (n_prompt_tokens, n_ctx)
    nodes: int = 0

    def add_message(self, text: str) -> None:
        self.messages.append(text.lower())

    def says_overflow(self) -> bool:
        if self.codes & _OVERFLOW_CODES:
            return True
        if any(prompt > window > 0 for prompt, window in self.token_counts):
            return True
        if self.codes & _LOOKALIKE_CODES or any(_LOOKALIKE_TEXT.search(text) for text in self.messages):
            return False
        return any(_OVERFLOW_TEXT.search(text) for text in self.messages)


def detect_context_overflow(status: int, body: bytes | str) -> bool:
    """True when the upstream answer means the prompt (plus requested output) exceeded the context window."""
    if status == 429:
        # A quota answer: waiting or a smaller request fixes it, whatever its text says.
        return False
    raw, text = _clip(body)
    if looks_like_sse(raw):
        verdict = _stream_verdict(raw)
        if verdict is not None:
            return verdict
    if 200 <= status < 300:
        return _success_verdict(text)
    if not text.strip():
        # Some hosted servers answer an oversized prompt with a bare 400 and no body at all; other
        # statuses without a body (500, 502, 413 from intermediaries) say nothing about the window.
        return status == 400
    return _findings_of_text(text).says_overflow()


def context_limit_from_error(body: bytes | str) -> int | None:
    """The context window size an overflow error names, or None when it names none."""
    raw, text = _clip(body)
    if looks_like_sse(raw):
        found = _Findings()
        for event in decode_all(raw):
            if is_error_event(event):
                _collect_event(event, found)
    else:
        found = _findings_of_text(text)
    for _prompt, window in found.token_counts:
        if window > 0:
            return window
    for message in found.messages:
        match = _LIMIT_TEXT.search(message)
        if match:
            number = next(group for group in match.groups() if group)
            return int(number.replace(",", "")) or None
    return None


def _clip(body: bytes | str) -> tuple[bytes, str]:
    if isinstance(body, str):
        raw = body[:_SCAN_LIMIT].encode("utf-8", "replace")
    else:
        raw = bytes(body[:_SCAN_LIMIT])
    return raw, raw.decode("utf-8", "replace")


def _stream_verdict(raw: bytes) -> bool | None:
    """Decided by the first error-or-content event; lifecycle events before it do not count."""
    for event in decode_all(raw):
        if is_error_event(event):
            found = _Findings()
            _collect_event(event, found)
            return found.says_overflow()
        if is_content_event(event):
            # An error after output is a mid-generation failure, but a first chunk may still end the
            # answer with a window-exceeded finish reason.
            return _has_overflow_finish(event.json())
    return None


def _success_verdict(text: str) -> bool:
    payload = _loads(text)
    if payload is not _NOT_JSON:
        records = payload if isinstance(payload, list) else [payload]
        for record in records:
            if isinstance(record, dict) and record.get("error"):
                found = _Findings()
                _collect(record, found, 0, is_message=True)
                return found.says_overflow()
            if _has_overflow_finish(record):
                return True
        return False
    frame = _EVENT_STREAM_KIND.search(text)
    if frame is None or frame.group(1) and frame.group(1).lower() == "event":
        return False
    return _findings_of_text(text[frame.end():]).says_overflow()


def _has_overflow_finish(payload: Any) -> bool:
    if not isinstance(payload, dict) or not isinstance(payload.get("choices"), list):
        return False
    return any(
        isinstance(choice, dict) and str(choice.get("finish_reason")).lower() in _OVERFLOW_FINISH_REASONS
        for choice in payload["choices"]
    )


def _findings_of_text(text: str) -> _Findings:
    found = _Findings()
    payload = _loads(text)
    if payload is _NOT_JSON:
        found.add_message(text)
    else:
        _collect(payload, found, 0, is_message=True)
    return found


def _collect_event(event: SseEvent, found: _Findings) -> None:
    payload = event.json()
    if payload is None:
        # A non-JSON error event (e.g. `event: error` with plain text) is its own message.
        found.add_message(event.data or event.field("error") or "")
    else:
        _collect(payload, found, 0, is_message=True)


def _collect(value: Any, found: _Findings, depth: int, *, is_message: bool) -> None:
    found.nodes += 1
    if depth > _MAX_DEPTH or found.nodes > _MAX_NODES:
        return
    if isinstance(value, dict):
        _collect_record(value, found, depth)
    elif isinstance(value, list):
        for item in value:
            _collect(item, found, depth + 1, is_message=is_message)
    elif isinstance(value, str) and is_message:
        nested = _loads(value)
        if nested is _NOT_JSON:
            found.add_message(value)
        else:
            # Gateways relay the upstream's whole JSON error as a string inside their own message.
            _collect(nested, found, depth + 1, is_message=True)


def _collect_record(record: dict[Any, Any], found: _Findings, depth: int) -> None:
    for key, item in record.items():
        name = str(key).lower()
        if name in _CODE_KEYS and isinstance(item, str):
            found.codes.add(item.strip().lower())
        elif isinstance(item, (dict, list, str)):
            _collect(item, found, depth + 1, is_message=name in _MESSAGE_KEYS)
    prompt_tokens, window = record.get("n_prompt_tokens"), record.get("n_ctx")
    if _is_count(prompt_tokens) and _is_count(window):
        found.token_counts.append((prompt_tokens, window))


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _loads(text: str) -> Any:
    """The decoded JSON value, or _NOT_JSON; only texts that open like an object, array or string."""
    if text.lstrip()[:1] not in ("{", "[", '"'):
        return _NOT_JSON
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return _NOT_JSON
