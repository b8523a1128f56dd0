"""How a fake upstream tells the proxy's summariser requests (either layout, built-in prompts) from chat turns."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# Words of prompts/compaction.md: the transcript layout's system prompt holds the transcript in this tag, the
# prefix layout's last user message asks for a summary of the messages above it.
TRANSCRIPT_TAG = "<transcript>"
PREFIX_REQUEST = "write a summary of the conversation above"
# Words of prompts/pair_summaries.md: a batch of old tool rounds to summarise one by one (stage 2).
PAIRS_REQUEST = "You summarise the results of old tool calls"
ROUND_HEADING = "\n## Round "


def layout_of(messages: Sequence[Any]) -> str | None:
    """"transcript", "prefix", or None for a chat turn."""
    if not messages or not all(isinstance(message, dict) for message in messages):
        return None
    first, last = messages[0], messages[-1]
    if first.get("role") == "system" and TRANSCRIPT_TAG in str(first.get("content")):
        return "transcript"
    if last.get("role") == "user" and PREFIX_REQUEST in str(last.get("content")):
        return "prefix"
    if last.get("role") == "user" and PAIRS_REQUEST in str(last.get("content")):
        return "pairs"
    return None


def round_texts(messages: Sequence[Any]) -> list[str]:
    """A pair-summaries request's rounds, each as its text (calls and results), in order."""
    return str(messages[-1].get("content")).split(ROUND_HEADING)[1:] if layout_of(messages) == "pairs" else []


def is_summarizer_request(messages: Sequence[Any]) -> bool:
    """A whole-history summary's request (either layout); a batch of tool-round summaries is not one."""
    return layout_of(messages) in ("transcript", "prefix")


def is_pairs_request(messages: Sequence[Any]) -> bool:
    return layout_of(messages) == "pairs"


def summarised_text(messages: Sequence[Any]) -> str:
    """What the summariser is asked to summarise, as one text: the transcript, or the messages before the ask."""
    layout = layout_of(messages)
    if layout == "transcript":
        return str(messages[0].get("content"))
    if layout == "prefix":
        return "\n".join(_text(message) for message in messages[:-1])
    return ""


def _text(message: dict[str, Any]) -> str:
    parts = [str(message.get("content") or "")]
    parts += [str(call.get("function", {}).get("arguments", "")) for call in message.get("tool_calls") or []
              if isinstance(call, dict)]
    return " ".join(parts)
