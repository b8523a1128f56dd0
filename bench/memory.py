"""Resident memory of each target: idle after warm-up, and with 1,000 streams held open through it."""

from __future__ import annotations

import time
from typing import Any

from bench.load_client import LoadClient
from bench.rounds import BenchFailed, progress
from bench.scenarios import Row
from bench.targets import Target

STREAMS = 1000
OPEN_SECONDS = (90.0, 45.0)     # (default, --quick) to open them all
SETTLE_SECONDS = 2.0            # after closing them: the upstream notices at its next chunk, 1 s apart
MB = 1024 * 1024


def idle_rss(targets: list[Target]) -> dict[str, int]:
    """RSS of every target but direct, now (called once everything is warmed up)."""
    return {target.column: target.rss() for target in targets if target.kind != "direct"}


def held_rss(load: LoadClient, targets: list[Target], quick: bool) -> dict[str, dict[str, Any]]:
    """For each target but direct: open STREAMS streams through it, RSS once all have their first chunk."""
    held = {}
    for target in targets:
        if target.kind == "direct":
            continue
        answer = load.hold(target.url, STREAMS, OPEN_SECONDS[quick], [target.child.pid])
        if answer["opened"] != STREAMS or not target.child.alive():
            raise BenchFailed(f"{target.column}: {answer['opened']} of {STREAMS} streams opened "
                              f"({answer['failures']} failed) in {answer['seconds_to_open']:.1f} s\n"
                              f"{target.child.output(2000)}")
        answer["rss"] = answer["rss_bytes"][str(target.child.pid)]
        held[target.column] = answer
        progress(f"  rss {target.column}: {STREAMS} streams open in {answer['seconds_to_open']:.1f} s, "
                 f"{answer['rss'] / MB:.1f} MB")
        time.sleep(SETTLE_SECONDS)
    return held


def rss_rows(idle: dict[str, int], held: dict[str, dict[str, Any]]) -> list[Row]:
    return [Row("RSS idle, after warm-up", "MB", {column: value / MB for column, value in idle.items()}),
            Row(f"RSS with {STREAMS:,} open streams", "MB",
                {column: answer["rss"] / MB for column, answer in held.items()})]
