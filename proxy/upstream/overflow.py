"""Recognise upstream answers that mean "the prompt did not fit the model's context window"."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from proxy.upstream import streaming as sse

# Error bodies are a few KiB; a huge one is judged on its head so the check stays cheap on every response.
_SCAN_LIMIT = 64 * 1024
# Hostile bodies may nest deeply or fan out widely; real error envelopes need a handful of levels.
_MAX_DEPTH = 32
_MAX_NODES = 4096

_OVERFLOW_CODES = frozenset({
    "context_length_exceeded", "exceed_context_size_error", "model_context_window_exceeded",
    "model_max_prompt_tokens_exceeded",
})
# Codes of look-alike failures: compacting would not fix them, or would loop. Generic codes ("invalid_request_error",
# "invalid_parameter_error", 400, "1261") are neutral: the message text decides.
_LOOKALIKE_CODES = frozenset({
    "rate_limit_exceeded", "rate_limit_error", "insufficient_quota", "resource_exhausted",
    "content_filter", "content_policy_violation", "overloaded_error", "request_too_large",
    "string_above_max_length", "data_inspection_failed",
})
_OVERFLOW_FINISH_REASONS = frozenset({"model_context_window_exceeded"})
# What answer_may_overflow looks for: a record's "error" key (as overflow_in_answer reads it, case and all), and,
# lower-cased, each finish reason and what marks an event-stream frame (_EVENT_STREAM_KIND).
_ERROR_KEY = b'"error"'
_MAY_OVERFLOW = (*(reason.encode() for reason in _OVERFLOW_FINISH_REASONS), b":message-type", b":exception-type")
# Keys whose values carry a type or code (compared exactly) versus human-readable text (searched).
_CODE_KEYS = frozenset({"code", "type", "type_", "error_type", "status", "reason"})
_MESSAGE_KEYS = frozenset({
    "message", "error", "raw", "detail", "details", "msg", "error_message", "status_msg",
})
# AWS event-stream frames (not SSE) name their kind in binary headers; the payload JSON stays readable.
_EVENT_STREAM_KIND = re.compile(r":message-type[^a-z0-9]{0,4}(event|exception)|:exception-type", re.IGNORECASE)
_NOT_JSON = object()


# The grammar. A message means overflow when an input-side SUBJECT stands in a COMPARISON to a LIMIT ("prompt is too
# long", "input token count exceeds the maximum number of tokens allowed"), or when the WINDOW itself is compared
# ("context size has been exceeded"). Clauses about the output budget alone are set aside first: "max_tokens is too
# large" must not count, while "`inputs` tokens + `max_new_tokens` must be <= 8192" still does.
# Patterns run on lower-cased text, and each alternative opens with plain text (no \b, no group): the regex engine
# then skips ahead by first character, several times faster than case-insensitive or assertion-first patterns.
def _any_of(*alternatives: str) -> re.Pattern[str]:
    return re.compile("|".join(alternatives))


_SUBJECT = _any_of(
    "prompt", "input", "message", "conversation", "token count", "number of tokens", "too many tokens",
)
# "request" names the input only when the text counts tokens ("your request exceeded model token limit"); alone it is
# as often a byte-size refusal ("request exceeds the limit of 32 mb").
_WEAK_SUBJECT = _any_of("request", "body")
_TOKENS = re.compile("token")
_OUTPUT = _any_of(
    "max_tokens", "max_new_tokens", "max_completion_tokens", "max_output_tokens", "maxoutputtokens", "max_gen_len",
    "max tokens", "maximum tokens", "output tokens", "completion tokens",
)
_COMPARISON = _any_of(
    "exceed", "too long", "too large", "too big", "too many", "greater than", "longer than", "larger than",
    "more than", "less than", r"<= ?\d", r" >=? ?(?:\d|n_ctx)", r"should be \[", r" is only\b", r" of only\b",
    "not enough", "overflow", "out of range", "reduce the length of",
)
# These carry their own limit: "prompt is too long", "please reduce the length of the messages" need nothing more.
_IMPLIED_LIMIT = _any_of("too long", "too large", "too big", "reduce the length of")
_LIMIT = _any_of(r"max(?![_a-z])", "maximum", "limit", "allowed", r"\[1, ?\d")
_WINDOW = _any_of(
    r"context[ _-]?(?:length|window|size|limit)", "n_ctx", "max_model_len", "max_seq_len",
    "maximum (?:model|sequence|input|prompt) length",
)
# Quota, rate, policy and field-size answers borrow overflow vocabulary ("reduce the prompt", "too many tokens").
_LOOKALIKE_TEXT = _any_of(
    "tokens per min", "per[ -]minute", "per day", r"\(tpm\)", "rate[ _-]?limit", "quota", "please wait", "throttl",
    "too many requests", "content (?:management )?polic", "content[ _]filter", "inappropriate content", "overloaded",
    "string (?:too long|value length)",
)
# A limit in characters or bytes guards the payload, not the token window.
_NON_TOKEN_UNIT = re.compile(r"\d ?(?:characters?|chars?|bytes?|[kmg]i?b)\b")
# TGI prefixes every validation failure with this; the word "input" in it names no subject.
_NOISE = "input validation error"
_CLAUSE_END = re.compile(r"[.;!?](?:\s+|$)|\n")

# Numbers: the window a text states, and the counts it says were requested. A whole number of at most 15 characters
# (int() refuses thousands of digits), not one in a unit other than tokens ("32 mb", "32000 characters").
_N = r"(\d(?:[\d,]{0,13}\d)?)(?![\d,]*\d)(?! ?(?:characters?|chars?|bytes?|[kmg]i?b)\b)"
_LIMIT_NOUN = (
    r"context[ _-]?(?:length|window|size|limit)|n_ctx|max_model_len|max_seq_len|maximum number of tokens allowed"
    r"|maximum (?:model|sequence|input|prompt) length|limit|max length|maximum length|max size|maximum size"
)
_STATED_LIMIT = _any_of(
    rf"context limit: \d+ \+ \d+ > {_N}",  # "input length and max_tokens exceed context limit: a + b > window"
    rf"> {_N} maximum",  # "prompt is too long: 211180 tokens > 200000 maximum"
    rf"with {_N} maximum context length",
    rf"should be \[1, ?{_N}\]",  # "range of input length should be [1, 30720]"
    rf"(?:{_LIMIT_NOUN})(?: is| of| was)?(?: only)?(?: of)?:? ?\(?{_N}",
)
# A bare bound names the limit only where the text counts an input: "`inputs` must have less than 4096 tokens", not
# "temperature must be <= 2".
_BOUND = re.compile(rf"(?:cannot exceed|must have less than|must be less than|must be <=) ?{_N}")
_REQUESTED = re.compile(
    rf"(?:requested|resulted in|contains|has|current length is|total of):?(?: about| at least| over)? {_N}",
)


def _input_text(message: str) -> str:
    """A lower-cased message without the clauses that speak only of the output budget."""
    message = message.replace(_NOISE, "")
    if not _OUTPUT.search(message):
        return message
    clauses = _CLAUSE_END.split(message)
    return "\n".join(clause for clause in clauses if not _OUTPUT.search(clause) or _SUBJECT.search(clause))


def _is_lookalike(message: str) -> bool:
    return bool(_LOOKALIKE_TEXT.search(message) or _NON_TOKEN_UNIT.search(message))


def _names_input(text: str) -> bool:
    return bool(_SUBJECT.search(text) or (_WEAK_SUBJECT.search(text) and _TOKENS.search(text)))


def _stated_limit(text: str) -> int | None:
    """The window an input text names; a bare bound ("must be <= N") only where it counts an input in tokens."""
    match = _STATED_LIMIT.search(text)
    bound = _BOUND.search(text)
    if bound and (match is None or bound.start() < match.start()) and _names_input(text) and _TOKENS.search(text):
        match = bound
    if match is None:
        return None
    return int(next(group for group in match.groups() if group).replace(",", ""))


def _counts(text: str) -> tuple[int | None, int | None]:
    requested = [int(match.group(1).replace(",", "")) for match in _REQUESTED.finditer(text)]
    return (max(requested) if requested else None), _stated_limit(text)


def _requested_and_limit(message: str) -> tuple[int | None, int | None]:
    """The largest count a lower-cased message says was requested, and the window it states (either may be absent)."""
    return _counts(_input_text(message))


def _message_says_overflow(message: str) -> bool:
    """The grammar's verdict on one lower-cased message; look-alike vocabulary is ruled out by the caller."""
    text = _input_text(message)
    if not _COMPARISON.search(text):
        # "maximum context length is 8192 tokens. however, you requested 9000 tokens": the numbers are the comparison.
        requested, limit = _counts(text)
        if requested is None or limit is None or requested <= limit:
            return False
    if _WINDOW.search(text):
        return True
    limited = _LIMIT.search(text) or _IMPLIED_LIMIT.search(text) or (_BOUND.search(text) and _TOKENS.search(text))
    return bool(limited) and _names_input(text)


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
        if self.codes & _LOOKALIKE_CODES or any(_is_lookalike(text) for text in self.messages):
            return False
        return any(_message_says_overflow(text) for text in self.messages)

    def window(self) -> int | None:
        """llama.cpp's n_ctx, else the first window a message states; a look-alike's numbers are no window."""
        for _prompt, window in self.token_counts:
            if window > 0:
                return window
        if self.codes & _LOOKALIKE_CODES:
            return None
        for message in self.messages:
            limit = None if _is_lookalike(message) else _stated_limit(_input_text(message))
            if limit is not None:
                return limit or None
        return None


