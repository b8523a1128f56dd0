"""proxy.compaction.pace: each conversation's turn spacing, and when a summary started now would be late."""

from __future__ import annotations

import pytest

from proxy.compaction.pace import MARGIN, Pace, smoothed


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def paced(gaps: list[float], capacity: int = 16) -> tuple[Pace, Clock]:
    clock = Clock()
    pace = Pace(clock, capacity)
    pace.answered("a")
    for gap in gaps:
        clock.now += gap
        pace.answered("a")
    return pace, clock


@pytest.mark.parametrize(("gaps", "interval"), [
    pytest.param([], None, id="one answer: no spacing yet"),
    pytest.param([2.0], 2.0, id="two answers: their gap"),
    pytest.param([2.0, 2.0, 2.0], 2.0, id="steady"),
    pytest.param([2.0, 12.0], 0.7 * 2.0 + 0.3 * 12.0, id="one slow turn weighs a share, not all"),
])
def test_a_conversations_turn_spacing(gaps: list[float], interval: float | None) -> None:
    pace, _ = paced(gaps)
    assert pace.interval("a") == pytest.approx(interval) if interval is not None else pace.interval("a") is None
    assert pace.interval("b") is None


@pytest.mark.parametrize(("gaps", "turns_left", "summary", "late"), [
    pytest.param([2.0], 10, 10.0, False, id="20 s of turns left for a 10 s summary: in time"),
    pytest.param([2.0], 5.9, 10.0, True, id="11.8 s left, under 1.2 times 10 s: late"),
    pytest.param([2.0], 6, 10.0, False, id="12 s left: just in time"),
    pytest.param([2.0], 0, 0.5, True, id="no turn left: late whatever the summary"),
    pytest.param([2.0], -3, 0.5, True, id="past the threshold already"),
    pytest.param([], 1, 10.0, False, id="spacing unknown: never late"),
    pytest.param([2.0], 1, None, False, id="no summary timed yet: never late"),
])
def test_a_summary_is_late_when_the_turns_left_take_less_than_its_time_and_a_margin(
        gaps: list[float], turns_left: float, summary: float | None, late: bool) -> None:
    pace, _ = paced(gaps)
    assert pace.late("a", turns_left, summary) is late
    assert MARGIN == 1.2  # the ids above count with it


def test_a_clock_that_steps_back_counts_no_negative_gap() -> None:
    pace, clock = paced([2.0])
    clock.now -= 50
    pace.answered("a")
    assert pace.interval("a") == pytest.approx(0.7 * 2.0)


def test_the_least_recently_answered_conversations_are_forgotten_past_the_capacity() -> None:
    clock = Clock()
    pace = Pace(clock, capacity=3)
    for key in ("a", "b", "c", "a", "d"):  # "a" answered again: "b" is the oldest when "d" comes
        clock.now += 1
        pace.answered(key)
        pace.answered(key)
    assert [pace.interval(key) is not None for key in "abcd"] == [True, False, True, True]


def test_many_conversations_answering_in_turns_keep_their_own_spacing() -> None:
    clock = Clock()
    pace = Pace(clock)
    for _ in range(5):
        for key, step in (("fast", 1.0), ("slow", 9.0)):
            clock.now += step
            pace.answered(key)
    # Interleaved, each conversation's gap is the time between its own answers: 10 s for both here.
    assert pace.interval("fast") == pytest.approx(10.0) and pace.interval("slow") == pytest.approx(10.0)


@pytest.mark.parametrize(("earlier", "latest", "expected"), [
    (None, 4.0, 4.0), (4.0, 4.0, 4.0), (10.0, 0.0, 7.0), (0.0, 10.0, 3.0),
])
def test_smoothed(earlier: float | None, latest: float, expected: float) -> None:
    assert smoothed(earlier, latest) == pytest.approx(expected)
