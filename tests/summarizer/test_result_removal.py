"""proxy.result_removal: the middle-out order and the rungs of the removal ladder."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.summarizer.result_removal import REMOVED_TOOL_RESULT, middle_out_order, removal_ladder

Message = dict[str, Any]


def tool_history(results: int) -> list[Message]:
    """`results` rounds of user request, assistant tool call and tool result."""
    history: list[Message] = []
    for index in range(results):
        call = {"id": f"call_{index}", "type": "function",
                "function": {"name": "run_step", "arguments": json.dumps({"step": index})}}
        history += [{"role": "user", "content": f"run step {index}"},
                    {"role": "assistant", "content": None, "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": f"call_{index}", "content": f"result {index}"}]
    return history


@pytest.mark.parametrize(
    ("count", "expected"),
    [(0, []), (1, [0]), (2, [0, 1]), (3, [1, 2, 0]), (5, [2, 3, 1, 4, 0]), (10, [4, 5, 3, 6, 2, 7, 1, 8, 0, 9])],
)
def test_middle_out_order(count: int, expected: list[int]) -> None:
    assert middle_out_order(count) == expected


@pytest.mark.parametrize("count", range(40))
def test_middle_out_order_is_a_permutation(count: int) -> None:
    assert sorted(middle_out_order(count)) == list(range(count))


def removed_results(history: list[Message]) -> set[int]:
    return {int(message["tool_call_id"].removeprefix("call_")) for message in history
            if message["role"] == "tool" and message["content"] == REMOVED_TOOL_RESULT}


@pytest.mark.parametrize(
    ("results", "expected"),
    [
        (0, [("direct", set())]),
        (1, [("direct", set()), ("removed_tool_results_10", {0})]),
        (3, [("direct", set()), ("removed_tool_results_10", {1}), ("removed_tool_results_50", {1, 2}),
             ("removed_tool_results_100", {0, 1, 2})]),
        (10, [("direct", set()), ("removed_tool_results_10", {4}), ("removed_tool_results_20", {4, 5}),
              ("removed_tool_results_50", {2, 3, 4, 5, 6}), ("removed_tool_results_100", set(range(10)))]),
    ],
)
def test_removal_ladder_rungs(results: int, expected: list[tuple[str, set[int]]]) -> None:
    history = [*tool_history(results), {"role": "user", "content": "next"}, {"role": "assistant", "content": "ok"}]
    rungs = list(removal_ladder(history))
    assert [(strategy, removed_results(attempt)) for strategy, attempt in rungs] == expected
    for _, attempt in rungs:
        assert len(attempt) == len(history)
        # Only tool results change; calls, ids and every other message stay exactly as they were.
        assert [m for m in attempt if m["role"] != "tool"] == [m for m in history if m["role"] != "tool"]
        assert [m["tool_call_id"] for m in attempt if m["role"] == "tool"] == [f"call_{i}" for i in range(results)]


def test_removal_ladder_leaves_the_input_untouched() -> None:
    history = tool_history(4)
    snapshot = json.dumps(history)
    list(removal_ladder(history))
    assert json.dumps(history) == snapshot
