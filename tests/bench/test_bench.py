"""The benchmarks run end to end: `bench --quick --only small,stream` (with its floor column), `bench.calls` and
`bench.summary_parse` print tables; each benchmark starts without pytest."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ROWS = (
    "small c=1 p50 (ms)", "small c=1 p99 (ms)", "small c=1 added p50 vs direct (ms)",
    "small c=1 added p50 / floor's (x)",
    "small c=32 throughput (req/s)", "small c=32 throughput / direct (x)", "small c=32 throughput / floor's (x)",
    "small c=32 CPU per request (ms)", "small c=32 CPU per request / floor's (x)",
    "small c=64 throughput (req/s)", "small c=64 throughput / direct (x)", "small c=64 throughput / floor's (x)",
    "small c=64 CPU per request (ms)", "small c=64 CPU per request / floor's (x)",
    "stream c=1 time to first byte p50 (ms)", "stream c=1 added time to first byte (ms)",
    "stream c=32 added time to first byte (ms)", "stream c=32 added inter-chunk p50 (ms)",
    "stream c=32 CPU per stream (ms)",
)
# Rows of the proxy over the floor (the minimal aiohttp pass-through of the same run): the floor's own cell is empty.
FLOOR_ROWS = tuple(row for row in ROWS if "/ floor's" in row)
ABSOLUTE_ROWS = ("small c=1 p50 (ms)", "small c=1 p99 (ms)", "small c=32 throughput (req/s)",
                 "small c=64 throughput (req/s)", "stream c=1 time to first byte p50 (ms)")


def table(stdout: str) -> dict[str, dict[str, str]]:
    """The markdown table's cells: row label -> column -> text."""
    lines = [line for line in stdout.splitlines() if line.startswith("|")]
    columns = [cell.strip() for cell in lines[0].strip("|").split("|")][1:]
    rows = {}
    for line in lines[2:]:
        label, *cells = (cell.strip() for cell in line.strip("|").split("|"))
        rows[label] = dict(zip(columns, cells, strict=True))
    return rows