def detect_context_overflow(status: int, body: bytes | str) -> bool:
    """True when the upstream answer means the prompt (plus requested output) exceeded the context window."""
    if status == 429:
        # A quota answer: waiting or a smaller request fixes it, whatever its text says.
        return False
    raw, text = _clip(body)
    if sse.looks_like_sse(raw):
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
    if sse.looks_like_sse(raw):
        found = _Findings()
        for event in sse.decode_all(raw):
            if sse.is_error_event(event):
                _collect_event(event, found)
    else:
        found = _findings_of_text(text)
    return found.window()


def _clip(body: bytes | str) -> tuple[bytes, str]:
    if isinstance(body, str):
        raw = body[:_SCAN_LIMIT].encode("utf-8", "replace")
    else:
        raw = bytes(body[:_SCAN_LIMIT])
    return raw, raw.decode("utf-8", "replace")


def _stream_verdict(raw: bytes) -> bool | None:
    """Decided by the first error-or-content event; lifecycle events before it do not count."""
    for event in sse.decode_all(raw):
        if sse.is_error_event(event):
            found = _Findings()
            _collect_event(event, found)
            return found.says_overflow()
        if sse.is_content_event(event):
            # An error after output is a mid-generation failure, but a first chunk may still end the
            # answer with a window-exceeded finish reason.
            return overflow_finish(event.json())
    return None


