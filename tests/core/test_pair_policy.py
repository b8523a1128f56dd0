"""proxy.core.pair_policy: which rounds stage 2 may summarise, and the settings it refuses."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.core.pair_policy import PairSummaryPolicy
from proxy.core.tool_rounds import tool_rounds


@pytest.mark.parametrize("wrong", [{"batch_size": 0}, {"keep_recent": -1}, {"cutoff": 0}, {"cutoff": 1},
                                   {"max_summary_tokens": 8}, {"timeout": 0}, {"max_lookups": -1}])
def test_a_policy_out_of_range_is_refused(wrong: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        PairSummaryPolicy(**wrong)


@pytest.mark.parametrize(("keep_recent", "rounds", "old"), [(8, 12, 4), (0, 3, 2), (1, 3, 2), (2, 1, 0), (5, 0, 0)])
def test_the_old_rounds_leave_the_recent_and_always_the_current(keep_recent: int, rounds: int, old: int) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for index in range(rounds):
        messages += [{"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{index}", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": f"c{index}", "content": "out"}]
    found = tool_rounds(messages)
    assert PairSummaryPolicy(keep_recent=keep_recent).old(found) == found[:old]
