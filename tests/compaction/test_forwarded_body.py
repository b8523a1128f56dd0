"""compaction.forwarded_body: the client's body, its edits encoded, or a reused summary spliced into its bytes —
each the same bytes as encoding what is forwarded whole."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from proxy.compaction.conversation import Conversation
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


@pytest.mark.parametrize("name", ["chat", "responses", "messages"])
def test_nothing_is_made_to_splice_into_a_body_the_memo_does_not_hold(name: str) -> None:
    # A small body, or a bridge's chat request: the summary's JSON or items were made, then the splice refused.
    if name == "chat":
        chat = Setup(read_by_memo=False)
        forwarded, journey, stored, whole = chat.forwarded, chat.journey, chat.stored, chat.encoded_whole()
    else:
        items = ItemsSetup(name, responses_items(6) if name == "responses" else messages_items(6), 6 if
                           name == "responses" else 8, keyed=False, remembered=False)
        forwarded, journey, stored, whole = items.forwarded, items.journey, items.stored, items.encoded_whole()
    assert forwarded.of(journey, ask_usage=False) == whole
    assert (forwarded.spliced, len(stored)) == (0, 0)


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


# --- Responses and Messages: the summary rendered as items, the rest the client's bytes ---------------------------

def responses_items(turns: int) -> list[Any]:
    items: list[Any] = []
    for index in range(turns):
        call = f"call_{index}"
        items += [{"type": "message", "role": "user", "content": f"step {index} é " + "words " * 30},
                  {"type": "function_call", "call_id": call, "name": "shell", "arguments": "{\"n\": 1}"},
                  {"type": "function_call_output", "call_id": call, "output": f"result {index} " + "x" * 50}]
    return items


def messages_items(turns: int) -> list[Any]:
    items: list[Any] = []
    for index in range(turns):
        call = f"toolu_{index}"
        items += [{"role": "user", "content": f"step {index} 中 " + "words " * 30},
                  {"role": "assistant", "content": [{"type": "text", "text": "on it"},
                                                    {"type": "tool_use", "id": call, "name": "bash",
                                                     "input": {"cmd": "ls"}}]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call, "content": "out"}]},
                  {"role": "assistant", "content": f"done {index}"}]
    return [*items, {"role": "user", "content": "go on"}]


def dialect_of(name: str) -> Any:
    from proxy.dialects.messages import MessagesDialect
    from proxy.dialects.messages_over_chat import MessagesOverChatDialect
    from proxy.dialects.responses import ResponsesDialect, ResponsesOverChatDialect

    return {"responses": ResponsesDialect(), "messages": MessagesDialect(),
            "responses over chat": ResponsesOverChatDialect(),
            "messages over chat": MessagesOverChatDialect()}[name]


class ItemsSetup:
    """A reuse hit in a dialect read from the client's items, with the summary's cut after message `cut`."""

    def __init__(self, name: str, items: list[Any], cut: int, *, keyed: bool = True, remembered: bool = True,
                 **fields: Any) -> None:
        self.dialect = dialect_of(name)
        key = self.dialect.history_key
        self.memo = BodyMemo(min_bytes=0 if remembered else 1 << 40)  # otherwise read whole, as a small body is
        self.body = orjson.dumps({"model": "m", key: items, **fields})
        self.call = self.dialect.parse(self.body, {}, "", self.memo.read(self.body, key), self.memo)
        view = self.dialect.history(self.call, self.memo)
        assert view is not None
        if keyed:  # as the journey does: its keys (and their counts) kept in the memo
            assert self.memo.keys_of_view(view, name) is not None and self.memo.view_keys(view) is not None
        counter, calibration = TokenCounter(), Calibration()
        history = HistoryIndex(counter).read(view.messages, "ns")
        record = CompactedPrefix(history.chain[cut - 1], cut, SUMMARY, 900, 90, "m", 0.0)
        self.journey: Journey[Any] = Journey(
            self.call, view, Conversation(view.messages, history.chain, "ns", record),
            Limits(window=100_000, threshold=0.8, target=0.5, reserve=0), history, 5)
        self.tokens = JourneyTokens(counter, calibration,
                                    ToolStages(settings_from_mapping({}, env={}), counter, calibration, None))
        self.stored = StoredReplacements()
        self.forwarded = ForwardedBody(self.dialect, self.memo, self.stored, self.tokens)

    def encoded_whole(self) -> bytes:
        return bytes(self.dialect.forwarded(self.call, self.journey.view, self.tokens.messages(self.journey),
                                            ask_usage=False))


@pytest.mark.parametrize("name, items, cut, fields, spliced", [
    ("responses", responses_items(6), 6, {}, True),                     # at a turn's start
    ("responses", responses_items(6), 7, {"store": False, "tools": [{"type": "function"}]}, True),
    ("responses", responses_items(6), 6, {"context_management": [{"type": "compaction"}]}, False),
    ("messages", messages_items(6), 8, {}, True),                       # a user message follows the summary's reply
    ("messages", messages_items(6), 9, {}, False),                      # an assistant one: forwarded merges them
    ("messages", [*messages_items(3), {"role": "user", "content": "again"}], 4, {}, False),  # the client's own
                                                                                             # neighbours of one role
    ("messages", messages_items(6), 4, {"system": "be brief", "max_tokens": 100}, True),
    ("responses over chat", responses_items(6), 6, {}, False),
    ("messages over chat", messages_items(6), 8, {}, False),
], ids=["responses", "responses-fields", "responses-context-management", "messages", "messages-merged",
        "messages-clients-neighbours", "messages-fields", "responses-over-chat", "messages-over-chat"])
def test_a_reuse_hit_in_items_is_spliced_where_forwarded_would_send_the_same(
        name: str, items: list[Any], cut: int, fields: dict[str, Any], spliced: bool) -> None:
    for keyed in (True, False):  # the view's counts from its keys in the memo, or counted here
        setup = ItemsSetup(name, items, cut, keyed=keyed, **fields)
        sent = setup.forwarded.of(setup.journey, ask_usage=False)
        assert sent == setup.encoded_whole()
        assert setup.forwarded.spliced == spliced
        assert setup.forwarded.of(setup.journey, ask_usage=False) == sent  # again: the summary rendered once
        # Rendered once where the client's bytes go on (spliced or not: the merged Messages cases); never for a
        # call whose body the dialect made anew (a bridge's chat request, Responses without context_management).
        remade = name.endswith("over chat") or "context_management" in fields
        assert len(setup.stored) == (0 if remade else 1)


def test_a_group_the_cut_splits_is_rendered_after_the_summary() -> None:
    items = messages_items(4)  # a user item holding a tool result and text: two messages, one group
    items[2]["content"].append({"type": "text", "text": "and then?"})
    probe = ItemsSetup("messages", items, 1).journey.view
    inside = next(index for index, group in enumerate(probe.groups) if len(group.messages) > 1)
    cut = sum(len(group.messages) for group in probe.groups[:inside]) + 1  # between its result and its text
    setup = ItemsSetup("messages", items, cut)
    assert setup.journey.view.kept_after(cut) == (cut + 1, inside + 1)
    sent = setup.forwarded.of(setup.journey, ask_usage=False)
    assert sent == setup.encoded_whole() and setup.forwarded.spliced == 1
    assert orjson.loads(sent)["messages"][3:] == items[inside + 1:]  # summary, reply, the text; the rest


@settings(max_examples=80, deadline=None)
@given(name=st.sampled_from(["responses", "messages"]), turns=st.integers(1, 5), data=st.data(),
       text=st.sampled_from([False, True]))
def test_any_cut_forwards_what_encoding_whole_forwards(name: str, turns: int, data: st.DataObject,
                                                       text: bool) -> None:
    items = messages_items(turns) if name == "messages" else responses_items(turns)
    if text and name == "messages":
        items[2]["content"].append({"type": "text", "text": "and then?"})  # a group of two messages
    probe = ItemsSetup(name, items, 1)
    cut = data.draw(st.integers(1, len(probe.journey.view.messages) - 1))
    setup = ItemsSetup(name, items, cut, keyed=data.draw(st.booleans()))
    assert setup.forwarded.of(setup.journey, ask_usage=False) == setup.encoded_whole()
    event(f"spliced={setup.forwarded.spliced}")
