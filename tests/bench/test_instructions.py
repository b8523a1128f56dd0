"""`python -m bench.instructions`: instructions per request counted by callgrind in each target, and the total read
out of a callgrind dump."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from bench.instructions import SHAPE_NAMES, UNPACED, counted_config
from proxy.config import Settings
from tests.bench.test_bench import ROOT, table


def ratio_between(numerator: str, denominator: str) -> tuple[float, float]:
    """Where a ratio printed to two decimals may lie, from the counts it was made of as the table prints them
    (rounded: "1.06" is anything from 1.055 to 1.065)."""
    def bounds(printed: str) -> tuple[float, float]:
        half = 0.5 * 10 ** -len(printed.partition(".")[2])
        return float(printed) - half, float(printed) + half
    (top_low, top_high), (bottom_low, bottom_high) = bounds(numerator), bounds(denominator)
    return top_low / bottom_high - 0.005, top_high / bottom_low + 0.005


@pytest.mark.parametrize(("numerator", "denominator", "printed", "inside"), [
    ("1.06", "0.651", 1.64, True),  # 1.0649 / 0.6505 is 1.637: the ratio of the unrounded counts
    ("1.06", "0.651", 1.62, True), ("1.06", "0.651", 1.66, False), ("0.931", "0.607", 1.53, True),
    ("0.931", "0.607", 1.55, False), ("0.931", "0.607", 1.52, False),
])
def test_a_printed_ratio_is_checked_within_its_counts_rounding(numerator: str, denominator: str, printed: float,
                                                              inside: bool) -> None:
    low, high = ratio_between(numerator, denominator)
    assert (low <= printed <= high) is inside


def test_it_counts_each_targets_instructions_per_request() -> None:
    done = subprocess.run([sys.executable, "-m", "bench.instructions", "--requests", "3", "--only", "small"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    rows = table(done.stdout)
    assert list(rows) == ["small: instructions per request (M)", "small: the same / floor's (x)",
                          "small: outside memory copies (M)", "small: outside memory copies / floor's (x)"]
    counts = {column: float(cell) for column, cell in rows["small: instructions per request (M)"].items()}
    outside = {column: float(cell) for column, cell in rows["small: outside memory copies (M)"].items()}
    assert list(counts) == list(outside) == ["floor", "proxy on"]
    # An aiohttp pass-through spends a few hundred thousand instructions on a small request; the proxy does that
    # and more (its glance, log line and metrics). Start-up and warm-up are not counted: far below a million each.
    assert 0.05 < counts["floor"] < counts["proxy on"] < 20
    # A small request copies little: most of its count is outside the copies, and never more than all of it.
    for column in counts:
        assert 0.5 * counts[column] < outside[column] <= counts[column]
    for figure, ratio in [("small: instructions per request (M)", "small: the same / floor's (x)"),
                          ("small: outside memory copies (M)", "small: outside memory copies / floor's (x)")]:
        assert rows[ratio]["floor"] == "—"
        low, high = ratio_between(rows[figure]["proxy on"], rows[figure]["floor"])
        assert low <= float(rows[ratio]["proxy on"]) <= high


@pytest.mark.parametrize("shape", SHAPE_NAMES)
def test_a_reuse_shape_is_counted_without_summaries_planned_by_pace(shape: str) -> None:
    """Under callgrind a turn takes fifty times longer, and a proxy that plans summaries by a conversation's pace
    in seconds would replay turns ahead that at full speed it does not: the reuse shapes are counted with
    compaction.background off, every other shape with the bench's configuration as it is."""
    config = json.loads(counted_config(8001, 8080, True, shape))
    assert ("background" in config["compaction"]) is (shape in UNPACED)
    if shape in UNPACED:
        assert config["compaction"]["background"] is False
    settings = Settings.model_validate(yaml.safe_load(counted_config(8001, 8080, True, shape)))
    assert settings.compaction.enabled and settings.compaction.background is (shape not in UNPACED)


def test_it_counts_a_reuse_hit() -> None:
    done = subprocess.run([sys.executable, "-m", "bench.instructions", "--requests", "2", "--only", "reuse-messages"],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    counts = table(done.stdout)["reuse-messages: instructions per request (M)"]
    # A 475 KB body read and sent on costs the floor a few million instructions; the proxy reads it too.
    assert 0.5 < float(counts["floor"]) < float(counts["proxy on"]) < 50


@pytest.mark.parametrize("flags", [["--only", "stream"], ["--only", "hold"], ["--only", "nonsense"],
                                   ["--requests", "0"], ["--requests", "2001"]])
def test_it_refuses_what_it_cannot_count_or_would_run_unbounded(flags: list[str]) -> None:
    done = subprocess.run([sys.executable, "-m", "bench.instructions", *flags], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and "error:" in done.stderr
