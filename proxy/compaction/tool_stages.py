"""The small tools before the sledgehammer, for one journey: stored summaries of old tool rounds swapped in (stage
2), then old tool results cleared (stage 1), both in what is forwarded only; the whole-history summary (stage 3)
comes only when these leave the request past the threshold."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from proxy.compaction.journey import Journey
from proxy.compaction.pair_summaries import PairSummaries
from proxy.config import ClearConfig, Settings, SummarizePairsConfig, ToolResultsConfig
from proxy.core import budget, clearing
from proxy.core.calibration import Calibration
from proxy.core.clearing import Cleared, ClearingRule
from proxy.core.messages import Message
from proxy.core.pair_policy import PairSummaryPolicy, Swapped
from proxy.core.tokens import TokenCounter
from proxy.summarizer import tool_call


class ToolStages:
    """Stages 1 and 2 as the settings (global, or a model's own) say, for every dialect's neutral conversation."""

    def __init__(self, settings: Settings, counter: TokenCounter, calibration: Calibration,
                 pairs: PairSummaries | None) -> None:
        self._settings = settings
        self._counter = counter
        self._calibration = calibration
        self._pairs = pairs
        self._reported = _Reported()
        # Stage 2 under each tool-results config in use (the global one, a model's own): made once, not per request.
        self._pair_views: dict[int, tuple[ToolResultsConfig, PairSummaries]] = {}

    async def shape(self, journey: Journey[Any]) -> None:
        """`journey.swapped` and `journey.cleared` for the conversation as it stands (after a summary too). With
        clearing on, a round's stored summary stands in for the placeholder of a round the clearing replaces, and
        nothing else changes: what is forwarded moves only when the cut moves. With clearing off, each round whose
        summary matches is swapped for it."""
        journey.swapped, journey.cleared, journey.elided = None, None, 0
        conversation = journey.conversation
        pairs = self._pairs_for(journey.call.model) if self._pairs is not None else None
        if not self._settings.tool_results_for(journey.call.model).clear.enabled:
            if pairs is not None:
                swapped = await pairs.applied(conversation.messages, conversation.namespace)
                journey.swapped = swapped if swapped.applied else None
            return
        cleared = self._cleared(journey, grown=0)
        if cleared is None or not cleared.results:
            return
        if pairs is not None:
            swapped = await pairs.applied(conversation.messages, conversation.namespace, within=cleared.indices)
            if swapped.applied:
                journey.swapped, cleared = swapped, self._summarised(conversation.messages, cleared, swapped)
        journey.cleared = cleared

    def base(self, journey: Journey[Any]) -> list[Message]:
        """What stage 3's elision starts from: the conversation with stages 2 and 1 applied."""
        if journey.cleared is not None:
            return journey.cleared.messages
        return journey.swapped.messages if journey.swapped is not None else journey.conversation.messages

    def clearing_would_do(self, journey: Journey[Any], growth: int) -> bool:
        """Whether the stages alone keep the next turn (this one grown by `growth` tokens) under the threshold, so
        no whole-history summary is to be built for it in the background."""
        settled = self.settled_tokens(journey, growth)
        return settled is not None and not budget.over_threshold(journey.limits, settled + growth)

    def settled_tokens(self, journey: Journey[Any], growth: int) -> int | None:
        """What this conversation weighs (the upstream's tokens, with the request's overhead) once stage 1 has
        cleared it as it would when grown by `growth`; None with clearing off."""
        cleared = self._cleared(journey, grown=growth)
        if cleared is None:
            return None
        raw = sum(self._counter.count_each(cleared.messages)) + journey.overhead
        return self._calibration.adjust(journey.call.model, raw)

    def passes_ahead(self, journey: Journey[Any], rounds: int, answer: int, following: int) -> bool | None:
        """Whether a request within `rounds` turns (each an answer of `answer` tokens and an input of `following`,
        the upstream's) passes the threshold, stage 1 replayed on the conversation as it will then be; None with
        clearing off. A clearing moves only when it frees half its room, so what it leaves jumps from turn to turn,
        and a request may pass the threshold turns before a clearing that would have made room again."""
        config = self._settings.tool_results_for(journey.call.model).clear
        if not config.enabled:
            return None
        model = journey.call.model
        ratio = self._calibration.ratio(model)
        messages = journey.conversation.messages
        sizes = journey.conversation_tokens(self._counter.count_each)
        added, added_sizes = clearing.rounds_ahead(messages, rounds, int(answer / ratio), int(following / ratio))
        every = [*messages, *added]
        ends = range(len(messages) + 2, len(every) + 1, 2)  # each round's request
        weights = clearing.weights(every, _rule(config), self._counter.count_message,
                                   room=self._own_room(journey, config, grown=0), sizes=[*sizes, *added_sizes],
                                   ends=ends, untouchable=journey.conversation.synthetic, reported=self._reported)
        return any(budget.over_threshold(journey.limits, self._calibration.adjust(model, weight + journey.overhead))
                   for weight in weights)

    def conversation_tokens(self, journey: Journey[Any]) -> int:
        """What the conversation weighs before stage 1 (a summary spliced in, nothing cleared), in the counter's
        tokens: it shrinks only when a summary is spliced in."""
        return sum(journey.conversation_tokens(self._counter.count_each))

    def after_answer(self, journey: Journey[Any], headers: Mapping[str, str]) -> None:
        """Old tool rounds of the client's conversation summarised in the background when enough have gathered;
        with clearing on, not the rounds it replaced already without a summary."""
        call = journey.call
        if self._pairs is None:
            return
        model = self._settings.compaction.summarizer.model or call.model
        self._pairs_for(call.model).start(journey.view.messages, journey.conversation.namespace,
                                                       window=journey.limits.window, model=model, headers=headers,
                                                       passed=self._placeholders(journey))

    async def close(self) -> None:
        if self._pairs is not None:
            await self._pairs.close()

    def _cleared(self, journey: Journey[Any], *, grown: int) -> Cleared | None:
        """Stage 1 on the conversation as if it had grown by `grown` tokens of the upstream's; None with clearing
        off. The room is converted to the counter's tokens, the unit the conversation is replayed in."""
        config = self._settings.tool_results_for(journey.call.model).clear
        if not config.enabled:
            return None
        conversation = journey.conversation
        return clearing.cleared(conversation.messages, _rule(config), self._counter.count_message,
                                room=self._own_room(journey, config, grown=grown), untouchable=conversation.synthetic,
                                reported=self._reported, sizes=journey.conversation_tokens(self._counter.count_each))

    def _own_room(self, journey: Journey[Any], config: ClearConfig, *, grown: int) -> int:
        """The clearing's room less `grown`, in the counter's tokens (the unit the conversation is replayed in).
        A client that asks for compaction at its own threshold hears of each one and drops what it stands for:
        its threshold brings the summary, clearing stays at the proxy's own room."""
        room = budget.clearing_room(journey.limits, config.trigger,
                                    before_compaction=journey.call.compact_threshold is None) - grown
        return max(int(room / self._calibration.ratio(journey.call.model)) - journey.overhead, 0)

    def _summarised(self, messages: list[Message], cleared: Cleared, swapped: Swapped) -> Cleared:
        """`cleared` with the rounds `swapped` holds as their summaries instead of placeholders; its own figures
        (results, tokens freed) for the placeholders left."""
        sent = list(cleared.messages)
        placeholders = 0
        for index in swapped.indices:
            sent[index] = swapped.messages[index]
            placeholders += self._counter.count_message(messages[index]) - \
                self._counter.count_message(cleared.messages[index])
        return Cleared(sent, cleared.results - len(swapped.indices), cleared.freed - placeholders,
                       cleared.indices - swapped.indices)

    @staticmethod
    def _placeholders(journey: Journey[Any]) -> frozenset[str]:
        """The call ids whose results this request cleared to a placeholder."""
        if journey.cleared is None:
            return frozenset()
        messages = journey.conversation.messages
        return frozenset(str(messages[index].get("tool_call_id")) for index in journey.cleared.indices)

    def _pairs_for(self, model: str) -> PairSummaries:
        """Stage 2 under the model's settings (called only when there are pair summaries). With clearing on, any
        round but the current one may be summarised: its summary is used only when the clearing reaches it, and the
        clearing keeps far fewer than keep_recent."""
        assert self._pairs is not None, "stage 2 is off: no pair summaries"
        settings = self._settings.tool_results_for(model)
        # Keyed by the config's identity: the settings hold it (the key is never reused while they live), and a
        # client's model names, unbounded, all map to one of a few configs.
        held = self._pair_views.get(id(settings))
        if held is not None and held[0] is settings:
            return held[1]
        policy = _policy(self._settings, settings.summarize_pairs)
        if settings.clear.enabled:
            policy = dataclasses.replace(policy, keep_recent=min(policy.keep_recent, 1))
        view = self._pairs.under(policy)
        self._pair_views[id(settings)] = (settings, view)
        return view


def pair_policy(settings: Settings) -> PairSummaryPolicy:
    """The global stage-2 policy, as the runtime builds the summaries with."""
    return _policy(settings, settings.compaction.tool_results.summarize_pairs)


def _policy(settings: Settings, config: SummarizePairsConfig) -> PairSummaryPolicy:
    """A batch may take as long as a whole summary may (compaction.summarizer.timeout): the same summariser writes
    both, and a model on a CPU reads a batch of ten rounds in minutes."""
    return PairSummaryPolicy(**config.model_dump(), timeout=settings.compaction.summarizer.timeout)


class _Reported:
    """tool_call.reported remembered by the text's hash: clearing reads every tool result of the conversation on
    every request, twice (this turn, and the next for the background summary), and the results come back whole
    turn after turn. On a 200-result conversation (0.9 MB of output) reading them took 9 ms a pass; hashing them
    takes a fraction of that. Bounded; a key is Python's hash of the text, as the token counter's cache keys are."""

    def __init__(self, size: int = 20_000) -> None:
        self._known: OrderedDict[int, str] = OrderedDict()
        self._size = size

    def __call__(self, text: str) -> str:
        key = hash(text)
        said = self._known.get(key)
        if said is None:
            said = tool_call.reported(text)
            self._known[key] = said
            if len(self._known) > self._size:
                self._known.popitem(last=False)
        else:
            self._known.move_to_end(key)
        return said


def _rule(config: ClearConfig) -> ClearingRule:
    return ClearingRule(config.keep, config.clear_at_least, frozenset(config.exclude_tools), config.clear_inputs)

