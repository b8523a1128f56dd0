"""A Responses API request (`POST /v1/responses`) as the client sent it: parsed once, read by every later step."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from proxy.dialects.call import client_mode, json_object

# Fields that keep the conversation upstream: the request holds only its newest part, nothing here to compact.
UPSTREAM_HISTORY_FIELDS = ("previous_response_id", "conversation")


@dataclass(frozen=True)
class ResponsesCall:
    """A parsed Responses request, as the client sent it."""

    body: bytes
    payload: dict[str, Any]
    headers: Mapping[str, str]
    query: str
    mode: str
    bridged: bool = False  # `body` is the request translated into a chat completion (upstream_api: chat)

    @classmethod
    def parse(cls, body: bytes, headers: Mapping[str, str], query: str) -> ResponsesCall:
        payload = json_object(body)
        mode, forwarded = client_mode(headers)
        return cls(body, payload, forwarded, query, mode)

    @cached_property
    def model(self) -> str:
        return str(self.payload.get("model") or "")

    @property
    def stream(self) -> bool:
        return self.payload.get("stream") is True

    @property
    def history_upstream(self) -> bool:
        """Whether the upstream holds the conversation (a previous response or a conversation object named)."""
        return any(self.payload.get(name) not in (None, "") for name in UPSTREAM_HISTORY_FIELDS)

    def reserved_output(self, default: int) -> int:
        value = self.payload.get("max_output_tokens")
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
        return default
