"""OpenAI chat messages → forgery-safe transcript records (one JSON object per line) for the summariser."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from proxy.core.messages import is_tool_result, role

# Reasoning is the model's scratch work: it is dropped from the transcript, never summarised.
_REASONING_PART_TYPES = frozenset({"thinking", "redacted_thinking", "reasoning", "reasoning_content"})

# json.dumps(ensure_ascii=False) leaves these as raw characters, yet str.splitlines() and some readers
# treat them as line breaks; escaping them keeps one message on exactly one line.
_LINE_BREAKS_JSON_KEEPS = {"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"}

INVALID_JSON = "<<invalid json>>"
NON_TEXT_CONTENT = "[non-text content]"


def format_transcript(messages: Iterable[Any]) -> str:
    """Every message as one record, records joined by newlines."""
    return "\n".join(format_message_for_compacting(message) for message in messages)


def format_message_for_compacting(message: Any) -> str:
    """One chat message as one line: `{"role": ..., "content": ...}` with every newline escaped.

    Because the record is a JSON object whose string values are escaped, no text inside a message can
    end its own record or start another role's turn.
    """
    if not isinstance(message, dict):
        return _record("unknown", _scalar_text(message), None)
    role_name = role(message) or "unknown"
    if is_tool_result(message):
        content = _tool_response(message.get("content"))
    else:
        content = _conversation_text(message)
    name = message.get("name")
    return _record(role_name, content, name if isinstance(name, str) and name else None)


def _record(role_name: str, content: str, name: str | None) -> str:
    record: dict[str, str] = {"role": role_name}
    if name is not None:
        record["name"] = name
    record["content"] = content
    line = json.dumps(record, ensure_ascii=False)
    for raw, escaped in _LINE_BREAKS_JSON_KEEPS.items():
        if raw in line:
            line = line.replace(raw, escaped)
    return line


def _conversation_text(message: dict[str, Any]) -> str:
    pieces = list(_content_pieces(message.get("content")))
    refusal = message.get("refusal")
    if isinstance(refusal, str) and refusal:
        pieces.append(f"refusal: {refusal}")
    tool_calls = message.get("tool_calls")
    if isinstance(tool_calls, list):
        pieces.extend(_tool_request(call) for call in tool_calls)
    function_call = message.get("function_call")
    if isinstance(function_call, dict):
        pieces.append(_function_request(function_call))
    return "\n".join(pieces)


def _tool_response(content: Any) -> str:
    text = "\n".join(_content_pieces(content, text_only=True))
    return f"tool_response: {text if text.strip() else NON_TEXT_CONTENT}"


def _content_pieces(content: Any, *, text_only: bool = False) -> Iterable[str]:
    """The readable pieces of a message's content, whatever shape the client sent."""
    if content is None:
        return
    if isinstance(content, str):
        if content:
            yield content
        return
    parts = content if isinstance(content, list) else [content]
    for part in parts:
        piece = _part_text(part, text_only=text_only)
        if piece:
            yield piece


def _part_text(part: Any, *, text_only: bool) -> str | None:
    if part is None:
        return None
    if not isinstance(part, dict):
        return _scalar_text(part)
    kind = part.get("type")
    if isinstance(kind, str) and kind in _REASONING_PART_TYPES:  # a client may send any JSON as a part's type
        return None
    text = part.get("text")
    if isinstance(text, str):
        return text
    if kind == "text":
        return None
    if kind == "refusal":
        refusal = part.get("refusal")
        return f"refusal: {refusal}" if isinstance(refusal, str) else None
    if text_only:
        return None
    return _attachment_label(kind, part)


def _attachment_label(kind: Any, part: dict[str, Any]) -> str:
    if kind == "image_url":
        return f"[image: {_image_kind(part.get('image_url'))}]"
    if kind == "input_audio":
        audio = part.get("input_audio")
        audio_format = audio.get("format") if isinstance(audio, dict) else None
        return f"[audio: {audio_format if isinstance(audio_format, str) and audio_format else 'unknown'}]"
    if kind == "file":
        return _document_label(part.get("file"))
    return f"[{kind if isinstance(kind, str) and kind else 'unknown'} content]"


def _image_kind(image: Any) -> str:
    url = image.get("url") if isinstance(image, dict) else image
    return _data_url_mime(url) or "url"


def _document_label(file: Any) -> str:
    details = file if isinstance(file, dict) else {}
    name = details.get("filename") or details.get("file_id") or "unnamed"
    mime = _data_url_mime(details.get("file_data")) or "unknown"
    return f"[document: {name} ({mime})]"


def _data_url_mime(url: Any) -> str | None:
    """`data:image/png;base64,...` → `image/png`; anything else → None."""
    if not isinstance(url, str) or not url.startswith("data:"):
        return None
    header = url[5:].split(",", 1)[0]
    mime = header.split(";", 1)[0].strip()
    return mime or None


def _tool_request(call: Any) -> str:
    if not isinstance(call, dict):
        return f"tool_request(unknown): {INVALID_JSON}"
    function = call.get("function")
    if isinstance(function, dict):
        return _function_request(function)
    custom = call.get("custom")
    if isinstance(custom, dict):
        # Custom tools take free-form text input rather than JSON arguments.
        name = _call_name(custom.get("name"))
        return f"tool_request({name}): {json.dumps(_scalar_text(custom.get('input')), ensure_ascii=False)}"
    return f"tool_request(unknown): {INVALID_JSON}"


def _function_request(function: dict[str, Any]) -> str:
    return f"tool_request({_call_name(function.get('name'))}): {compact_arguments(function.get('arguments'))}"


def _call_name(name: Any) -> str:
    return name if isinstance(name, str) and name else "unknown"


def compact_arguments(arguments: Any) -> str:
    """Tool-call arguments re-dumped as compact JSON; text that does not parse → `<<invalid json>>`."""
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        return "{}"
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):  # a string's own nesting is not bounded by the body's
            return INVALID_JSON
    try:
        return json.dumps(arguments, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        return INVALID_JSON


def _scalar_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)
