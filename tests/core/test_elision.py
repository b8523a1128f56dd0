"""Elision of oversized tool results: visible, bounded, only in the forwarded copy."""

from __future__ import annotations

import copy

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.budget import Limits
from proxy.core.elision import elide_oversized, elide_text


def words(text: str) -> int:
    return len(text.split())


def marker(tokens: int) -> str:
    return f"[{tokens} left out]"


def count(message: dict[str, object]) -> int:
    return 3 + words(str(message.get("content") or ""))


LIMITS = Limits(window=1000, threshold=0.8, target=0.5, reserve=100)


def test_a_huge_tool_result_is_elided_with_a_marker_and_both_ends_kept() -> None:
    text = " ".join(f"w{i}" for i in range(5000))
    messages = [{"role": "user", "content": "go"},
                {"role": "assistant", "tool_calls": [{"id": "a"}]},
                {"role": "tool", "tool_call_id": "a", "content": text}]
    before = copy.deepcopy(messages)
    elided = elide_oversized(messages, 0, count, words, LIMITS, marker)
    assert elided.count == 1 and messages == before
    content = elided.messages[2]["content"]
    assert content.startswith("w0 w1") and content.endswith("w4999") and "left out]" in content
    assert sum(count(m) for m in elided.messages) + LIMITS.reserve <= LIMITS.trigger_tokens
    assert elided.messages[2]["tool_call_id"] == "a"


def test_user_messages_and_fitting_requests_are_left_alone() -> None:
    huge_user = [{"role": "user", "content": "x " * 5000}]
    assert elide_oversized(huge_user, 0, count, words, LIMITS, marker).count == 0
    small = [{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "a", "content": "ok"}]
    assert elide_oversized(small, 0, count, words, LIMITS, marker).messages == small


def test_messages_before_the_first_index_are_never_touched() -> None:
    messages = [{"role": "tool", "tool_call_id": "a", "content": "y " * 3000},
                {"role": "tool", "tool_call_id": "b", "content": "z " * 3000}]
    elided = elide_oversized(messages, 1, count, words, LIMITS, marker)
    assert elided.messages[0] is messages[0] and elided.count == 1


@settings(max_examples=200, deadline=None)
@given(text=st.text(min_size=0, max_size=3000), keep=st.integers(1, 400))
def test_elide_text_never_exceeds_its_budget_by_more_than_the_marker(text: str, keep: int) -> None:
    shortened = elide_text(text, keep, words, marker)
    assert shortened == text or "left out]" in shortened
    assert words(shortened) <= max(keep, words(marker(10**9)) + 1) or shortened == text
