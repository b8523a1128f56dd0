"""compaction.journey_tokens: the estimate is the forwarded messages' counts, counted once per shape of the journey."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
import pytest

from proxy.compaction.conversation import Conversation
from proxy.compaction.journey import Journey
from proxy.compaction.journey_tokens import JourneyTokens
from proxy.compaction.tool_stages import ToolStages
from proxy.config import settings_from_mapping
from proxy.core.budget import Limits
from proxy.core.calibration import Calibration
from proxy.core.clearing import Cleared
from proxy.core.history_index import HistoryIndex
from proxy.core.tokens import TokenCounter
from proxy.core.view import View
from proxy.dialects.chat_request import ChatCall
from proxy.store.store import CompactedPrefix

OVERHEAD = 7


class CountingCounter(TokenCounter):
    def __init__(self) -> None:
        super().__init__()
        self.passes = 0

    def count_each(self, messages: Sequence[Any]) -> list[int]:
        self.passes += 1
        return super().count_each(messages)


def setup(messages: list[dict[str, Any]]) -> tuple[JourneyTokens, Journey[ChatCall], CountingCounter, Calibration]:
    counter, calibration = CountingCounter(), Calibration()
    settings = settings_from_mapping({}, env={})
    payload = {"model": "m", "messages": messages}
    call = ChatCall.parse(orjson.dumps(payload), {}, "", payload)
    history = HistoryIndex(counter).read(messages, "ns")
    journey: Journey[ChatCall] = Journey(call, View(messages), Conversation(messages, history.chain, "ns"),
                                         Limits(window=1000, threshold=0.8, target=0.5, reserve=0), history, OVERHEAD)
    return JourneyTokens(counter, calibration, ToolStages(settings, counter, calibration, None)), journey, counter, \
        calibration


MESSAGES = [{"role": "user", "content": "word " * 30}, {"role": "assistant", "content": "fine"},
            {"role": "user", "content": "and more " * 10}]


def test_the_estimate_is_the_counts_of_what_is_forwarded_and_the_overhead() -> None:
    tokens, journey, counter, _ = setup(MESSAGES)
    expected = sum(counter.count_message(message) for message in MESSAGES) + OVERHEAD
    assert tokens.raw_estimate(journey) == expected
    assert tokens.estimate(journey) == expected  # calibrated at 1 until the upstream says otherwise
    assert tokens.message_tokens(journey) == [counter.count_message(message) for message in MESSAGES]


@pytest.mark.parametrize("asks", [1, 2, 5])
def test_asking_again_counts_nothing_again(asks: int) -> None:
    tokens, journey, counter, _ = setup(MESSAGES)
    journey.cleared = Cleared([{"role": "user", "content": "short"}, *MESSAGES[1:]], results=1, freed=20)
    answers = {tokens.raw_estimate(journey) for _ in range(asks)} | {sum(tokens.message_tokens(journey))
                                                                      + OVERHEAD}
    assert len(answers) == 1
    assert counter.passes == 1


def test_a_new_shape_is_counted_anew() -> None:
    tokens, journey, counter, _ = setup(MESSAGES)
    whole = tokens.raw_estimate(journey)
    shorter = [{"role": "user", "content": "short"}, *MESSAGES[1:]]
    journey.cleared = Cleared(shorter, results=1, freed=20)
    assert tokens.raw_estimate(journey) == sum(map(counter.count_message, shorter)) + OVERHEAD < whole
    journey.cleared = None  # back to the conversation as sent
    assert tokens.raw_estimate(journey) == whole


def record(prefix_len: int) -> CompactedPrefix:
    return CompactedPrefix("abc", prefix_len, ({"role": "user", "content": "the summary " * 20},), 100, 30, "m", 0.0)


def test_a_stored_summarys_counts_are_its_own_then_the_clients_and_counted_once() -> None:
    tokens, journey, counter, _ = setup(MESSAGES)
    stored = record(2)
    journey.conversation = Conversation(MESSAGES, journey.history.chain, "ns", stored)
    expected = [counter.count_message(stored.replacement[0]), counter.count_message(MESSAGES[2])]
    counter.passes = 0
    asked = [journey.conversation_tokens(counter.count_each) for _ in range(3)]
    assert asked == [expected] * 3 and counter.passes == 1
    assert tokens.message_tokens(journey) == expected and counter.passes == 1
    journey.conversation = Conversation(MESSAGES, journey.history.chain, "ns", record(1))  # another summary
    assert journey.conversation_tokens(counter.count_each)[1:] == [counter.count_message(m) for m in MESSAGES[1:]]
    assert counter.passes == 2


def test_the_estimate_follows_the_calibration() -> None:
    tokens, journey, _, calibration = setup(MESSAGES)
    raw = tokens.raw_estimate(journey)
    for _ in range(20):
        calibration.observe("m", raw, 2 * raw)  # the upstream counts twice as many
    assert tokens.raw_estimate(journey) == raw
    assert tokens.estimate(journey) > 1.5 * raw


def test_counts_the_compactor_kept_for_a_stored_summary_are_used_not_counted_again() -> None:
    _, journey, counter, _ = setup(MESSAGES)
    stored = record(2)
    kept = (counter.count_message(stored.replacement[0]),)
    journey.conversation = Conversation(MESSAGES, journey.history.chain, "ns", stored, kept)
    counter.passes = 0
    assert journey.conversation_tokens(counter.count_each) == [*kept, counter.count_message(MESSAGES[2])]
    assert counter.passes == 0
