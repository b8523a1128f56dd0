"""How long other clients wait while an agent's turns each bring a large tool result (a file read, a test run).

Usage: python -m bench.stalls [--proxy-root PATH ...] [--result-chars N] [--turns N] [--conversations N] [--rounds N]

Each proxy (this checkout, and every --proxy-root: an older checkout measured in the same run) runs as its own
process, `python -m proxy` with the bench's config and compaction on, in front of the bench's fast fake upstream.
In each round, for each proxy in turn, one agent runs --conversations conversations of --turns turns; each turn
adds a tool call and its result, --result-chars characters of the proxy's own source (a different slice each turn),
and resends the conversation, which stays far below its model's window (nothing is summarised). Meanwhile a prober
in this process asks /healthz every millisecond (its waits include this process's own work on the turns, alike for
every proxy). Figures per proxy, the median over rounds: the probes' p50, p99 and slowest wait
(what any other client's request waits behind the turn's work on the proxy's loop), and the proxy's CPU per turn,
taken from as many conversations again without the prober. Bounded: 2 x --rounds x proxies x conversations x turns
requests, each with a 60 s timeout.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp
import orjson

from bench.machine import commit, header
from bench.processes import BENCH_ROOT, Child, cpu_seconds, start_proxy, start_upstream, stop, wait_proxy
from bench.scenarios import Row
from bench.table import render
from bench.targets import proxy_config

MODEL = "bench-long"  # a 400,000-token window in the bench's config: these conversations never near it
PROBE_EVERY = 0.001
TIMEOUT = aiohttp.ClientTimeout(total=60)
_SOURCE = "".join(path.read_text() for path in sorted((BENCH_ROOT / "proxy" / "compaction").glob("*.py")))


def tool_result(number: int, chars: int) -> str:
    """`chars` characters of Python source, starting at a place of its own for each `number`."""
    start = number * 7919 % len(_SOURCE)
    text = (_SOURCE[start:] + _SOURCE) * (chars // len(_SOURCE) + 1)
    return f"# result {number}\n" + text[:chars]


async def agent(session: aiohttp.ClientSession, url: str, conversation: int, turns: int, chars: int) -> None:
    messages: list[dict[str, object]] = [
        {"role": "system", "content": f"You are coding agent {conversation}."},
        {"role": "user", "content": f"Find and fix bug {conversation} in the pipeline."}]
    for number in range(turns):
        call_id = f"call_{conversation}_{number}"
        messages += [{"role": "assistant", "content": None, "tool_calls": [
                         {"id": call_id, "type": "function", "function": {"name": "read", "arguments": "{}"}}]},
                     {"role": "tool", "tool_call_id": call_id,
                      "content": tool_result(conversation * 1000 + number, chars)}]
        async with session.post(f"{url}/v1/chat/completions", data=orjson.dumps({"model": MODEL, "messages": messages}),
                                headers={"Content-Type": "application/json"}, timeout=TIMEOUT) as response:
            await response.read()
            if response.status != 200:
                raise SystemExit(f"turn {number} of conversation {conversation} answered {response.status}")


async def probed(url: str, work: asyncio.Task[None]) -> list[float]:
    """The waits of /healthz probes sent one after another, a millisecond apart, until `work` is done."""
    waits = []
    async with aiohttp.ClientSession() as session:
        while not work.done():
            started = time.perf_counter()
            async with session.get(f"{url}/healthz", timeout=TIMEOUT) as response:
                await response.read()
            waits.append(time.perf_counter() - started)
            await asyncio.sleep(PROBE_EVERY)
    await work
    return waits


async def one_round(url: str, child: Child, args: argparse.Namespace, start: int) -> dict[str, float]:
    """The probes' waits while the round's conversations run; then as many again without probes, for the proxy's
    CPU per turn alone (a loop left free answers more probes, which would count against it)."""
    async with aiohttp.ClientSession() as session:

        async def conversations(first: int) -> None:
            for conversation in range(first, first + args.conversations):
                await agent(session, url, conversation, args.turns, args.result_chars)

        waits = sorted(await probed(url, asyncio.ensure_future(conversations(start))))
        before = cpu_seconds(child.pid)
        await conversations(start + args.conversations)
        cpu = (cpu_seconds(child.pid) - before) / (args.conversations * args.turns)
    return {"p50": waits[len(waits) // 2], "p99": waits[min(len(waits) - 1, int(len(waits) * 0.99))],
            "max": waits[-1], "cpu": cpu, "probes": len(waits)}


def run(args: argparse.Namespace, roots: list[Path]) -> tuple[list[str], list[Row]]:
    directory = Path(tempfile.mkdtemp(prefix="bench-stalls-"))
    upstream, upstream_port = start_upstream(directory)
    proxies: list[tuple[str, Child, str]] = []
    try:
        for index, root in enumerate(roots):
            config = directory / f"proxy-{index}.json"
            config.write_text(proxy_config(upstream_port, 0, compaction=True))
            child = start_proxy(f"proxy-{index}", root, config, directory / f"proxy-{index}.log")
            port = wait_proxy(child)
            column = f"proxy {commit(root)}"
            column += f" ({index + 1})" if any(column == taken for taken, _, _ in proxies) else ""
            proxies.append((column, child, f"http://127.0.0.1:{port}"))
        figures: dict[str, list[dict[str, float]]] = {column: [] for column, _, _ in proxies}
        for number in range(args.rounds):
            for column, child, url in proxies:  # a round of each, alternating, so drift hits them alike
                figures[column].append(asyncio.run(one_round(url, child, args, 2 * number * args.conversations)))
    finally:
        for _, child, _ in proxies:
            stop(child)
        stop(upstream)
    columns = [column for column, _, _ in proxies]

    def median(field: str, scale: float = 1000.0) -> dict[str, float]:
        return {column: statistics.median(one[field] for one in figures[column]) * scale for column in columns}

    return columns, [Row("/healthz p50", "ms", median("p50")), Row("/healthz p99", "ms", median("p99")),
                     Row("/healthz slowest", "ms", median("max")), Row("proxy CPU per turn", "ms", median("cpu")),
                     Row("probes per round", "calls", median("probes", 1.0))]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.stalls", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--result-chars", type=int, default=32_000, help="characters of each tool result")
    parser.add_argument("--turns", type=int, default=6, help="turns of each conversation")
    parser.add_argument("--conversations", type=int, default=20, help="conversations a round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--proxy-root", type=Path, action="append", default=[],
                        help="another checkout's proxy, measured in the same run (repeatable)")
    args = parser.parse_args(argv)
    # The conversations stay far below the window: at most 6 x 64K characters of results each.
    if not (1 <= args.result_chars <= 64_000 and 1 <= args.turns <= 6 and 1 <= args.conversations <= 50
            and 1 <= args.rounds <= 10):
        parser.error("bounds: --result-chars 1-64000, --turns 1-6, --conversations 1-50, --rounds 1-10")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    roots = [BENCH_ROOT, *args.proxy_root]
    columns, rows = run(args, roots)
    print(render([*header(roots), f"{args.rounds} round(s) of {args.conversations} conversation(s) x {args.turns} "
                  f"turn(s), each adding a tool result of {args.result_chars:,} characters"], columns, rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
