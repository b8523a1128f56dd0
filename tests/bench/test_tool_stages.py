"""The tool-stages scenario of bench/agents.py (issue 30): its seeded plan, its prefix-stability figure, and a small
run of its three arms printing every figure (not how good they are)."""

from __future__ import annotations

import math
import subprocess
import sys

from bench.tool_stages import ARMS, ROWS, make_plan, next_round, prefix_shares, prefix_stability
from tests.bench.test_bench import ROOT, table


def test_the_plan_is_seeded_and_shaped_as_asked() -> None:
    plan = make_plan(200, seed=30)
    assert plan == make_plan(200, seed=30) and plan != make_plan(200, seed=31)
    calls = plan.calls
    assert len(calls) == 200 and {len(calls) for calls in plan.rounds} == {1, 2, 3}
    sizes = sorted(call.tokens for call in calls)
    assert 300 <= sizes[0] and sizes[-4] <= 3_100 and all(11_900 <= size <= 12_100 for size in sizes[-3:])
    assert len({call.id for call in calls}) == 200
    assert all(call.result.startswith(f"RESULT-{call.round}-{call.index}: {call.tool} ") for call in calls)
    # Sizes scale with the window.
    small = sorted(call.tokens for call in make_plan(20, window=8_000, huge=1).calls)
    assert 75 <= small[0] and small[-2] <= 800 and 2_900 <= small[-1] <= 3_100


def test_the_model_answers_the_round_after_the_last_result() -> None:
    assert next_round([{"role": "user", "content": "go"}]) == 0
    assert next_round([{"role": "tool", "tool_call_id": "call_7_2", "content": "[cleared]"}]) == 8
    assert next_round([]) == 0


def test_prefix_stability_is_the_share_of_the_earlier_request_the_next_one_starts_with() -> None:
    a, b, c, d = ({"role": "user", "content": text} for text in ("aaaa", "bbbb", "cccc", "dddd"))
    grown, changed = [a, b, c], [a, d, c]
    shares = prefix_shares([[a, b], grown, changed])
    assert shares[0] == 1.0  # the next request starts with all of the earlier one
    assert 0.3 < shares[1] < 0.4  # only the first of three equal messages kept
    assert prefix_stability([[a, b], grown, changed]) == (shares[0] + shares[1]) / 2
    assert prefix_shares([[a], [d]]) == [len("[]") / len('[{"role": "user", "content": "aaaa"}]')]
    assert math.isnan(prefix_stability([[a]]))  # with one request


def test_a_small_run_prints_every_figure_for_the_three_arms() -> None:
    done = subprocess.run([sys.executable, "bench/agents.py", "--only", "tool-stages", "--calls", "20",
                           "--window", "8000", "--huge", "1", "--seconds", "60"],
                          cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "tool stages: 20 tool calls in " in done.stdout and "window 8,000 tokens" in done.stdout
    rows = table(done.stdout)
    assert list(rows) == [f"{label} ({unit})" for label, unit, _ in ROWS]
    arms = list(ARMS)
    rounds = len(make_plan(20, window=8_000, huge=1).rounds)
    for label, cells in rows.items():
        assert list(cells) == [*arms, "stage 1 / off", "stages 1+2 / off"], label
        for arm in arms:
            assert float(cells[arm]) >= 0, (label, cells)
        for ratio in ("stage 1 / off", "stages 1+2 / off"):
            assert cells[ratio] == "—" or float(cells[ratio].removesuffix("x")) >= 0, (label, cells)
    for arm in arms:
        assert rows["turns (agent requests) (n)"][arm] == str(rounds + 1)
        assert rows["tool calls answered (n)"][arm] == "20"
        assert rows["failures (n)"][arm] == "0"
        assert 0 < float(rows["prefix stability (share)"][arm]) <= 1
        assert float(rows["tokens sent per turn, median (tokens)"][arm]) > 0
        total = sum(float(rows[f"summariser tokens, {kind} (tokens)"][arm]) for kind in ("whole history",
                                                                                           "pair summaries"))
        assert float(rows["summariser tokens, total (tokens)"][arm]) == total
    # What an arm turns off, it does not do.
    assert rows["turns with tool results cleared (n)"]["stages off"] == "0"
    assert rows["pair-summary calls (n)"]["stages off"] == rows["pair-summary calls (n)"]["stage 1"] == "0"
    assert float(rows["whole-history summariser calls (n)"]["stages off"]) > 0  # the small window is passed
    assert "goal, whole-history compactions at least 3x fewer: " in done.stdout
    assert "goal, total summariser tokens lower: " in done.stdout and "goal, prefix stability higher: " in done.stdout
