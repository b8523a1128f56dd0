"""A Responses API request (`POST /v1/responses`) as the client sent it: parsed once, read by every later step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy.dialects.call import JsonCall, is_positive

# Fields that keep the conversation upstream: the request holds only its newest part, nothing here to compact.
UPSTREAM_HISTORY_FIELDS = ("previous_response_id", "conversation")
# The input item by which Codex asks for the conversation compacted now (its "remote compaction v2"): the last item
# of a request whose answer must hold exactly one `compaction` output item.
TRIGGER = "compaction_trigger"


@dataclass(frozen=True)
class ResponsesCall(JsonCall):
    """A parsed Responses request, as the client sent it."""

    bridged: bool = False  # `body` is the request translated into a chat completion (upstream_api: chat)

    @property
    def history_upstream(self) -> bool:
        """Whether the upstream holds the conversation (a previous response or a conversation object named)."""
        return any(self.payload.get(name) not in (None, "") for name in UPSTREAM_HISTORY_FIELDS)

    @property
    def upstream_context(self) -> bool:
        """Whether the request asks the upstream to manage the context itself (compaction or truncation)."""
        return self.payload.get("context_management") is not None or self.payload.get("truncation") == "auto" \
            or without_trigger(self.payload) is not None

    @property
    def asks_compaction(self) -> bool:
        """Whether a `context_management` entry asks for compaction (with or without a threshold)."""
        entries = self.payload.get("context_management")
        return isinstance(entries, list) and any(isinstance(entry, dict) and entry.get("type") == "compaction"
                                                 for entry in entries)

    @property
    def compact_threshold(self) -> int | None:
        """The smallest `compact_threshold` of the request's `compaction` context-management entries."""
        entries = self.payload.get("context_management")
        thresholds = [entry.get("compact_threshold") for entry in entries if isinstance(entry, dict)
                      and entry.get("type") == "compaction"] if isinstance(entries, list) else []
        valid = [value for value in thresholds if is_positive(value)]
        return min(valid) if valid else None

    def reserved_output(self, default: int) -> int:
        cap = self.positive("max_output_tokens")
        return cap if cap is not None else default


def without_trigger(payload: dict[str, Any]) -> dict[str, Any] | None:
    """The payload without its closing `compaction_trigger` item, or None when it does not end with one."""
    items = payload.get("input")
    if not isinstance(items, list) or not items or not isinstance(items[-1], dict) or items[-1].get("type") != TRIGGER:
        return None
    return {**payload, "input": items[:-1]}
