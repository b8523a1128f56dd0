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


GROWTH = 100  # tokens a turn: a lead of 1,000 tokens is ten turns
THRESHOLD = 6000  # the prompt is what the lead leaves of it: a lead that grows back is a prompt that shrank


@pytest.mark.parametrize(("gaps", "leads", "summary", "late"), [
    pytest.param([2.0], [2000, 1000], 10.0, [False, False], id="40 s, then 20 s left for a 10 s summary: in time"),
    pytest.param([2.0], [1400, 590], 10.0, [False, True], id="28 s, then 11.8 s, under 1.2 times 10 s: late"),
    pytest.param([2.0], [1400, 600], 10.0, [False, False], id="12 s left: just in time"),
    pytest.param([2.0], [1400, 590, 400, 0, -300], 10.0, [False, True, True, True, True],
                 id="late stays late until the summary is spliced"),
    pytest.param([2.0], [1400, 590, 3000, 500], 10.0, [False, True, False, True], id="spliced: a new cycle"),
    pytest.param([2.0], [590, 400], 10.0, [False, False],
                 id="never in time since the last splice: a client without pauses is left to the mark"),
    pytest.param([2.0], [1400, 590, 3000, 500, 200], 10.0, [False, True, False, True, True],
                 id="in time again after the splice, then late again"),
    pytest.param([0.05], [1400, 0], 0.9, [False, False], id="a summariser under a second: never late"),
    pytest.param([], [1400, 100], 10.0, [False, False], id="spacing unknown: never late"),
    pytest.param([2.0], [1400, 100], None, [False, False], id="no summary timed yet: never late"),
])
def test_a_summary_is_late_at_the_last_turn_a_start_is_in_time(
        gaps: list[float], leads: list[int], summary: float | None, late: list[bool]) -> None:
    pace, _ = paced(gaps)
    assert [pace.late("a", THRESHOLD - lead, lead, GROWTH, summary) for lead in leads] == late
    assert MARGIN == 1.2  # the ids above count with it


@pytest.mark.parametrize(("gaps", "summary", "judges"), [
    pytest.param([2.0], 10.0, True, id="spacing and a slow summary known"),
    pytest.param([2.0], 0.9, False, id="a summariser under a second"),
    pytest.param([2.0], None, False, id="no summary timed yet"),
    pytest.param([], 10.0, False, id="spacing unknown"),
])
def test_the_pace_judges_only_what_it_can_find_late(gaps: list[float], summary: float | None, judges: bool) -> None:
    pace, _ = paced(gaps)
    assert pace.judges("a", summary) is judges
    assert not pace.judges("unseen", 10.0)
    # Never late where it does not judge, whatever the lead.
    assert judges or not any(pace.late("a", THRESHOLD - lead, lead, GROWTH, summary) for lead in (1400, 0, -50))


def test_a_lead_that_grows_back_while_the_prompt_grows_is_the_same_cycle() -> None:
    """A large input then a small one: the next turn's growth is guessed smaller, the lead grows, nothing shrank."""
    pace, _ = paced([2.0])
    assert [pace.late("a", prompt, lead, growth, 10.0) for prompt, lead, growth in
            [(3000, 1400, 100), (3500, 500, 100), (3600, 550, 100), (3700, 200, 100)]] == [False, True, True, True]


def test_a_fast_clients_summary_after_a_splice_is_never_late() -> None:
    """Turns with no pause between them never leave a summary's time: a start now would only cost a summary."""
    pace, clock = paced([0.01] * 5)
    for lead in (4000, 3500, 3000, 2000, 500, 0, 5000, 4500, 10):
        clock.now += 0.01
        pace.answered("a")
        assert not pace.late("a", THRESHOLD - lead, lead, GROWTH, 1.5)


def test_conversations_are_late_each_on_their_own() -> None:
    pace, clock = paced([2.0])
    pace.answered("b")
    clock.now += 2.0
    pace.answered("b")
    assert not pace.late("a", 4600, 1400, GROWTH, 10.0)
    assert not pace.late("b", 5410, 590, GROWTH, 10.0)  # "b" was never in time
    assert pace.late("a", 5410, 590, GROWTH, 10.0)


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


@pytest.mark.parametrize(("lead", "passing", "late", "asked"), [
    pytest.param(3000, [False, True], [False, True], [7, 7],
                 id="a straight lead says 30 turns; the replay sees the clearing stop: late"),
    pytest.param(100, [False, False], [False, False], [7, 7],
                 id="the replay keeps it under: in time, whatever the lead"),
    pytest.param(3000, [None, None], [False, False], [7, 7], id="no replay (clearing off): the lead decides"),
    pytest.param(100, [True, True], [False, False], [7, 7], id="never in time by the replay: left to the mark"),
])
def test_a_replay_of_the_turns_ahead_decides_in_place_of_the_lead(
        lead: int, passing: list[bool | None], late: list[bool], asked: list[int]) -> None:
    pace, _ = paced([2.0])
    rounds: list[int] = []

    def passes(turns: int) -> bool | None:
        rounds.append(turns)
        return passing[len(rounds) - 1]

    assert [pace.late("a", 5000 + turn, lead, GROWTH, 10.0, passes) for turn in range(2)] == late
    # 1.2 x 10 s at 2 s a turn is 6 turns after the next request, which is one turn on.
    assert rounds == asked


@pytest.mark.parametrize(("prompts", "growth"), [
    pytest.param([1000], None, id="one request: no growth yet"),
    pytest.param([1000, 1600], 600.0, id="two: their difference"),
    pytest.param([1000, 1600, 2600], 0.7 * 600 + 0.3 * 1000, id="smoothed"),
    pytest.param([1000, 1600, 900, 1500], 600.0, id="a prompt that shrank (a splice, a clearing) is no turn's growth"),
    pytest.param([None, None], None, id="no prompt told"),
])
def test_a_conversations_growth_per_turn(prompts: list[int | None], growth: float | None) -> None:
    clock = Clock()
    pace = Pace(clock)
    for prompt in prompts:
        clock.now += 2.0
        pace.answered("a", prompt)
    assert pace.growth("a") == pytest.approx(growth) if growth is not None else pace.growth("a") is None
    assert pace.growth("b") is None
