"""proxy.core.pair_reply: a batch's reply read as one summary per round, or refused with a reason code."""

from __future__ import annotations

import pytest

from proxy.core.pair_reply import BadReply, parsed_summaries


def test_parsed_summaries_tolerates_a_fence_and_words_around_the_list() -> None:
    reply = {"content": 'Sure:\n```json\n["a /x.py", " b "]\n```', "finish_reason": "stop"}
    assert parsed_summaries(reply, 2) == ["a /x.py", "b"]
    with pytest.raises(BadReply):
        parsed_summaries({"content": "[" * 100_000 + "]" * 100_000}, 1)


@pytest.mark.parametrize(("reply", "count", "reason"), [
    ({"content": '["a"]', "finish_reason": "length"}, 1, "cut_off"),
    ({"content": "no list here"}, 1, "not_a_list"),
    ({"content": "[not json]"}, 1, "not_json"),
    ({"content": '["a", "b"]'}, 3, "wrong_count"),
    ({"content": '{"a": 1}'}, 1, "not_a_list"),
    ({"content": '["a", "  "]'}, 2, "empty_summary"),
    ({"content": '[1, "b"]'}, 2, "empty_summary"),
])
def test_a_bad_reply_is_refused_with_its_reason(reply: dict[str, str], count: int, reason: str) -> None:
    with pytest.raises(BadReply, match=reason):
        parsed_summaries(reply, count)
