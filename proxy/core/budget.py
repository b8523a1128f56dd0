"""Every token-budget decision of compaction, as pure arithmetic: trigger, goal, allotments, rooms, growth.

The numbers it works with are prompt tokens as the proxy estimates them (calibrated against the upstream's own
counts). Nothing else in the package computes a budget; it asks this module, and the log line of a compaction
carries the `Allotment` it was planned with.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

# A summary shorter than this cannot carry the nine fields the prompt asks for.
MIN_SUMMARY_TOKENS = 256
# Summarising must save at least this much beyond the summary itself, or it only costs a summariser call.
MIN_GAIN_TOKENS = 64
# The share of the window the summary may count on before recent turns take theirs. At a tenth, a 3,072-token
# window asked the first summary of an agent's history for 307 tokens and a 1.5B model's plain reply ran past
# it; at 0.15 the probes after one compaction got 24 of 27 planted facts right against 25 of 27 with the full
# history (three seeds).
SUMMARY_SHARE = 0.15
# The part of that floor the summariser's request leaves room for whole, before its input gives way: more would
# cost the summariser the tool results it summarises in a small window.
WHOLE_SHARE = 0.1
# A summary should compress what it replaces at least this many times over.
COMPRESSION = 2
# An earlier summary in the span is carried, not compressed again: it holds what survived before, and halving it
# at every compaction drops facts each time (three compactions after one instruction: 74 % kept). The summary's
# floor grows to hold it and half a floor more, up to this share of the window; recent turns give up the rest.
CARRIED_SHARE = 0.2
# A message elided to fit keeps at least this much of its text (both ends), so the model still sees its shape.
MIN_ELIDED_TOKENS = 128
# Servers count tokens a little differently from any estimate: keep a margin when filling a window to the brim.
WINDOW_MARGIN_SHARE = 20
WINDOW_MARGIN_TOKENS = 16
# The summariser's answer must have at least this much room, or asking is pointless.
MIN_SUMMARIZER_OUTPUT = 128


@dataclass(frozen=True)
class Limits:
    """What a request may use: its model's window and the operator's fractions of it."""

    window: int
    threshold: float             # proactive trigger, a fraction of the window (0 or >= 1: never proactive)
    target: float                # where the next request should land after a compaction
    reserve: int                 # output tokens this request reserves
    tail_share: float = 0.25     # most of the window kept verbatim as recent turns beyond the minimum
    instruction_share: float = 0.1  # most of the window kept for earlier user messages, verbatim
    max_summary_tokens: int = 4096  # the summariser's output cap

    @property
    def proactive(self) -> bool:
        return 0 < self.threshold < 1

    @property
    def trigger_tokens(self) -> int:
        """Prompt plus reserved output above this compacts before sending."""
        return math.floor(self.threshold * self.window)

    @property
    def target_tokens(self) -> int:
        return math.floor(self.target * self.window)


def with_client_threshold(limits: Limits, asked: int | None, target_share: float) -> Limits:
    """`limits` with a client's own compaction threshold (prompt tokens, as a Responses `compact_threshold` counts
    them) honoured when it comes sooner than the operator's; compaction then lands below it by `target_share` of it,
    since the operator's target could leave the next request above the client's threshold again."""
    if asked is None or limits.window <= 0:
        return limits
    wanted = (asked + limits.reserve) / limits.window  # the trigger counts the reserved output on top
    if wanted >= 1 or 0 < limits.threshold <= wanted:
        return limits
    target = min(limits.target, (asked * target_share + limits.reserve) / limits.window)
    return replace(limits, threshold=wanted, target=target)


def over_threshold(limits: Limits, prompt_tokens: int) -> bool:
    """Whether a request should be compacted before it is sent."""
    return limits.proactive and prompt_tokens + limits.reserve > limits.trigger_tokens


def past_share(limits: Limits, prompt_tokens: int, share: float) -> bool:
    """Whether a request passes `share` of its threshold's tokens (where a summary is prepared ahead)."""
    return limits.proactive and prompt_tokens + limits.reserve > math.floor(share * limits.trigger_tokens)


def lead_tokens(limits: Limits, prompt_tokens: int) -> int:
    """How far a request of `prompt_tokens` is below its threshold: the growth a summary prepared now will meet."""
    return max(0, limits.trigger_tokens - limits.reserve - prompt_tokens)


