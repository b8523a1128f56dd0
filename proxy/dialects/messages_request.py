"""An Anthropic Messages request (`POST /v1/messages`) as the client sent it: parsed once, read by every later step."""

from __future__ import annotations

from dataclasses import dataclass, field

from proxy.dialects.call import JsonCall
from proxy.dialects.messages_context import ContextEdits


@dataclass(frozen=True)
class MessagesCall(JsonCall):
    """A parsed Messages request, as the client sent it."""

    bridged: bool = False  # `body` is the request translated into a chat completion (upstream_api: chat)

    # Anthropic's context management the proxy applies (read off the body the upstream sees), and what its clearing
    # edits did to this request: Anthropic's `applied_edits` entries, and each edit's outcome by type.
    edits: ContextEdits | None = None
    applied_edits: tuple[dict[str, object], ...] = ()
    outcomes: dict[str, str] = field(default_factory=dict, hash=False, compare=False)

    @property
    def compact_threshold(self) -> int | None:
        compact = self.edits.compact if self.edits is not None else None
        return compact.trigger if compact is not None else None

    @property
    def edit_outcomes(self) -> dict[str, str]:
        return self.outcomes

    @property
    def summary_instructions(self) -> str | None:
        return self.edits.instructions if self.edits is not None else None

    @property
    def pauses_after_compaction(self) -> bool:
        return self.edits is not None and self.edits.compact is not None and self.edits.compact.pause

    def reserved_output(self, default: int) -> int:
        cap = self.positive("max_tokens")  # required by the API: the room the answer may take
        return cap if cap is not None else default
