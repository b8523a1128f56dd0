"""The small tools before the sledgehammer, for one journey: stored summaries of old tool rounds swapped in (stage
2), then old tool results cleared (stage 1), both in what is forwarded only; the whole-history summary (stage 3)
comes only when these leave the request past the threshold."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.compaction.journey import Journey
from proxy.compaction.pair_summaries import PairSummaries, PairSummaryPolicy
from proxy.config import ClearConfig, Settings
from proxy.core import budget, clearing
from proxy.core.calibration import Calibration
from proxy.core.clearing import Cleared, ClearingRule
from proxy.core.messages import Message
from proxy.core.tokens import TokenCounter


class ToolStages:
    """Stages 1 and 2 as the settings (global, or a model's own) say, for every dialect's neutral conversation."""

    def __init__(self, settings: Settings, counter: TokenCounter, calibration: Calibration,
                 pairs: PairSummaries | None) -> None:
        self._settings = settings
        self._counter = counter
        self._calibration = calibration
        self._pairs = pairs

    async def shape(self, journey: Journey[Any]) -> None:
        """`journey.swapped` and `journey.cleared` for the conversation as it stands (after a summary too)."""
        journey.swapped, journey.cleared, journey.elided = None, None, 0
        conversation = journey.conversation
        if self._pairs is not None:
            swapped = await self._pairs_for(self._pairs, journey.call.model).applied(conversation.messages,
                                                                                      conversation.namespace)
            journey.swapped = swapped if swapped.applied else None
        cleared = self._cleared(journey, grown=0)
        journey.cleared = cleared if cleared is not None and cleared.results else None

    def base(self, journey: Journey[Any]) -> list[Message]:
        """What stage 3's elision starts from: the conversation with stages 2 and 1 applied."""
        if journey.cleared is not None:
            return journey.cleared.messages
        return journey.swapped.messages if journey.swapped is not None else journey.conversation.messages

    def clearing_would_do(self, journey: Journey[Any], growth: int) -> bool:
        """Whether the stages alone keep the next turn (this one grown by `growth` tokens) under the threshold, so
        no whole-history summary is to be built for it in the background."""
        cleared = self._cleared(journey, grown=growth)
        if cleared is None:
            return False
        raw = sum(self._counter.count_each(cleared.messages)) + journey.overhead
        return not budget.over_threshold(journey.limits, self._calibration.adjust(journey.call.model, raw) + growth)

    def after_answer(self, journey: Journey[Any], headers: Mapping[str, str]) -> None:
        """Old tool rounds of the client's conversation summarised in the background when enough have gathered."""
        call = journey.call
        if self._pairs is None:
            return
        model = self._settings.compaction.summarizer.model or call.model
        self._pairs_for(self._pairs, call.model).start(journey.view.messages, journey.conversation.namespace,
                                                       window=journey.limits.window, model=model, headers=headers)

    async def close(self) -> None:
        if self._pairs is not None:
            await self._pairs.close()

    def _cleared(self, journey: Journey[Any], *, grown: int) -> Cleared | None:
        """Stage 1 on the conversation (stage 2 applied) as if it had grown by `grown` tokens of the upstream's;
        None with clearing off. The room is converted to the counter's tokens, the unit the conversation is
        replayed in."""
        config = self._settings.tool_results_for(journey.call.model).clear
        if not config.enabled:
            return None
        conversation, swapped = journey.conversation, journey.swapped
        room = budget.clearing_room(journey.limits, config.trigger) - grown
        own_room = int(room / self._calibration.ratio(journey.call.model)) - journey.overhead
        messages = swapped.messages if swapped is not None else conversation.messages
        untouchable = conversation.synthetic | (swapped.indices if swapped is not None else frozenset())
        return clearing.cleared(messages, _rule(config), self._counter.count_message, room=max(own_room, 0),
                                untouchable=untouchable)

    def _pairs_for(self, pairs: PairSummaries, model: str) -> PairSummaries:
        config = self._settings.tool_results_for(model).summarize_pairs
        return pairs.under(PairSummaryPolicy(**config.model_dump()))


def pair_policy(settings: Settings) -> PairSummaryPolicy:
    """The global stage-2 policy, as the runtime builds the summaries with."""
    return PairSummaryPolicy(**settings.compaction.tool_results.summarize_pairs.model_dump())


def _rule(config: ClearConfig) -> ClearingRule:
    return ClearingRule(config.keep, config.clear_at_least, frozenset(config.exclude_tools), config.clear_inputs)

