"""Summaries made before the request that needs them: prepared past compaction.prepare_at (or earlier, when the
conversation's pace says the summariser would not be done in time) and kept aside until a request passes the
threshold, or (without a mark) started one turn before it."""

from __future__ import annotations

from typing import Generic

from proxy.compaction.background import BackgroundSummaries
from proxy.compaction.compactor import Compactor
from proxy.compaction.journey import C, Journey
from proxy.compaction.journey_tokens import JourneyTokens
from proxy.compaction.pace import Pace
from proxy.compaction.tool_stages import ToolStages
from proxy.config import Settings
from proxy.core import budget
from proxy.core.plan import last_input_tokens
from proxy.dialects.dialect import Dialect


class Ahead(Generic[C]):
    """One pipeline's summaries ahead: what an answer's usage starts, and the splice at the threshold."""

    def __init__(self, settings: Settings, dialect: Dialect[C], compactor: Compactor, stages: ToolStages,
                 tokens: JourneyTokens) -> None:
        self._settings = settings
        self._dialect = dialect
        self._compactor = compactor
        self._stages = stages
        self._tokens = tokens
        self._background = BackgroundSummaries()
        self._pace = Pace()

    def after_answer(self, journey: Journey[C], prompt_tokens: int, answer_tokens: int) -> None:
        """The next turn resends this prompt and answer plus one more input: past the mark (compaction.prepare_at),
        its summary is prepared once and kept aside; without a mark, it is started when that turn will pass the
        threshold, and the next request waits for what is left of it."""
        compaction = self._settings.compaction
        if not compaction.background:
            return
        key = journey.conversation.backoff_key
        self._pace.answered(key, prompt_tokens)
        next_input = last_input_tokens(self._tokens.messages(journey), self._tokens.message_tokens(journey))
        growth = budget.next_turn_growth(next_input, answer_tokens)
        limits, tokens = journey.limits, prompt_tokens + growth
        if budget.over_threshold(limits, tokens):
            if self._stages.clearing_would_do(journey, growth):
                return
            # The next turn passes the threshold: its summary now, unless one was prepared (its request splices
            # that in, or this one, should the window leave no room to prepare it).
            if compaction.prepare_share is None:
                self._background.start(lambda: self._begin(journey, answer_tokens, aside=False))
            else:
                self._background.prepare(lambda: self._compactor.prepared(journey.conversation),
                                         lambda: self._begin(journey, answer_tokens, aside=False))
            return
        share = compaction.prepare_share
        if share is None:
            return
        if not budget.past_share(limits, tokens, share) and not self._pace.judges(key, self._compactor.summary_seconds):
            return  # neither the mark (what the clearing leaves is no more) nor the pace can start one: no replay
        # The summary's time against the turns left (this conversation's pace): at the last turn a start is in
        # time, the summary is prepared, mark or not, within a wider slack. A turn grows the prompt by more than its
        # answer and input (the upstream's framing of items and calls): by what was measured, when it is more; the
        # excess goes with the answer, which no clearing frees. A new cycle is told by a summary spliced in, not by
        # a clearing: the turns after a clearing may be the last ones a start is in time. With stage 1 on, the
        # replay of the turns ahead decides, and the lead is not read.
        paced = max(growth, round(self._pace.growth(key) or 0))
        late = self._pace.late(key, self._stages.conversation_tokens(journey), budget.lead_tokens(limits, tokens),
                               paced, self._compactor.summary_seconds,
                               passes=lambda rounds: self._stages.passes_ahead(journey, rounds, paced - next_input,
                                                                               next_input))
        if not late and not budget.past_share(limits, tokens, share):
            return
        # With stage 1 on, the prompt falls back whenever old results are cleared: a summary is needed only when
        # what the clearing leaves passes the mark, and is planned for the lead from there. The mark and the plan
        # keep the guess.
        settled = self._stages.settled_tokens(journey, growth + budget.lead_tokens(limits, tokens))
        if settled is not None and settled < prompt_tokens:
            tokens = settled + growth
        lead = budget.lead_tokens(limits, tokens)
        if late or budget.past_share(limits, tokens, share):
            # Planned for the growth it will meet before it is needed: up to the threshold (`lead`), and the turn
            # that passes it (the request that splices it in is past the threshold by up to a turn). When that
            # leaves it too far past the target, it is not made yet (Compactor.begin): a later turn makes it, with
            # less growth ahead, or the turn before the threshold, as above.
            slack = (budget.late_slack if late else budget.prepared_slack)(limits)
            self._background.prepare(lambda: self._compactor.prepared(journey.conversation),
                                     lambda: self._begin(journey, answer_tokens + lead + growth, aside=True,
                                                         slack=slack))

    async def splice(self, journey: Journey[C]) -> None:
        """The summary prepared for this conversation spliced in, if one applies (`x-compaction: prepared`)."""
        if self._settings.compaction.prepare_share is None:
            return
        if not journey.tokens_before:
            journey.tokens_before = self._tokens.original(journey)
        promoted = await self._compactor.promote(journey.conversation)
        if promoted is not journey.conversation:
            journey.conversation, journey.trigger = promoted, "prepared"
            await self._stages.shape(journey)

    def _begin(self, journey: Journey[C], answer_tokens: int, *, aside: bool, slack: int | None = None) -> object:
        call = journey.call
        return self._compactor.begin(
            journey.conversation, journey.limits, model=call.model, trigger="prepared" if aside else "background",
            headers=call.headers, answer_tokens=answer_tokens, overhead=self._tokens.overhead(journey),
            tools=self._dialect.tools(call), instructions=call.summary_instructions, origin=journey.origin,
            aside=aside, slack=slack)

    async def close(self) -> None:
        await self._background.close()
