"""bench/waits.py: the added wait per turn is measured from the client's own send and answer times, and a small run
of every agent prints every figure (not how good they are)."""

from __future__ import annotations

import os
import time

import pytest

from bench.waits import DIALECTS, Turns, _percentile, arguments, main, paced, table


def test_the_added_wait_is_the_time_to_the_answer_less_the_models_own() -> None:
    turns = Turns(sent=[0.0, 10.0, 20.0], answered=[2.1, 14.0, 21.9], outcomes=["none", "prepared", "reused"])
    assert [round(value, 3) for value in turns.added(2.0)] == [0.1, 2.0, 0.0]  # never below nothing


@pytest.mark.parametrize(("values", "share", "expected"), [([], 0.95, 0.0), ([3.0], 0.95, 3.0),
                                                          ([float(n) for n in range(100)], 0.95, 95.0)])
def test_percentile(values: list[float], share: float, expected: float) -> None:
    assert _percentile(values, share) == expected


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(SystemExit):
        arguments(["--dialects", "chat,telnet"])
    options = arguments(["--delays", "2, 10", "--dialects", "chat"])
    assert options.delays == [2.0, 10.0] and options.dialects == ["chat"]


async def test_a_turn_is_paced_and_a_summary_is_not() -> None:
    seen: list[str] = []

    async def inner(*args: object) -> str:
        seen.append("answered")
        return "ok"

    hook = paced(inner, 0.3, chat=True)
    summary = {"messages": [{"role": "user", "content": "Stop the work here and write a summary of the conversation "
                                                        "above."}]}
    started = time.monotonic()
    assert await hook(None, summary, None) == "ok"
    asked = time.monotonic()
    assert await hook(None, {"messages": [{"role": "user", "content": "go on"}]}, None) == "ok"
    assert asked - started < 0.3 <= time.monotonic() - asked
    assert seen == ["answered", "answered"]


async def test_a_small_run_of_every_agent_prints_every_figure() -> None:
    options = arguments(["--delays", "0.3", "--turn", "0.05", "--rounds", "30", "--window", "6000"])
    rows = await main(options)
    assert [row["dialect"] for row in rows] == list(DIALECTS)
    for row in rows:
        assert row["summaries"] >= 1, row
        assert 0 <= row["waited_after_first"] <= row["waited"] <= row["turns"]
        assert 0 <= row["median"] <= row["p95"] <= row["max"]
        assert sum(row["outcomes"].values()) == row["turns"]
    # Each arm in a process of its own (on one loop, one client's preparing of a request delays the others).
    assert os.getpid() not in {row["process"] for row in rows}
    lines = table(rows)
    assert len(lines) == 2 + len(rows) and all(line.count("|") == lines[0].count("|") for line in lines)
