"""Where a request's time goes inside the proxy: the wall time of each of its own steps, per request.

Usage: python -m bench.steps [--shape long] [--requests N] [--pieces BYTES] [--proxy-root PATH]

The proxy runs in this process (proxy.app.start_server, the bench's config, compaction on) against the fast fake
upstream (bench.fast_upstream, a child process), and one client sends the shape's requests, to its API's route, one at
a time: WARMUP first, then N timed. Each step in STEPS is wrapped for the run: the time from its call to its return
(awaits included, so a step that waits on I/O shows its wait; the steps listed do none but the store lookup, which is
a dict here). The figures are what the proxy's own steps cost with everything else a request does around them, so they
run about twice what the same function costs in a loop on its own (the data it reads is no longer in the CPU's
caches). `--proxy-root` times another checkout's proxy (a step it lacks is left out). `--pieces` sends each body in
pieces of that many bytes (chunked), the loop let go between them, as a body comes in over a network: the proxy reads
it piece by piece instead of whole. Bounded: at most MAX_REQUESTS requests.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
import json
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp

from bench.bodies import SHAPES, Bodies
from bench.machine import commit, header
from bench.processes import BENCH_ROOT, start_upstream, stop
from bench.scenarios import Row
from bench.table import render
from bench.targets import proxy_config

WARMUP = 50
MAX_REQUESTS = 5000
# module:Owner.method (or module:function), outermost first.
STEPS = (
    "proxy.http.request_body:read_bounded",
    "proxy.compaction.pipeline:Pipeline.glanced",
    "proxy.compaction.pipeline:Pipeline.parse",
    "proxy.dialects.chat:ChatDialect.parse",  # which API's reading a request got: its shape's own
    "proxy.dialects.responses:ResponsesDialect.parse",
    "proxy.dialects.messages:MessagesDialect.parse",
    "proxy.dialects.body_memo:_encodes_to",
    "proxy.compaction.pipeline:Pipeline._edited",
    "proxy.compaction.pipeline:Pipeline._begin",
    "proxy.core.history_index:HistoryIndex.read_off_loop",
    "proxy.compaction.compactor:Compactor.reuse",
    "proxy.compaction.tool_stages:ToolStages.shape",
    "proxy.upstream.attempt:_judged",
    "proxy.compaction.pipeline:Pipeline._finish",
    "proxy.compaction.answer_headers:AnswerHeaders.of",
    "proxy.compaction.pipeline:Pipeline._learn",
    "proxy.http.request_log:_write",
)


class Clock:
    """Wall time and calls per step, wrapped around the named functions for one run."""

    def __init__(self) -> None:
        self.seconds: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()

    def wrap(self, step: str) -> bool:
        """Wrap one step in place; False when this checkout has no such step."""
        module_name, _, path = step.partition(":")
        owner_name, _, name = path.rpartition(".")
        try:
            module = importlib.import_module(module_name)
            owner = getattr(module, owner_name) if owner_name else module
            original = getattr(owner, name)
        except (ImportError, AttributeError):
            return False
        setattr(owner, name, self._timed(step, original))
        return True

    def _timed(self, step: str, original: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.iscoroutinefunction(original):
            async def timed_coroutine(*args: Any, **kwargs: Any) -> Any:
                started = time.perf_counter()
                try:
                    return await original(*args, **kwargs)
                finally:
                    self._add(step, started)
            return timed_coroutine

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self._add(step, started)
        return timed

    def _add(self, step: str, started: float) -> None:
        self.seconds[step] += time.perf_counter() - started
        self.calls[step] += 1

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()


async def _in_pieces(body: bytes, size: int) -> AsyncIterator[bytes]:
    for start in range(0, len(body), size):
        yield body[start:start + size]
        await asyncio.sleep(0)  # the proxy, in this process, reads each piece before the next is sent


async def run(shape: str, requests: int, clock: Clock, pieces: int = 0) -> float:
    """The proxy's and client's CPU seconds per timed request (the steps' times are in `clock`); with `pieces`,
    each body sent in pieces of that many bytes."""
    from proxy.app import start_server
    from proxy.config import Settings

    directory = Path(tempfile.mkdtemp(prefix="bench-steps-"))
    upstream, port = start_upstream(directory)
    try:
        settings = Settings.model_validate(json.loads(proxy_config(port, 0, compaction=True)))
        server = await start_server(settings, port=0)
        made = Bodies(SHAPES[shape])
        headers = made.headers()
        try:
            async with aiohttp.ClientSession() as session:
                for index in range(WARMUP + requests):
                    if index == WARMUP:
                        clock.reset()
                        started = time.process_time()
                    body = made.body(index)
                    data = _in_pieces(body, pieces) if pieces else body
                    async with session.post(f"{server.url}{made.shape.path}", data=data,
                                            headers=headers) as response:
                        await response.read()
                        if response.status != 200:
                            raise SystemExit(f"request {index} answered {response.status}")
                return (time.process_time() - started) / requests
        finally:
            await server.stop()
    finally:
        stop(upstream)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.steps", description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="long", choices=sorted(SHAPES.keys() - {"stream", "hold"}))
    parser.add_argument("--requests", type=int, default=400, help="timed requests (default 400)")
    parser.add_argument("--pieces", type=int, default=0,
                        help="send each body in pieces of this many bytes (default 0: whole)")
    parser.add_argument("--proxy-root", type=Path, default=None, help="a checkout whose proxy to time")
    args = parser.parse_args(argv)
    if not 1 <= args.requests <= MAX_REQUESTS:
        parser.error(f"--requests must be between 1 and {MAX_REQUESTS}")
    if args.pieces < 0:
        parser.error("--pieces must be 0 (whole) or more")
    if args.proxy_root is not None:
        sys.path.insert(0, str(args.proxy_root.resolve()))
    clock = Clock()
    steps = [step for step in STEPS if clock.wrap(step)]
    cpu = asyncio.run(run(args.shape, args.requests, clock, args.pieces))
    root = args.proxy_root or BENCH_ROOT
    column = f"proxy {commit(root)}"
    rows = [Row("proxy and client CPU per request", "ms", {column: cpu * 1000})]
    for step in steps:
        name = step.partition(":")[2]
        rows += [Row(name, "µs", {column: clock.seconds[step] / args.requests * 1e6}),
                 Row(f"{name} calls", "calls", {column: clock.calls[step] / args.requests})]
    print(render([*header([root]), f"shape: {args.shape}, {args.requests} requests"
                  + (f", sent in pieces of {args.pieces} bytes" if args.pieces else "")], [column], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
