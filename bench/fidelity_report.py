"""Aggregate the fidelity benchmark's graded probes and summariser measurements into tables."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from bench.fidelity_facts import KINDS

# "stages": the proxy with the tool-result stages on (clearing and pair summaries), driven over the same
# conversation after the proxy arm and probed at the proxy arm's points; not run unless asked for.
ARMS = ("proxy", "stages", "full", "tail", "naive")
DEFAULT_ARMS = ("proxy", "full", "tail", "naive")
Stat = dict[str, float]


def spread(values: Sequence[float], count: int) -> Stat:
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values), "n": count}


def aggregate(probes: Iterable[Mapping[str, Any]]) -> dict[int, dict[str, dict[str, Stat]]]:
    """cycle -> arm -> fact kind (and "overall") -> recall: mean and min-max over replicates, n probes."""
    tally: dict[tuple[int, str, str], dict[int, list[bool]]] = defaultdict(lambda: defaultdict(list))
    for probe in probes:
        # "truncated": the facts a truncating client no longer sends, the only ones the tail arm cannot just read.
        for kind in (probe["kind"], "overall", *(("truncated",) if probe.get("truncated") else ())):
            tally[probe["cycle"], probe["arm"], kind][probe["replicate"]].append(bool(probe["correct"]))
    table: dict[int, dict[str, dict[str, Stat]]] = defaultdict(lambda: defaultdict(dict))
    for (cycle, arm, kind), by_replicate in sorted(tally.items()):
        recalls = [sum(answers) / len(answers) for answers in by_replicate.values()]
        table[cycle][arm][kind] = spread(recalls, sum(len(answers) for answers in by_replicate.values()))
    return {cycle: dict(arms) for cycle, arms in table.items()}


def ratio(table: Mapping[str, Mapping[str, Stat]], over: str, kind: str = "overall") -> float | None:
    proxy, other = table.get("proxy", {}).get(kind), table.get(over, {}).get(kind)
    if not proxy or not other or not other["mean"]:
        return None
    return proxy["mean"] / other["mean"]


def _compared(table: Mapping[str, Mapping[str, Stat]], over: str, kind: str) -> str:
    """proxy/over as a ratio, or both recalls when `over` scored 0 (a ratio would be infinite)."""
    value = ratio(table, over, kind)
    if value is not None:
        return f"proxy/{over} {value:.2f}"
    return f"proxy {table['proxy'][kind]['mean']:.2f} vs {over} {table[over][kind]['mean']:.2f}"


def cell(stat: Stat | None) -> str:
    if stat is None:
        return "-"
    if stat["min"] == stat["max"]:
        return f"{stat['mean']:.2f} (n {stat['n']:.0f})"
    return f"{stat['mean']:.2f} ({stat['min']:.2f}-{stat['max']:.2f}, n {stat['n']:.0f})"


def recall_table(table: dict[int, dict[str, dict[str, Stat]]], arms: Sequence[str]) -> list[str]:
    """Markdown: one block per cycle, a row per fact kind, a column per arm."""
    lines: list[str] = []
    for cycle, by_arm in sorted(table.items()):
        lines += ["", f"After compaction {cycle}: recall, mean (min-max over replicates, n probes)", "",
                  "| fact | " + " | ".join(arms) + " |", "| --- |" + " --- |" * len(arms)]
        for kind in (*KINDS, "overall", "truncated"):
            if any(kind in by_arm.get(arm, {}) for arm in arms):
                label = "dropped by truncation" if kind == "truncated" else kind
                lines.append(f"| {label} | " + " | ".join(cell(by_arm.get(arm, {}).get(kind)) for arm in arms) + " |")
        ratios = [f"proxy/{over} {value:.2f}" for over in ("full", "tail") if (value := ratio(by_arm, over))]
        ratios += [f"on facts dropped by truncation {_compared(by_arm, over, 'truncated')}" for over in ("full", "tail")
                   if "truncated" in by_arm.get("proxy", {}) and "truncated" in by_arm.get(over, {})]
        lines.append(f"\n{'; '.join(ratios) or 'no ratios (an arm is missing or scored 0)'}")
    return lines


def summary_lines(summaries: Sequence[Mapping[str, Any]]) -> list[str]:
    """The proxy's summaries: facts kept verbatim, summariser tokens, latency and the server's evaluated tokens."""
    if not summaries:
        return ["", "no summaries were made"]
    lines = ["", "| cycle | summaries | kept verbatim | prompt tok (median) | completion tok | latency s (median) | "
             "server prompt tok evaluated (median) | cached tok | parsed |", "| --- |" + " --- |" * 8]
    by_cycle: dict[int, list[Mapping[str, Any]]] = defaultdict(list)
    for summary in summaries:
        by_cycle[summary["cycle"]].append(summary)
    for cycle, group in sorted(by_cycle.items()):
        kept = sum(len(s["kept"]) for s in group)
        span = sum(len(s["summarised"]) for s in group)
        lines.append(f"| {cycle} | {len(group)} | {kept}/{span} ({kept / span if span else 1:.0%}) | "
                     f"{_median(group, 'prompt_tokens')} | {_median(group, 'completion_tokens')} | "
                     f"{_median(group, 'seconds', 1)} | {_median(group, 'evaluated_tokens')} | "
                     f"{_median(group, 'cached_tokens')} | {sum(bool(s['parsed']) for s in group)}/{len(group)} |")
    return lines


def _median(group: Sequence[Mapping[str, Any]], key: str, digits: int = 0) -> str:
    values = [s[key] for s in group if s.get(key) is not None]
    return f"{statistics.median(values):.{digits}f}" if values else "-"
