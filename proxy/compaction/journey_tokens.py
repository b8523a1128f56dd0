"""What a journey's request costs in tokens: as the client sent it, and as it will be forwarded, counted once."""

from __future__ import annotations

from typing import Any

from proxy.compaction.journey import Journey
from proxy.compaction.tool_stages import ToolStages
from proxy.core.calibration import Calibration
from proxy.core.messages import Message
from proxy.core.tokens import TokenCounter


class JourneyTokens:
    """Counts in the upstream's tokens (calibrated) unless named raw; the counts of one shape of a journey's
    messages are kept on the journey, so asking again costs nothing."""

    def __init__(self, counter: TokenCounter, calibration: Calibration, stages: ToolStages) -> None:
        self._counter = counter
        self._calibration = calibration
        self._stages = stages

    def messages(self, journey: Journey[Any]) -> list[Message]:
        """The messages as they will be forwarded: the stages applied, then what elision shortened."""
        return journey.forwarded if journey.elided else self._stages.base(journey)

    def estimate(self, journey: Journey[Any]) -> int:
        """The request as it will be forwarded."""
        return self._calibration.adjust(journey.call.model, self.raw_estimate(journey))

    def raw_estimate(self, journey: Journey[Any]) -> int:
        return self._counted(journey)[2] + journey.overhead

    def original(self, journey: Journey[Any]) -> int:
        """The request as the client sent it."""
        return self._calibration.adjust(journey.call.model, sum(journey.history.tokens) + journey.overhead)

    def overhead(self, journey: Journey[Any]) -> int:
        """What the request costs besides its messages: tool definitions and the reply primer."""
        return self._calibration.adjust(journey.call.model, journey.overhead)

    def message_tokens(self, journey: Journey[Any]) -> list[int]:
        """Token counts of the messages as they will be forwarded, counted once per shape of the journey."""
        return self._counted(journey)[1]

    def _counted(self, journey: Journey[Any]) -> tuple[list[Message], list[int], int]:
        """The messages as they will be forwarded, their counts and the counts' sum, kept on the journey until
        its shape changes (the estimate is asked for several times a request)."""
        messages = self.messages(journey)
        counted = journey.counted
        if counted is not None and counted[0] is messages:
            return counted
        if journey.elided or journey.cleared or journey.swapped:
            tokens = self._counter.count_each(messages)
        else:  # the replacement, then the client's own messages after the stored prefix, already counted
            tokens = journey.conversation_tokens(self._counter.count_each)
        journey.counted = counted = (messages, tokens, sum(tokens))
        return counted
