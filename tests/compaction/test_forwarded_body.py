"""compaction.forwarded_body: the client's body, its edits encoded, or a reused summary spliced into its bytes —
each the same bytes as encoding what is forwarded whole."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.compaction.compactor import Conversation
from proxy.compaction.forwarded_body import ForwardedBody
from proxy.compaction.journey import Journey
from proxy.compaction.journey_tokens import JourneyTokens
from proxy.compaction.tool_stages import ToolStages
from proxy.config import settings_from_mapping
from proxy.core.budget import Limits
from proxy.core.calibration import Calibration
from proxy.core.clearing import Cleared
from proxy.core.history_index import HistoryIndex
from proxy.core.stored_replacements import StoredReplacements
from proxy.core.tokens import TokenCounter
from proxy.core.view import View
from proxy.dialects.body_memo import BodyMemo
from proxy.dialects.chat import ChatDialect
from proxy.dialects.chat_request import ChatCall
from proxy.store.store import CompactedPrefix

HISTORY = [{"role": "user" if index % 2 == 0 else "assistant", "content": f"turn {index} " + "words " * 40}
           for index in range(12)]
SUMMARY = ({"role": "user", "content": "Summary of the conversation so far: é, 中, \"quoted\"."},
           {"role": "assistant", "content": "Understood."})
PREFIX_LEN = 8


class NotAsRead(ChatDialect):
    """A dialect whose forwarded body is not the client's object with its history replaced (as Responses' is)."""

    forwards_history_as_read = False


class Setup:
    def __init__(self, *, dialect: ChatDialect | None = None, read_by_memo: bool = True,
                 summary: tuple[dict[str, Any], ...] | None = SUMMARY, **fields: Any) -> None:
        self.dialect = dialect or ChatDialect()
        self.memo = BodyMemo(min_bytes=0)
        self.body = orjson.dumps({"model": "m", "messages": HISTORY, **fields})
        payload = self.memo.read(self.body, "messages") if read_by_memo else orjson.loads(self.body)
        self.call = ChatCall.parse(self.body, {}, "", payload)
        counter, calibration = TokenCounter(), Calibration()
        messages = self.call.messages
        assert messages is not None
        history = HistoryIndex(counter).read(messages, "ns")
        record = CompactedPrefix(history.chain[PREFIX_LEN - 1], PREFIX_LEN, summary, 900, 90, "m", 0.0) \
            if summary is not None else None
        self.journey: Journey[ChatCall] = Journey(
            self.call, View(messages), Conversation(messages, history.chain, "ns", record),
            Limits(window=100_000, threshold=0.8, target=0.5, reserve=0), history, 5)
        self.stored = StoredReplacements()
        self.tokens = JourneyTokens(counter, calibration,
                                    ToolStages(settings_from_mapping({}, env={}), counter, calibration, None))
        self.forwarded = ForwardedBody(self.dialect, self.memo, self.stored, self.tokens)

    def encoded_whole(self, *, ask_usage: bool = False) -> bytes:
        return self.dialect.forwarded(self.call, self.journey.view, self.tokens.messages(self.journey),
                                      ask_usage=ask_usage)


def test_a_request_with_nothing_changed_goes_as_it_came() -> None:
    setup = Setup(summary=None)
    assert setup.forwarded.of(setup.journey, ask_usage=False) is setup.body


@pytest.mark.parametrize("fields", [{}, {"stream": True, "temperature": 0.2, "tools": [{"type": "function"}]}],
                         ids=["bare", "fields"])
def test_a_reused_summary_is_spliced_into_the_clients_bytes(fields: dict[str, Any]) -> None:
    setup = Setup(**fields)
    sent = setup.forwarded.of(setup.journey, ask_usage=False)
    assert sent == setup.encoded_whole()
    assert orjson.loads(sent)["messages"] == [*SUMMARY, *HISTORY[PREFIX_LEN:]]
    assert len(setup.stored) == 1  # the summary's JSON kept for the next request
    assert setup.forwarded.of(setup.journey, ask_usage=False) == sent


@pytest.mark.parametrize("case", ["not read by the memo", "not forwarded as read", "orjson refuses the summary"])
def test_otherwise_a_reused_summary_is_encoded_whole(case: str) -> None:
    setup = Setup(read_by_memo=case != "not read by the memo",
                  dialect=NotAsRead() if case == "not forwarded as read" else None,
                  summary=({"role": "user", "content": "half a pair: \ud800"},) if "refuses" in case else SUMMARY)
    assert setup.forwarded.of(setup.journey, ask_usage=False) == setup.encoded_whole()


@pytest.mark.parametrize("edit", ["cleared", "elided", "usage asked"])
def test_an_edited_history_is_encoded_whole(edit: str) -> None:
    setup = Setup()
    if edit == "cleared":
        shorter = [*setup.journey.conversation.messages]
        shorter[-2] = {"role": "user", "content": "[cleared]"}
        setup.journey.cleared = Cleared(shorter, results=1, freed=40, indices=frozenset({len(shorter) - 2}))
    elif edit == "elided":
        setup.journey.elided, setup.journey.forwarded = 1, [*SUMMARY, {"role": "user", "content": "[elided]"}]
    sent = setup.forwarded.of(setup.journey, ask_usage=edit == "usage asked")
    assert sent == setup.encoded_whole(ask_usage=edit == "usage asked")
    assert len(setup.stored) == 0  # nothing spliced
    if edit == "usage asked":
        assert orjson.loads(sent)["stream_options"] == {"include_usage": True}
