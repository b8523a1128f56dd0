"""One request's state on its way through the pipeline, and what a route's handler uses of a pipeline."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from proxy.compaction.conversation import Conversation
from proxy.compaction.recorder import Origin
from proxy.core.budget import Limits
from proxy.core.clearing import Cleared
from proxy.core.history_index import History
from proxy.core.messages import Message
from proxy.core.pair_policy import Swapped
from proxy.core.usage import Usage
from proxy.core.view import View
from proxy.dialects.call import Call
from proxy.upstream.answer import Answer

C = TypeVar("C", bound=Call)


@dataclass
class Journey(Generic[C]):
    """The state of one request as it moves through the pipeline."""

    call: C
    view: View  # the client's conversation, neutral, with the items each message goes back as
    conversation: Conversation
    limits: Limits
    history: History  # the client's messages as the index read them: chain and token counts
    overhead: int  # raw tokens of the request besides its messages (tools, the reply primer)
    trigger: str = "none"
    failed: bool = False
    reason: str | None = None  # why a compaction that was wanted did not happen
    failure: str | None = None  # the journal event of the summary that failed for it
    tokens_before: int = 0
    elided: int = 0
    swapped: Swapped | None = None  # stage 2: stored summaries of old tool rounds swapped into what is forwarded
    cleared: Cleared | None = None  # stage 1: old tool results cleared in what is forwarded
    forwarded: list[Message] = field(default_factory=list)
    counted: tuple[list[Message], list[int], int] | None = None  # the last messages counted: counts, sum
    origin: Origin | None = None  # the request as the journal names it; None without a journal
    # conversation_tokens of a conversation with a stored replacement, kept until the conversation changes
    spliced_counts: tuple[Conversation, list[int]] | None = field(default=None, repr=False)

    def conversation_tokens(self, count_each: Callable[[Sequence[Message]], list[int]]) -> list[int]:
        """Raw token counts of `conversation.messages`: the client's own as the history read counted them, a stored
        replacement as the compactor counted it when it spliced it in, or counted when first asked for (the stages, the
        estimate and the turn ahead each ask; every caller counts with the pipeline's one counter). Read them, never
        change them."""
        conversation, read = self.conversation, self.history.tokens
        if conversation.record is None:
            return read
        if self.spliced_counts is not None and self.spliced_counts[0] is conversation:
            return self.spliced_counts[1]
        stored = conversation.replacement_counts
        counts = [*(count_each(conversation.record.replacement) if stored is None else stored),
                  *read[conversation.record.prefix_len:]]
        self.spliced_counts = (conversation, counts)
        return counts


class Serving(Protocol):
    """What a route's handler and the runtime use of a pipeline (or of a pair of them, see api_fallback)."""

    def parse(self, body: bytes, headers: Mapping[str, str], query: str) -> Any: ...

    def glanced(self, body: bytes, headers: Mapping[str, str]) -> str | None: ...

    def relay(self, body: bytes, headers: Mapping[str, str], query: str,
              model: str) -> AbstractAsyncContextManager[Answer]: ...

    def answer(self, call: Any) -> AbstractAsyncContextManager[Answer]: ...

    async def close(self) -> None: ...

    async def compacted(self, call: Any) -> Journey[Any] | None: ...

    def summary_usage(self, journey: Journey[Any]) -> Usage: ...

    def compaction_answer(self, journey: Journey[Any]) -> Answer: ...

    def edited(self, call: Any) -> Any: ...

    def estimate(self, call: Any) -> int: ...
