"""Whether a summariser's reply can be a summary: a table of real summaries, junk and edge cases."""

from __future__ import annotations

import json

import pytest

from proxy.summarizer.summary_check import MIN_JUDGED_CHARS, problem
from tests.fakes.hostile_summariser import filler

STRUCTURED = "<analysis>3 facts</analysis>\n```json\n" + json.dumps({
    "user_intent": ["keep a running list of facts"], "user_messages": ["FACT-0, FACT-1, FACT-2"],
    "current_work": "recording facts"}) + "\n```"
FACTS_300 = ", ".join(f"FACT-{index}" for index in range(300))
TEST_LOG = "\n".join(f"tests/test_x.py::test_case_{index} PASSED [{index}%]" for index in range(100))


@pytest.mark.parametrize(("reply", "replaced", "expected"), [
    # Summaries, terse or long, in any script: None.
    (STRUCTURED, 30_000, None),
    ("The user asked for the weather in Paris.", 30_000, None),
    ("这是一个摘要 用户希望记住所有事实 助手逐条记录", 30_000, None),  # a word a character
    (f"The user listed facts: {FACTS_300}.", 30_000, None),  # near-identical ids compress to 0.25: still words
    (f"Tests run:\n{TEST_LOG}", 30_000, None),  # a quoted log of similar lines compresses to 0.12
    (filler("prose", 100_000), 30_000, None),
    ("Nothing else", 100, None),  # a tiny history asks for two words
    # Junk: a reason.
    ("</analysis>{" * 5000, 30_000, "mostly one thing repeated"),
    ("I will summarise the conversation now. " * 400, 30_000, "mostly one thing repeated"),
    ("}{][)(;:,.<>/?!@#$%^&*-_=+|~`'\"\\ " * 200, 30_000, "mostly markup"),
    ("OK", 30_000, "1 distinct word(s), fewer than the 4"),
    ("Done. Done.", 30_000, "1 distinct word(s)"),
    ("", 30_000, "0 distinct word(s)"),
    ("\n\n   \t", 30_000, "0 distinct word(s)"),
])
def test_problem(reply: str, replaced: int, expected: str | None) -> None:
    found = problem(reply, replaced)
    if expected is None:
        assert found is None, found
    else:
        assert found is not None and expected in found, found


def test_the_words_asked_for_grow_with_what_is_replaced_up_to_four() -> None:
    assert problem("one two three", 800) is None
    assert problem("one two three", 1600) is not None  # four asked of 1,600 characters
    assert problem("one two three four", 1_000_000) is None  # never more than four


def test_a_short_repetitive_reply_is_not_judged_by_compression() -> None:
    short = "fact fact fact fact " * ((MIN_JUDGED_CHARS - 40) // 20) + " four words here"
    assert len(short) < MIN_JUDGED_CHARS
    assert problem(short, 100) is None