def _success_verdict(text: str) -> bool:
    payload = _loads(text)
    if payload is not _NOT_JSON:
        return overflow_in_answer(payload)
    frame = _EVENT_STREAM_KIND.search(text)
    if frame is None or (frame.group(1) and frame.group(1).lower() == "event"):
        return False
    return _findings_of_text(text[frame.end():]).says_overflow()


def overflow_in_answer(payload: Any) -> bool:
    """Whether a successful answer, already decoded, is an overflow: an error record or an overflow finish."""
    records = payload if isinstance(payload, list) else [payload]
    for record in records:
        if isinstance(record, dict) and record.get("error"):
            found = _Findings()
            _collect(record, found, 0, is_message=True)
            return found.says_overflow()
        if overflow_finish(record):
            return True
    return False


def answer_may_overflow(body: bytes) -> bool:
    """False only when a successful answer's bytes cannot hold an overflow as detect_context_overflow and
    overflow_in_answer read one: no "error" key, no overflow finish reason in any case, no event-stream frame, and
    no \\u escape that could spell any of them. Almost no successful answer is an overflow; this spares decoding
    one to find that out."""
    if _ERROR_KEY in body or b"\\u" in body:
        return True
    lowered = body.lower()
    for mark in _MAY_OVERFLOW:  # a loop, not a generator: every relayed answer is looked at
        if mark in lowered:
            return True
    return False


def overflow_finish(payload: Any) -> bool:
    """A finish that says the window ran out: a chat choice's `finish_reason`, a response's (Responses API, whole
    or in a stream's closing event) `incomplete_details.reason`, a message's (Messages API, whole or in a stream's
    `message_delta`) `stop_reason`."""
    if not isinstance(payload, dict):
        return False
    if not isinstance(payload.get("choices"), list):
        response, delta = payload.get("response", payload), payload.get("delta")
        details = response.get("incomplete_details") if isinstance(response, dict) else None
        reasons = [details.get("reason") if isinstance(details, dict) else None, payload.get("stop_reason"),
                   delta.get("stop_reason") if isinstance(delta, dict) else None]
        return any(isinstance(reason, str) and reason.lower() in _OVERFLOW_FINISH_REASONS for reason in reasons)
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


def _collect_event(event: sse.SseEvent, found: _Findings) -> None:
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


def _is_count(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _loads(text: str) -> Any:
    """The decoded JSON value, or _NOT_JSON; only texts that open like an object, array or string."""
    if text.lstrip()[:1] not in ("{", "[", '"'):
        return _NOT_JSON
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return _NOT_JSON