def prepared_slack(limits: Limits) -> int:
    """How far above the target a summary prepared ahead may leave its request: a quarter of the way to the
    threshold, so the conversation keeps three quarters of its usual room before its next summary (at half the way,
    a 60-turn conversation at a 4,096-token window needed 14 summaries instead of 11). Made when needed instead, it
    would meet no more growth, but the client would wait for it."""
    return max(0, limits.trigger_tokens - limits.target_tokens) // 4


def late_slack(limits: Limits) -> int:
    """The slack of a summary prepared ahead that is late (its conversation's turns would reach the threshold
    before the summariser is done): half the way to the threshold. The conversation's next summary comes sooner,
    and only for the agents that would otherwise wait for this one."""
    return max(0, limits.trigger_tokens - limits.target_tokens) // 2


def clearing_room(limits: Limits, share: float, *, before_compaction: bool = True) -> int:
    """The prompt tokens a request may take before old tool results are cleared (stage 1, before any summary):
    `share` of the window with the reserved output beside it, or (`before_compaction`) the compaction trigger if
    that comes first."""
    room = share * limits.window - limits.reserve
    if limits.proactive and before_compaction:
        room = min(room, limits.trigger_tokens - limits.reserve)
    return max(int(room), 0)


def near_window(limits: Limits, prompt_tokens: int) -> bool:
    """Whether an unexplained failure (an empty stream) is plausibly an overflow: the prompt is past the target."""
    return prompt_tokens > limits.target_tokens


def next_turn_growth(last_input_tokens: int, answer_tokens: int) -> int:
    """How much longer the next request will be: this answer, resent, plus one more input like the last one."""
    return max(0, last_input_tokens) + max(0, answer_tokens)


def expected_answer(limits: Limits, last_answer_tokens: int | None) -> int:
    """The answer this request will get, before it is known: like the last one, never more than the reserve."""
    if last_answer_tokens is None or last_answer_tokens <= 0:
        return limits.reserve // 4
    return min(limits.reserve, last_answer_tokens)


@dataclass(frozen=True)
class Allotment:
    """How a compacted prompt spends the target, so the next request (one turn longer) still fits it."""

    goal: int                  # prompt tokens the compacted request may use: target - reserve - growth
    fixed: int                 # what must stay verbatim whatever the budget (head, current round, last user)
    summary_tokens: int        # the output the summariser is asked for
    tail_tokens: int           # verbatim turns kept beyond the minimum tail
    instruction_tokens: int    # earlier user messages kept verbatim
    growth: int

    @property
    def attainable(self) -> bool:
        """Whether the goal can be met at all; when not, the plan keeps as little as the tail allows."""
        return self.shortfall == 0

    @property
    def shortfall(self) -> int:
        """How far past the goal the compacted prompt stays (0 when attainable): the next request lands that much
        above the target, and the next summary comes that much sooner."""
        return max(0, self.fixed + self.summary_tokens - self.goal)

    def why_not_attainable(self) -> str | None:
        """In words, why the compacted prompt cannot reach the goal; None when it can."""
        if self.attainable:
            return None
        if self.goal <= 0:
            return (f"the reserved output and the next turn ({self.growth} tokens) alone fill the target: "
                    "only a larger window, a higher target or a smaller reserve would leave room")
        return (f"what must stay verbatim ({self.fixed} tokens: system and developer messages, the current tool "
                f"round, the latest user message) and the summary's floor ({self.summary_tokens}) need "
                f"{self.fixed + self.summary_tokens}, past the goal of {self.goal} (the target less the reserved "
                f"output and the next turn's {self.growth}): the prompt stays above the target, with as little "
                "kept as the tail allows")

    def as_log(self) -> dict[str, int]:
        """The allotment's figures for a log line, named apart from the plan's own (`tail_tokens` there is what
        the tail holds; here it is what the tail was allowed beyond the current round)."""
        return {f"allotted_{key}" if key not in ("goal", "fixed", "growth") else key: value
                for key, value in asdict(self).items()}