def test_quick_run_prints_a_table_of_numbers() -> None:
    done = subprocess.run([sys.executable, "-m", "bench", "--quick", "--only", "small,stream"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "date: " in done.stdout and "machine: " in done.stdout and "python: " in done.stdout
    rows = table(done.stdout)
    assert list(rows) == list(ROWS)
    for label, cells in rows.items():
        assert {"direct", "floor", "proxy off", "proxy on"} <= set(cells)
        # The floor is measured like a proxy; only a figure over itself is empty.
        assert (cells["floor"] == "—") == (label in FLOOR_ROWS), (label, cells)
        for column in ("proxy off", "proxy on"):
            float(cells[column])  # every proxy figure is a number
        for text in cells.values():
            assert text == "—" or float(text) == float(text), (label, cells)
        # Absolute figures exist for direct too; "added" and "/ direct" ones are relative to it.
        assert (cells["direct"] != "—") == (label in ABSOLUTE_ROWS), (label, cells)
    assert float(rows["small c=32 throughput (req/s)"]["proxy on"]) > 0
    assert float(rows["small c=32 throughput / floor's (x)"]["proxy on"]) > 0
    assert float(rows["stream c=1 time to first byte p50 (ms)"]["proxy on"]) > 0


def test_the_summary_parse_benchmark_prints_a_time_per_shape_and_size() -> None:
    done = subprocess.run([sys.executable, "-m", "bench.summary_parse", "--sizes", "2000,4000", "--repeats", "1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-4000:]
    rows = table(done.stdout)
    assert set(rows) == {"broken fences", "terminators", "terminator, fence, empty object", "unterminated lists",
                         "legitimate summary"}
    for cells in rows.values():
        assert [float(cells[size].removesuffix(" ms")) >= 0 for size in ("2 KB", "4 KB")] == [True, True]
        assert cells["last step"].endswith("x")


def test_the_calls_benchmark_counts_each_targets_python_calls_per_request() -> None:
    done = subprocess.run([sys.executable, "-m", "bench.calls", "--requests", "3", "--only", "small", "--top", "3"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    rows = table(done.stdout)
    assert list(rows) == ["small: Python calls per request (calls)", "small: the same / floor's (x)"]
    counts = {column: float(cell) for column, cell in rows["small: Python calls per request (calls)"].items()}
    assert list(counts) == ["floor", "proxy off", "proxy on"]
    # The floor does the least any aiohttp proxy can; the proxy does that and more (its log, metrics, glance).
    assert 0 < counts["floor"] < counts["proxy off"] and counts["floor"] < counts["proxy on"]
    assert rows["small: the same / floor's (x)"]["floor"] == "—"
    assert float(rows["small: the same / floor's (x)"]["proxy on"]) == pytest.approx(
        counts["proxy on"] / counts["floor"], abs=0.01)
    assert done.stdout.count("the functions whose calls grew most per request") == 3


@pytest.mark.parametrize("pieces", ["0", "65536"], ids=["whole", "in pieces"])
def test_the_steps_benchmark_times_the_proxys_own_steps_per_request(pieces: str) -> None:
    done = subprocess.run([sys.executable, "-m", "bench.steps", "--shape", "long", "--requests", "5",
                           "--pieces", pieces], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert (f"sent in pieces of {pieces} bytes" in done.stdout) == (pieces != "0")
    rows = {label: float(next(iter(cells.values()))) for label, cells in table(done.stdout).items()}
    # A resent history goes the whole way: read, its journey begun, answered, learnt from; each step once.
    for step in ("read_bounded", "Pipeline.parse", "Pipeline._begin", "HistoryIndex.read_off_loop",
                 "Pipeline._finish", "Pipeline._learn"):
        assert rows[f"{step} (µs)"] > 0 and rows[f"{step} calls (calls)"] == 1.0, step
    assert rows["Pipeline._begin (µs)"] >= rows["HistoryIndex.read_off_loop (µs)"]  # the index is read inside it


@pytest.mark.parametrize(("shape", "read_by"), [("long", "ChatDialect"), ("long-responses", "ResponsesDialect"),
                                                ("long-messages", "MessagesDialect")])
def test_the_steps_benchmark_sends_each_shape_to_its_apis_route(shape: str, read_by: str) -> None:
    done = subprocess.run([sys.executable, "-m", "bench.steps", "--shape", shape, "--requests", "3"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    rows = {label: float(next(iter(cells.values()))) for label, cells in table(done.stdout).items()}
    calls = {dialect: rows[f"{dialect}.parse calls (calls)"]
             for dialect in ("ChatDialect", "ResponsesDialect", "MessagesDialect")}
    assert calls == {dialect: 1.0 if dialect == read_by else 0.0 for dialect in calls}


def test_the_stalls_benchmark_probes_the_loop_while_turns_bring_large_results() -> None:
    done = subprocess.run([sys.executable, "-m", "bench.stalls", "--rounds", "1", "--turns", "2", "--conversations",
                           "2", "--result-chars", "20000"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "each adding a tool result of 20,000 characters" in done.stdout
    rows = {label: float(next(iter(cells.values()))) for label, cells in table(done.stdout).items()}
    assert rows["probes per round (calls)"] >= 1
    assert 0 < rows["/healthz p50 (ms)"] <= rows["/healthz p99 (ms)"] <= rows["/healthz slowest (ms)"]
    assert rows["proxy CPU per turn (ms)"] >= 0


@pytest.mark.parametrize("flags", [["--turns", "7"], ["--result-chars", "0"], ["--rounds", "11"]])
def test_the_stalls_benchmark_refuses_what_would_near_the_window_or_run_unbounded(flags: list[str]) -> None:
    done = subprocess.run([sys.executable, "-m", "bench.stalls", *flags], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and "bounds:" in done.stderr


@pytest.mark.parametrize("module", ["bench", "bench.agents", "bench.calls", "bench.fidelity", "bench.hostile",
                                    "bench.small_windows", "bench.reuse_latency", "bench.soak", "bench.steps",
                                    "bench.stalls", "bench.instructions"])
def test_a_benchmark_starts_without_pytest(module: str) -> None:
    """The fakes and helpers a benchmark shares with the tests import no pytest: a machine with only the
    benchmark's dependencies runs it."""
    blocked = ("import runpy, sys; sys.modules['pytest'] = None; sys.argv = [sys.argv[1], '--help']; "
               "runpy.run_module(sys.argv[0], run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", blocked, module], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0 and "usage" in done.stdout.lower(), done.stderr[-2000:]


def test_the_apis_scenarios_send_the_history_as_codex_and_claude_code_do() -> None:
    """`--only apis,apis-reuse`: the long history through /v1/responses and /v1/messages, then served from its
    stored summary; every target answers each request (a refusal would fail the run), and each figure is a
    number."""
    done = subprocess.run([sys.executable, "-m", "bench", "--quick", "--only", "apis,apis-reuse", "--rounds", "1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-4000:]
    rows = table(done.stdout)
    for api in ("responses", "messages"):
        cells = rows[f"100k history in {api}: CPU per request / floor's (x)"]
        assert float(cells["proxy on"]) > 0 and float(cells["proxy off"]) > 0 and cells["floor"] == "—"
        assert float(rows[f"100k history in {api}: CPU per request (ms)"]["floor"]) > 0
        # Every measured request was served from the stored summary (the run fails otherwise), smaller upstream.
        assert 0 < float(rows[f"reuse hit in {api}: forwarded / client body (x)"]["proxy on"]) < 0.5
