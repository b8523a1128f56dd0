"""The measured scenarios: what each sends, to which targets, how much of it per run, and the rows it yields."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bench.targets import FLOOR, KINDS

# Per measure: column -> one answer of the load generator per round (plus the target's CPU per request).
ByColumn = dict[str, list[dict[str, Any]]]
Results = dict[str, ByColumn]
DIRECT = "direct"


@dataclass(frozen=True)
class Measure:
    key: str
    shape: str                          # bench.bodies.SHAPES
    concurrency: int
    requests: tuple[int, int]           # at most this many requests per run: (default, --quick)
    seconds: tuple[float, float]        # and at most this many seconds per run
    kinds: tuple[str, ...] = KINDS
    expect: tuple[str, str] | None = None   # a header every answer of a compaction-on proxy must carry

    def max_requests(self, quick: bool) -> int:
        return self.requests[quick]

    def max_seconds(self, quick: bool) -> float:
        return self.seconds[quick]


@dataclass(frozen=True)
class Row:
    label: str
    unit: str                           # ms, req/s, x, MB, KB: how table.py formats it
    values: dict[str, float]            # column -> figure; a column not here prints "—"


@dataclass(frozen=True)
class Scenario:
    name: str
    measures: tuple[Measure, ...]
    rows: Callable[[Results], list[Row]]
    # (shape, header value) pairs: one request of each per proxy-on target first, answered with that x-compaction
    prime: tuple[tuple[str, str], ...] = ()


def _rounds(by_column: ByColumn, column: str, field: str) -> list[float]:
    return [answer[field] for answer in by_column.get(column, []) if answer.get(field) is not None]


def absolute(by_column: ByColumn, field: str, *, direct: bool = True, scale: float = 1.0) -> dict[str, float]:
    """Per column, the median over rounds of `field`."""
    return {column: statistics.median(values) * scale for column in by_column
            if (direct or column != DIRECT) and (values := _rounds(by_column, column, field))}


def paired(by_column: ByColumn, field: str, combine: Callable[[float, float], float],
           base_column: str = DIRECT) -> dict[str, float]:
    """Per column but the base, the median over rounds of combine(column's figure, the base's figure that round)."""
    base = _rounds(by_column, base_column, field)
    figures = {}
    for column in by_column:
        values = _rounds(by_column, column, field)
        if column != base_column and values and len(values) == len(base):
            figures[column] = statistics.median(combine(value, ref) for value, ref in zip(values, base, strict=True))
    return figures


def added(by_column: ByColumn, field: str) -> dict[str, float]:
    return paired(by_column, field, lambda value, ref: value - ref)


def _over(value: float, ref: float) -> float:
    return value / ref if ref else float("nan")


def ratio(by_column: ByColumn, field: str) -> dict[str, float]:
    return paired(by_column, field, _over)


def cpu(by_column: ByColumn) -> dict[str, float]:
    return absolute(by_column, "cpu_ms_per_request", direct=False)


def faults(by_column: ByColumn) -> dict[str, float]:
    """Minor page faults per request: a large body's buffers given back to the system and taken again each time
    move a target's CPU by as much as the proxy's own work does (docs/performance.md#the-floors-page-faults)."""
    return absolute(by_column, "faults_per_request", direct=False)


# The columns that are not a proxy: a figure "over the floor's" is reported for the others only.
REFERENCES = (DIRECT, FLOOR, "nginx")


def over_floor(figures: dict[str, float]) -> dict[str, float]:
    """Each proxy column's figure over the floor's (the same row's medians); nothing without a positive floor."""
    floor = figures.get(FLOOR)
    if not floor or floor <= 0:
        return {}
    return {column: value / floor for column, value in figures.items() if column not in REFERENCES}


def per_shape(by_target: dict[str, dict[str, float]], shapes: Sequence[str], what: str, unit: str,
              scale: float = 1.0, same: str = "the same") -> list[Row]:
    """For each shape, `what` of every target (its figure times `scale`), then the same over the floor's (the
    floor's own cell empty), labelled `same`: the tables of bench.calls and bench.instructions."""
    found = []
    for shape in shapes:
        figures = {target: by_shape[shape] for target, by_shape in by_target.items()}
        found.append(Row(f"{shape}: {what}", unit, {target: value * scale for target, value in figures.items()}))
        found.append(Row(f"{shape}: {same} / floor's", "x", over_floor(figures)))
    return found


def throughput_over_floor(by_column: ByColumn) -> dict[str, float]:
    """Per proxy column, the median over rounds of its throughput over the floor's in the same round."""
    figures = paired(by_column, "rps", _over, base_column=FLOOR)
    return {column: value for column, value in figures.items() if column not in REFERENCES}


def small_rows(results: Results) -> list[Row]:
    c1 = results["c1"]
    added_p50 = added(c1, "p50_ms")
    rows = [Row("small c=1 p50", "ms", absolute(c1, "p50_ms")),
            Row("small c=1 p99", "ms", absolute(c1, "p99_ms")),
            Row("small c=1 added p50 vs direct", "ms", added_p50),
            Row("small c=1 added p50 / floor's", "x", over_floor(added_p50))]
    for level in ("c32", "c64"):
        by_column = results[level]
        per_request = cpu(by_column)
        rows += [Row(f"small c={level[1:]} throughput", "req/s", absolute(by_column, "rps")),
                 Row(f"small c={level[1:]} throughput / direct", "x", ratio(by_column, "rps")),
                 Row(f"small c={level[1:]} throughput / floor's", "x", throughput_over_floor(by_column)),
                 Row(f"small c={level[1:]} CPU per request", "ms", per_request),
                 Row(f"small c={level[1:]} CPU per request / floor's", "x", over_floor(per_request))]
    return rows


def stream_rows(results: Results) -> list[Row]:
    c1, c32 = results["c1"], results["c32"]
    return [Row("stream c=1 time to first byte p50", "ms", absolute(c1, "ttfb_p50_ms")),
            Row("stream c=1 added time to first byte", "ms", added(c1, "ttfb_p50_ms")),
            Row("stream c=32 added time to first byte", "ms", added(c32, "ttfb_p50_ms")),
            Row("stream c=32 added inter-chunk p50", "ms", added(c32, "gap_p50_ms")),
            Row("stream c=32 CPU per stream", "ms", cpu(c32))]


def long_rows(results: Results) -> list[Row]:
    c1 = results["c1"]
    per_request = cpu(c1)
    return [Row("100k history c=1 p50", "ms", absolute(c1, "p50_ms")),
            Row("100k history c=1 added p50", "ms", added(c1, "p50_ms")),
            Row("100k history CPU per request", "ms", per_request),
            Row("100k history CPU per request / floor's", "x", over_floor(per_request)),
            Row("100k history minor page faults", "per request", faults(c1))]


def by_api(results: Results, what: str, floor_note: str = "", forwarded: bool = False) -> list[Row]:
    """The rows of a measure per client API (the measures keyed by API)."""
    rows = []
    for api in ("responses", "messages"):
        c1 = results[api]
        per_request = cpu(c1)
        rows += [Row(f"{what} in {api}: c=1 added p50", "ms", added(c1, "p50_ms")),
                 Row(f"{what} in {api}: CPU per request", "ms", per_request),
                 Row(f"{what} in {api}: CPU per request / floor's{floor_note}", "x", over_floor(per_request))]
        if forwarded:
            rows.append(Row(f"{what} in {api}: forwarded / client body", "x", ratio(c1, "received_bytes")))
    return rows


def apis_rows(results: Results) -> list[Row]:
    return by_api(results, "100k history")


def apis_reuse_rows(results: Results) -> list[Row]:
    return by_api(results, "reuse hit", " on the client's body", forwarded=True)


def reuse_rows(results: Results) -> list[Row]:
    c1 = results["c1"]
    per_request = cpu(c1)
    return [Row("reuse hit c=1 p50", "ms", absolute(c1, "p50_ms")),
            Row("reuse hit c=1 added p50", "ms", added(c1, "p50_ms")),
            Row("reuse hit CPU per request", "ms", per_request),
            Row("reuse hit CPU per request / floor's on the client's body", "x", over_floor(per_request)),
            Row("reuse hit minor page faults", "per request", faults(c1)),
            Row("reuse body the upstream receives", "KB", absolute(c1, "received_bytes", scale=1 / 1024)),
            Row("reuse forwarded / client body", "x", ratio(c1, "received_bytes"))]


# (default, --quick) bounds of every run.
SCENARIOS = {scenario.name: scenario for scenario in (
    Scenario("small", (Measure("c1", "small", 1, (3000, 400), (2.0, 0.4)),
                       Measure("c32", "small", 32, (100_000, 20_000), (2.5, 0.5)),
                       Measure("c64", "small", 64, (100_000, 20_000), (2.5, 0.5))), small_rows),
    Scenario("stream", (Measure("c1", "stream", 1, (12, 3), (3.0, 1.0)),
                        Measure("c32", "stream", 32, (384, 96), (3.0, 1.0))), stream_rows),
    Scenario("long", (Measure("c1", "long", 1, (1000, 60), (4.0, 1.0)),), long_rows),
    Scenario("apis", (Measure("responses", "long-responses", 1, (1000, 60), (4.0, 1.0)),
                      Measure("messages", "long-messages", 1, (1000, 60), (4.0, 1.0))), apis_rows),
    Scenario("reuse", (Measure("c1", "reuse", 1, (1000, 60), (4.0, 1.0), kinds=("direct", FLOOR, "on"),
                               expect=("x-compaction", "reused")),), reuse_rows, prime=(("reuse", "proactive"),)),
    Scenario("apis-reuse", tuple(Measure(api, f"reuse-{api}", 1, (1000, 60), (4.0, 1.0), kinds=("direct", FLOOR, "on"),
                                         expect=("x-compaction", "reused")) for api in ("responses", "messages")),
             apis_reuse_rows,
             prime=(("reuse-responses", "proactive"), ("reuse-messages", "proactive"))),
)}
