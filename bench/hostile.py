"""What a broken or hostile summariser costs the proxy: memory under an endless answer, and how long other clients
wait (/healthz) while a large answer is read, parsed, judged and fitted.

Usage: python -m bench.hostile [--proxy-root PATH ...] [--seconds S]

Each proxy (this checkout, and every --proxy-root: an older checkout measured in the same run) runs as its own
process, `python -m proxy`, in front of a fake upstream served by this process on 127.0.0.1: chat turns are a
windowed model's (8,192 tokens, so a 30-turn history overflows and the proxy compacts), summary requests get the
answer under test. Figures, per proxy:
- RSS peak: the proxy's resident memory, sampled every 50 ms while one request's summary is answered with an
  endless body (`stream: false` answered with JSON that never ends, then with an event stream that never ends),
  for at most --seconds each; and the bytes the fake managed to send before the proxy hung up.
- /healthz max: the slowest of /healthz probes sent every 10 ms from this process while one request's summary is
  answered with 10 MB, then with as much as this checkout reads for the output asked (proxy.model_client's bound):
  prose, a JSON list of thousands of entries, thousands of fences, thousands of unknown keys.
- status: what the client got (200 compacted, 400 the upstream's own refusal) and x-compaction.
Bounded: the endless answers stop at 96 MB or when the proxy hangs up; every request has a 120 s timeout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.processes import BENCH_ROOT, rss_bytes, start_proxy, stop, wait_proxy
from proxy.summarizer.model_client import reply_bound
from tests.fakes.hostile_summariser import (
    HostileSummariser,
    Reply,
    endless_json,
    filled_body,
    filling,
    history,
    sse_flood,
)
from tests.fakes.openai_upstream import FakeUpstream, FakeUpstreamApp
from tests.fakes.serving import serve_app
from tests.fakes.windowed import WindowedModel

TEN_MB = 10 * 1024 * 1024
LARGE_KINDS = ("prose", "json-list", "fences", "extra-keys")
TIMEOUT = aiohttp.ClientTimeout(total=120)


class Switchable:
    """The fake's summariser answer, switched between measurements."""

    def __init__(self) -> None:
        self.reply: Reply = endless_json()

    async def __call__(self, request: Any, body: dict[str, Any], fake: HostileSummariser) -> Any:
        return await self.reply(request, body, fake)


def config(path: Path, upstream: str, port: int) -> Path:
    path.write_text(json.dumps({
        "server": {"port": port}, "upstream": {"base_url": f"{upstream}/v1"},
        "models": {"default": {"context_window": 8192}},
        "compaction": {"threshold": 0, "background": False},
        # INFO: the start-up line says which port the proxy got (bench.processes.wait_proxy).
        "logging": {"level": "INFO", "access_log": False}}))
    return path


async def turn(session: aiohttp.ClientSession, url: str, tenant: int) -> str:
    """One overflowing turn (a tenant each, so no summary is reused or backed off); its status and x-compaction."""
    async with session.post(f"{url}/v1/chat/completions", json={"model": "fake-small", "messages": history(30)},
                            headers={"Authorization": f"Bearer sk-bench-{tenant}"}, timeout=TIMEOUT) as response:
        await response.read()
        return f"{response.status} {response.headers.get('x-compaction', '-')}"


async def rss_peak(session: aiohttp.ClientSession, url: str, pid: int, tenant: int, seconds: float) -> tuple[int, str]:
    peak, outcome = rss_bytes(pid), "timed out"
    task = asyncio.ensure_future(turn(session, url, tenant))
    deadline = time.monotonic() + seconds
    while not task.done() and time.monotonic() < deadline:
        peak = max(peak, rss_bytes(pid))
        await asyncio.sleep(0.05)
    if task.done():
        outcome = task.result()
    else:
        task.cancel()
    return peak, outcome


async def healthz_max(session: aiohttp.ClientSession, url: str, tenant: int) -> tuple[float, str]:
    task = asyncio.ensure_future(turn(session, url, tenant))
    slowest = 0.0
    while not task.done():
        started = time.perf_counter()
        async with session.get(f"{url}/healthz", timeout=TIMEOUT) as response:
            await response.read()
        slowest = max(slowest, time.perf_counter() - started)
        await asyncio.sleep(0.01)
    return slowest, task.result()


async def measure(name: str, root: Path, upstream: str, switch: Switchable, fake: HostileSummariser,
                  seconds: float, directory: Path) -> list[str]:
    child = start_proxy(name, root, config(directory / f"{name}.json", upstream, 0), directory / f"{name}.log")
    rows = []
    try:
        port = wait_proxy(child)
        url = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession() as session:
            await turn(session, url, 0)  # warm: tokenizer loaded, window learned
            idle = rss_bytes(child.pid)
            for label, reply in (("endless JSON", endless_json()), ("endless SSE", sse_flood())):
                switch.reply, fake.sent_bytes = reply, []
                peak, outcome = await rss_peak(session, url, child.pid, len(rows) + 1, seconds)
                sent = max(fake.sent_bytes, default=0)
                rows.append(f"| {name} | {label} | RSS {idle / 2**20:.0f} MB idle, {peak / 2**20:.0f} MB peak | "
                            f"fake sent {sent / 2**20:.1f} MB | {outcome} |")
            for size, label in ((TEN_MB, "10 MB"), (0, "at the bound")):
                for kind in LARGE_KINDS:
                    if size:
                        filled_body(kind, size)  # made before measuring
                    switch.reply = filling(kind, lambda asked, size=size: size or reply_bound(asked))
                    fake.sent_bytes = []
                    slowest, outcome = await healthz_max(session, url, 100 + len(rows))
                    sent = max(fake.sent_bytes, default=0)
                    rows.append(f"| {name} | {label} {kind} | /healthz max {slowest * 1000:.0f} ms | "
                                f"answer {sent / 1024:.0f} KB | {outcome} |")
    finally:
        stop(child)
    return rows


async def main(args: argparse.Namespace) -> None:
    switch = Switchable()
    fake = HostileSummariser(WindowedModel(window=8192), switch)
    state = FakeUpstream()
    state.chat_hook = fake
    runner, upstream = await serve_app(FakeUpstreamApp(state).build())
    roots = [("this", BENCH_ROOT), *((commit_of(root), root) for root in args.proxy_root)]
    rows = ["| proxy | summariser answer | figure | | client got |", "| --- | --- | --- | --- | --- |"]
    try:
        with tempfile.TemporaryDirectory(prefix="bench-hostile-") as directory:
            for name, root in roots:
                rows += await measure(name, root, upstream, switch, fake, args.seconds, Path(directory))
    finally:
        await runner.cleanup()
    print("\n".join(rows))


def commit_of(root: Path) -> str:
    done = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=False)
    return done.stdout.strip() or root.name


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.hostile", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--proxy-root", type=Path, action="append", default=[],
                        help="another checkout to measure in the same run (its `proxy` package is imported)")
    parser.add_argument("--seconds", type=float, default=20.0, help="longest an endless answer is measured")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
