"""Stage 2's terms: the policy tool rounds are summarised under, and a request's messages with summaries swapped in."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from proxy.core.messages import Message
from proxy.core.tool_rounds import ToolRound


@dataclass(frozen=True)
class PairSummaryPolicy:
    """Stage 2's settings: compaction.tool_results.summarize_pairs, and limits only code sets."""

    enabled: bool = True
    batch_size: int = 10  # rounds per summariser call
    keep_recent: int = 8  # the latest rounds are never summarised (nor the current one, whatever this says)
    cutoff: float = 0.25  # summarise once the old unsummarised rounds' results pass this share of the window
    max_summary_tokens: int = 200  # per round
    timeout: float = 120.0  # seconds for one batch: the store's reads and writes and the summariser call
    min_result_tokens: int = 64  # a round with less in its results is not worth a summary
    max_lookups: int = 256  # store reads per request (rounds this process already knows cost none)

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.keep_recent < 0 or not 0 < self.cutoff < 1 or self.max_summary_tokens < 16 \
                or self.timeout <= 0 or self.min_result_tokens < 0 or self.max_lookups < 0:
            raise ValueError("pair summaries need batch_size >= 1, keep_recent >= 0, 0 < cutoff < 1, "
                             "max_summary_tokens >= 16, timeout > 0, min_result_tokens and max_lookups >= 0")

    def old(self, rounds: Sequence[ToolRound]) -> list[ToolRound]:
        """The rounds that may be summarised: all but the last `keep_recent`, and never the last (the current)."""
        return list(rounds[:max(len(rounds) - max(self.keep_recent, 1), 0)])


@dataclass(frozen=True)
class Swapped:
    """A request's messages with the rounds whose stored summary matched swapped, and what that came to."""

    messages: list[Message]
    applied: int = 0  # rounds swapped
    tokens_freed: int = 0  # by the counter: the results' tokens less what stands in for them
    mismatches: int = 0  # rounds with a stored summary made of other calls or results: left whole
    indices: frozenset[int] = frozenset()  # positions of the result messages swapped (for later stages to leave)
