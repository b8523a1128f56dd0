"""An Anthropic Messages request (`POST /v1/messages`) as the client sent it: parsed once, read by every later step."""

from __future__ import annotations

from dataclasses import dataclass

from proxy.dialects.call import JsonCall


@dataclass(frozen=True)
class MessagesCall(JsonCall):
    """A parsed Messages request, as the client sent it."""

    def reserved_output(self, default: int) -> int:
        cap = self.positive("max_tokens")  # required by the API: the room the answer may take
        return cap if cap is not None else default
