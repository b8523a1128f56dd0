"""Conversation: the history as forwarded, what the proxy wrote in it, positions back in the client's history."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.compaction.conversation import Conversation
from proxy.store.store import CompactedPrefix

SYSTEM = {"role": "system", "content": "be brief"}
HISTORY: list[dict[str, Any]] = [SYSTEM, *({"role": "user" if n % 2 == 0 else "assistant", "content": f"turn {n}"}
                                           for n in range(6))]
CHAIN = [f"link-{n}" for n in range(len(HISTORY))]
SUMMARY = {"role": "user", "content": "<summary>turns 0 to 3</summary>"}
FILLER = {"role": "assistant", "content": "Understood."}


def record(prefix_len: int, *replacement: dict[str, Any]) -> CompactedPrefix:
    return CompactedPrefix(CHAIN[prefix_len - 1], prefix_len, replacement, 900, 60, "m", 1.0)


# (stored replacement, prefix_len) -> (messages as forwarded, synthetic positions)
CASES: dict[str, tuple[tuple[dict[str, Any], ...], int, list[dict[str, Any]], frozenset[int]]] = {
    "summary and filler": ((SYSTEM, SUMMARY, FILLER), 5, [SYSTEM, SUMMARY, FILLER, *HISTORY[5:]],
                           frozenset({1, 2})),
    "summary alone": ((SUMMARY,), 3, [SUMMARY, *HISTORY[3:]], frozenset({0})),
    # Only the first user message is the summary: a later one is the client's own words, carried over.
    "a user message after the summary": ((SUMMARY, FILLER, HISTORY[5]), 6, [SUMMARY, FILLER, HISTORY[5],
                                                                            HISTORY[6]], frozenset({0, 1})),
    "no user message": ((SYSTEM, FILLER), 2, [SYSTEM, FILLER, *HISTORY[2:]], frozenset({1})),
}


@pytest.mark.parametrize("name", CASES)
def test_a_stored_summary_stands_in_for_the_first_messages(name: str) -> None:
    replacement, prefix_len, forwarded, synthetic = CASES[name]
    conversation = Conversation(HISTORY, CHAIN, "ns", record(prefix_len, *replacement))
    assert conversation.messages == forwarded
    assert conversation.synthetic == synthetic
    assert conversation.replaced == len(replacement)
    # Every message after the replacement is the client's, at its place in the client's history.
    for index in range(conversation.replaced, len(forwarded)):
        assert HISTORY[conversation.original_index(index)] is forwarded[index]


def test_without_a_record_the_history_goes_as_sent() -> None:
    conversation = Conversation(HISTORY, CHAIN, "ns")
    assert conversation.messages == HISTORY and conversation.messages is not HISTORY
    assert (conversation.synthetic, conversation.replaced) == (frozenset(), 0)
    assert [conversation.original_index(n) for n in range(3)] == [0, 1, 2]


@pytest.mark.parametrize(("history", "chain", "key"), [
    (HISTORY, CHAIN, "ns:link-1"),  # the first message after the instructions
    (HISTORY[1:], CHAIN[1:], "ns:link-1"),  # the same conversation without its system prompt
    ([SYSTEM], CHAIN[:1], "ns:link-0"),  # nothing but instructions: the first message
    ([SYSTEM, SYSTEM, HISTORY[1]], CHAIN[:2], "ns:link-1"),  # a chain shorter than the history: its last link
    ([], [], "ns"),  # no history at all
])
def test_a_conversation_backs_off_as_one_by_its_tenant_and_first_words(
        history: list[dict[str, Any]], chain: list[str], key: str) -> None:
    assert Conversation(history, chain, "ns").backoff_key == key


def test_tenants_back_off_apart() -> None:
    assert Conversation(HISTORY, CHAIN, "a").backoff_key != Conversation(HISTORY, CHAIN, "b").backoff_key


def test_what_the_proxy_wrote_comes_with_the_stored_replacement_when_known() -> None:
    """The compactor hands over the positions it keeps with the replacement (StoredReplacements): they are used as
    given, and not part of what the conversation is."""
    given = frozenset({1, 2})
    conversation = Conversation(HISTORY, CHAIN, "ns", record(5, SYSTEM, SUMMARY, FILLER), None, given)
    assert conversation.synthetic is given
    assert conversation == Conversation(HISTORY, CHAIN, "ns", record(5, SYSTEM, SUMMARY, FILLER))
    assert Conversation(HISTORY, CHAIN, "ns", None, None, given).synthetic == frozenset()  # no record, nothing


def test_the_forwarded_messages_are_made_once() -> None:
    conversation = Conversation(HISTORY, CHAIN, "ns", record(5, SYSTEM, SUMMARY, FILLER))
    assert conversation.messages is conversation.messages
    # The counts a stored replacement came with are not part of what a conversation is.
    assert conversation == Conversation(HISTORY, CHAIN, "ns", record(5, SYSTEM, SUMMARY, FILLER), (1, 2, 3))
