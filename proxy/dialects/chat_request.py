"""A chat-completion request as the client sent it: parsed once, read by every later step."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from itertools import repeat

from proxy.core.messages import Message
from proxy.dialects.call import JsonCall


@dataclass(frozen=True)
class ChatCall(JsonCall):
    """A parsed chat-completion request, as the client sent it."""

    @cached_property
    def messages(self) -> list[Message] | None:
        """The messages when they are a non-empty list of objects (checked once: a history can hold thousands)."""
        messages = self.payload.get("messages")
        if isinstance(messages, list) and messages and all(map(isinstance, messages, repeat(dict))):
            return messages
        return None

    def reserved_output(self, default: int) -> int:
        cap = self.positive("max_completion_tokens", "max_tokens")
        return cap if cap is not None else default
