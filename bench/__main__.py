"""Performance benchmark of the proxy against a fake upstream, direct access and nginx, all on 127.0.0.1.

Usage: python -m bench [--quick] [--only small,stream,long,apis,reuse,apis-reuse,rss] [--json FILE]
                       [--proxy-root PATH ...] [--rounds N] [--store memory|sqlite|redis]

How to read it
--------------
One markdown table: a row per figure, a column per target. `direct` is the load generator talking to the fake
upstream itself; `nginx` (when nginx is installed) is nginx as a plain reverse proxy to it, a reference for what
any proxy hop costs; `proxy off` is `python -m proxy` with `compaction.enabled: false` and `proxy on` the same with
compaction on (defaults). Each `--proxy-root` gets its own pair of proxy columns (labelled root@commit), so an old
checkout and a new one are measured in the same run. "—": the figure does not apply to that column. `--store`
puts every proxy's summaries in a SQLite file of its own, or under a key prefix of its own in one redis-server the
bench starts (bench.stores), instead of the memory store.

The targets are measured in interleaved rounds (direct, each proxy, nginx; then again), so drift on a shared
machine hits them alike; each figure is the median over rounds, and "added" and "/ direct" figures are computed
round by round against direct's figure of the same round. Every process — the load generator, the fake upstream,
the proxies, nginx, and anything else running on this machine — shares the same cores: absolute numbers depend on
the machine and its load, the comparisons within one table are what counts. Every child runs with glibc's malloc
thresholds fixed (`bench.processes.STEADY_MALLOC`, unless GLIBC_TUNABLES is set): with glibc's defaults a small
heap gives a large body's memory back and faults it in again, a different number of times each round, and the
floor's CPU on the long history moved 0.5 to 1.3 ms with it.

- small c=1 p50 / p99: latency of a ~50-token non-streaming chat completion, one request at a time (each
  percentile is taken per round, then the median over rounds). added p50: the proxy's p50 minus direct's, i.e.
  what the extra hop costs one client.
- small c=32 / c=64 throughput: answered requests per second with 32 / 64 closed-loop clients; "/ direct" its
  ratio to direct's. CPU per request: the target process's CPU time (utime + stime from /proc, its children
  included) during the run over the requests answered. Direct's column is empty: that would be the upstream's.
- stream: SSE streams of 20 chunks 10 ms apart. time to first byte: until the first body chunk; added inter-chunk
  p50: the median gap between chunks as the client sees them, minus direct's (the pacing itself is 10 ms).
  CPU per stream as above.
- 100k history: a 400-message, ~95k-token (cl100k) agent history (user, assistant tool call, tool result,
  assistant text) resent with one new user message each time; the window is large, so nothing is compacted.
- 100k history in responses / messages: the same history and new message sent as Codex and the Agents SDK send
  it (POST /v1/responses: its system message as `instructions`, tool calls and results as items) and as Claude Code
  does (POST /v1/messages: `system`, tool_use and tool_result blocks); bench.api_bodies. apis-reuse: the same
  two served from their stored summaries, as the reuse hit below.
- reuse hit: the same history to a model whose window (64k; the same proxy-on process, whose `models:` give
  each request shape's model its own window) it passes 0.8 of: the first request compacts (the
  fake upstream answers the summariser), every measured one is served from the stored summary — checked: each
  answer must say `x-compaction: reused`. "body the upstream receives" is what the fake upstream was sent: the
  client's body for direct, the compacted one for the proxy; "forwarded / client body" their ratio.
  minor page faults (both): pages the kernel mapped for the target per request (/proc minflt), as when a large
  body's buffers went back to the system and are taken again; they move a target's CPU from one round to the next.
- RSS: resident memory of the target (proxy: with its children) idle after a warm-up, and once 1,000 streams
  (chunks 1 s apart) are open through it, each having received its first chunk.

--json FILE writes every figure of every round, the table's rows, and the header.
Bounds: every run stops at its request count or its seconds, whichever comes first; the default run takes a few
minutes (under 15), --quick well under 90 seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import machine, nginx
from bench.load_client import LoadClient, LoadFailed
from bench.memory import held_rss, idle_rss, rss_rows
from bench.processes import BENCH_ROOT, StartFailed, raise_open_files
from bench.rounds import BenchFailed, once, progress, run_scenario
from bench.scenarios import SCENARIOS, Measure, Row
from bench.stores import STORES
from bench.table import column_order, render
from bench.targets import Target, fleet

NAMES = (*SCENARIOS, "rss")
WARM_UP = (Measure("warm-small", "small", 4, (40, 40), (5.0, 5.0)),
           Measure("warm-stream", "stream", 2, (4, 4), (5.0, 5.0)))


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="short runs and 2 rounds: a smoke test")
    parser.add_argument("--only", type=lambda text: [name.strip() for name in text.split(",") if name.strip()],
                        default=list(NAMES), help=f"comma-separated scenarios of {','.join(NAMES)} (default all)")
    parser.add_argument("--json", type=Path, help="write every raw figure here")
    parser.add_argument("--proxy-root", type=Path, action="append", default=[],
                        help="a checkout whose proxy package to run (repeatable; default the one holding bench/)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 5, --quick 2)")
    parser.add_argument("--store", choices=STORES, default="memory",
                        help="where the proxies keep their summaries (default memory; redis starts a redis-server)")
    args = parser.parse_args(argv)
    unknown = [name for name in args.only if name not in NAMES]
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}; choose from {', '.join(NAMES)}")
    if args.rounds is not None and args.rounds < 1:
        parser.error("--rounds must be at least 1")
    return args


def warm_up(load: LoadClient, targets: list[Target]) -> None:
    for measure in WARM_UP:
        for target in targets:
            once(load, target, measure, quick=True)


def measure_all(load: LoadClient, targets: list[Target], names: list[str], rounds: int,
                quick: bool) -> tuple[list[Row], dict[str, Any]]:
    warm_up(load, targets)
    idle = idle_rss(targets)
    rows: list[Row] = []
    raw: dict[str, Any] = {"idle_rss_bytes": idle}
    for name in (name for name in NAMES if name in names):
        started = time.monotonic()
        progress(f"{name}:")
        if name == "rss":
            held = held_rss(load, targets, quick)
            rows += rss_rows(idle, held)
            raw["rss"] = held
        else:
            results = run_scenario(load, SCENARIOS[name], targets, rounds, quick)
            rows += SCENARIOS[name].rows(results)
            raw[name] = results
        progress(f"{name}: {time.monotonic() - started:.1f} s")
    return rows, raw


def run(args: argparse.Namespace) -> int:
    roots = [root.resolve() for root in args.proxy_root] or [BENCH_ROOT]
    rounds = args.rounds or (2 if args.quick else 5)
    header = [*machine.header(roots), f"nginx: {nginx.version()}",
              f"runs: {'--quick' if args.quick else 'default'}, {rounds} round(s)", f"summary store: {args.store}"]
    raise_open_files()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-") as scratch, \
            fleet(Path(scratch), roots, store=args.store) as targets:
        load = LoadClient(Path(scratch))
        try:
            rows, raw = measure_all(load, targets, args.only, rounds, args.quick)
        finally:
            load.close()
    columns = column_order([target.column for target in targets])
    header.append(f"wall time: {time.monotonic() - started:.0f} s")
    print(render(header, columns, rows))
    if args.json is not None:
        rows_out = [{"label": row.label, "unit": row.unit, "values": row.values} for row in rows]
        document = {"header": header, "columns": columns, "rows": rows_out, "raw": raw}
        args.json.write_text(json.dumps(document, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        return run(args)
    except (BenchFailed, StartFailed, LoadFailed) as error:
        print(f"benchmark failed: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
