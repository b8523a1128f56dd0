"""The OpenAI chat message shape: roles, content parts, tool calls and the legacy `function` role, read totally."""

from __future__ import annotations

import re
from typing import Any

Message = dict[str, Any]
# A surrogate code point on its own: JSON's `\ud800` escape makes one, and no UTF-8 encoder takes it.
_SURROGATE = re.compile("[\ud800-\udfff]")

# Messages that instruct rather than converse: never summarised away.
INSTRUCTION_ROLES = frozenset({"system", "developer"})
# A tool's answer: `tool` today, `function` in the legacy function-calling shape.
TOOL_RESULT_ROLES = frozenset({"tool", "function"})
# Reasoning a provider attached to an assistant turn: not conversation text, but kept verbatim where sent.
REASONING_KEYS = ("reasoning_content", "reasoning", "thinking")


def role(message: Any) -> str | None:
    """The message's role, or None for anything that is not a message with a string role."""
    value = message.get("role") if isinstance(message, dict) else None
    return value if isinstance(value, str) else None


def is_instruction(message: Any) -> bool:
    return role(message) in INSTRUCTION_ROLES


def is_user(message: Any) -> bool:
    return role(message) == "user"


def is_tool_result(message: Any) -> bool:
    return role(message) in TOOL_RESULT_ROLES


def call_ids(message: Any) -> list[Any] | None:
    """The ids of an assistant message's tool calls, or None when it makes none (absent, null or empty)."""
    if role(message) != "assistant":
        return None
    calls = message.get("tool_calls")
    if not isinstance(calls, list) or not calls:
        return None
    return [call.get("id") if isinstance(call, dict) else None for call in calls]


def makes_tool_calls(message: Any) -> bool:
    return call_ids(message) is not None


def answered_call_id(message: Any) -> str | None:
    """The tool call a `tool` message answers (legacy `function` results carry none)."""
    if role(message) != "tool":
        return None
    value = message.get("tool_call_id")
    return value if isinstance(value, str) else None


def content_text(content: Any) -> str:
    """The text of a content value: a string, or the text parts of a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part["text"] for part in content
                       if isinstance(part, dict) and isinstance(part.get("text"), str))
    return ""


def with_text(message: Message, text: str) -> Message:
    """A copy of `message` whose content is `text`; every other field (ids, names, reasoning) kept."""
    return {**message, "content": text}


def valid_text(text: str) -> str:
    """`text` as valid Unicode: each lone surrogate replaced by U+FFFD (what a UTF-8 decoder shows for bad bytes).
    Text that was already valid is returned as it is, unchanged and uncopied."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text)
    return text
