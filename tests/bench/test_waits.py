"""bench/waits.py: the added wait per turn is measured from the client's own send and answer times, and a small run
of every agent prints every figure (not how good they are)."""

from __future__ import annotations

import os
import time

import pytest

from bench.waits import DIALECTS, Arm, Turns, _percentile, _row, arguments, main, paced, run_arm, table
from tests.fakes.windowed import WindowedModel


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


@pytest.mark.parametrize("dialect", ["responses", "messages"])
async def test_an_agent_with_a_slow_summariser_waits_for_hardly_any_of_its_later_summaries(dialect: str) -> None:
    """The bench's agent loop at a fifth of its pace (a summary takes five turns): from the second summary on, the
    proxy knows both paces and starts each summary early enough that at most one turn waits for one (without the
    pace, the Messages agent waited on 3 of 4; starting with no time to spare, on 2 of 4)."""
    options = arguments(["--turn", "0.3", "--rounds", "100", "--dialects", dialect])
    row = await run_arm(Arm(dialect, 1.5), options)
    assert row["summaries"] >= 4, row
    assert row["waited_after_first"] <= 1, row


@pytest.mark.parametrize(("outcomes", "answered", "waited", "after_first"), [
    pytest.param(["none", "none", "prepared", "reused"], [3.0, 12.1, 25.0, 32.0], 1, 0,
                 id="the first turn's start is not a summary's wait; the first summary's is not a later one's"),
    pytest.param(["none", "prepared", "reused", "prepared"], [2.1, 15.0, 22.0, 35.0], 2, 1,
                 id="a later summary waited for"),
    pytest.param(["none", "none", "reused", "reused"], [2.1, 12.1, 27.0, 37.0], 2, 1,
                 id="without a mark: told by the waits alone"),
])
def test_which_turns_waited_for_a_summary(outcomes: list[str], answered: list[float], waited: int,
                                          after_first: int) -> None:
    turns = Turns(sent=[0.0, 10.0, 20.0, 30.0], answered=answered, outcomes=outcomes)
    row = _row(Arm("chat", 10.0), turns, WindowedModel(window=1000), 2.0)
    assert (row["waited"], row["waited_after_first"]) == (waited, after_first)
