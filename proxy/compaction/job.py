"""One summary to build: its plan, where it is stored, and the numbers it was planned with."""

from __future__ import annotations

import math
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from proxy.compaction.recorder import Origin
from proxy.core import budget
from proxy.core.budget import Limits
from proxy.core.messages import Message
from proxy.core.plan import Plan
from proxy.request_context import current_request_id
from proxy.summarizer.summarizer import ConversationPrefix


@dataclass(frozen=True)
class Job:
    """One summary to build, with the numbers it was planned with (they go into its log line)."""

    plan: Plan
    prefix_hash: str
    prefix_len: int
    namespace: str
    backoff_key: str
    limits: Limits
    model: str
    trigger: str
    headers: Mapping[str, str]
    summary_tokens: int
    level: int
    prefix: ConversationPrefix | None = None
    source: tuple[Message, ...] = ()  # the client's messages the summary stands in for
    ratio: float = 1.0  # the upstream's tokens per token of ours (the calibration), as the plan was counted with
    instructions: str | None = None  # the client's own for its summary (Anthropic's compaction `instructions`)
    origin: Origin | None = None  # the request it is made for, as the journal names it
    force: bool = False  # asked for whatever the size (mode force, a client's request): applied even if longer
    # The journal event of its failure, should it fail: named before, so every request waiting on it can tell it.
    failure_id: str = field(default_factory=lambda: secrets.token_hex(12))

    def upstream_tokens(self, tokens: int) -> int:
        """`tokens` of our own count in the upstream's, the unit of the window and of the plan."""
        return math.ceil(tokens * self.ratio)

    def own_tokens(self, upstream_tokens: int) -> int:
        return math.floor(upstream_tokens / self.ratio)

    @property
    def own_ask(self) -> int:
        """The summary's ask in our own count, the unit of the summary's text (the plan's is the upstream's)."""
        return self.own_tokens(self.summary_tokens)

    def room_beside_tail(self, replacement_tokens: int) -> int:
        """The window's room (the upstream's tokens) once a replacement of `replacement_tokens` (our count) and the
        recent turns are in, with the reserved output and the margin; below 0 the retry would overflow."""
        return budget.window_room(self.limits, self.upstream_tokens(replacement_tokens) + self.plan.tail_tokens)

    def log_fields(self) -> dict[str, Any]:
        limits = self.limits
        return {"request_id": current_request_id(), "trigger": self.trigger, "summarizer_model": self.model,
                "window": limits.window,
                "threshold": limits.threshold, "target": limits.target, "reserved_output": limits.reserve,
                "trigger_tokens": limits.trigger_tokens, "target_tokens": limits.target_tokens,
                "summarized_messages": len(self.plan.to_summarise), "summary_tokens_requested": self.summary_tokens,
                "backoff_level": self.level, "window_margin": budget.window_margin(limits.window),
                "attainable": self.plan.allotment.attainable,
                **({"not_attainable_because": why} if (why := self.plan.allotment.why_not_attainable()) else {}),
                **self.plan.as_log()}
