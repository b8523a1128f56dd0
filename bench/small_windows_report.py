"""The small-window bench's results: each run turn by turn, and the table, failure list and JSON they are shown as."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Turn:
    """What the client saw for one turn, and what the proxy logged while serving it."""

    index: int
    status: int
    answered: bool
    compaction: str
    prompt_tokens: int | None
    completion_tokens: int | None
    seconds: float
    user_tokens: int
    history_messages: int
    content: str = ""
    error: str = ""
    upstream_requests: list[dict[str, Any]] = field(default_factory=list)
    proxy_log: list[str] = field(default_factory=list)


@dataclass
class Run:
    """One model x n_ctx x window-config run."""

    model: str
    n_ctx: int
    window_config: str
    config: dict[str, Any]
    turns: list[Turn]
    seconds: float
    compaction_events: list[dict[str, Any]]
    summary_failures: list[dict[str, Any]]
    server_context_errors: int
    chat_context_errors: int
    summariser_context_errors: int
    summariser_requests: int
    framing_tokens: int = 0

    @property
    def answered(self) -> int:
        return sum(turn.answered for turn in self.turns)

    @property
    def compacted_turns(self) -> int:
        # "reused": the turn was served on a stored summary (built in the background after an earlier turn).
        return sum(turn.compaction in ("proactive", "reactive", "reused") for turn in self.turns)

    @property
    def median_seconds(self) -> float:
        """Over answered turns: a refused turn returns at once and would only hide how slow the answers are."""
        answered = [turn.seconds for turn in self.turns if turn.answered]
        return statistics.median(answered) if answered else 0.0

    def summary(self) -> dict[str, Any]:
        return {"model": self.model, "n_ctx": self.n_ctx, "window_config": self.window_config,
                "turns": len(self.turns), "answered": self.answered, "compacted_turns": self.compacted_turns,
                "compactions_logged": len(self.compaction_events), "server_context_errors":
                self.server_context_errors, "chat_context_errors": self.chat_context_errors,
                "summariser_context_errors": self.summariser_context_errors,
                "summariser_requests": self.summariser_requests, "summary_failures": len(self.summary_failures),
                "median_turn_seconds": round(self.median_seconds, 2), "run_seconds": round(self.seconds, 1),
                "summariser_framing_tokens": self.framing_tokens}


def table(runs: Sequence[Run]) -> str:
    header = (f"{'model':10s} {'n_ctx':>5s} {'window':>7s} {'answered':>9s} {'compactions':>11s} "
              f"{'ctx errors':>10s} {'(chat/summ)':>11s} {'summ fails':>10s} {'median s':>8s} {'run s':>6s} "
              f"{'framing':>7s}")
    lines = [header, "-" * len(header)]
    for run in runs:
        lines.append(f"{run.model:10s} {run.n_ctx:5d} {run.window_config:>7s} "
                     f"{f'{run.answered}/{len(run.turns)}':>9s} "
                     f"{f'{run.compacted_turns} ({len(run.compaction_events)})':>11s} "
                     f"{run.server_context_errors:10d} "
                     f"{f'{run.chat_context_errors}/{run.summariser_context_errors}':>11s} "
                     f"{len(run.summary_failures):10d} {run.median_seconds:8.1f} {run.seconds:6.0f} "
                     f"{run.framing_tokens:7d}")
    lines.append("compactions: turns with x-compaction proactive/reactive/reused (compaction events the proxy "
                 "logged, background ones included); ctx errors: requests the server refused as too long;\n"
                 "median s: of answered turns; framing: tokens of the built-in summariser prompt and instruction")
    return "\n".join(lines)


def failure_report(runs: Sequence[Run]) -> str:
    lines: list[str] = []
    for run in runs:
        failed = [turn for turn in run.turns if not turn.answered]
        if not failed:
            continue
        lines.append(f"{run.model} n_ctx {run.n_ctx} window {run.window_config}: failed turns "
                     f"{[turn.index for turn in failed]}")
        for turn in failed:
            lines.append(f"  turn {turn.index}: {turn.status} x-compaction={turn.compaction} {turn.error[:200]}")
            for line in turn.proxy_log:
                lines.append(f"    log: {line[:400]}")
    return "\n".join(lines)


def write_json(path: Path, runs: Sequence[Run]) -> None:
    path.write_text(json.dumps([{**run.summary(), "config": run.config, "compaction_events": run.compaction_events,
                                 "summary_failures": run.summary_failures,
                                 "turns": [asdict(turn) for turn in run.turns]} for run in runs], indent=2),
                    encoding="utf-8")
