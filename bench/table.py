"""The one markdown table: a row per figure, a column per target, "—" where a figure does not apply."""

from __future__ import annotations

import math

from bench.scenarios import Row

DASH = "—"


def cell(value: float | None, unit: str) -> str:
    if value is None or math.isnan(value):
        return DASH
    if unit in ("req/s", "KB"):
        return f"{value:.0f}"
    if unit == "MB":
        return f"{value:.1f}"
    if unit == "x":
        return f"{value:.3f}" if abs(value) < 0.1 else f"{value:.2f}"
    magnitude = abs(value)
    return f"{value:.3f}" if magnitude < 1 else f"{value:.2f}" if magnitude < 100 else f"{value:.0f}"


def column_order(columns: list[str]) -> list[str]:
    """direct, nginx, the floor, then the proxies in the order they were started."""
    first = [name for name in ("direct", "nginx", "floor") if name in columns]
    return first + [name for name in columns if name not in first]


def render(header: list[str], columns: list[str], rows: list[Row]) -> str:
    ordered = column_order(columns)
    lines = [f"{line}  " for line in header] + [""]   # two trailing spaces: a line break in markdown
    lines.append("| figure | " + " | ".join(ordered) + " |")
    lines.append("| --- | " + " | ".join("---:" for _ in ordered) + " |")
    for row in rows:
        cells = [cell(row.values.get(column), row.unit) for column in ordered]
        lines.append(f"| {row.label} ({row.unit}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)
