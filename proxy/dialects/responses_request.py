"""A Responses API request (`POST /v1/responses`) as the client sent it: parsed once, read by every later step."""

from __future__ import annotations

from dataclasses import dataclass

from proxy.dialects.call import JsonCall

# Fields that keep the conversation upstream: the request holds only its newest part, nothing here to compact.
UPSTREAM_HISTORY_FIELDS = ("previous_response_id", "conversation")


@dataclass(frozen=True)
class ResponsesCall(JsonCall):
    """A parsed Responses request, as the client sent it."""

    bridged: bool = False  # `body` is the request translated into a chat completion (upstream_api: chat)

    @property
    def history_upstream(self) -> bool:
        """Whether the upstream holds the conversation (a previous response or a conversation object named)."""
        return any(self.payload.get(name) not in (None, "") for name in UPSTREAM_HISTORY_FIELDS)

    def reserved_output(self, default: int) -> int:
        cap = self.positive("max_output_tokens")
        return cap if cap is not None else default