def allot(limits: Limits, *, fixed: int, growth: int, carried: int = 0) -> Allotment:
    """Share the target between recent turns, earlier user messages and the summary, in that order.

    The summary's floor (SUMMARY_SHARE of the window, at least a useful summary; with an earlier summary of
    `carried` tokens to carry forward, that and half the floor more, as far as the room goes) is set aside
    first; then recent turns take their share (what the operator set), earlier user messages theirs, and the
    summary gets the rest, never more than its cap.
    """
    goal = limits.target_tokens - limits.reserve - growth
    room = max(0, goal - fixed)
    # The summary's own floor grows with the window: with only the fixed minimum, a 3,072-token window gave it 256
    # tokens while the tail took 1,024, and small models' summaries of a 2,000-token span ran past that.
    base = _base_floor(limits)
    holding = min(carried + base // 2, math.floor(CARRIED_SHARE * limits.window)) if carried > 0 else 0
    # Only out of room the goal has: a floor past it leaves every compaction short of the target, and the next
    # request compacts again (a 3,000-token window with 1,024 reserved compacted 26 times in 40 turns).
    floor = min(limits.max_summary_tokens, max(base, min(holding, room)))
    spare = max(0, room - floor)
    tail = min(spare, math.floor(limits.tail_share * limits.window))
    instructions = min(spare - tail, math.floor(limits.instruction_share * limits.window))
    summary = min(limits.max_summary_tokens, max(floor, room - tail - instructions))
    return Allotment(goal, fixed, summary, tail, instructions, growth)


def _base_floor(limits: Limits, share: float = SUMMARY_SHARE) -> int:
    return max(MIN_SUMMARY_TOKENS, math.floor(share * limits.window))


def whole_summary_tokens(limits: Limits, ask: int) -> int:
    """The part of an ask the summariser's request must leave room for whole: WHOLE_SHARE of the window. Beyond
    it (a longer floor, room to carry an earlier summary) the ask gives way first, before the summariser's input
    loses its tool results."""
    return min(ask, _base_floor(limits, WHOLE_SHARE))


def summary_ask(allotment: Allotment, span_tokens: int, carried: int = 0) -> int:
    """The summary's output cap for a given span: its allotment, and never more than the span compressed, an
    earlier summary in it (`carried` of its tokens) counted whole."""
    carried = min(max(0, carried), span_tokens)
    compressed = carried + (span_tokens - carried) // COMPRESSION
    return max(MIN_SUMMARY_TOKENS, min(allotment.summary_tokens, compressed))


def worth_summarizing(span_tokens: int, ask_tokens: int, filler_tokens: int) -> bool:
    """Whether replacing `span_tokens` by a summary of up to `ask_tokens` (plus fillers) makes the prompt smaller."""
    return span_tokens >= ask_tokens + filler_tokens + MIN_GAIN_TOKENS


def window_margin(window: int) -> int:
    return window // WINDOW_MARGIN_SHARE + WINDOW_MARGIN_TOKENS


def summarizer_output_room(window: int | None, prompt_tokens: int, max_output: int,
                           whole: int | None = None) -> int | None:
    """The summariser's output cap once its prompt is in; None when the summary asked for does not fit.

    The ask (`max_output`, or its `whole` part when given; up to a quarter of the window, as
    summarizer_input_budget plans by) must fit whole: a smaller cap cuts a summary off mid-JSON
    (Qwen2.5-Coder-0.5B at 191 of 256 tokens asked, on a 3,072 window), where a shorter prompt (tool results left
    out, or the history in parts) lets it finish.
    """
    if not window:
        return max_output
    room = window - prompt_tokens - window_margin(window)
    needed = max(MIN_SUMMARIZER_OUTPUT, min(max_output if whole is None else min(whole, max_output), window // 4))
    return min(max_output, room) if room >= needed else None


def summarizer_input_budget(window: int, framing_tokens: int, output_tokens: int) -> int:
    """Transcript tokens one summariser request may carry: its window less framing, output and margin."""
    return window - framing_tokens - min(output_tokens, window // 4) - window_margin(window)


def elision_cap(limits: Limits, other_tokens: int) -> int:
    """The most one oversized message may keep so the request fits under the trigger (or the window if off)."""
    ceiling = limits.trigger_tokens if limits.proactive else limits.window - window_margin(limits.window)
    return max(MIN_ELIDED_TOKENS, ceiling - limits.reserve - other_tokens)


def window_room(limits: Limits, prompt_tokens: int) -> int:
    """Tokens the window has left beside a prompt of `prompt_tokens`, its reserved output and the margin."""
    return limits.window - window_margin(limits.window) - limits.reserve - prompt_tokens


def fits_window(limits: Limits, prompt_tokens: int) -> bool:
    """Whether a request can be sent at all: prompt and reserved output within the window, with a margin."""
    return window_room(limits, prompt_tokens) >= 0
