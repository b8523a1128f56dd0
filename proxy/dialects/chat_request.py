"""A chat-completion request as the client sent it: parsed once, read by every later step."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from proxy.core.messages import Message
from proxy.dialects.call import client_mode, json_object


@dataclass(frozen=True)
class ChatCall:
    """A parsed chat-completion request, as the client sent it."""

    body: bytes
    payload: dict[str, Any]
    headers: Mapping[str, str]
    query: str
    mode: str

    @classmethod
    def parse(cls, body: bytes, headers: Mapping[str, str], query: str) -> ChatCall:
        payload = json_object(body)
        mode, forwarded = client_mode(headers)
        return cls(body, payload, forwarded, query, mode)

    @cached_property
    def model(self) -> str:
        return str(self.payload.get("model") or "")

    @cached_property
    def messages(self) -> list[Message] | None:
        """The messages when they are a non-empty list of objects (checked once: a history can hold thousands)."""
        messages = self.payload.get("messages")
        if isinstance(messages, list) and messages and all(isinstance(m, dict) for m in messages):
            return messages
        return None

    @property
    def stream(self) -> bool:
        return self.payload.get("stream") is True

    def reserved_output(self, default: int) -> int:
        for key in ("max_completion_tokens", "max_tokens"):
            value = self.payload.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        return default
